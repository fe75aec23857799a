'use strict';
// Worker-pool benchmarks for Node.js (libuv threadpool): the Node peer of nodus's
// crates/nodus/benches/pool.rs and bench/rust/src/bin/pool_micro.rs (tokio spawn_blocking).
// One benchmark per process; prints one JSON line.
// Usage: node pool.js <bench> [n]
//   pool_trivial  100k crypto.randomFill(1 byte), 64 in flight: the cheapest public
//                 threadpool request Node has (a pool round trip around ~nothing)
//   stat          100k fs.stat('/etc/hostname'), 64 in flight
//   pbkdf2        100k crypto.pbkdf2('password', 'salt', 1, 32, 'sha256'), 64 in flight
//   read_1g       fs.createReadStream of a 1 GiB sparse file (64 KiB highWaterMark), read once
//                 untimed first to fill the page cache; n = MiB
//   gzip          zlib.createGzip() (level 6) fed n MiB (default 64) of generated text in
//                 64 KiB writes; MB/s of input
const fs = require('fs');
const os = require('os');
const path = require('path');
const crypto = require('crypto');
const zlib = require('zlib');

const bench = process.argv[2] || 'pool_trivial';
const nArg = process.argv[3] ? parseInt(process.argv[3], 10) : 0;
const STAT_PATH = '/etc/hostname';
const CHUNK = 64 * 1024;

const now = () => process.hrtime.bigint();
const hwmKb = () => +(/VmHWM:\s+(\d+)/.exec(fs.readFileSync('/proc/self/status', 'utf8'))[1]);

function emit(n, totalNs, extra = {}) {
  const ns = Number(totalNs);
  console.log(JSON.stringify({
    impl: 'node-' + process.version, bench, n,
    total_ms: +(ns / 1e6).toFixed(3),
    ns_per_op: +(ns / n).toFixed(2),
    ops_per_s: Math.round(n / (ns / 1e9)),
    max_rss_kb: hwmKb(),
    threadpool: +(process.env.UV_THREADPOOL_SIZE || 4),
    ...extra,
  }));
}

function inFlight(n, conc, op) {
  let started = 0, finished = 0; const t0 = now();
  function one() {
    started++;
    op((err) => {
      if (err) throw err;
      finished++;
      if (started < n) one();
      else if (finished === n) emit(n, now() - t0, { concurrency: conc });
    });
  }
  for (let i = 0; i < Math.min(conc, n); i++) one();
}

function read1g(mib) {
  const file = path.join(os.tmpdir(), 'node-bench-read-' + process.pid);
  const bytes = mib * 1024 * 1024;
  fs.closeSync(fs.openSync(file, 'w'));
  fs.truncateSync(file, bytes);
  // Untimed warm-up read: the timed one measures the pool and the page cache (as the peers).
  const fd = fs.openSync(file, 'r'); const warm = Buffer.alloc(1 << 20);
  while (fs.readSync(fd, warm, 0, warm.length, null) > 0);
  fs.closeSync(fd);
  let total = 0; const t0 = now();
  fs.createReadStream(file, { highWaterMark: CHUNK })
    .on('data', (c) => { total += c.length; })
    .on('end', () => {
      const t = now() - t0;
      fs.unlinkSync(file);
      if (total !== bytes) throw new Error('short read');
      emit(bytes / CHUNK, t, { bytes, mb_per_s: +(bytes / 1e6 / (Number(t) / 1e9)).toFixed(1) });
    });
}

// Repetitive text (like a log file); the same xorshift32 word sequence as benches/pool.rs.
function text(len) {
  const words = ['event ', 'loop ', 'pool ', 'worker ', 'nodus ', 'libuv ', '\n'].map((w) => Buffer.from(w));
  const out = Buffer.alloc(len + 8);
  let x = 0x9E3779B9 >>> 0; let at = 0;
  while (at < len) {
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    at += words[x % words.length].copy(out, at);
  }
  return out.subarray(0, len);
}

function gzip(mib) {
  const input = text(mib * 1024 * 1024);
  let outBytes = 0; const t0 = now();
  const gz = zlib.createGzip({ level: 6 });
  gz.on('data', (c) => { outBytes += c.length; });
  gz.on('end', () => {
    const t = now() - t0;
    emit(input.length / CHUNK, t, {
      bytes: input.length, out_bytes: outBytes,
      mb_per_s: +(input.length / 1e6 / (Number(t) / 1e9)).toFixed(1),
    });
  });
  for (let off = 0; off < input.length; off += CHUNK) gz.write(input.subarray(off, off + CHUNK));
  gz.end();
}

const salt = Buffer.from('salt');
switch (bench) {
  case 'pool_trivial': inFlight(nArg || 1e5, 64, (cb) => crypto.randomFill(Buffer.alloc(1), cb)); break;
  case 'stat': inFlight(nArg || 1e5, 64, (cb) => fs.stat(STAT_PATH, cb)); break;
  case 'pbkdf2': inFlight(nArg || 1e5, 64, (cb) => crypto.pbkdf2('password', salt, 1, 32, 'sha256', cb)); break;
  case 'read_1g': read1g(nArg || 1024); break;
  case 'gzip': gzip(nArg || 64); break;
  default: console.error('unknown bench ' + bench); process.exit(2);
}
