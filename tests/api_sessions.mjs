// Concurrent streamed completions through the official openai client, with a node killed in
// the middle of them (tests/test-market-standby.sh). Every session of SPEC streams at once;
// once each has brought a few chunks, KILL_PID gets SIGKILL; the streams go on to their end.
// Each session's text goes to OUTDIR/<i>.txt (its error, if any, to OUTDIR/<i>.err), and one
// JSON line says how many were still running at the kill and how many failed.
// usage: node tests/api_sessions.mjs BASE_URL KEY SPEC.json OUTDIR KILL_PID
//   SPEC: [{"prompt", "max_tokens", "temperature", "seed", "top_k", "top_p", "min_p"}, ...]
import fs from 'node:fs';
import OpenAI from 'openai';

const [base, key, specPath, outDir, killPid] = process.argv.slice(2);
const spec = JSON.parse(fs.readFileSync(specPath, 'utf8'));
const client = new OpenAI({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 120000 });
const chunks = spec.map(() => 0);
const ended = spec.map(() => false);
let killed = false, runningAtKill = 0;

function maybeKill() {
    if (killed || !chunks.every((n) => n >= 3)) return;
    killed = true;
    runningAtKill = ended.filter((e) => !e).length;
    process.kill(Number(killPid), 'SIGKILL');
}

async function one(i) {
    const s = spec[i];
    let text = '';
    try {
        const stream = await client.completions.create({
            model: 'kvasir', prompt: s.prompt, max_tokens: s.max_tokens, temperature: s.temperature,
            seed: s.seed, top_k: s.top_k, top_p: s.top_p, min_p: s.min_p, ignore_eos: true,
            stream: true });
        for await (const ch of stream) {
            if (!ch.choices.length) continue;
            text += ch.choices[0].text ?? '';
            chunks[i]++;
            maybeKill();
        }
        fs.writeFileSync(`${outDir}/${i}.txt`, text);
    } catch (e) {
        fs.writeFileSync(`${outDir}/${i}.err`, `${e.status ?? ''} ${e.constructor.name}: ${e.message}`);
    }
    ended[i] = true;
}

await Promise.all(spec.map((_, i) => one(i)));
const failed = spec.filter((_, i) => fs.existsSync(`${outDir}/${i}.err`)).length;
console.log(JSON.stringify({ killed, running_at_kill: runningAtKill, failed }));
