// Concurrent streamed completions through the official openai client, with a node killed in
// the middle of them (tests/integration/test-market-standby.sh). Every session of SPEC streams at once;
// KILL_PID gets SIGKILL once rank 0's control socket CTL_SOCK has reported every session open
// there and a few steps a session since, with sessions still running: the kill lands while
// rank 0 runs them whatever the clients' lag (on a loaded machine a client reads its stream
// late, after rank 0 may have finished it). The
// streams go on to their end. Each session's text goes to OUTDIR/<i>.txt (its error, if any,
// to OUTDIR/<i>.err), and one JSON line says how many were running at the kill (rank 0's count)
// and how many failed.
// usage: node tests/lib/api_sessions.mjs BASE_URL KEY SPEC.json OUTDIR KILL_PID CTL_SOCK
//   SPEC: [{"prompt", "max_tokens", "temperature", "seed", "top_k", "top_p", "min_p"}, ...]
import fs from 'node:fs';
import net from 'node:net';
import OpenAI from 'openai';

const [base, key, specPath, outDir, killPid, ctlSock] = process.argv.slice(2);
const spec = JSON.parse(fs.readFileSync(specPath, 'utf8'));
const client = new OpenAI({ baseURL: base, apiKey: key, maxRetries: 0, timeout: 120000 });
const ended = spec.map(() => false);
let killed = false, runningAtKill = 0;

// rank 0's status ({"op":"status"} on its control socket): {sessions, steps}, or null
function rank0Status() {
    return new Promise((resolve) => {
        let buf = '';
        const c = net.connect(ctlSock, () => c.write('{"op":"status"}\n'));
        c.setTimeout(5000, () => { c.destroy(); resolve(null); });
        c.on('data', (d) => {
            buf += d;
            const nl = buf.indexOf('\n');
            if (nl < 0) return;
            c.destroy();
            try { resolve(JSON.parse(buf.slice(0, nl))); } catch { resolve(null); }
        });
        c.on('error', () => resolve(null));
    });
}

// Polls rank 0 until every session is open there and a few steps a session have run since,
// then kills, while sessions still run there.
async function killDuring() {
    let steps0 = -1;   // rank 0's steps when it first held every session
    while (!ended.every((e) => e)) {
        const st = await rank0Status();
        if (st && steps0 < 0 && st.sessions >= spec.length)
            steps0 = st.steps;
        if (st && steps0 >= 0 && st.sessions >= 1 && st.steps - steps0 >= 3 * spec.length) {
            killed = true;
            runningAtKill = st.sessions;
            process.kill(Number(killPid), 'SIGKILL');
            return;
        }
        await new Promise((r) => setTimeout(r, 10));
    }
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
        }
        fs.writeFileSync(`${outDir}/${i}.txt`, text);
    } catch (e) {
        fs.writeFileSync(`${outDir}/${i}.err`, `${e.status ?? ''} ${e.constructor.name}: ${e.message}`);
    }
    ended[i] = true;
}

await Promise.all([...spec.map((_, i) => one(i)), killDuring()]);
const failed = spec.filter((_, i) => fs.existsSync(`${outDir}/${i}.err`)).length;
console.log(JSON.stringify({ killed, running_at_kill: runningAtKill, failed }));
