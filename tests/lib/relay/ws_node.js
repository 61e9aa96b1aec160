// Interop: Node's `ws` package as a client of the relay (kvd --role relay).
// usage: node ws_node.js URL_BASE     e.g. wss://127.0.0.1:4430 (certificate not checked)
// Checks the handshake, pairing, binary messages both ways in order, ping/pong, and the
// relay's close codes (bad role 4004, duplicate role 4003, bad bridge id 4005, partner gone
// 4002). Prints one line per case; exits 1 on any failure.
'use strict';
const crypto = require('crypto');
const path = require('path');
let WebSocket;
try {
    WebSocket = require(path.join(__dirname, '..', '..', 'node_modules', 'ws'));
} catch (e) {
    console.log('FAIL the npm package ws is missing: run scripts/setup.sh (npm install --prefix tests ws@8)');
    process.exit(1);
}
const BASE = process.argv[2];
let failures = 0;
function check(cond, what) {
    if (!cond) { failures++; console.log('FAIL ' + what); }
}
const bid = () => crypto.randomBytes(16).toString('hex');
function open(id) {
    return new Promise((resolve, reject) => {
        const ws = new WebSocket(`${BASE}/v1/bridge/${id}`, { rejectUnauthorized: false, perMessageDeflate: false });
        ws.binaryType = 'nodebuffer';
        ws.inbox = [];
        ws.waiters = [];
        ws.on('message', (d, isBinary) => {
            const m = { d, isBinary };
            if (ws.waiters.length) ws.waiters.shift()(m); else ws.inbox.push(m);
        });
        ws.closed = new Promise(res => ws.on('close', (code, reason) => res({ code, reason: reason.toString() })));
        ws.on('open', () => resolve(ws));
        ws.on('error', reject);
    });
}
function recv(ws, ms = 10000) {
    if (ws.inbox.length) return Promise.resolve(ws.inbox.shift());
    return new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error('recv timeout')), ms);
        ws.waiters.push(m => { clearTimeout(t); resolve(m); });
    });
}
function within(p, ms, what) {
    return Promise.race([p, new Promise((_, rej) => setTimeout(() => rej(new Error(what + ': timeout')), ms))]);
}

async function pairAndForward() {
    const id = bid();
    const up = await open(id), down = await open(id);
    up.send(Buffer.from([1]));
    down.send(Buffer.from([2]));
    const a = [], b = [];
    for (let i = 0; i < 150; i++) {
        a.push(crypto.randomBytes(1 + (i * 7919) % 70000));
        b.push(crypto.randomBytes(1 + (i * 104729) % 50000));
    }
    a.forEach(m => up.send(m));
    b.forEach(m => down.send(m));
    for (let i = 0; i < a.length; i++) {
        const m = await recv(down);
        check(m.isBinary && Buffer.compare(m.d, a[i]) === 0, `up->down message ${i} changed or reordered`);
    }
    for (let i = 0; i < b.length; i++) {
        const m = await recv(up);
        check(m.isBinary && Buffer.compare(m.d, b[i]) === 0, `down->up message ${i} changed or reordered`);
    }
    const pong = new Promise(res => up.once('pong', d => res(d.toString())));
    up.ping('node-ping');
    check(await within(pong, 5000, 'pong') === 'node-ping', 'pong echoes the ping payload');
    up.close(1000, 'done');
    const c = await within(down.closed, 10000, 'partner gone');
    check(c.code === 4002 && c.reason.startsWith('partner gone'), `partner gone: got ${c.code} ${c.reason}`);
    console.log('ok   pair_and_forward');
}

async function refusals() {
    let ws = await open(bid());
    ws.send(Buffer.from([0x33]));
    let c = await within(ws.closed, 10000, 'bad role');
    check(c.code === 4004, `bad role byte: got ${c.code} ${c.reason}`);
    const id = bid();
    const a = await open(id);
    a.send(Buffer.from([1]));
    await new Promise(r => setTimeout(r, 100));
    ws = await open(id);
    ws.send(Buffer.from([1]));
    c = await within(ws.closed, 10000, 'dup role');
    check(c.code === 4003, `duplicate role: got ${c.code} ${c.reason}`);
    a.close();
    ws = await open('not-a-bridge-id');
    c = await within(ws.closed, 10000, 'bad id');
    check(c.code === 4005, `bad bridge id: got ${c.code} ${c.reason}`);
    console.log('ok   refusals');
}

(async () => {
    for (const f of [pairAndForward, refusals]) {
        try { await within(f(), 60000, f.name); } catch (e) { check(false, `${f.name}: ${e.message}`); }
    }
    console.log(`node ws ${require(path.join(__dirname, '..', '..', 'node_modules', 'ws', 'package.json')).version}: ${failures} failures`);
    process.exit(failures ? 1 : 0);
})();
