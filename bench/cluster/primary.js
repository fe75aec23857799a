'use strict';
// Node cluster primary of the cluster benchmarks (bench/cluster/run.py), after
// shared/reliability-anchors/primary.js (the anchors), trimmed to what run.py measures and
// writing its events in the nodus cluster's format.
//   PORT=18091 WORKERS=2 EVENTS=/path/events.jsonl NODE_CLUSTER_SCHED_POLICY=rr|none node primary.js
// Workers run app.js. Behaviour:
//   - a worker that exits without having been disconnected is re-forked at once into its slot
//   - SIGHUP: rolling reload, the usual hand-written recipe: for each old worker in turn, fork a new
//     one into its slot, wait for its 'listening', then old.disconnect() with a 5 s SIGKILL timer, and
//     wait for the old one's 'exit' before the next slot
//   - SIGTERM/SIGINT: SIGTERM the workers (SIGKILL after 2 s), then exit
// Events: JSON lines {"t_ns", "event", "worker" (slot), "pid"}; t_ns = process.hrtime.bigint()
// (CLOCK_MONOTONIC, the clock of Python's time.monotonic_ns()).
const cluster = require('cluster');
const fs = require('fs');
const path = require('path');
const { once } = require('events');

const WORKERS = +(process.env.WORKERS || 2);
const KILL_TIMEOUT_MS = 5000;
const EVENTS = process.env.EVENTS || '';

function log(event, fields = {}) {
  if (!EVENTS) return;
  const rest = JSON.stringify({ event, ...fields }).slice(1);
  fs.appendFileSync(EVENTS, `{"t_ns":${process.hrtime.bigint()},${rest}\n`);
}

cluster.setupPrimary({ exec: path.join(__dirname, 'app.js') });
let stopping = false;
let reloading = false;

function fork(slot) {
  const w = cluster.fork();
  w.slot = slot;
  const pid = w.process.pid;
  log('fork', { worker: slot, pid });
  w.once('online', () => log('online', { worker: slot, pid }));
  w.once('listening', () => log('listening', { worker: slot, pid }));
  return w;
}

cluster.on('exit', (w, code, signal) => {
  const planned = w.exitedAfterDisconnect === true;
  log('exit', { worker: w.slot, pid: w.process.pid, code, signal, planned });
  if (!planned && !stopping) fork(w.slot);
});

async function rollingReload() {
  if (reloading) return;
  reloading = true;
  log('reload_start');
  for (const old of Object.values(cluster.workers)) {
    const nw = fork(old.slot);
    await once(nw, 'listening');
    const timer = setTimeout(() => old.process.kill('SIGKILL'), KILL_TIMEOUT_MS);
    old.disconnect();
    await once(old, 'exit');
    clearTimeout(timer);
  }
  log('reload_done');
  reloading = false;
}

for (let slot = 0; slot < WORKERS; slot++) fork(slot);

process.on('SIGHUP', () => {
  rollingReload().catch((e) => log('reload_failed', { error: String(e) }));
});
const stop = () => {
  if (stopping) return;
  stopping = true;
  for (const w of Object.values(cluster.workers)) w.process.kill('SIGTERM');
  const hard = setTimeout(() => {
    for (const w of Object.values(cluster.workers)) w.process.kill('SIGKILL');
    process.exit(0);
  }, 2000);
  const check = () => {
    if (Object.keys(cluster.workers).length === 0) {
      clearTimeout(hard);
      process.exit(0);
    }
  };
  cluster.on('exit', check);
  check();
};
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
