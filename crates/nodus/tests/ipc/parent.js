'use strict';
// A Node parent that forks a nodus program (the ipc_echo example, path in argv[2]) and checks:
// messages both ways (key order kept), a net.Server handle the nodus child accepts on, and a
// net.Socket handle after which server.close() still calls back within 2 s (NODE_SOCKET_*).
// Prints "ok <details>" and exits 0, or prints the failure and exits 1.
const cp = require('child_process');
const net = require('net');
const assert = require('assert');

const child = cp.fork(__filename, [], { execPath: process.argv[2] });
const inbox = [];
let waiter = null;
child.on('message', (m) => {
  inbox.push(m);
  if (waiter) { const w = waiter; waiter = null; w(); }
});
function next() {
  return new Promise((resolve) => {
    if (inbox.length) return resolve(inbox.shift());
    waiter = () => resolve(inbox.shift());
  });
}
function fetchLine(port) {
  return new Promise((resolve, reject) => {
    let data = '';
    net.connect(port, '127.0.0.1')
      .on('data', (d) => { data += d; })
      .on('end', () => resolve(data))
      .on('error', reject);
  });
}
const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
const fail = (e) => { console.log('FAIL', e && e.stack || e); process.exit(1); };
setTimeout(() => fail('timed out'), 15000).unref();

(async () => {
  // 1. Messages both ways, key order preserved, non-ASCII as is.
  child.send({ b: 1, a: [1, 'é€😀'], z: null });
  const m1 = await next();
  assert.strictEqual(JSON.stringify(m1), '{"echo":{"b":1,"a":[1,"é€😀"],"z":null}}');
  child.send('a plain string');
  assert.deepStrictEqual(await next(), { echo: 'a plain string' });

  // 2. A listening net.Server: the nodus child accepts on it.
  const server = net.createServer();
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const port = server.address().port;
  // Close our copy once it is on its way, so only the child accepts.
  child.send({ what: 'server' }, server, () => server.close());
  assert.deepStrictEqual(await next(), { echo: { what: 'server' } });
  for (let i = 0; i < 3; i++) {
    const line = await fetchLine(port);
    assert.strictEqual(line, `hello from nodus ${child.pid}\n`);
  }

  // 3. A net.Socket from a net.Server: after sending it, server.close() must call back.
  const srv2 = net.createServer((sock) => child.send({ what: 'socket' }, sock));
  await new Promise((r) => srv2.listen(0, '127.0.0.1', r));
  const client = net.connect(srv2.address().port, '127.0.0.1');
  client.on('error', () => {});
  assert.deepStrictEqual(await next(), { echo: { what: 'socket' } });
  const t0 = Date.now();
  await new Promise((r) => srv2.close(r));
  const closeMs = Date.now() - t0;
  assert.ok(closeMs < 2000, `server.close() took ${closeMs} ms`);
  client.destroy();

  // 4. "exit": no echo, the child disconnects and exits 0.
  child.send('exit');
  const { code, signal } = await exited;
  assert.strictEqual(code, 0, `exit code ${code} signal ${signal}`);
  assert.strictEqual(inbox.length, 0, `unexpected messages ${JSON.stringify(inbox)}`);
  console.log(`ok close_ms=${closeMs}`);
  process.exit(0);
})().catch(fail);
