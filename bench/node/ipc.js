'use strict';
// IPC benchmarks for Node.js: the Node↔Node peer of crates/nodus/benches/ipc.rs (which runs this
// script itself, side by side). The parent forks this script as its child; one benchmark per
// process; prints one JSON line.
// Usage: node ipc.js <bench> [n]
//   roundtrip   n sequential round trips of a small message ({"i":k} -> {"echo":{"i":k}})
//   fd_handoff  n sequential handoffs of a listening socket (send(msg, server, {keepOpen})),
//               each received as a net.Server, closed, and answered
const cp = require('child_process');
const net = require('net');

if (process.argv[2] === 'child') {
  process.on('message', (m, handle) => {
    if (handle) {
      handle.close();
      process.send('ok');
    } else if (m === 'exit') {
      process.disconnect();
    } else {
      process.send({ echo: m });
    }
  });
  return;
}

const bench = process.argv[2] || 'roundtrip';
const n = parseInt(process.argv[3] || (bench === 'roundtrip' ? '100000' : '20000'), 10);
const child = cp.fork(__filename, ['child']);
let i = 0;
let t0;
function emit() {
  const ns = Number(process.hrtime.bigint() - t0);
  console.log(JSON.stringify({
    impl: 'node-' + process.version, bench, n,
    total_ms: +(ns / 1e6).toFixed(3),
    ns_per_op: +(ns / n).toFixed(2),
    ops_per_s: Math.round(n / (ns / 1e9)),
  }));
  child.send('exit');
}

if (bench === 'roundtrip') {
  child.on('message', () => {
    if (++i === n) return emit();
    child.send({ i });
  });
  t0 = process.hrtime.bigint();
  child.send({ i });
} else if (bench === 'fd_handoff') {
  const server = net.createServer();
  server.listen(0, '127.0.0.1', () => {
    child.on('message', () => {
      if (++i === n) { emit(); server.close(); return; }
      child.send({ i }, server, { keepOpen: true });
    });
    t0 = process.hrtime.bigint();
    child.send({ i }, server, { keepOpen: true });
  });
} else {
  console.error(`unknown bench ${bench}`);
  process.exit(2);
}
