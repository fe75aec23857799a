"""N keep-alive GETs over K connections, one request in flight per connection, for
bench/http/instructions.sh: python3 keepalive_client.py PORT N K."""
import socket, selectors, sys, time
port, total, conns = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for _ in range(300):  # wait up to 30 s for the server (valgrind starts slowly)
    try:
        socket.create_connection(("127.0.0.1", port)).close(); break
    except OSError: time.sleep(0.1)
sel = selectors.DefaultSelector()
REQ = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
sent = done = 0
bufs = {}
for i in range(conns):
    s = socket.create_connection(("127.0.0.1", port)); s.setblocking(False)
    bufs[s] = b""; sel.register(s, selectors.EVENT_READ)
    if sent < total: s.send(REQ); sent += 1
while done < total:
    for key, _ in sel.select(10):
        s = key.fileobj; d = s.recv(65536)
        if not d: raise SystemExit("closed")
        b = bufs[s] + d
        while True:
            h = b.find(b"\r\n\r\n")
            if h < 0: break
            head = b[:h].decode()
            cl = int([l.split(":")[1] for l in head.split("\r\n") if l.lower().startswith("content-length")][0])
            if len(b) < h + 4 + cl: break
            b = b[h+4+cl:]; done += 1
            if sent < total: s.send(REQ); sent += 1
        bufs[s] = b
print("done", done)
