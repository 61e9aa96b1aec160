// The official openai client against Kvasir's API (tests/integration/test-api-openai.sh): a streamed chat
// completion and a non-streamed completion with the sampling parameters given, printed as one
// JSON object for the script to compare with `kvctl generate`.
// usage: node tests/lib/api_openai_client.mjs BASE_URL PROMPT MAX_TOKENS TEMP TOP_P SEED
//        node tests/lib/api_openai_client.mjs --key BASE_URL KEY   (a 2-token completion with KEY:
//        "ok 2" or "STATUS ErrorClass")
import OpenAI from 'openai';

if (process.argv[2] === '--key') {
    const c = new OpenAI({ baseURL: process.argv[3], apiKey: process.argv[4], maxRetries: 0 });
    try {
        const r = await c.completions.create({ model: 'x', prompt: 'Once', max_tokens: 2 });
        console.log(`ok ${r.usage.completion_tokens}`);
    } catch (e) { console.log(`${e.status} ${e.constructor.name}`); }
    process.exit(0);
}

const [base, prompt, maxTokens, temp, topP, seed] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base, apiKey: process.env.KV_API_KEY || 'none', maxRetries: 0 });
const params = { model: 'kvasir', max_tokens: Number(maxTokens), temperature: Number(temp),
                 top_p: Number(topP), seed: Number(seed) };
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const stream = await client.chat.completions.create({
    ...params, messages: [{ role: 'user', content: prompt }], stream: true,
    stream_options: { include_usage: true } });
out.chat = { text: '', chunks: 0, finish: null, usage: null, role: null };
for await (const ch of stream) {
    out.chat.chunks++;
    if (ch.object !== 'chat.completion.chunk') throw new Error(`chunk object ${ch.object}`);
    if (ch.usage) out.chat.usage = ch.usage;
    if (!ch.choices.length) continue;
    const c = ch.choices[0];
    if (c.delta.role) out.chat.role = c.delta.role;
    out.chat.text += c.delta.content ?? '';
    if (c.finish_reason) out.chat.finish = c.finish_reason;
}

const cmpl = await client.completions.create({ ...params, prompt, logprobs: 2 });
out.completion = { text: cmpl.choices[0].text, finish: cmpl.choices[0].finish_reason,
                   usage: cmpl.usage, object: cmpl.object,
                   n_logprobs: cmpl.choices[0].logprobs?.token_logprobs?.length ?? -1,
                   n_top: cmpl.choices[0].logprobs?.top_logprobs?.[0]
                       ? Object.keys(cmpl.choices[0].logprobs.top_logprobs[0]).length : -1 };

// an error the client turns into its own exception class, with the status
try {
    await client.completions.create({ ...params, prompt, n: 2 });
    out.n2 = 'accepted';
} catch (e) {
    out.n2 = `${e.status} ${e.constructor.name} ${e.error?.param ?? ''}`;
}
console.log(JSON.stringify(out));
