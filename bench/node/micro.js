'use strict';
// Event-loop microbenchmarks for Node.js (a peer program of nodus's bench/run.sh, copied from the
// project's baseline anchors; added here: `microtask`, and `rss_before_kb` in `timers`).
// One benchmark per process; prints one JSON line.
// Usage: node micro.js <bench> [n]
//   immediate  1M chained setImmediate
//   nexttick   1M chained process.nextTick
//   microtask  1M chained queueMicrotask
//   await      1M chained `await p` on an already-resolved promise (one async fn)
//   timers     1M setTimeout(fn, rand 0..999 ms): insert time + time until all fired
//   fsstat     100k fs.stat, 64 in flight (libuv threadpool, UV_THREADPOOL_SIZE default 4)
//   pbkdf2     100k crypto.pbkdf2(iterations=1), 64 in flight (threadpool)
const fs = require('fs');
const crypto = require('crypto');

const bench = process.argv[2] || 'immediate';
const nArg = process.argv[3] ? parseInt(process.argv[3], 10) : 0;
const STAT_PATH = '/etc/hostname';

const now = () => process.hrtime.bigint();
// Peak RSS (VmHWM) of this process image; resourceUsage().maxRSS keeps the
// pre-exec high-water mark of the forking parent on Linux.
const hwmKb = () => +(/VmHWM:\s+(\d+)/.exec(fs.readFileSync('/proc/self/status', 'utf8'))[1]);
const rssKb = () => +(/VmRSS:\s+(\d+)/.exec(fs.readFileSync('/proc/self/status', 'utf8'))[1]);
const cpuNs = () => { const u = process.cpuUsage(); return (u.user + u.system) * 1000; };

function emit(n, totalNs, extra = {}) {
  const ns = Number(totalNs);
  const out = {
    impl: 'node-' + process.version, bench, n,
    total_ms: +(ns / 1e6).toFixed(3),
    ns_per_op: +(ns / n).toFixed(2),
    ops_per_s: Math.round(n / (ns / 1e9)),
    max_rss_kb: hwmKb(),
    ...extra,
  };
  console.log(JSON.stringify(out));
}

// xorshift64* identical to rt_micro.rs so both use the same deadline set
function deadlinesMs(n) {
  const out = new Int32Array(n);
  let x = 0x9E3779B97F4A7C15n;
  const M = (1n << 64n) - 1n;
  for (let i = 0; i < n; i++) {
    x ^= x >> 12n; x ^= (x << 25n) & M; x ^= x >> 27n;
    out[i] = Number((((x * 0x2545F4914F6CDD1Dn) & M) >> 33n) % 1000n);
  }
  return out;
}

function immediate(n) {
  let i = 0; const t0 = now();
  function step() { if (++i < n) setImmediate(step); else emit(n, now() - t0); }
  setImmediate(step);
}

function microtask(n) {
  let i = 0; const t0 = now();
  function step() { if (++i < n) queueMicrotask(step); else emit(n, now() - t0); }
  queueMicrotask(step);
}

function nexttick(n) {
  let i = 0; const t0 = now();
  function step() { if (++i < n) process.nextTick(step); else emit(n, now() - t0); }
  process.nextTick(step);
}

async function awaitBench(n) {
  const p = Promise.resolve(1);
  let s = 0; const t0 = now();
  for (let i = 0; i < n; i++) s += await p;
  const t = now() - t0;
  if (s !== n) throw new Error('bad sum');
  emit(n, t);
}

function timers(n) {
  const dl = deadlinesMs(n);
  let maxDl = 0; for (let i = 0; i < n; i++) if (dl[i] > maxDl) maxDl = dl[i];
  let left = n;
  const rss0 = rssKb();
  const cpu0 = cpuNs();
  const t0 = now();
  function fire() {
    if (--left === 0) {
      const total = now() - t0;
      const cpu = cpuNs() - cpu0;
      const totalMs = Number(total) / 1e6;
      emit(n, total, {
        insert_ms: +(Number(insert) / 1e6).toFixed(3),
        insert_ns_per_op: +(Number(insert) / n).toFixed(2),
        fire_all_ms: +totalMs.toFixed(3), max_deadline_ms: maxDl,
        lag_ms: +(totalMs - maxDl).toFixed(3),
        cpu_ns_per_timer: +(cpu / n).toFixed(2),
        rss_before_kb: rss0,
      });
    }
  }
  for (let i = 0; i < n; i++) setTimeout(fire, dl[i]);
  const insert = now() - t0;
}

function pool(n, conc, op) {
  let started = 0, finished = 0; const t0 = now();
  function one() {
    started++;
    op((err) => {
      if (err) throw err;
      finished++;
      if (started < n) one();
      else if (finished === n) emit(n, now() - t0, { concurrency: conc, threadpool: +(process.env.UV_THREADPOOL_SIZE || 4) });
    });
  }
  for (let i = 0; i < Math.min(conc, n); i++) one();
}

const salt = Buffer.from('salt');
switch (bench) {
  case 'immediate': immediate(nArg || 1e6); break;
  case 'nexttick': nexttick(nArg || 1e6); break;
  case 'microtask': microtask(nArg || 1e6); break;
  case 'await': awaitBench(nArg || 1e6); break;
  case 'timers': timers(nArg || 1e6); break;
  case 'fsstat': pool(nArg || 1e5, 64, (cb) => fs.stat(STAT_PATH, cb)); break;
  case 'pbkdf2': pool(nArg || 1e5, 64, (cb) => crypto.pbkdf2('password', salt, 1, 32, 'sha256', cb)); break;
  default: console.error('unknown bench ' + bench); process.exit(2);
}
