'use strict';
// Forks a nodus program (argv[2]) with serialization: 'advanced' and prints its exit code and
// stderr as JSON: nodus speaks only 'json' and must say so clearly.
const cp = require('child_process');
const child = cp.fork(__filename, [], {
  execPath: process.argv[2],
  serialization: 'advanced',
  stdio: ['inherit', 'inherit', 'pipe', 'ipc'],
});
let stderr = '';
child.stderr.on('data', (d) => { stderr += d; });
child.on('error', () => {});
child.on('close', (code, signal) => {
  console.log(JSON.stringify({ code, signal, stderr }));
});
