//! `nodus serve` end to end: the real binary on 127.0.0.1, a real (minimal) HTTP client.
//!
//! Every server is started on port 0, its address read from its startup line, and stopped by
//! PID (SIGTERM, then SIGKILL if it does not exit).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("nodus-serve-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A running `nodus serve`.
struct Server {
    child: Child,
    addr: SocketAddr,
    stderr: mpsc::Receiver<String>,
}

impl Server {
    fn start(dir: &Path, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_nodus"))
            .arg("serve")
            .arg(dir)
            .args(["--listen", "127.0.0.1:0", "--workers", "1"])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let addr = loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => {
                    if let Some(rest) = line.split("on http://").nth(1) {
                        break rest.split('/').next().unwrap().parse().unwrap();
                    }
                }
                Err(e) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("nodus serve printed no startup line: {e}");
                }
            }
        };
        Server {
            child,
            addr,
            stderr: rx,
        }
    }

    fn pid(&self) -> rustix::process::Pid {
        rustix::process::Pid::from_raw(self.child.id() as i32).unwrap()
    }

    fn signal(&self, sig: rustix::process::Signal) {
        rustix::process::kill_process(self.pid(), sig).unwrap();
    }

    /// Waits for the process to exit; returns its exit code.
    fn wait(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }
}

/// A child killed (by PID) if the test ends before it exits: a failed assertion leaks nothing.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().unwrap().is_none() {
            let _ = rustix::process::kill_process(self.pid(), rustix::process::Signal::TERM);
            if self.wait(Duration::from_secs(5)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Sends one request (raw head lines) and reads the response (`head` = no body expected).
fn request(addr: SocketAddr, method: &str, path: &str, extra: &[&str]) -> Reply {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    for h in extra {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    read_reply(&mut BufReader::new(s), method == "HEAD")
}

fn read_reply(r: &mut impl BufRead, head_only: bool) -> Reply {
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status = line
        .split_whitespace()
        .nth(1)
        .expect("a status line")
        .parse()
        .unwrap();
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').unwrap();
        headers.push((k.to_ascii_lowercase(), v.trim().to_owned()));
    }
    let mut reply = Reply {
        status,
        headers,
        body: Vec::new(),
    };
    let len: Option<usize> = reply.header("content-length").map(|v| v.parse().unwrap());
    let chunked = reply.header("transfer-encoding") == Some("chunked");
    if !head_only && status != 304 {
        match len {
            Some(n) => {
                reply.body.resize(n, 0);
                r.read_exact(&mut reply.body).unwrap();
            }
            None if chunked => reply.body = read_chunked(r),
            None => {
                r.read_to_end(&mut reply.body).unwrap();
            }
        }
    }
    reply
}

/// Decodes a chunked body.
fn read_chunked(r: &mut impl BufRead) -> Vec<u8> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        r.read_line(&mut line).unwrap();
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap(), 16).unwrap();
        let mut chunk = vec![0; size + 2];
        r.read_exact(&mut chunk).unwrap();
        if size == 0 {
            return body;
        }
        body.extend_from_slice(&chunk[..size]);
    }
}

fn site() -> TempDir {
    let d = TempDir::new(&format!(
        "site-{}",
        std::thread::current()
            .name()
            .unwrap_or("t")
            .replace("::", "-")
    ));
    let p = d.path();
    std::fs::write(p.join("hello.txt"), "hello, nodus\n").unwrap();
    std::fs::write(p.join("index.html"), "<h1>home</h1>").unwrap();
    std::fs::create_dir(p.join("docs")).unwrap();
    std::fs::write(p.join("docs/a&b <c>.txt"), "escaped").unwrap();
    std::fs::write(p.join(".env"), "SECRET=1").unwrap();
    std::fs::create_dir(p.join(".git")).unwrap();
    std::fs::write(p.join(".git/config"), "[core]").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", p.join("passwd-link")).unwrap();
    let fifo = p.join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    d
}

#[test]
fn files_head_range_conditional_and_listing() {
    let dir = site();
    let server = Server::start(dir.path(), &[]);
    let a = server.addr;

    let r = request(a, "GET", "/hello.txt", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hello, nodus\n");
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.header("content-length"), Some("13"));
    let etag = r.header("etag").unwrap().to_owned();
    assert!(r.header("last-modified").is_some());

    let r = request(a, "HEAD", "/hello.txt", &[]);
    assert_eq!((r.status, r.header("content-length")), (200, Some("13")));

    let r = request(a, "GET", "/hello.txt", &["Range: bytes=7-10"]);
    assert_eq!(r.status, 206);
    assert_eq!(r.body, b"nodu");
    assert_eq!(r.header("content-range"), Some("bytes 7-10/13"));
    let r = request(a, "GET", "/hello.txt", &["Range: bytes=50-60"]);
    assert_eq!(
        (r.status, r.header("content-range")),
        (416, Some("bytes */13"))
    );

    let r = request(a, "GET", "/hello.txt", &[&format!("If-None-Match: {etag}")]);
    assert_eq!(r.status, 304);

    let r = request(a, "GET", "/", &[]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"<h1>home</h1>"[..]));
    let r = request(a, "GET", "/docs", &[]);
    assert_eq!((r.status, r.header("location")), (301, Some("/docs/")));
    let r = request(a, "GET", "/docs/", &[]);
    assert_eq!(r.status, 200);
    let html = String::from_utf8(r.body).unwrap();
    assert!(html.contains("a&amp;b &lt;c&gt;.txt"), "{html}");
}

#[test]
fn traversal_dotfiles_and_special_files_are_refused() {
    let dir = site();
    let server = Server::start(dir.path(), &[]);
    let a = server.addr;
    for path in [
        "/../hello.txt",
        "/docs/../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/docs%2f..%2f..%2fetc%2fpasswd",
        "/..%5c..%5cetc%5cpasswd",
        "//etc/passwd",
        "/passwd-link",
        "/.env",
        "/.git/config",
        "/fifo",
        "/hello.txt%00.png",
    ] {
        let r = request(a, "GET", path, &[]);
        assert!([400, 403, 404].contains(&r.status), "{path}: {}", r.status);
        assert!(
            !String::from_utf8_lossy(&r.body).contains("root:"),
            "{path} leaked /etc/passwd"
        );
    }
    // With --dotfiles allow, dotfiles are served.
    drop(server);
    let server = Server::start(dir.path(), &["--dotfiles", "allow"]);
    assert_eq!(request(server.addr, "GET", "/.env", &[]).body, b"SECRET=1");
}

#[test]
fn the_dev_directory_attack_does_not_hang() {
    let server = Server::start(Path::new("/dev"), &[]);
    for path in ["/random", "/urandom", "/zero", "/null"] {
        let r = request(server.addr, "GET", path, &[]);
        assert!([403, 404].contains(&r.status), "{path}: {}", r.status);
    }
}

#[test]
fn oversized_heads_and_bodies() {
    let dir = site();
    let server = Server::start(dir.path(), &[]);
    let big = format!("X-Big: {}", "a".repeat(64 * 1024));
    assert_eq!(
        request(server.addr, "GET", "/hello.txt", &[&big]).status,
        431
    );
    let r = request(
        server.addr,
        "POST",
        "/hello.txt",
        &["Content-Length: 104857600"],
    );
    assert_eq!(r.status, 413);
}

#[test]
fn admin_endpoints() {
    let dir = site();
    let server = Server::start(dir.path(), &[]);
    let a = server.addr;
    assert_eq!(request(a, "GET", "/hello.txt", &[]).status, 200);
    let r = request(a, "GET", "/_nodus/metrics", &[]);
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body).unwrap();
    assert!(
        text.contains("nodus_http_requests_total{status=\"2xx\"}"),
        "{text}"
    );
    assert!(text.contains("nodus_loop_iterations_total"));
    assert_eq!(request(a, "GET", "/_nodus/healthz", &[]).status, 200);
    assert_eq!(request(a, "GET", "/_nodus/readyz", &[]).status, 200);
    let r = request(a, "GET", "/_nodus/stats", &[]);
    let stats: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(stats["pid"].as_u64(), Some(u64::from(server.child.id())));
    assert!(stats["http"]["responses_by_class"][1].as_u64().unwrap() >= 1);
    let r = request(a, "GET", "/_nodus/", &[]);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let page = String::from_utf8(r.body).unwrap();
    assert!(page.contains("/_nodus/stats") && !page.contains("<script src"));
}

#[test]
fn a_separate_admin_listener() {
    let dir = site();
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let admin_addr = probe.local_addr().unwrap();
    drop(probe);
    let server = Server::start(dir.path(), &["--admin", &admin_addr.to_string()]);
    assert_eq!(
        request(admin_addr, "GET", "/_nodus/healthz", &[]).status,
        200
    );
    // The public listener no longer answers them.
    assert_eq!(
        request(server.addr, "GET", "/_nodus/healthz", &[]).status,
        404
    );
}

#[test]
fn sigterm_turns_readyz_to_503_then_drains_and_exits_0() {
    let dir = site();
    let mut server = Server::start(
        dir.path(),
        &["--shutdown-delay", "0.5", "--drain-timeout", "2"],
    );
    let a = server.addr;
    server.signal(rustix::process::Signal::TERM);
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(request(a, "GET", "/_nodus/readyz", &[]).status, 503);
    assert_eq!(
        request(a, "GET", "/hello.txt", &[]).status,
        200,
        "still serving during the delay"
    );
    assert_eq!(server.wait(Duration::from_secs(10)), Some(0));
    assert!(TcpStream::connect(a).is_err());
    let log: Vec<String> = server.stderr.try_iter().collect();
    assert!(log.iter().any(|l| l.contains("SIGTERM")), "{log:?}");
}

#[test]
fn bad_flags_and_a_busy_address_fail_clearly() {
    let out = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(["serve", "--bogus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bogus"));

    let out = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(["serve", "--workers", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--workers"));

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(["serve", "--listen", &addr])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already in use") && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn a_1gib_sparse_file_streams_in_bounded_memory_while_healthz_answers() {
    let dir = TempDir::new("sparse");
    let f = std::fs::File::create(dir.path().join("big.bin")).unwrap();
    f.set_len(1 << 30).unwrap();
    drop(f);
    let server = Server::start(dir.path(), &[]);
    let a = server.addr;
    let done = Arc::new(AtomicBool::new(false));
    let d = done.clone();
    let download = std::thread::spawn(move || {
        let mut s = TcpStream::connect(a).unwrap();
        s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut total = 0u64;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match s.read(&mut buf).unwrap() {
                0 => break,
                n => total += n as u64,
            }
        }
        d.store(true, Ordering::Release);
        total
    });
    let mut latencies = Vec::new();
    let mut max_rss = 0;
    while !done.load(Ordering::Acquire) {
        let t = Instant::now();
        assert_eq!(request(a, "GET", "/_nodus/healthz", &[]).status, 200);
        latencies.push(t.elapsed());
        max_rss = max_rss.max(server.rss_kib());
        std::thread::sleep(Duration::from_millis(20));
    }
    let total = download.join().unwrap();
    assert!(total > 1 << 30, "headers + 1 GiB: got {total}");
    assert!(!latencies.is_empty());
    assert!(max_rss < 64 * 1024, "RSS reached {max_rss} KiB");
    // Within 100 ms, allowing a tenth of the probes to be late on a loaded shared machine (a
    // blocked loop would make every probe wait for the whole download), and none stuck.
    let late = latencies
        .iter()
        .filter(|l| **l >= Duration::from_millis(100))
        .count();
    assert!(
        late * 10 <= latencies.len(),
        "{late} of {} healthz probes took 100 ms or more",
        latencies.len()
    );
    assert!(
        latencies.iter().all(|l| *l < Duration::from_secs(2)),
        "{latencies:?}"
    );
}

#[test]
fn gzip_for_clients_that_accept_it() {
    let dir = TempDir::new("gzip");
    let text: String = (0..2000)
        .map(|i| format!("line {i} of a compressible file\n"))
        .collect();
    std::fs::write(dir.path().join("big.txt"), &text).unwrap();
    std::fs::write(dir.path().join("small.txt"), "tiny").unwrap();
    let server = Server::start(dir.path(), &["--gzip"]);
    let r = request(server.addr, "GET", "/big.txt", &["Accept-Encoding: gzip"]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert!(r.header("etag").unwrap().starts_with("W/"));
    assert!(
        r.body.len() < text.len() / 4,
        "{} compressed bytes",
        r.body.len()
    );
    let mut plain = String::new();
    flate2::read::GzDecoder::new(&r.body[..])
        .read_to_string(&mut plain)
        .unwrap();
    assert_eq!(plain, text);
    // Not for clients that do not ask, nor for ranges or tiny files.
    assert_eq!(
        request(server.addr, "GET", "/big.txt", &[]).header("content-encoding"),
        None
    );
    let r = request(
        server.addr,
        "GET",
        "/big.txt",
        &["Accept-Encoding: gzip", "Range: bytes=0-9"],
    );
    assert_eq!((r.status, r.header("content-encoding")), (206, None));
    assert_eq!(
        request(server.addr, "GET", "/small.txt", &["Accept-Encoding: gzip"])
            .header("content-encoding"),
        None
    );
}

#[test]
fn an_inherited_socket_is_served_as_systemd_passes_it() {
    let dir = site();
    // Python binds, puts the socket at fd 3, sets LISTEN_FDS/LISTEN_PID for its own pid (which exec
    // keeps), prints the port and becomes `nodus serve`, as systemd socket activation does.
    let script = r#"
import os, socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
os.dup2(s.fileno(), 3); os.set_inheritable(3, True)
env = dict(os.environ, LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
os.execve(sys.argv[1], [sys.argv[1], "serve", sys.argv[2], "--listen", "127.0.0.1:1"], env)
"#;
    let mut child = KillOnDrop(
        Command::new("python3")
            .args(["-c", script, env!("CARGO_BIN_EXE_nodus")])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut port = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut port)
        .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", port.trim()).parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let reply = loop {
        // The listener exists before nodus starts: connections queue until it serves them.
        if let Ok(mut s) = TcpStream::connect(addr) {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                .unwrap();
            break read_reply(&mut BufReader::new(s), false);
        }
        assert!(Instant::now() < deadline, "never connected");
        std::thread::sleep(Duration::from_millis(20));
    };
    let pid = rustix::process::Pid::from_raw(child.0.id() as i32).unwrap();
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let status = child.0.wait().unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, b"hello, nodus\n");
    assert_eq!(status.code(), Some(0));
}

#[test]
fn the_service_manager_hears_ready_and_stopping() {
    let dir = site();
    let sock_path = std::env::temp_dir().join(format!("nodus-notify-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&sock_path);
    let manager = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_nodus"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .arg(dir.path())
        .env("NOTIFY_SOCKET", &sock_path)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 256];
    let n = manager.recv(&mut buf).unwrap();
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let n = manager.recv(&mut buf).unwrap();
    let stopping = String::from_utf8_lossy(&buf[..n]).into_owned();
    let status = child.wait().unwrap();
    let _ = std::fs::remove_file(&sock_path);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    assert_eq!(status.code(), Some(0));
}
