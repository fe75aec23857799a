//! `nodus_http::serve` against real clients on 127.0.0.1: limits, timeouts, drain, metrics.
//!
//! Each test runs a server on its own loop thread and talks to it with blocking std sockets.

use std::cell::Cell;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use http::StatusCode;
use nodus::Runtime;
use nodus::net::TcpListener;
use nodus_http::{Config, collect_body, full, serve, text};
use nodus_testkit::http::{Reply, read_reply, write_request};

/// A server on its own thread; `drain` (or drop) stops it.
struct TestServer {
    addr: SocketAddr,
    drain: Arc<AtomicBool>,
    /// The server's open connections (`Server::connections`), as of 5 ms ago at most, until
    /// the drain begins.
    open: Arc<AtomicUsize>,
    /// The requests the drain cut, and the final snapshot.
    thread: Option<JoinHandle<(usize, nodus::metrics::Snapshot)>>,
}

impl TestServer {
    fn start(config: Config, drain_timeout: Duration) -> TestServer {
        let (tx, rx) = mpsc::channel();
        let drain = Arc::new(AtomicBool::new(false));
        let d = drain.clone();
        let open = Arc::new(AtomicUsize::new(0));
        let o = open.clone();
        let thread = std::thread::spawn(move || {
            let rt = Runtime::new();
            rt.block_on(async move {
                let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
                let server = serve(listener, config, |req| {
                    // A handler that panics before it makes its future.
                    assert_ne!(req.uri().path(), "/panic-now", "a handler bug");
                    async move {
                        match req.uri().path() {
                            "/slow" => {
                                nodus::sleep(300).await;
                                text(StatusCode::OK, "slow done")
                            }
                            // Answered on a later loop turn, as from a file read on the pool.
                            "/later" => {
                                nodus::sleep(1).await;
                                text(StatusCode::OK, "hello")
                            }
                            "/panic" => panic!("a handler bug"),
                            // What a request smuggled in a body would get.
                            "/x" => text(StatusCode::OK, "smuggled"),
                            "/connections-max" => text(
                                StatusCode::OK,
                                nodus_http::snapshot().http.connections_max.to_string(),
                            ),
                            "/peer" => {
                                let peer = req.extensions().get::<nodus_http::ConnInfo>();
                                let peer = peer.and_then(|c| c.peer);
                                text(StatusCode::OK, format!("{peer:?}"))
                            }
                            // Server-sent events: a line, 400 ms of silence, a second line.
                            "/events" => http::Response::new(nodus_http::body::boxed(Events {
                                sent: 0,
                                gap: Box::pin(nodus::sleep(400)),
                            })),
                            // 6 bytes whose data comes 400 ms after the head, as a file chunk
                            // read on a swamped I/O pool: of that exact length, or of none.
                            "/late-body" => {
                                http::Response::new(nodus_http::body::boxed(LateBody::new(true)))
                            }
                            "/late-stream" => {
                                http::Response::new(nodus_http::body::boxed(LateBody::new(false)))
                            }
                            // 8 MiB: more than the socket buffers hold when the client reads none.
                            "/big" => http::Response::new(full(vec![b'x'; 8 << 20])),
                            // 128 KiB, not reading the request's body: more than a client with a
                            // 4 KiB receive buffer takes before it reads, less than the server's
                            // send buffer holds.
                            "/128k" => http::Response::new(full(vec![b'x'; 128 << 10])),
                            // The same, and the handler closes the connection after it.
                            "/128k-close" => {
                                let mut resp = http::Response::new(full(vec![b'x'; 128 << 10]));
                                resp.headers_mut().insert(
                                    http::header::CONNECTION,
                                    http::HeaderValue::from_static("close"),
                                );
                                resp
                            }
                            // A body of no known length: chunked to HTTP/1.1, to the close to 1.0.
                            "/stream" => {
                                let chunks = ["str", "eam"].map(|c| {
                                    Ok(hyper::body::Frame::data(bytes::Bytes::from_static(
                                        c.as_bytes(),
                                    )))
                                });
                                let body = http_body_util::StreamBody::new(
                                    futures_util::stream::iter(chunks),
                                );
                                http::Response::new(nodus_http::body::boxed(body))
                            }
                            // 200,000 one-byte chunks, all ready at once.
                            "/tiny-chunks" => {
                                let chunks = (0..200_000).map(|_| {
                                    Ok(hyper::body::Frame::data(bytes::Bytes::from_static(b"x")))
                                });
                                let body = http_body_util::StreamBody::new(
                                    futures_util::stream::iter(chunks),
                                );
                                http::Response::new(nodus_http::body::boxed(body))
                            }
                            // A chunked body that ends with a trailer it announces.
                            "/trailers" => {
                                let mut fields = http::HeaderMap::new();
                                fields.insert("x-checksum", http::HeaderValue::from_static("abc"));
                                let frames = [
                                    Ok(hyper::body::Frame::data(bytes::Bytes::from_static(
                                        b"hello",
                                    ))),
                                    Ok(hyper::body::Frame::trailers(fields)),
                                ];
                                let body = http_body_util::StreamBody::new(
                                    futures_util::stream::iter(frames),
                                );
                                let mut resp = http::Response::new(nodus_http::body::boxed(body));
                                resp.headers_mut().insert(
                                    http::header::TRAILER,
                                    http::HeaderValue::from_static("x-checksum"),
                                );
                                resp
                            }
                            // Answered at once; the body is read later by a task of its own.
                            "/read-later" => {
                                let body = req.into_body();
                                nodus::task::spawn(async move {
                                    nodus::sleep(20).await;
                                    let _ = collect_body(body).await;
                                })
                                .detach();
                                text(StatusCode::ACCEPTED, "later")
                            }
                            "/echo" => match collect_body(req.into_body()).await {
                                Ok(b) => http::Response::new(full(b)),
                                Err(nodus_http::BodyError::TooLarge) => {
                                    text(StatusCode::PAYLOAD_TOO_LARGE, "too large")
                                }
                                Err(nodus_http::BodyError::TimedOut) => {
                                    text(StatusCode::REQUEST_TIMEOUT, "timed out")
                                }
                                Err(e) => text(StatusCode::BAD_REQUEST, e.to_string()),
                            },
                            _ => text(StatusCode::OK, "hello"),
                        }
                    }
                });
                tx.send(server.local_addr().unwrap()).unwrap();
                while !d.load(Ordering::Acquire) {
                    o.store(server.connections(), Ordering::Release);
                    nodus::sleep(5).await;
                }
                let cut = server.drain(drain_timeout).await;
                (cut, nodus_http::snapshot())
            })
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("server started");
        TestServer {
            addr,
            drain,
            open,
            thread: Some(thread),
        }
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// Waits up to 5 s for the server to have `n` connections open; how long it took.
    fn wait_open(&self, n: usize) -> Duration {
        let start = Instant::now();
        while self.open.load(Ordering::Acquire) != n {
            assert!(start.elapsed() < Duration::from_secs(5), "never {n} open");
            std::thread::sleep(Duration::from_millis(5));
        }
        start.elapsed()
    }

    /// Starts the drain and waits for the server to finish it; returns the requests its deadline
    /// cut and the final snapshot.
    fn finish(mut self) -> (usize, nodus::metrics::Snapshot) {
        self.drain.store(true, Ordering::Release);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.drain.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn get(s: &mut TcpStream, path: &str) {
    write_request(s, "GET", path, &[]).unwrap();
}

#[test]
fn serves_keep_alive_requests_and_counts_them() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    for _ in 0..3 {
        get(&mut s, "/");
        let Reply { status, body, .. } = read_reply(&mut r, false).unwrap();
        assert_eq!((status, body.as_slice()), (200, &b"hello"[..]));
    }
    drop((s, r));
    let (_, snap) = server.finish();
    assert_eq!(snap.http.responses_by_class[1], 3);
    assert_eq!(snap.http.connections_total, 1);
    assert!(snap.http.bytes_received_total > 0 && snap.http.bytes_sent_total > 0);
    assert_eq!(snap.http.request_duration.count, 3);
    assert!(snap.task_classes.iter().any(|c| c.name == "http"));
}

#[test]
fn the_peer_is_in_the_extensions_unless_conn_info_is_off() {
    for conn_info in [true, false] {
        let server = TestServer::start(
            Config {
                conn_info,
                ..Config::default()
            },
            Duration::from_secs(1),
        );
        let mut s = server.connect();
        let local = s.local_addr().unwrap();
        get(&mut s, "/peer");
        let reply = read_reply(&mut BufReader::new(s), false).unwrap();
        let expected = if conn_info {
            format!("Some({local})")
        } else {
            "None".to_string()
        };
        assert_eq!(String::from_utf8_lossy(&reply.body), expected);
        server.finish();
    }
}

#[test]
fn a_handler_that_panics_gets_its_request_a_500_and_the_server_goes_on() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let mut s = server.connect();
    get(&mut s, "/panic");
    let reply = read_reply(&mut BufReader::new(s), false).unwrap();
    assert_eq!(reply.status, 500);
    assert_eq!(reply.header("connection"), Some("close"));
    let mut s = server.connect();
    get(&mut s, "/");
    assert_eq!(
        read_reply(&mut BufReader::new(s), false).unwrap().status,
        200
    );
    let (cut, snap) = server.finish();
    assert_eq!(cut, 0);
    assert_eq!(snap.http.responses_by_class[4], 1, "the 500 is counted");
}

/// One report to `Config::on_refused`: status, request line, whether it had a peer and a
/// duration, body bytes.
type Report = (u16, Option<String>, bool, bool, u64);

fn report(r: &nodus_http::Refused<'_>) -> Report {
    let line = r
        .request
        .map(|l| format!("{} {} {:?}", l.method, l.path, l.version));
    (
        r.status.as_u16(),
        line,
        r.peer.is_some(),
        r.elapsed_ns.is_some(),
        r.body_bytes,
    )
}

/// What `Config::on_refused` was told in `a_panicked_handlers_500_is_reported_to_on_refused`.
static PANICKED: std::sync::Mutex<Vec<Report>> = std::sync::Mutex::new(Vec::new());

fn record_panic(r: &nodus_http::Refused<'_>) {
    PANICKED.lock().unwrap().push(report(r));
}

/// The 500 that stands in for a panicked handler's response is a response like any other to an
/// access log: reported once to `on_refused` with the request's method, path (no query) and
/// version, whether the handler panicked in a poll of its future or while making it.
#[test]
fn a_panicked_handlers_500_is_reported_to_on_refused() {
    let config = Config {
        on_refused: Some(record_panic),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    for (raw, status) in [
        (&b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n"[..], 200),
        (b"DELETE /panic?q=1 HTTP/1.1\r\nHost: t\r\n\r\n", 500),
        (b"GET /panic-now HTTP/1.0\r\n\r\n", 500),
    ] {
        assert_eq!(status_of(&server, raw), status);
    }
    let mut s = server.connect();
    s.write_all(b"HEAD /panic HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(
        read_reply(&mut BufReader::new(s), true).unwrap().status,
        500
    );
    let (_, snap) = server.finish();
    let reported = std::mem::take(&mut *PANICKED.lock().unwrap());
    let line = |l: &str| Some(l.to_owned());
    assert_eq!(
        reported,
        [
            (500, line("DELETE /panic HTTP/1.1"), true, true, 22),
            (500, line("GET /panic-now HTTP/1.0"), true, true, 22),
            // The answer to HEAD has no body.
            (500, line("HEAD /panic HTTP/1.1"), true, true, 0),
        ]
    );
    assert_eq!(snap.http.responses_by_class[4], 3, "each 500 counted once");
}

#[test]
fn oversized_heads_get_431_and_bodies_413() {
    let config = Config {
        max_header_bytes: 4096,
        max_body_bytes: 1024,
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));

    let mut s = server.connect();
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "a".repeat(8192)
    )
    .unwrap();
    let Reply { status, .. } = read_reply(&mut BufReader::new(s), false).unwrap();
    assert_eq!(status, 431);

    let mut s = server.connect();
    write!(
        s,
        "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4096\r\n\r\n"
    )
    .unwrap();
    let reply = read_reply(&mut BufReader::new(s), false).unwrap();
    assert_eq!(reply.status, 413);
    assert_eq!(reply.header("connection"), Some("close"));

    // A chunked body over the limit is refused by the handler's read.
    let mut s = server.connect();
    let chunk = "b".repeat(800);
    write!(
        s,
        "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .unwrap();
    for _ in 0..2 {
        write!(s, "{:x}\r\n{chunk}\r\n", chunk.len()).unwrap();
    }
    write!(s, "0\r\n\r\n").unwrap();
    let Reply { status, .. } = read_reply(&mut BufReader::new(s), false).unwrap();
    assert_eq!(status, 413);

    // Other connections are unaffected.
    let mut s = server.connect();
    get(&mut s, "/");
    assert_eq!(
        read_reply(&mut BufReader::new(s), false).unwrap().status,
        200
    );
}

#[test]
fn an_http_1_1_request_without_host_gets_400_and_the_connection_closes() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let mut s = server.connect();
    // The second request is never answered: the connection closes after the 400.
    s.write_all(b"GET / HTTP/1.1\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!(reply.status, 400);
    assert_eq!(reply.header("connection"), Some("close"));
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));

    // HTTP/1.0 has no Host requirement.
    let mut s = server.connect();
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let reply = read_reply(&mut BufReader::new(s), false).unwrap();
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hello"[..]));

    let (_, snap) = server.finish();
    assert_eq!(snap.http.responses_by_class[1], 1);
    assert_eq!(snap.http.responses_by_class[3], 1);
    assert_eq!(snap.http.request_duration.count, 2);
    assert_eq!(snap.http.requests_in_flight, 0);
}

#[test]
fn an_http_2_preface_to_the_http_1_server_gets_400_as_from_node() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let mut s = server.connect();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    s.read_to_end(&mut reply).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&reply),
        "HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n"
    );
}

/// What `Config::on_refused` was told in `every_refusal_is_counted_and_reported_once`.
static REFUSED: std::sync::Mutex<Vec<Report>> = std::sync::Mutex::new(Vec::new());

fn record_refusal(r: &nodus_http::Refused<'_>) {
    REFUSED.lock().unwrap().push(report(r));
}

/// Writes `raw` on a new connection and reads the status of the answer.
fn status_of(server: &TestServer, raw: &[u8]) -> u16 {
    let mut s = server.connect();
    s.write_all(raw).unwrap();
    read_reply(&mut BufReader::new(s), false).unwrap().status
}

#[test]
fn every_refusal_is_counted_and_reported_once() {
    let config = Config {
        // Above hyper's longest URI (65,534 bytes), so that a longer one is a 414.
        max_header_bytes: 128 * 1024,
        max_body_bytes: 1024,
        on_refused: Some(record_refusal),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    assert_eq!(
        status_of(&server, b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n"),
        200
    );
    assert_eq!(status_of(&server, b"GET /no-host HTTP/1.1\r\n\r\n"), 400);
    let two_hosts = b"GET /two-hosts HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n";
    assert_eq!(status_of(&server, two_hosts), 400);
    let body = b"POST /echo?q=1 HTTP/1.1\r\nHost: t\r\nContent-Length: 4096\r\n\r\n";
    assert_eq!(status_of(&server, body), 413);
    let many: String = (0..101).map(|i| format!("X-{i}: v\r\n")).collect();
    let many = format!("GET / HTTP/1.1\r\nHost: t\r\n{many}\r\n");
    assert_eq!(status_of(&server, many.as_bytes()), 431);
    let long = format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "u".repeat(70_000));
    assert_eq!(status_of(&server, long.as_bytes()), 414);
    // A request line that alone reaches the head limit: 414 from nodus where hyper says 431.
    // (Exactly the limit, no more, so that the server reads all of it and its close is no reset.)
    let longer = format!("GET /{}", "u".repeat(128 * 1024 - 5));
    assert_eq!(status_of(&server, longer.as_bytes()), 414);
    assert_eq!(
        status_of(&server, b"GET / HTTP/1.1\r\nHo st: t\r\n\r\n"),
        400
    );
    // hyper (httparse) reads HTTP/1.0 and 1.1 only: a higher HTTP/1 minor version is refused,
    // as by Node (nginx would answer it as 1.1).
    assert_eq!(
        status_of(&server, b"GET / HTTP/1.2\r\nHost: t\r\n\r\n"),
        400
    );
    let mut s = server.connect();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    s.read_to_end(&mut Vec::new()).unwrap();
    // A client that goes away without a request was refused nothing.
    drop(server.connect());
    let (_, snap) = server.finish();
    let refused = std::mem::take(&mut *REFUSED.lock().unwrap());
    let line = |l: &str| Some(l.to_owned());
    assert_eq!(
        refused,
        [
            (400, line("GET /no-host HTTP/1.1"), true, true, 40),
            (400, line("GET /two-hosts HTTP/1.1"), true, true, 56),
            (413, line("POST /echo HTTP/1.1"), true, true, 23),
            (431, None, true, false, 0),
            (414, None, true, false, 0),
            (414, None, true, false, 0),
            (400, None, true, false, 0),
            (400, None, true, false, 0),
            (400, None, true, false, 0),
        ]
    );
    assert_eq!(snap.http.responses_by_class[1], 1);
    assert_eq!(snap.http.responses_by_class[3], 9, "every refusal counted");
    // Only the parsed ones have a duration; nothing is left in flight.
    assert_eq!(snap.http.request_duration.count, 4);
    assert_eq!(snap.http.requests_in_flight, 0);
}

#[test]
fn a_slowloris_client_is_cut_while_others_are_served() {
    let config = Config {
        header_read_timeout: Duration::from_millis(400),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let mut slow = server.connect();
    let start = Instant::now();
    let request = b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: 1\r\n\r\n";
    let mut cut = false;
    for b in request {
        if slow.write_all(&[*b]).is_err() {
            cut = true;
            break;
        }
        // Meanwhile a normal client is served at once.
        let mut ok = server.connect();
        get(&mut ok, "/");
        assert_eq!(
            read_reply(&mut BufReader::new(ok), false).unwrap().status,
            200
        );
        std::thread::sleep(Duration::from_millis(100));
        let mut probe = [0u8; 1];
        slow.set_nonblocking(true).unwrap();
        let r = slow.read(&mut probe);
        slow.set_nonblocking(false).unwrap();
        if matches!(r, Ok(0)) || matches!(&r, Err(e) if e.kind() != std::io::ErrorKind::WouldBlock)
        {
            cut = true;
            break;
        }
    }
    assert!(cut, "the slow client was never cut");
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_millis(350),
        "cut too early: {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(3),
        "cut too late: {elapsed:?}"
    );
}

/// A streamed body (server-sent events): `first`, 400 ms of silence, `second`.
struct Events {
    sent: u8,
    gap: std::pin::Pin<Box<nodus::Sleep>>,
}

impl hyper::body::Body for Events {
    type Data = bytes::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, std::io::Error>>> {
        use std::future::Future;
        use std::task::Poll;
        let line: &'static [u8] = match self.sent {
            0 => b"data: first\n\n",
            1 => {
                if self.gap.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                b"data: second\n\n"
            }
            _ => return Poll::Ready(None),
        };
        self.sent += 1;
        Poll::Ready(Some(Ok(hyper::body::Frame::data(
            bytes::Bytes::from_static(line),
        ))))
    }
}

/// `later!`, 400 ms after it is first polled; with its exact length, or none.
struct LateBody {
    exact: bool,
    sent: bool,
    gap: std::pin::Pin<Box<nodus::Sleep>>,
}

impl LateBody {
    fn new(exact: bool) -> LateBody {
        LateBody {
            exact,
            sent: false,
            gap: Box::pin(nodus::sleep(400)),
        }
    }
}

impl hyper::body::Body for LateBody {
    type Data = bytes::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, std::io::Error>>> {
        use std::future::Future;
        use std::task::Poll;
        if self.sent {
            return Poll::Ready(None);
        }
        if self.gap.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.sent = true;
        Poll::Ready(Some(Ok(hyper::body::Frame::data(
            bytes::Bytes::from_static(b"later!"),
        ))))
    }

    fn is_end_stream(&self) -> bool {
        self.sent
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match (self.exact, self.sent) {
            (true, false) => hyper::body::SizeHint::with_exact(6),
            (true, true) => hyper::body::SizeHint::with_exact(0),
            (false, _) => hyper::body::SizeHint::default(),
        }
    }
}

/// An endless body of 64 KiB chunks that counts the chunks hyper took from it.
struct CountedChunks(Arc<AtomicUsize>);

impl hyper::body::Body for CountedChunks {
    type Data = bytes::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, std::io::Error>>> {
        self.0.fetch_add(1, Ordering::Relaxed);
        let chunk = bytes::Bytes::from(vec![b'x'; 64 << 10]);
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(chunk))))
    }
}

/// A client that stops reading a large response pins little of it in the server: hyper takes
/// the next body chunk only while it holds less than its buffer cap (the head limit, 16 KiB),
/// not its default ~400 KiB, so with the socket buffers small on both ends the server has taken
/// a few 64 KiB chunks, not eight. Over HTTP/1 alone and with h2c on.
#[test]
fn a_client_that_stops_reading_pins_a_chunk_or_two_of_the_response_not_hypers_default_buffer() {
    for http2 in [false, true] {
        let chunks = Arc::new(AtomicUsize::new(0));
        let counted = chunks.clone();
        let (tx, rx) = mpsc::channel();
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            Runtime::new().block_on(async move {
                let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
                // Accepted sockets inherit it: the kernel holds little of the response.
                rustix::net::sockopt::set_socket_send_buffer_size(&listener, 4096).unwrap();
                let config = Config {
                    http2,
                    ..Config::default()
                };
                let server = serve(listener, config, move |_req| {
                    let body = CountedChunks(counted.clone());
                    async move { http::Response::new(nodus_http::body::boxed(body)) }
                });
                tx.send(server.local_addr().unwrap()).unwrap();
                while stop_rx.try_recv().is_err() {
                    nodus::sleep(5).await;
                }
                server.drain(Duration::ZERO).await;
            })
        });
        let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let fd = rustix::net::socket(
            rustix::net::AddressFamily::INET,
            rustix::net::SocketType::STREAM,
            None,
        )
        .unwrap();
        rustix::net::sockopt::set_socket_recv_buffer_size(&fd, 4096).unwrap();
        rustix::net::connect(&fd, &addr).unwrap();
        let mut s = TcpStream::from(fd);
        get(&mut s, "/");
        // Until the server has taken what it will: the count stays the same for 300 ms.
        let start = Instant::now();
        let mut last = (usize::MAX, Instant::now());
        loop {
            let now = chunks.load(Ordering::Relaxed);
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() > Duration::from_millis(300) {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(10), "never settled");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            (1..=3).contains(&last.0),
            "h2c {http2}: {} chunks of 64 KiB taken for a client that reads none",
            last.0
        );
        stop_tx.send(()).unwrap();
        drop(s);
        thread.join().unwrap();
    }
}

/// A small body of a known length whose data waits on the server's own work (a file chunk read
/// on a swamped I/O pool) past the keep-alive timeout, its head already sent, is not idle: it
/// arrives whole (it was cut after its head, a clean EOF short of its `Content-Length`).
#[test]
fn a_small_body_waiting_on_the_server_past_the_keep_alive_timeout_is_not_cut() {
    let config = Config {
        keep_alive_timeout: Duration::from_millis(200),
        on_response: Some(record_late),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    get(&mut s, "/late-body");
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(String::from_utf8_lossy(&reply.body), "later!");
    let start = Instant::now();
    while LATE.lock().unwrap().is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10), "never reported");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        std::mem::take(&mut *LATE.lock().unwrap()),
        [(200, 6, true)],
        "on_response: status, body bytes, complete"
    );
}

static LATE: std::sync::Mutex<Vec<(u16, u64, bool)>> = std::sync::Mutex::new(Vec::new());

fn record_late(a: &nodus_http::Answered<'_>) {
    LATE.lock()
        .unwrap()
        .push((a.status.as_u16(), a.body_bytes, a.complete));
}

static CUT: std::sync::Mutex<Vec<(u16, u64, bool)>> = std::sync::Mutex::new(Vec::new());

fn record_cut(a: &nodus_http::Answered<'_>) {
    CUT.lock()
        .unwrap()
        .push((a.status.as_u16(), a.body_bytes, a.complete));
}

/// A response the drain deadline cuts while its body waits on the server ends with a reset: an
/// HTTP/1.0 body of no known length ends with the connection, so a plain close would pass for
/// its end. `on_response` reports it incomplete.
#[test]
fn a_response_the_drain_deadline_cuts_before_its_body_ends_is_reset() {
    let config = Config {
        on_response: Some(record_cut),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_millis(100));
    let mut s = server.connect();
    s.write_all(b"GET /late-stream HTTP/1.0\r\n\r\n").unwrap();
    let mut head = [0u8; 12];
    s.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.0 200");
    let (cut, _) = server.finish();
    assert_eq!(cut, 1, "the drain reports the response it cut");
    let mut got = Vec::new();
    let err = s
        .read_to_end(&mut got)
        .expect_err("a clean end after the head");
    assert_eq!(
        err.kind(),
        std::io::ErrorKind::ConnectionReset,
        "{err}; got {}",
        String::from_utf8_lossy(&got)
    );
    assert_eq!(
        *CUT.lock().unwrap(),
        [(200, 0, false)],
        "on_response: status, body bytes, complete"
    );
}

/// A streamed body silent for longer than the keep-alive timeout is the server's own pace, not
/// an idle connection: it is not cut.
#[test]
fn a_streamed_body_silent_past_the_keep_alive_timeout_is_not_cut() {
    let config = Config {
        keep_alive_timeout: Duration::from_millis(200),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let mut s = server.connect();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    get(&mut s, "/events");
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&got).contains("data: second") {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "cut before the second event: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn idle_keep_alive_connections_close_after_the_timeout() {
    let config = Config {
        keep_alive_timeout: Duration::from_millis(200),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    get(&mut s, "/");
    assert_eq!(read_reply(&mut r, false).unwrap().status, 200);
    let start = Instant::now();
    let mut buf = [0u8; 1];
    assert_eq!(
        r.read(&mut buf).unwrap(),
        0,
        "the server closed the idle connection"
    );
    assert!(
        start.elapsed() >= Duration::from_millis(150),
        "{:?}",
        start.elapsed()
    );
}

/// A listener that keeps a copy of every connection's fd, as a stalled cluster worker's channel
/// keeps the copy of a connection the primary took back from it and handed to another worker.
struct KeepsCopies {
    inner: TcpListener,
    copies: std::cell::RefCell<Vec<std::os::fd::OwnedFd>>,
}

impl nodus_http::Accept for KeepsCopies {
    type Stream = nodus::net::TcpStream;

    fn poll_accept(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<(Self::Stream, Option<SocketAddr>)>> {
        nodus_http::Accept::poll_accept(&self.inner, cx).map_ok(|(stream, peer)| {
            use std::os::fd::AsFd;
            let copy = stream.as_fd().try_clone_to_owned().unwrap();
            self.copies.borrow_mut().push(copy);
            (stream, peer)
        })
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        nodus_http::Accept::local_addr(&self.inner)
    }
}

#[test]
fn an_idle_connection_closed_by_the_server_ends_for_its_client_while_a_copy_of_its_fd_lives() {
    let (tx, rx) = mpsc::channel();
    let stop = Arc::new(AtomicBool::new(false));
    let stop_server = stop.clone();
    let thread = std::thread::spawn(move || {
        Runtime::new().block_on(async move {
            let listener = KeepsCopies {
                inner: TcpListener::bind(("127.0.0.1", 0)).unwrap(),
                copies: Default::default(),
            };
            let config = Config {
                keep_alive_timeout: Duration::from_millis(200),
                ..Config::default()
            };
            let server = serve(listener, config, |_req| async {
                text(StatusCode::OK, "hi")
            });
            tx.send(server.local_addr().unwrap()).unwrap();
            while !stop_server.load(Ordering::Acquire) {
                nodus::sleep(5).await;
            }
            server.drain(Duration::from_secs(1)).await;
        })
    });
    let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    get(&mut s, "/");
    assert_eq!(read_reply(&mut r, false).unwrap().status, 200);
    // The server closes it after 200 ms idle; the copy keeps the socket open in the kernel.
    let mut buf = [0u8; 1];
    let read = r.read(&mut buf);
    assert!(
        matches!(read, Ok(0)),
        "the client reads its EOF after the keep-alive timeout: {read:?}"
    );
    stop.store(true, Ordering::Release);
    thread.join().unwrap();
}

#[test]
fn graceful_drain_finishes_in_flight_work_and_refuses_new_connections() {
    let server = TestServer::start(Config::default(), Duration::from_secs(5));
    // An in-flight slow request.
    let mut slow = server.connect();
    get(&mut slow, "/slow");
    // A keep-alive client with one request answered.
    let mut ka = server.connect();
    let mut ka_r = BufReader::new(ka.try_clone().unwrap());
    get(&mut ka, "/");
    assert_eq!(read_reply(&mut ka_r, false).unwrap().status, 200);
    std::thread::sleep(Duration::from_millis(50));

    let addr = server.addr;
    let drained = std::thread::spawn(move || server.finish());
    std::thread::sleep(Duration::from_millis(50));

    // New connections are refused once the drain began.
    assert!(TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err());
    // The keep-alive client's next request is answered, with Connection: close.
    get(&mut ka, "/");
    let reply = read_reply(&mut ka_r, false).unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("connection"), Some("close"));
    // A client closes a connection its server said it closes (one that does not is waited for
    // until its lingering close ends, by the drain's deadline at the latest).
    drop((ka, ka_r));
    // The in-flight slow request completes.
    let Reply { status, body, .. } = read_reply(&mut BufReader::new(slow), false).unwrap();
    assert_eq!((status, body.as_slice()), (200, &b"slow done"[..]));
    let (cut, snap) = drained.join().unwrap();
    assert_eq!(cut, 0, "every request was answered");
    assert_eq!(snap.http.connections_open, 0);
    assert_eq!(snap.http.responses_by_class[1], 3);
}

#[test]
fn two_drains_at_once_both_end_when_the_last_connection_closes() {
    let rt = Runtime::new();
    let (first, second) = rt.block_on(async {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let answering = Rc::new(Cell::new(false));
        let flag = answering.clone();
        let server = Rc::new(serve(listener, Config::default(), move |_req| {
            flag.set(true);
            async {
                nodus::sleep(200).await;
                text(StatusCode::OK, "slow done")
            }
        }));
        let addr = server.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            get(&mut s, "/");
            read_reply(&mut BufReader::new(s), false).unwrap().status
        });
        while !answering.get() {
            nodus::sleep(5).await;
        }
        let drain = |server: Rc<nodus_http::Server>| {
            nodus::spawn(async move { server.drain(Duration::from_secs(5)).await })
        };
        let (a, b) = (drain(server.clone()), drain(server.clone()));
        let both = nodus::timeout(10_000, async { (a.await.unwrap(), b.await.unwrap()) })
            .await
            .expect("both drains end");
        assert_eq!(
            client.join().unwrap(),
            200,
            "the request in flight was answered"
        );
        both
    });
    assert_eq!((first, second), (0, 0));
}

/// A listener fed from outside, as a cluster worker's round-robin listener is fed by the
/// primary's messages: connections pushed to it, then its end (the primary's `disconnect`).
#[derive(Clone, Default)]
struct HandedOver(Rc<HandedOverQueue>);

#[derive(Default)]
struct HandedOverQueue {
    conns: std::cell::RefCell<Vec<nodus::net::TcpStream>>,
    closed: Cell<bool>,
    waker: std::cell::RefCell<Option<std::task::Waker>>,
}

impl HandedOver {
    /// Queues `conns`, closes the queue and wakes the accept task, in one go.
    fn hand_over_and_close(&self, conns: Vec<nodus::net::TcpStream>) {
        self.0.conns.borrow_mut().extend(conns);
        self.0.closed.set(true);
        if let Some(w) = self.0.waker.borrow_mut().take() {
            w.wake();
        }
    }
}

impl nodus_http::Accept for HandedOver {
    type Stream = nodus::net::TcpStream;

    fn poll_accept(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<(Self::Stream, Option<SocketAddr>)>> {
        if let Some(s) = self.0.conns.borrow_mut().pop() {
            return std::task::Poll::Ready(Ok((s, None)));
        }
        if self.0.closed.get() {
            return std::task::Poll::Ready(Err(std::io::ErrorKind::UnexpectedEof.into()));
        }
        *self.0.waker.borrow_mut() = Some(cx.waker().clone());
        std::task::Poll::Pending
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        None
    }
}

/// A cluster worker at a rolling reload: the primary's last `newconns` and its `disconnect` are
/// read in one turn, which wakes the accept task (connections queued, then the queue's end)
/// and then the task that drains. The accept task takes the connections (their tasks spawned,
/// not yet run) and ends; the drain begins before any connection's task has run. It must wait
/// for them: were it to find nothing open, the worker would exit with them unanswered.
#[test]
fn a_drain_that_begins_before_an_accepted_connection_first_runs_waits_for_it() {
    let rt = Runtime::new();
    let (client, served, cut, open) = rt.block_on(async {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let client = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            get(&mut s, "/");
            read_reply(&mut BufReader::new(s), false)
        });
        let (stream, _) = listener.accept().await.unwrap();
        let served = Rc::new(Cell::new(0));
        let count = served.clone();
        let handed = HandedOver::default();
        let server = serve(handed.clone(), Config::default(), move |_req| {
            count.set(count.get() + 1);
            async { text(StatusCode::OK, "hello") }
        });
        // The accept task waits for connections.
        nodus::sleep(20).await;
        // One event wakes the accept task first, then this one (the end of the task it awaits).
        nodus::spawn(async move { handed.hand_over_and_close(vec![stream]) })
            .await
            .unwrap();
        let cut = nodus::timeout(10_000, server.drain(Duration::from_secs(5)))
            .await
            .expect("the drain ends");
        (client, served.get(), cut, server.connections())
    });
    // The runtime is gone, with any task it never ran: the answer came before the drain ended.
    drop(rt);
    let reply = client.join().unwrap();
    assert_eq!(served, 1, "the drain waited for the accepted connection");
    assert_eq!((cut, open), (0, 0));
    let reply = reply.expect("an answer, not a connection closed unanswered");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("connection"), Some("close"));
}

#[test]
fn at_most_max_connections_are_served_at_once() {
    let config = Config {
        max_connections: 1,
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let mut first = server.connect();
    get(&mut first, "/");
    let mut first_r = BufReader::new(first.try_clone().unwrap());
    assert_eq!(read_reply(&mut first_r, false).unwrap().status, 200);
    // The second connection waits in the backlog.
    let mut second = server.connect();
    get(&mut second, "/");
    second
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut second_r = BufReader::new(second.try_clone().unwrap());
    assert!(
        read_reply(&mut second_r, false).is_err(),
        "served beyond max_connections"
    );
    drop((first, first_r));
    second
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(read_reply(&mut second_r, false).unwrap().status, 200);
}

/// The loop's stats carry the cap of the server while it accepts (`connections_max`), and not
/// once its drain stopped it.
#[test]
fn the_stats_say_the_cap_while_the_server_accepts() {
    let config = Config {
        max_connections: 7,
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let mut s = server.connect();
    get(&mut s, "/connections-max");
    let reply = read_reply(&mut BufReader::new(s), false).unwrap();
    assert_eq!((reply.status, &reply.body[..]), (200, &b"7"[..]));
    let (_, snap) = server.finish();
    assert_eq!(snap.http.connections_max, 0);
}

#[test]
fn http2_with_prior_knowledge_runs_streams_as_local_tasks() {
    let config = Config {
        http2: true,
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let addr = server.addr;
    let rt = Runtime::new();
    let (statuses, versions) = rt.block_on(async move {
        let stream = nodus::net::TcpStream::connect(addr).await.unwrap();
        let io = nodus_http::HyperIo::new(stream);
        let (mut sender, conn) =
            hyper::client::conn::http2::Builder::new(nodus_http::LocalExec::new("h2-client"))
                .timer(nodus_http::NodusTimer)
                .handshake::<_, http_body_util::Empty<bytes::Bytes>>(io)
                .await
                .unwrap();
        nodus::spawn(conn).detach();
        let mut statuses = Vec::new();
        let mut versions = Vec::new();
        for path in ["/", "/slow"] {
            let req = http::Request::get(format!("http://{addr}{path}"))
                .body(http_body_util::Empty::new())
                .unwrap();
            let resp = sender.send_request(req).await.unwrap();
            statuses.push(resp.status().as_u16());
            versions.push(resp.version());
        }
        (statuses, versions)
    });
    assert_eq!(statuses, [200, 200]);
    assert!(versions.iter().all(|v| *v == http::Version::HTTP_2));
    // Plain HTTP/1.1 still works on the same listener.
    let mut s = server.connect();
    get(&mut s, "/");
    assert_eq!(
        read_reply(&mut BufReader::new(s), false).unwrap().status,
        200
    );
}

/// Whether the server has closed `s` (EOF or reset), without blocking.
fn closed_by_server(s: &mut TcpStream) -> bool {
    let mut probe = [0u8; 1];
    s.set_nonblocking(true).unwrap();
    let r = s.read(&mut probe);
    s.set_nonblocking(false).unwrap();
    matches!(r, Ok(0)) || matches!(&r, Err(e) if e.kind() != std::io::ErrorKind::WouldBlock)
}

/// Waits up to 5 s for the server to close `s`; how long it took.
fn wait_closed(s: &mut TcpStream) -> Duration {
    let start = Instant::now();
    while !closed_by_server(s) {
        assert!(start.elapsed() < Duration::from_secs(5), "never closed");
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

#[test]
fn the_header_read_timeout_counts_from_each_wait_for_a_head() {
    for http2 in [false, true] {
        let config = Config {
            header_read_timeout: Duration::from_millis(400),
            http2,
            ..Config::default()
        };
        let server = TestServer::start(config, Duration::from_secs(1));
        let mut s = server.connect();
        let mut r = BufReader::new(s.try_clone().unwrap());
        // Requests 250 ms apart, 1 s in all: each head comes within the timeout of its own wait.
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(250));
            get(&mut s, "/");
            assert_eq!(
                read_reply(&mut r, false).unwrap().status,
                200,
                "http2: {http2}"
            );
        }
        // A head that never completes is cut one timeout after the wait for it began.
        s.write_all(b"GET / HTTP/1.1\r\n").unwrap();
        let waited = wait_closed(&mut s);
        assert!(
            waited >= Duration::from_millis(350) && waited < Duration::from_secs(3),
            "http2: {http2}: cut after {waited:?}"
        );
    }
}

#[test]
fn a_header_read_timeout_longer_than_keep_alive_still_cuts_a_trickling_head() {
    let config = Config {
        header_read_timeout: Duration::from_millis(700),
        keep_alive_timeout: Duration::from_millis(200),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let mut s = server.connect();
    let start = Instant::now();
    // A byte every 100 ms: never idle for the keep-alive timeout, never a whole head.
    let head = b"GET / HTTP/1.1\r\nHost: t\r\nX-Trickle: 0123456789\r\n\r\n";
    let cut = head.iter().any(|b| {
        s.write_all(&[*b]).is_err() || {
            std::thread::sleep(Duration::from_millis(100));
            closed_by_server(&mut s)
        }
    });
    let elapsed = start.elapsed();
    assert!(cut, "the trickling head was never cut");
    assert!(
        elapsed >= Duration::from_millis(650) && elapsed < Duration::from_secs(3),
        "cut after {elapsed:?}"
    );
}

/// With h2c, a client that trickles what may still be the HTTP/2 preface (a byte every 100 ms:
/// never idle for the keep-alive timeout) is cut at the header-read timeout from its start, as an
/// HTTP/1 head is; so is an HTTP/1 head whose first bytes matched the preface for most of that
/// timeout (its wait ends by then, not a whole timeout after it began).
#[test]
fn with_http2_a_trickled_preface_or_head_is_cut_at_the_header_read_timeout_from_the_start() {
    let config = Config {
        http2: true,
        header_read_timeout: Duration::from_millis(2000),
        keep_alive_timeout: Duration::from_millis(700),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    // "PRI" matches the preface, 600 ms apart (1.8 s); then an HTTP/1 head, trickled.
    let head = b"PRIX / HTTP/1.1\r\nHost: t\r\nX-Trickle: 0123456789012345678901234567890\r\n\r\n";
    for (case, bytes, gap) in [("preface", &preface[..], 100), ("PRI head", &head[..], 600)] {
        let mut s = server.connect();
        let start = Instant::now();
        let cut = bytes.iter().enumerate().any(|(i, b)| {
            s.write_all(&[*b]).is_err() || {
                let gap = if i < 3 { gap } else { 100 };
                std::thread::sleep(Duration::from_millis(gap));
                closed_by_server(&mut s)
            }
        });
        let elapsed = start.elapsed();
        assert!(cut, "{case}: never cut");
        assert!(
            elapsed >= Duration::from_millis(1900) && elapsed < Duration::from_millis(3000),
            "{case}: cut after {elapsed:?}"
        );
    }
}

/// A drain deadline past what a `u64` of nanoseconds holds (a cluster primary's `drainMs` is any
/// `u64` of milliseconds) is no deadline at all, not one wrapped around to a few microseconds.
#[test]
fn a_drain_deadline_too_far_for_nanoseconds_waits_for_the_request_in_flight() {
    // 2^64 ns and one microsecond.
    let far = Duration::new(18_446_744_073, 709_552_616);
    let server = TestServer::start(Config::default(), far);
    let mut slow = server.connect();
    get(&mut slow, "/slow");
    std::thread::sleep(Duration::from_millis(50));
    let (cut, _) = server.finish();
    assert_eq!(cut, 0, "the drain cut the request in flight");
    let Reply { status, body, .. } = read_reply(&mut BufReader::new(slow), false).unwrap();
    assert_eq!((status, body.as_slice()), (200, &b"slow done"[..]));
}

#[test]
fn a_request_cut_by_the_drain_deadline_leaves_no_request_in_flight() {
    let server = TestServer::start(Config::default(), Duration::from_millis(50));
    let mut slow = server.connect();
    get(&mut slow, "/slow");
    std::thread::sleep(Duration::from_millis(50));
    let (cut, snap) = server.finish();
    assert_eq!(cut, 1, "the drain reports the request it cut");
    assert_eq!(snap.http.connections_open, 0);
    assert_eq!(snap.http.requests_in_flight, 0);
    assert_eq!(
        snap.http.request_duration.count, 0,
        "an unanswered request has no duration"
    );
}

#[test]
fn a_drain_counts_a_response_it_cut_while_writing_but_not_an_idle_keep_alive_connection() {
    let server = TestServer::start(Config::default(), Duration::from_millis(200));
    // Answered and idle: cut at the deadline (before its keep-alive timeout), losing nothing.
    let mut idle = server.connect();
    get(&mut idle, "/");
    assert_eq!(
        read_reply(&mut BufReader::new(idle.try_clone().unwrap()), false)
            .unwrap()
            .status,
        200
    );
    let (cut, snap) = server.finish();
    assert_eq!(snap.http.connections_open, 0);
    assert_eq!(
        cut, 0,
        "an idle connection cut at the deadline lost no request"
    );

    let server = TestServer::start(Config::default(), Duration::from_millis(200));
    // Answered, but its body is still being written to a client that reads none of it.
    let mut stalled = server.connect();
    get(&mut stalled, "/big");
    let mut head = [0u8; 12];
    stalled.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let (cut, snap) = server.finish();
    assert_eq!(cut, 1, "the response cut while being written counts");
    assert_eq!(snap.http.connections_open, 0);
}

#[test]
fn a_keep_alive_timeout_beyond_the_longest_timer_is_accepted() {
    let config = Config {
        keep_alive_timeout: Duration::MAX,
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_millis(100));
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    for _ in 0..2 {
        get(&mut s, "/");
        assert_eq!(read_reply(&mut r, false).unwrap().status, 200);
    }
}

/// A header-read timeout past what an `Instant` holds (hyper adds it to one) is no timeout, not
/// a panic; with `http2` too (its HTTP/1 side has the same timeout).
#[test]
fn a_header_read_timeout_beyond_any_instant_is_accepted() {
    for http2 in [false, true] {
        let config = Config {
            header_read_timeout: Duration::MAX,
            http2,
            ..Config::default()
        };
        let server = TestServer::start(config, Duration::from_millis(100));
        let mut s = server.connect();
        let mut r = BufReader::new(s.try_clone().unwrap());
        for _ in 0..2 {
            get(&mut s, "/");
            let reply = read_reply(&mut r, false);
            assert_eq!(reply.map(|r| r.status).ok(), Some(200), "http2: {http2}");
        }
    }
}

/// A handler that blocks the loop is reported by the watchdog under the server's name, at the
/// line that called `serve` (not inside nodus-http), while it still blocks.
#[test]
fn a_blocking_handler_is_reported_at_its_serve_call() {
    let (tx, rx) = mpsc::channel();
    let done = Arc::new(AtomicBool::new(false));
    let (d, stop) = (done.clone(), done.clone());
    let thread = std::thread::spawn(move || {
        let rt = Runtime::builder()
            .stall_threshold(Duration::from_millis(50))
            .build()
            .unwrap();
        let loop_id = rt.id();
        rt.block_on(async move {
            let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
            let config = Config {
                name: "http:blocking-app",
                ..Config::default()
            };
            let server = serve(listener, config, move |_req| {
                let d = d.clone();
                async move {
                    // Blocks the loop (never do this) until the report is seen, 10 s at most.
                    let give_up = Instant::now() + Duration::from_secs(10);
                    while !d.load(Ordering::Acquire) && Instant::now() < give_up {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    text(StatusCode::OK, "late")
                }
            });
            tx.send((server.local_addr().unwrap(), loop_id)).unwrap();
            while !stop.load(Ordering::Acquire) {
                nodus::sleep(5).await;
            }
            server.drain(Duration::from_secs(5)).await
        })
    });
    let (addr, loop_id) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let client = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write_request(&mut s, "GET", "/", &[]).unwrap();
        read_reply(&mut BufReader::new(s), false).map(|r| r.status)
    });
    let give_up = Instant::now() + Duration::from_secs(10);
    let report = loop {
        if let Some(r) = nodus::watchdog::recent_stalls_for(loop_id)
            .into_iter()
            .next()
        {
            break r;
        }
        assert!(Instant::now() < give_up, "no stall report within 10 s");
        std::thread::sleep(Duration::from_millis(5));
    };
    done.store(true, Ordering::Release);
    assert_eq!(report.task_name, "http:blocking-app");
    assert!(
        report.location.contains("tests/server.rs:"),
        "placed at {}",
        report.location
    );
    assert_eq!(client.join().unwrap().unwrap(), 200);
    assert_eq!(thread.join().unwrap(), 0, "nothing cut by the drain");
}

/// What the process logged (a global subscriber, installed once by
/// `a_handler_that_blocks_the_loop_is_reported_with_the_request_it_serves`).
static LOGGED: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGGED.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The lines logged so far that mention `what`.
fn logged(what: &str) -> Vec<String> {
    String::from_utf8_lossy(&LOGGED.lock().unwrap())
        .lines()
        .filter(|l| l.contains(what))
        .map(str::to_owned)
        .collect()
}

/// A handler that blocks the loop is named by the request it serves, `GET /slow/thing` (its
/// method and path, never the query), while it blocks: in the watchdog's stall report and its
/// warning, then in the end-of-stall line and the slow-poll line; over HTTP/1, where the
/// connection's task polls the handler, and HTTP/2, where each stream is a task of its own. The
/// handler first awaits, so the note is the one its task kept from an earlier poll.
#[test]
fn a_handler_that_blocks_the_loop_is_reported_with_the_request_it_serves() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_writer(|| LogWriter)
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
    });
    for http2 in [false, true] {
        let name: &'static str = if http2 {
            "http:route-h2"
        } else {
            "http:route-h1"
        };
        let (tx, rx) = mpsc::channel();
        let seen = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, stop2) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let rt = Runtime::builder()
                .stall_threshold(Duration::from_millis(50))
                .build()
                .unwrap();
            let loop_id = rt.id();
            rt.block_on(async move {
                let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
                let config = Config {
                    name,
                    http2,
                    ..Config::default()
                };
                let server = serve(listener, config, move |_req| {
                    let seen = s2.clone();
                    async move {
                        nodus::sleep(1).await;
                        // Blocks the loop (never do this) for 300 ms, and until the report is
                        // seen (10 s at most).
                        let start = Instant::now();
                        while (start.elapsed() < Duration::from_millis(300)
                            || !seen.load(Ordering::Acquire))
                            && start.elapsed() < Duration::from_secs(10)
                        {
                            std::hint::spin_loop();
                        }
                        text(StatusCode::OK, "late")
                    }
                });
                tx.send((server.local_addr().unwrap(), loop_id)).unwrap();
                while !stop2.load(Ordering::Acquire) {
                    nodus::sleep(5).await;
                }
                server.drain(Duration::from_secs(1)).await
            })
        });
        let (addr, loop_id) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        if http2 {
            let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
            out.extend(h2_frame(4, 0, 0, &[]));
            // HPACK: :method GET, :scheme http, :path "/slow/thing?secret=1", :authority "t".
            let path = b"/slow/thing?secret=1";
            let block = [
                &[0x82, 0x86, 0x44, path.len() as u8][..],
                path,
                &[0x41, 1],
                b"t",
            ]
            .concat();
            out.extend(h2_frame(1, 0x5, 1, &block));
            s.write_all(&out).unwrap();
        } else {
            get(&mut s, "/slow/thing?secret=1");
        }
        let give_up = Instant::now() + Duration::from_secs(10);
        let report = loop {
            if let Some(r) = nodus::watchdog::recent_stalls_for(loop_id)
                .into_iter()
                .find(|r| r.ongoing && r.task_name == name)
            {
                break r;
            }
            assert!(Instant::now() < give_up, "no stall report within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        };
        seen.store(true, Ordering::Release);
        assert_eq!(report.note, "GET /slow/thing", "http2: {http2}: {report:?}");
        // The end of the stall, once the handler returned: the same note.
        let ended = loop {
            if let Some(r) = nodus::watchdog::recent_stalls_for(loop_id)
                .into_iter()
                .find(|r| !r.ongoing && r.task_name == name)
            {
                break r;
            }
            assert!(
                Instant::now() < give_up,
                "the stall did not end within 10 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(ended.note, "GET /slow/thing", "http2: {http2}: {ended:?}");
        // `task "NAME" [GET /slow/thing] (...)`, or `mostly "NAME" [...] (...)` for a stall
        // that was more than one poll (the handler's task woken by its sleep's timer).
        let task = format!("\"{name}\" [GET /slow/thing] (");
        let lines = loop {
            let lines = logged(&format!("\"{name}\""));
            let has = |what: &str| lines.iter().any(|l| l.contains(what) && l.contains(&task));
            if has("loop stalled: ") && has("stall ended: ") && has("slow poll: ") {
                break lines;
            }
            assert!(
                Instant::now() < give_up,
                "http2: {http2}: not every line names the request: {lines:#?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        assert!(
            lines.iter().all(|l| !l.contains("secret")),
            "the query is left out: {lines:#?}"
        );
        drop(s);
        stop.store(true, Ordering::Release);
        assert_eq!(
            thread.join().unwrap(),
            0,
            "http2: {http2}: nothing cut by the drain"
        );
    }
}

#[test]
fn a_client_that_half_closes_after_its_request_gets_the_whole_response() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let heads: [&[u8]; 2] = [
        b"GET /later HTTP/1.0\r\n\r\n",
        b"GET /later HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    ];
    for head in heads {
        for i in 0..20 {
            // As `nc -N` does: the request, then a half-close at once.
            let mut s = server.connect();
            s.write_all(head).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let mut raw = Vec::new();
            s.read_to_end(&mut raw).unwrap();
            let reply = read_reply(&mut &raw[..], false);
            let what = format!(
                "{} #{i}",
                String::from_utf8_lossy(head).lines().next().unwrap()
            );
            let reply = reply.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(
                (reply.status, reply.body.as_slice()),
                (200, &b"hello"[..]),
                "{what}"
            );
        }
    }
    // A half-close in the middle of a large download does not cut it.
    let mut s = server.connect();
    s.write_all(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut head = [0u8; 12];
    r.read_exact(&mut head).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    let mut raw = head.to_vec();
    raw.extend_from_slice(&rest);
    let reply = read_reply(&mut &raw[..], false).unwrap();
    assert_eq!((reply.status, reply.body.len()), (200, 8 << 20));
}

#[test]
fn repeated_or_invalid_host_headers_get_400_and_the_connection_closes() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    for raw in [
        &b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"[..],
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
        b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: bad host\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a:80x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a%zz\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a%4\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: []:80\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: [fe80::1%2]\r\n\r\n",
        b"GET / HTTP/1.0\r\nHost: bad host\r\n\r\n",
    ] {
        let what = String::from_utf8_lossy(raw);
        let mut s = server.connect();
        s.write_all(raw).unwrap();
        let mut r = BufReader::new(s);
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!(reply.status, 400, "{what}");
        assert_eq!(reply.header("connection"), Some("close"), "{what}");
    }
    for host in [
        "t",
        "example.com:8080",
        "127.0.0.1",
        "[::1]:80",
        "[fe80::1%25eth0]",
        "a-b_c~d.e",
        "x:",
        "",
    ] {
        let raw = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
        assert_eq!(status_of(&server, raw.as_bytes()), 200, "{host:?}");
    }
    let (_, snap) = server.finish();
    assert_eq!(snap.http.responses_by_class[3], 13);
}

/// Request heads framed as Node (llhttp) refuses them and hyper alone would not, each with the
/// body its framing may claim (`/x` answers without reading it).
const BAD_FRAMING: &[&[u8]] = &[
    // Bare line feeds: ending the request line, a field line, the empty line, all.
    b"GET /x HTTP/1.1\nHost: a\r\n\r\n",
    b"GET /x HTTP/1.1\r\nHost: a\nX: y\r\n\r\n",
    b"GET /x HTTP/1.1\r\nHost: a\r\n\n",
    b"GET /x HTTP/1.1\nHost: a\n\n",
    // Content-Length twice, even equal.
    b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\nabc",
    // Transfer-Encoding with Content-Length, either first.
    b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n\
      3\r\nabc\r\n0\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
      3\r\nabc\r\n0\r\n\r\n",
    // chunked twice, in one line or two.
    b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n\
      3\r\nabc\r\n0\r\n\r\n",
    b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\
      \r\n3\r\nabc\r\n0\r\n\r\n",
    // Behind empty lines (skipped, as Node skips them), or with a fragment in the target (not in
    // the parsed one): refused all the same.
    b"\r\n\r\nPOST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    b"\r\nGET /x HTTP/1.1\r\nHost: a\r\nX: y\nContent-Length: 3\r\n\r\nabc",
    b"POST /x#frag HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
      3\r\nabc\r\n0\r\n\r\n",
    b"GET /x#f HTTP/1.1\r\nHost: a\r\nX: y\nContent-Length: 3\r\n\r\nabc",
];

/// What `Config::on_refused` was told in
/// `framing_node_refuses_gets_400_and_the_connection_closes_before_the_handler`.
static FRAMING_REFUSED: std::sync::Mutex<Vec<Report>> = std::sync::Mutex::new(Vec::new());

fn record_framing(r: &nodus_http::Refused<'_>) {
    FRAMING_REFUSED.lock().unwrap().push(report(r));
}

#[test]
fn framing_node_refuses_gets_400_and_the_connection_closes_before_the_handler() {
    let config = Config {
        on_refused: Some(record_framing),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    for raw in BAD_FRAMING {
        let what = String::from_utf8_lossy(raw);
        let mut s = server.connect();
        // A request behind it would be smuggled: its handler answers "smuggled".
        s.write_all(&[raw, SMUGGLED].concat()).unwrap();
        let reply = read_reply_then_eof(&mut BufReader::new(s));
        assert_eq!(reply.status, 400, "{what}");
        // The refusal's own body: the handler (which answers `/x` "smuggled") never ran.
        assert_eq!(reply.body, b"bad request framing\n", "{what}");
        assert_eq!(reply.header("connection"), Some("close"), "{what}");
    }
    // A head whose facts come in several reads: split in its line ends and its names.
    for (first, rest) in [
        (&b"GET /x HTTP/1.1\r\nHost: a\r"[..], &b"\nX: y\n\r\n"[..]),
        (
            b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Len",
            b"gth: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
    ] {
        let mut s = server.connect();
        s.set_nodelay(true).unwrap();
        s.write_all(first).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(rest).unwrap();
        let reply = read_reply_then_eof(&mut BufReader::new(s));
        assert_eq!(reply.status, 400, "{}", String::from_utf8_lossy(first));
    }
    // Each reported once, with its request line.
    let refused = FRAMING_REFUSED.lock().unwrap();
    assert_eq!(refused.len(), BAD_FRAMING.len() + 2, "{refused:?}");
    assert!(
        refused
            .iter()
            .all(|r| r.0 == 400 && r.1.as_deref().is_some_and(|l| l.contains(" /x "))),
        "{refused:?}"
    );
}

#[test]
fn request_lines_node_refuses_get_400_and_the_connection_closes() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    for line in [
        // Methods Node and nginx refuse: not uppercase letters, `-` and `_`.
        &b"get /x HTTP/1.1"[..],
        b"Get /x HTTP/1.1",
        b"G!T /x HTTP/1.1",
        // Authority-form but for CONNECT; a byte over 0x7F in the target.
        b"GET h:80 HTTP/1.1",
        b"GET a HTTP/1.1",
        b"GET /a\xc3\xa9 HTTP/1.1",
        b"CONNECT /x HTTP/1.1",
    ] {
        let what = String::from_utf8_lossy(line);
        let mut s = server.connect();
        // A request behind it would be answered "smuggled".
        s.write_all(&[line, b"\r\nHost: t\r\n\r\n", SMUGGLED].concat())
            .unwrap();
        let reply = read_reply_then_eof(&mut BufReader::new(s));
        assert_eq!(reply.status, 400, "{what}");
        assert_eq!(reply.header("connection"), Some("close"), "{what}");
    }
    // Other uppercase methods (Node's or not) and target forms are served.
    for line in [
        "M-SEARCH * HTTP/1.1",
        "PROPFIND /x HTTP/1.1",
        "FOO /x HTTP/1.1",
        "GET http://t/x HTTP/1.1",
        "GET * HTTP/1.1",
    ] {
        let raw = format!("{line}\r\nHost: t\r\n\r\n");
        assert_eq!(status_of(&server, raw.as_bytes()), 200, "{line}");
    }
}

/// A CONNECT reaches the handler, but nothing after its head is read as a request (it would be
/// the tunnel's bytes behind a proxy that opened one): its response says `Connection: close`
/// and the connection ends with it; a 2xx one goes without the handler's body.
#[test]
fn a_connect_is_answered_and_ends_its_connection() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    for raw in [
        &b"CONNECT t:443 HTTP/1.1\r\nHost: t:443\r\n\r\nGET /next HTTP/1.1\r\nHost: t\r\n\r\n"[..],
        // A length does not make a body of what follows.
        b"CONNECT t:443 HTTP/1.1\r\nHost: t:443\r\nContent-Length: 28\r\n\r\n\
          GET /x HTTP/1.1\r\nHost: t\r\n\r\nGET /next HTTP/1.1\r\nHost: t\r\n\r\n",
        // Nor a body over the limit: no 413.
        b"CONNECT t:443 HTTP/1.1\r\nHost: t:443\r\nContent-Length: 99999999\r\n\r\n",
    ] {
        let mut s = server.connect();
        s.write_all(raw).unwrap();
        let reply = read_reply_then_eof(&mut BufReader::new(s));
        // A 2xx to CONNECT has no body nor length (RFC 9110 section 9.3.6): its client would
        // take one for the tunnel's bytes.
        assert_eq!((reply.status, &reply.body[..]), (200, &b""[..]));
        assert_eq!(reply.header("content-length"), None);
        assert_eq!(reply.header("connection"), Some("close"));
    }
    // Alone, it is not left open either.
    let mut s = server.connect();
    s.write_all(b"CONNECT t:443 HTTP/1.1\r\nHost: t:443\r\n\r\n")
        .unwrap();
    let reply = read_reply_then_eof(&mut BufReader::new(s));
    assert_eq!(reply.header("connection"), Some("close"));
}

/// What `Config::on_refused` was told in
/// `an_expect_other_than_100_continue_gets_417_before_the_handler`.
static EXPECT_REFUSED: std::sync::Mutex<Vec<Report>> = std::sync::Mutex::new(Vec::new());

fn record_expect(r: &nodus_http::Refused<'_>) {
    EXPECT_REFUSED.lock().unwrap().push(report(r));
}

#[test]
fn an_expect_other_than_100_continue_gets_417_before_the_handler() {
    let config = Config {
        on_refused: Some(record_expect),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    for expect in ["foo", "100-continuex", ""] {
        let mut s = server.connect();
        // Its body, were it read, would be followed by a request answered "smuggled".
        let raw = format!(
            "POST /echo HTTP/1.1\r\nHost: t\r\nExpect: {expect}\r\nContent-Length: 5\r\n\r\nhello"
        );
        s.write_all(&[raw.as_bytes(), SMUGGLED].concat()).unwrap();
        let reply = read_reply_then_eof(&mut BufReader::new(s));
        assert_eq!(reply.status, 417, "{expect:?}");
        // The refusal's own body: the handler (which echoes the body) never ran.
        assert_eq!(reply.body, b"expectation failed\n", "{expect:?}");
        assert_eq!(reply.header("connection"), Some("close"), "{expect:?}");
    }
    // HTTP/1.0 has no Expect; a value Node reads as 100-continue gets its `100 Continue` first.
    for (version, expect, interim) in [
        ("HTTP/1.0", "foo", &b""[..]),
        (
            "HTTP/1.1",
            "100-continue, x",
            b"HTTP/1.1 100 Continue\r\n\r\n",
        ),
    ] {
        let raw = format!(
            "POST /echo {version}\r\nHost: t\r\nExpect: {expect}\r\nContent-Length: 5\r\n\r\nhello"
        );
        let mut s = server.connect();
        s.write_all(raw.as_bytes()).unwrap();
        let mut r = BufReader::new(s);
        let mut first = vec![0; interim.len()];
        r.read_exact(&mut first).unwrap();
        assert_eq!(first, interim, "{version} {expect}");
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!(
            (reply.status, &reply.body[..]),
            (200, &b"hello"[..]),
            "{version} {expect}"
        );
    }
    let (_, snap) = server.finish();
    let refused = EXPECT_REFUSED.lock().unwrap();
    let report = (417, Some("POST /echo HTTP/1.1".to_owned()), true, true, 19);
    assert_eq!(*refused, [report.clone(), report.clone(), report]);
    assert_eq!(snap.http.responses_by_class[3], 3);
    assert_eq!(snap.http.responses_by_class[1], 2);
}

#[test]
fn well_formed_framing_is_served_in_one_read_or_several() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let good: &[(&[u8], &[u8])] = &[
        (b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n", b"smuggled"),
        (
            b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
            b"abc",
        ),
        (
            b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
              3\r\nabc\r\n0\r\n\r\n",
            b"abc",
        ),
        // chunked once, last, after another coding (the handler sees it encoded, as from Node).
        (
            b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\
              Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            b"abc",
        ),
        // Names that begin as the two compared do; a body with bare line feeds.
        (
            b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Type: t\r\nTrailer: x\r\n\
              Content-Length: 4\r\n\r\n\n\n\n\n",
            b"\n\n\n\n",
        ),
    ];
    // One connection: keep-alive goes on after each.
    let mut s = server.connect();
    s.set_nodelay(true).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    for (raw, body) in good {
        // Whole, then split at every 7th byte into reads of their own.
        s.write_all(raw).unwrap();
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!((reply.status, &reply.body[..]), (200, *body));
        for piece in raw.chunks(7) {
            s.write_all(piece).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!((reply.status, &reply.body[..]), (200, *body));
    }
    // Pipelined, all in one write.
    s.write_all(
        &good
            .iter()
            .map(|(raw, _)| *raw)
            .collect::<Vec<_>>()
            .concat(),
    )
    .unwrap();
    for (_, body) in good {
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!((reply.status, &reply.body[..]), (200, *body));
    }
    assert!(!closed_by_server(&mut s));
}

/// A connection whose receive buffer is 4 KiB: the server can send it little until it reads.
fn connect_small_window(addr: SocketAddr) -> TcpStream {
    use rustix::net::{AddressFamily, SocketType, sockopt};
    let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
    // Before connecting, so that the window advertised is small from the start.
    sockopt::set_socket_recv_buffer_size(&fd, 4096).unwrap();
    rustix::net::connect(&fd, &addr).unwrap();
    let s = TcpStream::from(fd);
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

/// A client with a tiny receive buffer that reads the start of `/big` (8 KiB), then stops
/// reading; with the length of the response's head.
fn stalled_download(addr: SocketAddr) -> (TcpStream, u64) {
    let mut s = connect_small_window(addr);
    get(&mut s, "/big");
    let mut start = vec![0u8; 8 * 1024];
    s.read_exact(&mut start).unwrap();
    assert!(start.starts_with(b"HTTP/1.1 200"));
    let head = start.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    (s, head as u64)
}

#[test]
fn a_client_that_stops_reading_a_response_is_cut_after_the_write_stall_timeout() {
    let config = Config {
        write_stall_timeout: Duration::from_secs(1),
        // Longer than the test: only the stall timeout can close it.
        keep_alive_timeout: Duration::from_secs(60),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_millis(100));
    let (s, _) = stalled_download(server.addr);
    let start = Instant::now();
    loop {
        // Reading nothing (the buffered response would come before the reset): the socket's
        // pending error tells the reset.
        if rustix::net::sockopt::socket_error(&s).unwrap().is_err() {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "never closed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(500),
        "closed after {waited:?}"
    );
    // A download that keeps reading, however slowly, is not cut.
    let mut s = server.connect();
    get(&mut s, "/big");
    let mut r = BufReader::new(s);
    let mut got = 0;
    let mut buf = vec![0u8; 1 << 20];
    let start = Instant::now();
    while got < 8 << 20 {
        let n = r.read(&mut buf).unwrap();
        assert!(n > 0, "cut after {got} bytes");
        got += n;
        if start.elapsed() < Duration::from_millis(1500) {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let (cut, snap) = server.finish();
    assert_eq!((cut, snap.http.connections_open), (0, 0));
}

/// Reads what the server sends until it closes the connection (bounded by the read timeout).
fn read_to_close(r: &mut impl Read) -> Vec<u8> {
    let mut rest = Vec::new();
    r.read_to_end(&mut rest)
        .expect("the server closes the connection");
    rest
}

#[test]
fn a_request_line_over_the_head_limit_gets_414_and_a_header_over_it_431() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let uri = |len: usize| format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "u".repeat(len));
    // nginx answers a request line that does not fit its buffer with 414, not 431.
    let mut s = server.connect();
    s.write_all(uri(17 * 1000).as_bytes()).unwrap();
    let mut r = BufReader::new(s);
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!(reply.status, 414);
    assert!(reply.closes(), "{:?}", reply.headers);
    assert!(read_to_close(&mut r).is_empty());
    // A long URI that fits is served; a header over the limit is still 431.
    assert_eq!(status_of(&server, uri(16_000).as_bytes()), 200);
    let big_header = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "a".repeat(17 * 1000)
    );
    assert_eq!(status_of(&server, big_header.as_bytes()), 431);
    // A keep-alive connection's later request is checked from its own start.
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    s.write_all(uri(10_000).as_bytes()).unwrap();
    assert_eq!(read_reply(&mut r, false).unwrap().status, 200);
    s.write_all(uri(10_000).as_bytes()).unwrap();
    assert_eq!(read_reply(&mut r, false).unwrap().status, 200);
    let (_, snap) = server.finish();
    assert_eq!(snap.http.responses_by_class[3], 2, "the 414 and the 431");
}

/// A request line that is too long in the very first read of its head, with nothing in hyper's
/// buffer yet (a head limit no larger than hyper's first read; a keep-alive connection whose
/// earlier large body grew hyper's reads), still gets its 414: hyper takes a read error on an
/// empty buffer for the peer's close, and answered nothing.
#[test]
fn a_request_line_too_long_in_the_heads_first_read_gets_414() {
    let uri = |len: usize| format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "u".repeat(len));
    let server = TestServer::start(
        Config {
            max_header_bytes: 8192,
            ..Config::default()
        },
        Duration::from_secs(1),
    );
    let mut s = server.connect();
    s.write_all(uri(9000).as_bytes()).unwrap();
    let reply = read_reply(&mut BufReader::new(s), false).unwrap();
    assert_eq!(reply.status, 414);
    let (_, snap) = server.finish();
    assert_eq!(snap.http.responses_by_class[3], 1);
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let body = vec![b'b'; 512 * 1024];
    let head = format!(
        "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&body).unwrap();
    assert_eq!(read_reply(&mut r, false).unwrap().status, 200);
    std::thread::sleep(Duration::from_millis(50)); // the echo's end read before the next head
    s.write_all(uri(40_000).as_bytes()).unwrap();
    assert_eq!(read_reply(&mut r, false).unwrap().status, 414);
}

/// A handler that answers without reading the request's body (an early 405): a short rest of
/// known length is discarded; one over 64 KiB, or one an `Expect: 100-continue` waits to be
/// asked for, leaves hyper a body nobody takes: it closes the connection after the response
/// (unless the rest of the body happens to be in its buffer), so the response says so. (A
/// chunked one: the tests after this one.)
#[test]
fn an_unread_body_is_discarded_when_short_and_otherwise_the_response_says_connection_close() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    for head in [
        "PUT / HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\nExpect: 100-continue\r\n\r\n",
        // Every `Expect` Node reads as 100-continue waits the same (a discard would take the
        // next request for the body).
        "PUT / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\nExpect: 100-continue, x\r\n\r\n",
        "PUT / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\nExpect: foo\r\nExpect: 100-continue\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100000\r\n\r\n",
    ] {
        let mut s = server.connect();
        s.write_all(head.as_bytes()).unwrap();
        let mut r = BufReader::new(s);
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!(reply.status, 200, "{head:?}: no 100 Continue first");
        assert!(reply.closes(), "{head:?}: {:?}", reply.headers);
        assert!(read_to_close(&mut r).is_empty(), "{head:?}");
    }
    // A short unread body of known length, sent after the answer came, is read and discarded:
    // the connection serves the next request (hyper alone would have closed it).
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    s.write_all(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
        .unwrap();
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!(reply.status, 200);
    assert!(!reply.closes(), "{:?}", reply.headers);
    s.write_all(&[b'x'; 1000]).unwrap();
    get(&mut s, "/");
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hello"[..]));
    // A body the handler reads to its end (by length, or chunked) keeps the connection.
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
        .unwrap();
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hello"[..]));
    assert!(!reply.closes(), "{:?}", reply.headers);
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        .unwrap();
    s.write_all(b"2\r\nhi\r\n0\r\n\r\n").unwrap();
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hi"[..]));
    assert!(!reply.closes(), "{:?}", reply.headers);
    get(&mut s, "/");
    assert_eq!(read_reply(&mut r, false).unwrap().status, 200);
}

/// A request that says `Expect: 100-continue` gets `100 Continue` once its handler reads its
/// body, and not before: the client sends the body only then, and the connection serves on.
#[test]
fn an_expect_100_continue_body_is_asked_for_when_the_handler_reads_it() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    s.write_all(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    )
    .unwrap();
    let mut interim = [0u8; 25];
    r.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(b"hello").unwrap();
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hello"[..]));
    assert!(!reply.closes(), "{:?}", reply.headers);
    get(&mut s, "/");
    assert_eq!(read_reply(&mut r, false).unwrap().status, 200);
}

/// A response body of many small chunks ready at once is written 16 segments at a time, as
/// hyper writes it: the queue is never walked whole, so a large output buffer (a large head
/// limit) does not make each chunk cost more than the last (the read timeout catches a server
/// that takes minutes).
#[test]
fn a_body_of_many_tiny_chunks_streams_in_time_with_a_large_buffer() {
    let config = Config {
        max_header_bytes: 1 << 20,
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    get(&mut s, "/tiny-chunks");
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body.len(), 200_000);
    assert!(reply.body.iter().all(|&b| b == b'x'));
}

/// A chunked response's trailers are sent when the request said `TE: trailers` and the
/// response's `Trailer` header names them (hyper's rule); otherwise the body ends without them.
#[test]
fn trailers_a_response_announces_are_sent_to_a_client_that_takes_them() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    for (te, end) in [
        ("TE: trailers\r\n", &b"0\r\nx-checksum: abc\r\n\r\n"[..]),
        ("", &b"0\r\n\r\n"[..]),
    ] {
        let mut s = server.connect();
        write!(
            s,
            "GET /trailers HTTP/1.1\r\nHost: t\r\n{te}Connection: close\r\n\r\n"
        )
        .unwrap();
        let raw = read_to_close(&mut s);
        let body = [&b"5\r\nhello\r\n"[..], end].concat();
        assert!(raw.ends_with(&body), "{te:?}: {}", raw.escape_ascii());
    }
}

/// A handler that answers at once and gives the request's body to a task of its own, which
/// reads it later: the connection waits for the body to be read, then serves the request
/// pipelined behind it (as hyper's did), and the response does not say `Connection: close`.
#[test]
fn a_body_read_by_another_task_after_the_answer_keeps_the_connection() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    s.write_all(b"POST /read-later HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
        .unwrap();
    get(&mut s, "/");
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!((reply.status, reply.body.as_slice()), (202, &b"later"[..]));
    assert!(!reply.closes(), "{:?}", reply.headers);
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hello"[..]));
}

/// One chunk of a chunked body.
fn chunk(data: &[u8]) -> Vec<u8> {
    let mut c = format!("{:x}\r\n", data.len()).into_bytes();
    c.extend_from_slice(data);
    c.extend_from_slice(b"\r\n");
    c
}

/// A request in a body's bytes: what a smuggling attempt hopes the server reads as a request.
const SMUGGLED: &[u8] = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n";

/// A chunked POST's head.
const CHUNKED_POST: &[u8] = b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";

/// Reads until the server closes the connection (an EOF, or the reset of a close with input
/// unread), within the read timeout; what came before.
fn read_until_closed(r: &mut impl Read) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the connection did not close: {e} (after {got:?})"),
        }
    }
}

/// A chunked body the handler lets go of unread is read and discarded, as one of known length
/// is, when it ends within 64 KiB of body data: the response keeps the connection, which serves
/// the next request; the body's bytes are never read as a request, whatever they look like.
#[test]
fn an_unread_chunked_body_within_64_kib_is_discarded_and_the_connection_serves_on() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    // The whole body with its head (in hyper's buffer when the handler answers).
    let mut request = CHUNKED_POST.to_vec();
    request.extend(chunk(SMUGGLED));
    request.extend_from_slice(b"0\r\n\r\n");
    s.write_all(&request).unwrap();
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hello"[..]));
    assert!(!reply.closes(), "{:?}", reply.headers);
    // The body after the answer came: 62 KiB of it in 1 KiB chunks that are requests over
    // and over, a chunk extension, and trailers.
    s.write_all(CHUNKED_POST).unwrap();
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!(reply.status, 200);
    assert!(!reply.closes(), "{:?}", reply.headers);
    let data: Vec<u8> = SMUGGLED.iter().copied().cycle().take(1024).collect();
    let mut body = Vec::new();
    for _ in 0..62 {
        body.extend(chunk(&data));
    }
    body.extend_from_slice(b"4;ext=1\r\nGET \r\n0\r\nX-Trailer: GET /x HTTP/1.1\r\n\r\n");
    s.write_all(&body).unwrap();
    // The next answers are those of the next requests: none to a request in the body.
    for _ in 0..2 {
        get(&mut s, "/");
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hello"[..]));
        assert!(!reply.closes(), "{:?}", reply.headers);
    }
}

/// A discard has bounds (Node's reads any amount): a chunked body with more than 64 KiB
/// (or more than `max_body_bytes`) of data still to come, or a malformed chunk, ends the
/// connection after the response (whose head, written before the body's size was known, may
/// have promised keep-alive: the close is still clean, after the whole response), and the rest
/// of the body is never read as a request.
#[test]
fn an_unread_chunked_body_past_its_bounds_or_malformed_ends_the_connection_after_the_response() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let small = TestServer::start(
        Config {
            max_body_bytes: 1024,
            ..Config::default()
        },
        Duration::from_secs(1),
    );
    // 100 KiB of requests in a body (8 KiB to the server whose body limit is 1 KiB), then its
    // end and a request of its own after it. hyper, told the body is not wanted, decodes at most one more
    // chunk of what it has (`poll_drain_or_close_read`): the end is always more than one chunk
    // away, so the connection closes with nothing after it read.
    let data: Vec<u8> = SMUGGLED.iter().copied().cycle().take(1024).collect();
    for (server, chunks) in [(&server, 100), (&small, 8)] {
        let mut s = server.connect();
        let mut r = BufReader::new(s.try_clone().unwrap());
        s.write_all(CHUNKED_POST).unwrap();
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hello"[..]));
        let mut body = Vec::new();
        for _ in 0..chunks {
            body.extend(chunk(&data));
        }
        body.extend_from_slice(b"0\r\n\r\n");
        body.extend_from_slice(SMUGGLED);
        // The server may close (and reset) before it has all of it.
        let _ = s.write_all(&body);
        let rest = read_until_closed(&mut r);
        assert!(
            rest.is_empty(),
            "{chunks} KiB: {:?}",
            String::from_utf8_lossy(&rest)
        );
    }
    // A malformed chunk, after the response said keep-alive (the body's end was to come).
    for bad in [&b"cde\r\nzz\r\n"[..], b"cdeXY0\r\n\r\n", b"cde\r\n-1\r\n"] {
        let mut s = server.connect();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut request = CHUNKED_POST.to_vec();
        request.extend_from_slice(b"5\r\nab");
        s.write_all(&request).unwrap();
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!(reply.status, 200);
        assert!(!reply.closes(), "{:?}", reply.headers);
        let mut rest = bad.to_vec();
        rest.extend_from_slice(SMUGGLED);
        let _ = s.write_all(&rest);
        let rest = read_until_closed(&mut r);
        assert!(
            rest.is_empty(),
            "{bad:?}: {:?}",
            String::from_utf8_lossy(&rest)
        );
    }
}

/// A line feed without its CR in a chunked body's trailer section, which hyper's decoder takes
/// for a byte of a trailer line (reading on, the next request included, to a CR LF CR LF), fails
/// the body's read as Node refuses it: the handler reading the body sees the error, the
/// connection closes after its answer, and the request after the bare line feed is never
/// answered, whether the body came with its head, after the answer (the discard of a body the
/// handler let go of), or split in several reads, with h2c on (whose first reads are followed
/// before hyper's HTTP/1 side waits for a head) or not.
#[test]
fn a_bare_line_feed_in_a_chunked_bodys_trailers_fails_the_body_and_nothing_after_it_is_served() {
    for http2 in [false, true] {
        let config = Config {
            http2,
            ..Config::default()
        };
        bare_line_feeds_in_trailers_fail_the_body(&TestServer::start(
            config,
            Duration::from_secs(1),
        ));
    }
}

fn bare_line_feeds_in_trailers_fail_the_body(server: &TestServer) {
    let echo = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    for trailers in [
        &b"0\r\n\n"[..],
        b"0\r\nX: y\n\r\n",
        b"0\r\nX: y\r\nZ: w\n\r\n\r\n",
    ] {
        let what = String::from_utf8_lossy(trailers);
        // The handler reads the body: its read fails, and its answer is the connection's last.
        let whole = [&echo[..], &chunk(b"hello"), trailers, SMUGGLED].concat();
        let body_at = echo.len();
        for split in [
            None,
            Some(body_at),
            Some(body_at + 9),
            Some(whole.len() - SMUGGLED.len() - 1),
        ] {
            let mut s = server.connect();
            s.set_nodelay(true).unwrap();
            match split {
                None => s.write_all(&whole).unwrap(),
                Some(at) => {
                    s.write_all(&whole[..at]).unwrap();
                    std::thread::sleep(Duration::from_millis(30));
                    // The server may have closed already.
                    let _ = s.write_all(&whole[at..]);
                }
            }
            let mut r = BufReader::new(s);
            let reply = read_reply(&mut r, false).unwrap();
            assert_eq!(reply.status, 400, "{what} split at {split:?}");
            let body = String::from_utf8_lossy(&reply.body);
            assert!(body.contains("line feed without its CR"), "{what}: {body}");
            let rest = read_until_closed(&mut r);
            assert!(
                rest.is_empty(),
                "{what} split at {split:?}: {}",
                String::from_utf8_lossy(&rest)
            );
        }
        // The handler answers without reading it: the body's discard fails, and the connection
        // closes after the answer.
        let mut s = server.connect();
        let mut r = BufReader::new(s.try_clone().unwrap());
        s.write_all(CHUNKED_POST).unwrap();
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hello"[..]));
        let _ = s.write_all(&[&chunk(b"hello"), trailers, SMUGGLED].concat());
        let rest = read_until_closed(&mut r);
        assert!(
            rest.is_empty(),
            "{what}: {}",
            String::from_utf8_lossy(&rest)
        );
    }
    // Trailers with their CRs, and bare line feeds in chunk data, are a body like any other.
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let body = [&echo[..], &chunk(b"a\nb\n\n"), b"0\r\nX: y\r\n\r\n"].concat();
    s.write_all(&body).unwrap();
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!(
        (reply.status, reply.body.as_slice()),
        (200, &b"a\nb\n\n"[..])
    );
    assert!(!reply.closes(), "{:?}", reply.headers);
    s.write_all(SMUGGLED).unwrap();
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!(
        (reply.status, reply.body.as_slice()),
        (200, &b"smuggled"[..])
    );
}

/// Chunk framing Node refuses and hyper takes (a space or tab after a chunk size, a chunk
/// extension llhttp's strict grammar refuses, a `Content-Length` or `Transfer-Encoding` trailer
/// field) fails the body's read: the answer is the connection's last, and the request pipelined
/// after the body is never answered, whether the handler reads the body or lets go of it.
#[test]
fn chunk_framing_node_refuses_fails_the_body_and_a_pipelined_request_is_never_served() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let echo = b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n";
    let smuggled = b"GET /smuggled HTTP/1.1\r\nHost: t\r\n\r\n";
    for (body, error) in [
        (&b"5 \r\nhello\r\n0\r\n\r\n"[..], "malformed chunked body"),
        (b"5\t\r\nhello\r\n0\r\n\r\n", "malformed chunked body"),
        (b"5; a=b\r\nhello\r\n0\r\n\r\n", "malformed chunked body"),
        (b"5;a=\"b\r\nhello\r\n0\r\n\r\n", "malformed chunked body"),
        (
            b"5\r\nhello\r\n0\r\nContent-Length: 5\r\n\r\n",
            "trailer section",
        ),
    ] {
        let what = String::from_utf8_lossy(body);
        // The handler reads the body: its read fails.
        let mut s = server.connect();
        let mut r = BufReader::new(s.try_clone().unwrap());
        s.write_all(&[&echo[..], body, smuggled].concat()).unwrap();
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!(reply.status, 400, "{what}");
        let text = String::from_utf8_lossy(&reply.body);
        assert!(text.contains(error), "{what}: {text}");
        let rest = read_until_closed(&mut r);
        assert!(
            rest.is_empty(),
            "{what}: {}",
            String::from_utf8_lossy(&rest)
        );
        // The handler answers without reading it: its discard fails.
        let mut s = server.connect();
        let mut r = BufReader::new(s.try_clone().unwrap());
        s.write_all(CHUNKED_POST).unwrap();
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hello"[..]));
        let _ = s.write_all(&[body, smuggled].concat());
        let rest = read_until_closed(&mut r);
        assert!(
            rest.is_empty(),
            "{what}: {}",
            String::from_utf8_lossy(&rest)
        );
    }
    // Extensions and trailers Node takes are a body like any other.
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let body = b"5;a=\"x y\";b\r\nhello\r\n0;ext=1\r\nX-Check: 1\r\n\r\n";
    s.write_all(&[&echo[..], body, smuggled].concat()).unwrap();
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hello"[..]));
    assert!(!reply.closes(), "{:?}", reply.headers);
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hello"[..]));
}

/// A discard is bounded in time too: a body whose rest does not come (a stall), or comes too
/// slowly (one byte at a time, each within the keep-alive timeout, which alone would never
/// fire), is given up at the keep-alive timeout after its handler let go of it, and the
/// connection closes.
#[test]
fn an_unread_body_that_stalls_or_trickles_is_given_up_at_the_keep_alive_timeout() {
    let config = Config {
        keep_alive_timeout: Duration::from_millis(500),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let stalled: &[u8] = b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab";
    // A chunk of 64 KiB - 1 bytes begun: trickled bytes are its data.
    let chunked: &[u8] =
        b"POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nffff\r\n";
    let sized: &[u8] = b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n";
    for (head, trickle) in [
        (stalled, false),
        (chunked, false),
        (chunked, true),
        (sized, false),
        (sized, true),
    ] {
        let mut s = server.connect();
        let mut r = BufReader::new(s.try_clone().unwrap());
        s.write_all(head).unwrap();
        let start = Instant::now();
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!(reply.status, 200);
        assert!(!reply.closes(), "{:?}", reply.headers);
        let stop = Arc::new(AtomicBool::new(false));
        let writer = trickle.then(|| {
            let (mut s, stop) = (s.try_clone().unwrap(), stop.clone());
            std::thread::spawn(move || {
                // 1000 bytes, one each 50 ms: 50 s unless the server gives up.
                for _ in 0..1000 {
                    if stop.load(Ordering::Acquire) || s.write_all(b"x").is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        });
        let rest = read_until_closed(&mut r);
        let waited = start.elapsed();
        stop.store(true, Ordering::Release);
        if let Some(w) = writer {
            w.join().unwrap();
        }
        assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
        let shown = String::from_utf8_lossy(head);
        assert!(
            waited >= Duration::from_millis(250) && waited < Duration::from_secs(5),
            "{shown:?} (trickle: {trickle}): closed after {waited:?}"
        );
    }
}

/// What `Config::on_response` was told in
/// `on_response_reports_each_answer_with_the_body_bytes_the_socket_took`: status, start line,
/// body bytes.
/// Status, start line, body bytes, complete.
type Answer = (u16, String, u64, bool);

static ANSWERED: std::sync::Mutex<Vec<Answer>> = std::sync::Mutex::new(Vec::new());

fn record_answered(a: &nodus_http::Answered<'_>) {
    let r = a.request;
    let line = format!("{} {} {:?}", r.method, r.path, r.version);
    ANSWERED
        .lock()
        .unwrap()
        .push((a.status.as_u16(), line, a.body_bytes, a.complete));
}

/// Waits (10 s at most) until `on_response` has been told of `n` answers; takes them.
fn answered(n: usize) -> Vec<Answer> {
    let start = Instant::now();
    loop {
        let mut got = ANSWERED.lock().unwrap();
        if got.len() >= n {
            return std::mem::take(&mut *got);
        }
        drop(got);
        assert!(start.elapsed() < Duration::from_secs(10), "no {n} answers");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An access log's BYTES: the body bytes the socket took, none for `HEAD`, no chunk framing; and
/// for a download its client went away from, exactly what was written of it before the write
/// that failed: the bytes the server's socket took for the connection, less the head. (Counted
/// as the body handed to hyper, it would be the whole 8 MiB: hyper takes it in one chunk.)
#[test]
fn on_response_reports_each_answer_with_the_body_bytes_the_socket_took() {
    let config = || Config {
        on_response: Some(record_answered),
        ..Config::default()
    };
    let server = TestServer::start(config(), Duration::from_secs(1));
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    for (method, path) in [("GET", "/"), ("HEAD", "/"), ("GET", "/stream")] {
        write_request(&mut s, method, path, &[]).unwrap();
        assert_eq!(read_reply(&mut r, method == "HEAD").unwrap().status, 200);
    }
    assert_eq!(
        answered(3),
        [
            (200, "GET / HTTP/1.1".to_owned(), 5, true),
            (200, "HEAD / HTTP/1.1".to_owned(), 0, true),
            (200, "GET /stream HTTP/1.1".to_owned(), 6, true),
        ]
    );
    drop(server);
    // Alone on its server (whose byte counter is then this connection's): a client with a
    // small receive buffer reads the start of an 8 MiB body, then resets the connection.
    let server = TestServer::start(config(), Duration::from_secs(1));
    let (s, head) = stalled_download(server.addr);
    rustix::net::sockopt::set_socket_linger(&s, Some(Duration::ZERO)).unwrap();
    drop(s);
    let [(status, line, bytes, complete)] = <[_; 1]>::try_from(answered(1)).unwrap();
    assert_eq!(
        (status, line.as_str(), complete),
        (200, "GET /big HTTP/1.1", false)
    );
    let (_, snap) = server.finish();
    assert_eq!(bytes, snap.http.bytes_sent_total - head, "head {head}");
    assert!(bytes >= 8 * 1024 - head && bytes < 8 << 20, "{bytes}");
}

/// HTTP/1.0 has no chunked coding: a body of no known length ends with the connection, so the
/// answer to a keep-alive request says `Connection: close` (as nginx), not `keep-alive`.
#[test]
fn an_http_1_0_response_of_unknown_length_says_connection_close_and_ends_the_connection() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let mut s = server.connect();
    s.write_all(b"GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        .unwrap();
    let reply = read_reply(&mut BufReader::new(s), false).unwrap();
    assert_eq!((reply.status, reply.body.as_slice()), (200, &b"stream"[..]));
    assert!(reply.closes(), "{:?}", reply.headers);
    assert_eq!(reply.header("content-length"), None);
    // One of known length keeps the connection, as the client asked.
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    for _ in 0..2 {
        s.write_all(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .unwrap();
        let reply = read_reply(&mut r, false).unwrap();
        assert_eq!((reply.status, reply.body.as_slice()), (200, &b"hello"[..]));
        assert_eq!(reply.header("connection"), Some("keep-alive"));
    }
    // To HTTP/1.1 the same body is chunked, and the connection stays.
    let mut s = server.connect();
    let mut r = BufReader::new(s.try_clone().unwrap());
    get(&mut s, "/stream");
    let reply = read_reply(&mut r, false).unwrap();
    assert_eq!(reply.body, b"stream");
    assert!(!reply.closes(), "{:?}", reply.headers);
}

/// What `Config::on_refused` was told in
/// `a_request_whose_connection_ends_before_its_handler_answers_is_reported_as_499`.
static UNANSWERED: std::sync::Mutex<Vec<Report>> = std::sync::Mutex::new(Vec::new());

fn record_unanswered(r: &nodus_http::Refused<'_>) {
    UNANSWERED.lock().unwrap().push(report(r));
}

/// An access log has a line for a request whose handler never answered: nginx's 499.
#[test]
fn a_request_whose_connection_ends_before_its_handler_answers_is_reported_as_499() {
    let config = Config {
        on_refused: Some(record_unanswered),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_millis(50));
    let mut answered = server.connect();
    get(&mut answered, "/");
    assert_eq!(
        read_reply(&mut BufReader::new(answered), false)
            .unwrap()
            .status,
        200
    );
    let mut slow = server.connect();
    get(&mut slow, "/slow?q=1");
    std::thread::sleep(Duration::from_millis(50));
    let (cut, _) = server.finish();
    assert_eq!(cut, 1);
    let reported = std::mem::take(&mut *UNANSWERED.lock().unwrap());
    assert_eq!(
        reported,
        [(499, Some("GET /slow HTTP/1.1".to_owned()), true, true, 0)]
    );
}

/// Writes `data` in 64 KiB pieces 10 ms apart: a client still sending when the answer comes.
fn send_slowly(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    for piece in data.chunks(64 * 1024) {
        s.write_all(piece)?;
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Reads a whole response, then the end of the connection: an EOF, not a reset.
fn read_reply_then_eof(r: &mut impl std::io::BufRead) -> Reply {
    let reply = read_reply(r, false).expect("the whole response");
    let mut rest = Vec::new();
    r.read_to_end(&mut rest)
        .expect("an EOF after the response, not a reset");
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    reply
}

/// A POST of 1 MiB that `/` answers without reading: over the discard's 64 KiB, so the
/// connection closes after the answer while the client is still sending.
const UNREAD_POST: &[u8] = b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1048576\r\n\r\n";

/// A handler answers without reading a 1 MiB body, and the connection closes after the answer
/// while the client, slower, is still sending the body, and has read little of the answer (its
/// receive buffer is small, the rest waits in the server's send buffer): the server shuts down
/// its write side and reads on (a lingering close, RFC 9112 section 9.6), so the client's writes
/// go through and it then reads the whole response and an EOF. A close with the client's input
/// unread would have reset the connection, the rest of the response discarded with it. (With
/// `http2` too: an HTTP/1 connection of the sniffing server lingers the same.)
#[test]
fn a_client_still_sending_a_body_left_unread_gets_the_whole_response_and_an_eof() {
    for http2 in [false, true] {
        let config = Config {
            http2,
            ..Config::default()
        };
        let server = TestServer::start(config, Duration::from_secs(1));
        let mut s = connect_small_window(server.addr);
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"POST /128k HTTP/1.1\r\nHost: t\r\nContent-Length: 1048576\r\n\r\n")
            .unwrap();
        // The answer is written, and the server done with the connection, before the body
        // starts.
        std::thread::sleep(Duration::from_millis(100));
        send_slowly(&mut s, &[b'b'; 1 << 20])
            .unwrap_or_else(|e| panic!("http2: {http2}: the server reads what is sent: {e}"));
        let reply = read_reply_then_eof(&mut BufReader::new(s));
        assert_eq!((reply.status, reply.body.len()), (200, 128 << 10));
        assert!(reply.closes(), "{:?}", reply.headers);
        let (cut, snap) = server.finish();
        assert_eq!((cut, snap.http.connections_open), (0, 0));
    }
}

/// A client pipelines a request (a POST of 64 KiB: more than the server reads with the first)
/// behind one after which the connection closes because the request asked for it
/// (`Connection: close`, HTTP/1.0) or the handler's response did, and has read little of the
/// answer (its receive buffer is small, the rest waits in the server's send buffer): the server
/// lingers, and the client reads the whole response and an EOF. A close with the pipelined
/// request unread would have reset the connection, the rest of the response discarded with it.
#[test]
fn a_close_the_client_or_the_handler_asked_for_lingers_for_a_request_pipelined_behind_it() {
    let mut pipelined = b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 65536\r\n\r\n".to_vec();
    pipelined.extend_from_slice(&[b'b'; 64 << 10]);
    for http2 in [false, true] {
        let config = Config {
            http2,
            ..Config::default()
        };
        let server = TestServer::start(config, Duration::from_secs(1));
        for first in [
            &b"GET /128k HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"[..],
            b"GET /128k HTTP/1.0\r\n\r\n",
            b"GET /128k-close HTTP/1.1\r\nHost: t\r\n\r\n",
        ] {
            let what = format!(
                "http2: {http2}: {}",
                String::from_utf8_lossy(first).lines().next().unwrap()
            );
            let mut s = connect_small_window(server.addr);
            s.write_all(&[first, &pipelined[..]].concat()).unwrap();
            // The server is done with the connection before the client reads.
            std::thread::sleep(Duration::from_millis(100));
            let mut r = BufReader::new(s);
            let reply = read_reply(&mut r, false).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!((reply.status, reply.body.len()), (200, 128 << 10), "{what}");
            let mut rest = Vec::new();
            r.read_to_end(&mut rest)
                .unwrap_or_else(|e| panic!("{what}: an EOF after the response: {e}"));
            assert!(rest.is_empty(), "{what}");
        }
        let (cut, snap) = server.finish();
        assert_eq!((cut, snap.http.connections_open), (0, 0));
    }
}

/// The refusals written before the handler while the rest of the request is on its way (413 to
/// a declared length over the limit, 431 to a head over it, 414 to a request line over it)
/// reach a client that keeps sending, as in the test above.
#[test]
fn a_refusal_reaches_a_client_still_sending_its_request() {
    let server = TestServer::start(Config::default(), Duration::from_secs(1));
    let too_large = format!(
        "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        8 << 20
    );
    for (start, status) in [
        (too_large.as_str(), 413),
        ("GET / HTTP/1.1\r\nHost: t\r\nX-Big: ", 431),
        ("GET /", 414),
    ] {
        let mut s = server.connect();
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(start.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        // 1 MiB more: of the body, or of the head's header or request line.
        send_slowly(&mut s, &[b'a'; 1 << 20])
            .unwrap_or_else(|e| panic!("{status}: the server reads what the client sends: {e}"));
        let reply = read_reply_then_eof(&mut BufReader::new(s));
        assert_eq!(reply.status, status);
    }
    let (cut, snap) = server.finish();
    assert_eq!((cut, snap.http.connections_open), (0, 0));
    assert_eq!(snap.http.responses_by_class[3], 3);
}

/// A client that never closes: the lingering connection is cut after `lingering_timeout`
/// without input, or `lingering_time` in all for one that keeps sending.
#[test]
fn a_lingering_connection_is_cut_at_its_bounds_when_the_client_never_closes() {
    let config = Config {
        lingering_time: Duration::from_millis(1200),
        lingering_timeout: Duration::from_millis(400),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    // Silent after the answer.
    let mut s = server.connect();
    s.write_all(UNREAD_POST).unwrap();
    s.write_all(&[b'b'; 64 * 1024]).unwrap();
    let reply = read_reply_then_eof(&mut BufReader::new(s.try_clone().unwrap()));
    assert_eq!(reply.status, 200);
    let start = Instant::now();
    server.wait_open(1);
    server.wait_open(0);
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "a silent client was cut after {waited:?}"
    );
    // Sending a little every 100 ms, never closing.
    let mut trickling = server.connect();
    trickling.write_all(UNREAD_POST).unwrap();
    let mut r = BufReader::new(trickling.try_clone().unwrap());
    assert_eq!(read_reply_then_eof(&mut r).status, 200);
    let start = Instant::now();
    // The first write after the server's close draws a reset, a later one fails.
    while trickling.write_all(b"b").is_ok() {
        assert!(start.elapsed() < Duration::from_secs(5), "never cut");
        std::thread::sleep(Duration::from_millis(100));
    }
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(1000),
        "a trickling client was cut after {waited:?}"
    );
    let (cut, snap) = server.finish();
    assert_eq!((cut, snap.http.connections_open), (0, 0));
    drop(s);
}

/// A lingering connection is on the server's books (it counts toward `max_connections`, and a
/// drain waits for it) and ends by the drain's deadline, having lost nothing.
#[test]
fn a_drain_ends_a_lingering_connection_by_its_deadline() {
    let config = Config {
        lingering_time: Duration::from_secs(60),
        lingering_timeout: Duration::from_secs(60),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_millis(500));
    let mut s = server.connect();
    s.write_all(UNREAD_POST).unwrap();
    let reply = read_reply_then_eof(&mut BufReader::new(s.try_clone().unwrap()));
    assert_eq!(reply.status, 200);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        server.open.load(Ordering::Acquire),
        1,
        "the connection lingers"
    );
    let start = Instant::now();
    let (cut, snap) = server.finish();
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(3),
        "the drain took {took:?}"
    );
    assert_eq!((cut, snap.http.connections_open), (0, 0));
    drop(s);
}

/// What the hooks were told in
/// `an_http2_client_that_goes_away_while_its_handler_works_is_reported_as_499`.
static GONE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn record_gone_refused(r: &nodus_http::Refused<'_>) {
    GONE.lock()
        .unwrap()
        .push(format!("refused {:?}", report(r)));
}

fn record_gone_answered(a: &nodus_http::Answered<'_>) {
    let r = a.request;
    let status = a.status.as_u16();
    GONE.lock().unwrap().push(format!(
        "answered {status} {} {} {:?}",
        r.method, r.path, r.version
    ));
}

/// An HTTP/2 frame: its header (length, type, flags, stream) and payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An h2c connection (prior knowledge) whose stream 1 is `GET /slow`, its head and end sent.
fn h2_get_slow(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    // HPACK: :method GET, :scheme http, :path "/slow", :authority "t".
    let block = [&[0x82, 0x86, 0x44, 5][..], b"/slow", &[0x41, 1], b"t"].concat();
    // HEADERS, END_STREAM | END_HEADERS.
    out.extend(h2_frame(1, 0x5, 1, &block));
    s.write_all(&out).unwrap();
    s
}

/// An HTTP/2 client that goes away while its request's handler is at work (it closes the
/// connection, resets it, or resets the stream) gets its request reported as 499, not counted as
/// a response, and the handler's future dropped. (Over HTTP/1 a client's close while its handler
/// works cannot be told from a half-close, which is answered: the server module's docs.)
#[test]
fn an_http2_client_that_goes_away_while_its_handler_works_is_reported_as_499() {
    let config = Config {
        http2: true,
        on_refused: Some(record_gone_refused),
        on_response: Some(record_gone_answered),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    for case in ["close", "reset", "stream reset"] {
        let mut s = h2_get_slow(server.addr);
        std::thread::sleep(Duration::from_millis(50));
        // Read what the server sent (its SETTINGS), so that the close is a FIN.
        s.set_nonblocking(true).unwrap();
        while matches!(s.read(&mut [0u8; 4096]), Ok(n) if n > 0) {}
        match case {
            "reset" => {
                let fd = std::os::fd::AsFd::as_fd(&s);
                rustix::net::sockopt::set_socket_linger(fd, Some(Duration::ZERO)).unwrap();
            }
            // RST_STREAM, CANCEL; the connection stays open until the handler would have answered.
            "stream reset" => s
                .write_all(&h2_frame(3, 0, 1, &8u32.to_be_bytes()))
                .unwrap(),
            _ => {}
        }
        let open = (case == "stream reset").then_some(s);
        // The handler would answer 300 ms after the request.
        std::thread::sleep(Duration::from_millis(500));
        let reported = std::mem::take(&mut *GONE.lock().unwrap());
        let expected = r#"refused (499, Some("GET /slow HTTP/2.0"), true, true, 0)"#;
        assert_eq!(reported, [expected], "{case}");
        drop(open);
    }
    let (cut, snap) = server.finish();
    assert_eq!((cut, snap.http.requests_in_flight), (0, 0));
    assert_eq!(snap.http.responses_by_class, [0; 5], "nothing was answered");
}

/// The response bodies of client streams 1, 3, 5, ... (`streams` of them), read from DATA frames
/// until each has ended.
fn h2_response_bodies(s: &mut TcpStream, streams: usize) -> Vec<Vec<u8>> {
    let mut bodies = vec![Vec::new(); streams];
    let mut ended = 0;
    while ended < streams {
        let (kind, flags, stream, payload) = read_h2_frame(s).expect("every answer");
        if kind == 0 && stream % 2 == 1 {
            bodies[(stream as usize - 1) / 2].extend(payload);
            ended += usize::from(flags & 1 != 0);
        }
    }
    bodies
}

/// Reads one HTTP/2 frame: its type, flags, stream and payload.
fn read_h2_frame(r: &mut impl Read) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    r.read_exact(&mut head)?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok((head[3], head[4], stream, payload))
}

/// Reads frames until one of type `kind` (answering PINGs on the way); the types read before it.
/// `None`: until the server closes the connection.
fn h2_frames_until(s: &mut TcpStream, kind: Option<u8>) -> Vec<u8> {
    let mut seen = Vec::new();
    loop {
        let (t, flags, _, payload) = match read_h2_frame(s) {
            Ok(frame) => frame,
            Err(e) if kind.is_none() && e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return seen;
            }
            Err(e) => panic!("no frame of type {kind:?} (seen {seen:?}): {e}"),
        };
        if t == 6 && flags & 1 == 0 {
            s.write_all(&h2_frame(6, 1, 0, &payload)).unwrap();
        }
        if Some(t) == kind {
            return seen;
        }
        seen.push(t);
    }
}

/// A drain sends GOAWAY to every HTTP/2 connection when it begins: one that has sent no
/// request yet (it then closes, long before the deadline), and one with a request in flight,
/// before that request's answer, which still comes.
#[test]
fn a_drain_sends_goaway_at_once_to_every_http2_connection() {
    let config = Config {
        http2: true,
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(20));
    let mut idle = server.connect();
    let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    preface.extend(h2_frame(4, 0, 0, &[]));
    idle.write_all(&preface).unwrap();
    let mut busy = h2_get_slow(server.addr);
    busy.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    server.wait_open(2);
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    server.drain.store(true, Ordering::Release);
    // GOAWAY (type 7) comes before the response's HEADERS (type 1): at the drain's start.
    let before = h2_frames_until(&mut busy, Some(7));
    assert!(!before.contains(&1), "GOAWAY after the answer: {before:?}");
    let rest = h2_frames_until(&mut busy, Some(0));
    assert!(
        rest.contains(&1),
        "the request in flight is answered: {rest:?}"
    );
    h2_frames_until(&mut idle, Some(7));
    // The idle one, told to go away (its PING answered), is closed by the server.
    h2_frames_until(&mut idle, None);
    drop(busy);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    let (cut, snap) = server.finish();
    assert_eq!((cut, snap.http.connections_open), (0, 0));
}

/// Whether the server ends the connection (a close or a reset) within `limit`, `s` reading and
/// dropping what comes.
fn ended_within(s: &mut TcpStream, limit: Duration) -> bool {
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut buf = vec![0u8; 64 << 10];
    while start.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

/// An HTTP/2 client that never opens its flow-control window (`SETTINGS_INITIAL_WINDOW_SIZE` 0,
/// no `WINDOW_UPDATE`) stalls its response's write with the socket empty: cut after the
/// write-stall timeout, as a client that stops reading is. A body silent on its own work longer
/// than that (server-sent events) is not cut.
#[test]
fn an_http2_client_that_never_opens_its_window_is_cut_after_the_write_stall_timeout() {
    let config = Config {
        http2: true,
        // Shorter than `/events`' 400 ms of silence.
        write_stall_timeout: Duration::from_millis(300),
        // Longer than the test: only the stall timeout can close it.
        keep_alive_timeout: Duration::from_secs(60),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_millis(100));
    let mut s = server.connect();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    // SETTINGS: INITIAL_WINDOW_SIZE (4) = 0.
    out.extend(h2_frame(4, 0, 0, &[0, 4, 0, 0, 0, 0]));
    // HPACK: :method GET, :scheme http, :path "/big", :authority "t".
    let block = [&[0x82, 0x86, 0x44, 4][..], b"/big", &[0x41, 1], b"t"].concat();
    out.extend(h2_frame(1, 0x5, 1, &block));
    s.write_all(&out).unwrap();
    assert!(
        ended_within(&mut s, Duration::from_secs(8)),
        "a response its client's window holds back is never cut"
    );
    let mut s = server.connect();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    let block = [&[0x82, 0x86, 0x44, 7][..], b"/events", &[0x41, 1], b"t"].concat();
    out.extend(h2_frame(1, 0x5, 1, &block));
    s.write_all(&out).unwrap();
    let mut data = Vec::new();
    loop {
        let (kind, flags, _, payload) = read_h2_frame(&mut s).expect("the events all come");
        if kind == 0 {
            data.extend(payload);
            if flags & 1 != 0 {
                break;
            }
        }
    }
    assert_eq!(data, b"data: first\n\ndata: second\n\n");
    let (cut, snap) = server.finish();
    assert_eq!((cut, snap.http.connections_open), (0, 0));
}

/// An HTTP/2 connection is idle by its requests, not its bytes: one that only PINGs, one that
/// trickles a request's head, and one whose last request's stream it reset are closed once no
/// request started or ended for the keep-alive timeout.
#[test]
fn an_http2_connection_that_sends_no_request_is_closed_at_the_keep_alive_timeout() {
    let config = Config {
        http2: true,
        keep_alive_timeout: Duration::from_secs(1),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_millis(100));
    for case in ["ping", "trickled head", "stream reset"] {
        let mut s = server.connect();
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        out.extend(h2_frame(4, 0, 0, &[]));
        s.write_all(&out).unwrap();
        let head = [&[0x82, 0x86, 0x44, 5][..], b"/slow", &[0x41, 1], b"t"].concat();
        // The bytes sent every 200 ms, until the server closes the connection.
        let trickle: Vec<Vec<u8>> = match case {
            "ping" => vec![h2_frame(6, 0, 0, &[0; 8]); 30],
            "trickled head" => {
                let frame = h2_frame(1, 0x5, 1, &head);
                frame.iter().map(|&b| vec![b]).collect()
            }
            _ => {
                let mut first = h2_frame(1, 0x5, 1, &head);
                first.extend(h2_frame(3, 0, 1, &8u32.to_be_bytes()));
                let mut sent = vec![first];
                sent.extend(vec![h2_frame(6, 0, 0, &[0; 8]); 30]);
                sent
            }
        };
        s.set_nonblocking(true).unwrap();
        let start = Instant::now();
        let mut closed = false;
        for bytes in trickle {
            // Read and drop what the server sent; its close ends the test.
            loop {
                match s.read(&mut [0u8; 4096]) {
                    Ok(0) => closed = true,
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => closed = true,
                }
                break;
            }
            if closed || s.write_all(&bytes).is_err() {
                closed = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        assert!(closed, "{case}: never closed");
        assert!(
            start.elapsed() >= Duration::from_millis(800),
            "{case}: {:?}",
            start.elapsed()
        );
    }
    let (cut, snap) = server.finish();
    assert_eq!((cut, snap.http.connections_open), (0, 0));
}

/// A request body that stalls is not waited for past `request_timeout`: the handler's read
/// fails (it answers 408 here); an HTTP/1 connection closes after the answer, an HTTP/2
/// request's stream gets the answer and the connection serves on.
#[test]
fn a_request_body_that_stalls_fails_the_read_at_the_request_timeout() {
    let config = Config {
        http2: true,
        request_timeout: Some(Duration::from_secs(1)),
        lingering_timeout: Duration::from_millis(200),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_millis(100));
    let mut s = server.connect();
    s.write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\nabc")
        .unwrap();
    let mut r = BufReader::new(s);
    let reply = read_reply(&mut r, false).expect("an answer");
    assert_eq!(
        (reply.status, reply.header("connection")),
        (408, Some("close"))
    );
    read_to_close(&mut r);

    let mut s = server.connect();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    // HPACK: :method POST, :scheme http, :path "/echo", :authority "t"; END_HEADERS only.
    let block = [&[0x83, 0x86, 0x44, 5][..], b"/echo", &[0x41, 1], b"t"].concat();
    out.extend(h2_frame(1, 0x4, 1, &block));
    out.extend(h2_frame(0, 0, 1, b"abc"));
    s.write_all(&out).unwrap();
    let mut data = Vec::new();
    loop {
        let (kind, flags, stream, payload) = read_h2_frame(&mut s).expect("an answer");
        if kind == 0 && stream == 1 {
            data.extend(payload);
            if flags & 1 != 0 {
                break;
            }
        }
    }
    assert_eq!(data, b"timed out");
    drop(s);
    let (cut, snap) = server.finish();
    assert_eq!((cut, snap.http.connections_open), (0, 0));
}

/// With `http2` (hyper-util sniffs the first bytes for the HTTP/2 preface before hyper's HTTP/1
/// reads the head), a request line over the head limit still gets 414, a long one that fits is
/// served, and a header over the limit gets 431.
#[test]
fn with_http2_a_request_line_over_the_head_limit_still_gets_414() {
    let config = Config {
        http2: true,
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let uri = |len: usize| format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "u".repeat(len));
    // A line (`GET /`, the path, ` HTTP/1.1`) of 16 KiB, the limit, or more.
    for len in [17 * 1000, 16 * 1024 - 14, 16 * 1024 - 13] {
        assert_eq!(status_of(&server, uri(len).as_bytes()), 414, "{len}");
    }
    assert_eq!(status_of(&server, uri(16_000).as_bytes()), 200);
    let big_header = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "a".repeat(17 * 1000)
    );
    assert_eq!(status_of(&server, big_header.as_bytes()), 431);
    let (_, snap) = server.finish();
    assert_eq!(snap.http.responses_by_class[3], 4, "the 414s and the 431");
}

/// What `Config::on_refused` was told in `an_http2_head_over_the_limits_gets_431_counted_and_reported`.
static H2_REFUSED: std::sync::Mutex<Vec<Report>> = std::sync::Mutex::new(Vec::new());

fn record_h2_refusal(r: &nodus_http::Refused<'_>) {
    H2_REFUSED.lock().unwrap().push(report(r));
}

/// An HPACK string length (RFC 7541 section 5.1: a 7-bit prefix, no Huffman coding).
fn hpack_len(out: &mut Vec<u8>, n: usize) {
    if n < 127 {
        out.push(n as u8);
        return;
    }
    out.push(127);
    let mut n = n - 127;
    while n >= 128 {
        out.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    out.push(n as u8);
}

/// An HPACK literal header field without indexing, its name new (RFC 7541 section 6.2.2).
fn hpack_literal(name: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    hpack_len(&mut out, name.len());
    out.extend_from_slice(name);
    hpack_len(&mut out, value.len());
    out.extend_from_slice(value);
    out
}

/// A request head with no body on `stream`: HEADERS (END_STREAM) and as many CONTINUATION
/// frames as `block` needs at 16 KiB a frame.
fn h2_request_head(stream: u32, block: &[u8]) -> Vec<u8> {
    let chunks: Vec<&[u8]> = block.chunks(16 << 10).collect();
    let mut out = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let (kind, mut flags) = if i == 0 { (1, 0x1) } else { (9, 0) };
        if i == chunks.len() - 1 {
            flags |= 0x4;
        }
        out.extend(h2_frame(kind, flags, stream, chunk));
    }
    out
}

/// Over HTTP/2 the head limits hold as over HTTP/1: more than `max_headers` header fields, or a
/// header list over `max_header_bytes`, gets 431, counted in the 4xx class and reported to
/// `on_refused` with its request line (as a refusal of the server, not h2's own answer).
#[test]
fn an_http2_head_over_the_limits_gets_431_counted_and_reported() {
    let config = Config {
        http2: true,
        on_refused: Some(record_h2_refusal),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let mut s = server.connect();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    let many = |n: usize| -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| hpack_literal(format!("x-h{i}").as_bytes(), b"v"))
            .collect()
    };
    // Default limits: 100 headers, a 16 KiB header list (the pseudo-header fields ~170 bytes).
    let cases: [(&str, Vec<Vec<u8>>); 4] = [
        ("/100", many(100)),
        ("/101", many(101)),
        ("/fits", vec![hpack_literal(b"x-big", &[b'a'; 16_000])]),
        ("/big", vec![hpack_literal(b"x-big", &[b'a'; 17_000])]),
    ];
    for (i, (path, fields)) in cases.iter().enumerate() {
        // HPACK: :method GET, :scheme http, :path, :authority "t"; then the fields.
        let mut block = vec![0x82, 0x86, 0x44, path.len() as u8];
        block.extend_from_slice(path.as_bytes());
        block.extend_from_slice(&[0x41, 1, b't']);
        block.extend(fields.concat());
        out.extend(h2_request_head(1 + 2 * i as u32, &block));
    }
    s.write_all(&out).unwrap();
    let bodies = h2_response_bodies(&mut s, cases.len());
    let refused = b"request header fields too large\n";
    assert_eq!(
        bodies,
        [&b"hello"[..], refused, b"hello", refused].map(<[u8]>::to_vec)
    );
    drop(s);
    let (_, snap) = server.finish();
    let line = |l: &str| Some(l.to_owned());
    assert_eq!(
        std::mem::take(&mut *H2_REFUSED.lock().unwrap()),
        [
            (431, line("GET /101 HTTP/2.0"), true, true, 32),
            (431, line("GET /big HTTP/2.0"), true, true, 32),
        ]
    );
    assert_eq!(snap.http.responses_by_class[1], 2);
    assert_eq!(snap.http.responses_by_class[3], 2);
}

/// Over HTTP/2 an `expect` other than exactly `100-continue` gets 417 on its stream without
/// reaching the handler, as from Node's HTTP/2 compatibility layer; the connection serves on.
#[test]
fn an_http2_expect_other_than_100_continue_gets_417() {
    let config = Config {
        http2: true,
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let mut s = server.connect();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    let cases: [&[&[u8]]; 5] = [
        &[],
        &[b"100-continue"],
        &[b"foo"],
        &[b"100-Continue"],
        &[b"100-continue", b"100-continue"],
    ];
    for (i, values) in cases.iter().enumerate() {
        // HPACK: :method GET, :scheme http, :path "/", :authority "t"; then the expect fields.
        let mut block = vec![0x82, 0x86, 0x84, 0x41, 1, b't'];
        for v in *values {
            block.extend(hpack_literal(b"expect", v));
        }
        out.extend(h2_request_head(1 + 2 * i as u32, &block));
    }
    s.write_all(&out).unwrap();
    let bodies = h2_response_bodies(&mut s, cases.len());
    let failed = b"expectation failed\n";
    assert_eq!(
        bodies,
        [&b"hello"[..], b"hello", failed, failed, failed].map(<[u8]>::to_vec)
    );
    drop(s);
    let (_, snap) = server.finish();
    assert_eq!(snap.http.responses_by_class[1], 2);
    assert_eq!(snap.http.responses_by_class[3], 3);
}

/// An HTTP/2 connection closed for idleness is told GOAWAY first (RFC 9113 section 6.8): one
/// whose client answers the server's PING (hyper's graceful GOAWAY waits for it), and one whose
/// client never does, closed after a short grace.
#[test]
fn an_idle_http2_connection_gets_goaway_before_its_close() {
    let config = Config {
        http2: true,
        keep_alive_timeout: Duration::from_millis(300),
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_millis(100));
    for answers_ping in [true, false] {
        let mut s = server.connect();
        let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        out.extend(h2_frame(4, 0, 0, &[]));
        // HPACK: :method GET, :scheme http, :path "/", :authority "t".
        out.extend(h2_frame(1, 0x5, 1, &[0x82, 0x86, 0x84, 0x41, 1, b't']));
        s.write_all(&out).unwrap();
        let start = Instant::now();
        let seen = if answers_ping {
            h2_frames_until(&mut s, None)
        } else {
            let mut seen = Vec::new();
            while let Ok((kind, ..)) = read_h2_frame(&mut s) {
                seen.push(kind);
            }
            seen
        };
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "answers PING: {answers_ping}: {:?}",
            start.elapsed()
        );
        let (data, goaway) = (
            seen.iter().position(|&k| k == 0),
            seen.iter().position(|&k| k == 7),
        );
        assert!(
            matches!((data, goaway), (Some(d), Some(g)) if d < g),
            "answers PING: {answers_ping}: the answer, then GOAWAY: {seen:?}"
        );
    }
    let (cut, snap) = server.finish();
    assert_eq!((cut, snap.http.connections_open), (0, 0));
}

/// An HTTP/2 client is told it may open 128 streams at once (nginx's default), not hyper's 200:
/// the server's first SETTINGS says `SETTINGS_MAX_CONCURRENT_STREAMS` 128.
#[test]
fn an_http2_client_may_open_128_streams_at_once() {
    let config = Config {
        http2: true,
        ..Config::default()
    };
    let server = TestServer::start(config, Duration::from_secs(1));
    let mut s = server.connect();
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(h2_frame(4, 0, 0, &[]));
    s.write_all(&out).unwrap();
    let (kind, flags, _, payload) = read_h2_frame(&mut s).unwrap();
    assert_eq!((kind, flags & 1), (4, 0), "the server's SETTINGS first");
    let settings: Vec<(u16, u32)> = payload
        .chunks(6)
        .map(|c| {
            let id = u16::from_be_bytes([c[0], c[1]]);
            (id, u32::from_be_bytes([c[2], c[3], c[4], c[5]]))
        })
        .collect();
    // SETTINGS_MAX_CONCURRENT_STREAMS is 0x3.
    assert!(settings.contains(&(3, 128)), "{settings:?}");
}
