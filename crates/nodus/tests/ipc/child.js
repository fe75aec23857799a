'use strict';
// Forked by a nodus parent (crates/nodus/tests/ipc_node.rs): echoes every message as
// {echo: m}; serves a net.Server it is given ("hello from node <pid>\n" to each connection);
// answers on a net.Socket it is given ("answered by node\n"); exits on "exit".
const net = require('net');
const servers = [];
process.on('message', (m, handle) => {
  if (m === 'exit') {
    for (const s of servers) s.close();
    process.disconnect();
    return;
  }
  if (handle instanceof net.Server) {
    servers.push(handle);
    handle.on('connection', (s) => s.end(`hello from node ${process.pid}\n`));
    process.send({ echo: m, serving: true });
  } else if (handle instanceof net.Socket) {
    handle.end('answered by node\n');
    process.send({ echo: m, answered: true });
  } else {
    process.send({ echo: m });
  }
});
process.send({ ready: process.pid, channelFd: process.env.NODE_CHANNEL_FD === undefined });
