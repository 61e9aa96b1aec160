// The API benchmark of tests/bench.sh (section api): C clients at once, each sending R
// streamed completions one after another; prints requests per second and time to first
// token (the first event with text) for each C. Plain fetch: no package needed.
// usage: node tests/bench/api_bench.mjs BASE_URL MAX_TOKENS REQUESTS_PER_CLIENT C...
const [base, maxTokens, perClient, ...cs] = process.argv.slice(2);

async function one(seed) {
    const t0 = performance.now();
    const r = await fetch(`${base}/v1/completions`, {
        method: 'POST', headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: Number(maxTokens),
                               ignore_eos: true, seed, stream: true }) });
    if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
    let ttft = -1, buf = '';
    const dec = new TextDecoder();
    for await (const chunk of r.body) {
        buf += dec.decode(chunk, { stream: true });
        if (ttft < 0 && /"text":"[^"]/.test(buf)) ttft = performance.now() - t0;
    }
    if (!buf.includes('data: [DONE]')) throw new Error('no [DONE]');
    return ttft;
}

for (const c of cs.map(Number)) {
    const ttfts = [];
    const t0 = performance.now();
    await Promise.all(Array.from({ length: c }, async (_, k) => {
        for (let i = 0; i < Number(perClient); i++) ttfts.push(await one(k * 1000 + i));
    }));
    const s = (performance.now() - t0) / 1000;
    ttfts.sort((a, b) => a - b);
    const q = (p) => ttfts[Math.min(ttfts.length - 1, Math.floor(p * ttfts.length))];
    const mean = ttfts.reduce((a, b) => a + b, 0) / ttfts.length;
    console.log(`${String(c).padStart(3)} clients: ${(ttfts.length / s).toFixed(2)} requests/s ` +
        `(${ttfts.length} x ${maxTokens} tokens in ${s.toFixed(2)} s, ${(ttfts.length * maxTokens / s).toFixed(1)} tok/s), ` +
        `time to first token mean ${mean.toFixed(1)} ms, p50 ${q(0.5).toFixed(1)} ms, p95 ${q(0.95).toFixed(1)} ms`);
}
