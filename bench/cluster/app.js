'use strict';
// Hello-world HTTP server of the cluster benchmarks (bench/cluster/run.py), copied from
// shared/reliability-anchors/app.js, with which the anchors were measured. Used three ways:
//   - alone (one process):               PORT=18090 node app.js
//   - as the worker of primary.js (Node cluster) and of `nodus run -w 2 --node -- node app.js`
//   - as the app of PM2 cluster mode:    PORT=18093 pm2 start app.js -i 2
// 200, text/plain, 13-byte body, the handler of bench/node/http-server.js. No SIGINT/SIGTERM handler on
// purpose: this is the "default app" a supervisor has to cope with.
const http = require('http');
const port = +(process.env.PORT || process.argv[2] || 18090);
const BODY = 'Hello, World!';
const server = http.createServer((req, res) => {
  res.writeHead(200, { 'Content-Type': 'text/plain', 'Content-Length': BODY.length });
  res.end(BODY);
});
server.keepAliveTimeout = 65000;
server.listen(port, '127.0.0.1', () => {
  if (!require('cluster').isWorker) console.error(`app listening on 127.0.0.1:${port} pid ${process.pid}`);
});
