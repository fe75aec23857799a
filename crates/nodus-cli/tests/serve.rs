//! `nodus serve` end to end: the real binary on 127.0.0.1, a real (minimal) HTTP client. Also
//! the address arguments of every command: a port out of range is said to be, a host name is
//! resolved (and one that does not resolve is said to); a negative number given to a numeric
//! flag is an invalid value.
//!
//! Every server is started on port 0, its address read from its startup line, and stopped by
//! PID (SIGTERM, then SIGKILL if it does not exit).

mod common;

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::NODUS;
use common::http::request;
use common::serve::Serve;
use nodus_testkit::net::free_addr;
use nodus_testkit::proc::Proc;
use nodus_testkit::tmp::TempDir;

/// Runs `nodus ARGS`, which must be a usage error (exit code 2); its stderr.
fn usage_error<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S> + std::fmt::Debug,
) -> String {
    let shown = format!("{args:?}");
    let out = Command::new(NODUS).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{shown}: {stderr}");
    stderr
}

/// A service manager's end of `NOTIFY_SOCKET`: a datagram socket at a fresh path under the temp
/// dir (`NAME-PID.sock`), reads bounded at 20 s.
fn notify_manager(name: &str) -> (std::path::PathBuf, std::os::unix::net::UnixDatagram) {
    let path = std::env::temp_dir().join(format!("{name}-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let manager = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    (path, manager)
}

#[test]
fn an_address_whose_port_is_out_of_range_is_a_usage_error_that_says_so() {
    for args in [
        &["serve", "--listen", "127.0.0.1:99999"][..],
        &["serve", "--admin", "[::1]:65536"],
        &["serve", "--listen", "localhost:99999"],
        &["run", "-l", "127.0.0.1:99999", "--", "true"],
        &["top", "--once", "127.0.0.1:99999"],
    ] {
        let stderr = usage_error(args);
        assert!(
            stderr.contains("port 99999 is out of range (0-65535)")
                || stderr.contains("port 65536 is out of range (0-65535)"),
            "{args:?}: {stderr}"
        );
    }
    // Any other mistake keeps std's message, with the forms an address takes.
    for addr in [
        "127.0.0.1",
        "::1:80",
        "[127.0.0.1]:80",
        ":80",
        "localhost:+80",
    ] {
        let stderr = usage_error(["serve", "--listen", addr]);
        assert!(
            stderr.contains("invalid socket address syntax (IP:PORT, [IPv6]:PORT or HOST:PORT)"),
            "{addr}: {stderr}"
        );
    }
}

#[test]
fn a_negative_number_is_an_invalid_value_not_a_hint_to_use_double_dash() {
    for (flag, shown) in [
        ("--workers", "--workers <WORKERS>"),
        ("--drain-timeout", "--drain-timeout <DRAIN_TIMEOUT>"),
        ("--shutdown-delay", "--shutdown-delay <SHUTDOWN_DELAY>"),
    ] {
        let stderr = usage_error(["serve", flag, "-1"]);
        assert!(
            stderr.contains(&format!("invalid value '-1' for '{shown}'")),
            "{flag}: {stderr}"
        );
        assert!(!stderr.contains("as a value, use '--"), "{flag}: {stderr}");
    }
}

#[test]
fn a_host_name_is_resolved_to_its_first_address_and_one_that_does_not_resolve_is_said() {
    // What `localhost` is here (the first address, as Node's `listen(port, 'localhost')`).
    use std::net::ToSocketAddrs;
    let expected = ("localhost", 0)
        .to_socket_addrs()
        .unwrap()
        .next()
        .unwrap()
        .ip();
    assert!(expected.is_loopback(), "localhost is {expected} here");
    let dir = site();
    let mut cmd = Command::new(NODUS);
    cmd.arg("serve")
        .arg(dir.path())
        .args(["--listen", "localhost:0", "--workers", "1"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut proc = Proc::spawn(&mut cmd);
    let line = proc.wait_line("on http://");
    let addr: SocketAddr = line
        .split("on http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    assert_eq!(addr.ip(), expected, "{line}");
    assert!(addr.port() != 0, "{line}");
    assert_eq!(
        request(addr, "GET", "/hello.txt", &[]).body,
        b"hello, nodus\n"
    );

    for args in [
        &["serve", "--listen", "nodus-no-such-host.invalid:80"][..],
        &["serve", "--admin", "nodus-no-such-host.invalid:80"],
        &["run", "-l", "nodus-no-such-host.invalid:80", "--", "true"],
    ] {
        let stderr = usage_error(args);
        assert!(
            stderr.contains("cannot resolve 'nodus-no-such-host.invalid': "),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn an_ipv6_zone_may_name_its_interface_and_an_unknown_one_is_said() {
    // `lo` exists, so the address reads: `top` gets as far as connecting (nothing listens there).
    let out = Command::new(NODUS)
        .args(["top", "--once", "[fe80::1%lo]:9"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot connect"), "{stderr}");
    for args in [
        &["serve", "--listen", "[fe80::1%nodus-no-if]:8080"][..],
        &["run", "-l", "[fe80::1%nodus-no-if]:8080", "--", "true"],
    ] {
        let stderr = usage_error(args);
        assert!(
            stderr.contains("no network interface is named 'nodus-no-if'"),
            "{args:?}: {stderr}"
        );
    }
    for (addr, says) in [
        ("[fe80::1%lo]:99999", "port 99999 is out of range (0-65535)"),
        ("[fe80::1%lo]:+80", "invalid socket address syntax"),
    ] {
        let stderr = usage_error(["serve", "--listen", addr]);
        assert!(stderr.contains(says), "{addr}: {stderr}");
    }
}

/// The resident set size of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
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
    let server = Serve::start(dir.path(), 1, &[]);
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
    let r = request(a, "GET", "/docs?page=2", &[]);
    assert_eq!(
        (r.status, r.header("location")),
        (301, Some("/docs/?page=2"))
    );
    let r = request(a, "GET", "/docs/", &[]);
    assert_eq!(r.status, 200);
    let html = String::from_utf8(r.body).unwrap();
    assert!(html.contains("a&amp;b &lt;c&gt;.txt"), "{html}");

    // Absolute-form targets (RFC 9112 section 3.2.2): an empty path is `/`; the query is kept.
    for (target, status, location) in [
        ("http://t?a=1", 200, None),
        ("http://t", 200, None),
        ("http://t/hello.txt?a=1", 200, None),
        ("http://t/docs?page=2", 301, Some("/docs/?page=2")),
    ] {
        let mut s = TcpStream::connect(a).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let head = format!("GET {target} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
        s.write_all(head.as_bytes()).unwrap();
        let r = nodus_testkit::http::read_reply(&mut BufReader::new(s), false).unwrap();
        let body = String::from_utf8_lossy(&r.body);
        assert_eq!(
            (r.status, r.header("location")),
            (status, location),
            "{target}: {body}"
        );
    }
}

/// Sets the soft address-space limit of process `pid` to `soft` bytes (its hard one stays).
fn limit_as(pid: u32, soft: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to fill, then to read; a null old value is allowed.
    unsafe {
        let pid = pid as libc::pid_t;
        assert_eq!(
            libc::prlimit(pid, libc::RLIMIT_AS, std::ptr::null(), &mut limit),
            0
        );
        limit.rlim_cur = soft.min(limit.rlim_max);
        assert_eq!(
            libc::prlimit(pid, libc::RLIMIT_AS, &limit, std::ptr::null_mut()),
            0
        );
    }
}

/// A server whose I/O pool cannot start its threads (its address space limited before its first
/// request, too tight for a pool thread's stack; a full `pids.max` likewise): 503 with
/// `Retry-After: 5`, said in one WARN line for the burst, no panic; once threads can be started
/// again, the next request starts the pool and is served.
#[test]
fn an_io_pool_that_cannot_start_is_503_with_retry_after_then_starts_when_it_can() {
    let dir = site();
    let mut server = Serve::start(dir.path(), 1, &[]);
    let pid = server.proc.id();
    // Its size once its threads are up: a thread's first allocation may still reserve an arena
    // after the start line, and a limit below the size it then has would fail every mapping, not
    // only a pool thread's stack.
    let pages = || -> u64 {
        let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap();
        statm.split_whitespace().next().unwrap().parse().unwrap()
    };
    let mut size = pages();
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(20));
        let now = pages();
        if now == size {
            break;
        }
        size = now;
    }
    limit_as(pid, size * 4096 + (4 << 20));
    for _ in 0..5 {
        let r = request(server.addr, "GET", "/hello.txt", &[]);
        assert_eq!(
            (r.status, r.header("retry-after")),
            (503, Some("5")),
            "{}",
            String::from_utf8_lossy(&r.body)
        );
    }
    limit_as(pid, u64::MAX);
    let r = request(server.addr, "GET", "/hello.txt", &[]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello, nodus\n"[..]));
    let out = server.proc.output_so_far();
    let said: Vec<_> = out
        .iter()
        .filter(|l| l.contains("cannot start the I/O pool"))
        .collect();
    assert_eq!(said.len(), 1, "{out:#?}");
    assert!(
        said[0].contains("WARN") && said[0].contains("answered 503"),
        "{said:?}"
    );
    assert!(
        !out.iter()
            .any(|l| l.contains("panicked") || l.contains("ERROR")),
        "{out:#?}"
    );
}

#[test]
fn traversal_dotfiles_and_special_files_are_refused() {
    let dir = site();
    let server = Serve::start(dir.path(), 1, &[]);
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
    let server = Serve::start(dir.path(), 1, &["--dotfiles", "allow"]);
    assert_eq!(request(server.addr, "GET", "/.env", &[]).body, b"SECRET=1");
}

#[test]
fn head_answers_an_unreadable_file_as_get_does() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    let dir = site();
    let secret = dir.path().join("unreadable.txt");
    std::fs::write(&secret, "no one may read this").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
    // Root reads any file: then the server runs as nobody (a file of root's, mode 000, is
    // unreadable to it; the temp directory is world-readable).
    let as_root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    let server = Serve::start_with(dir.path(), 1, &[], |cmd| {
        if as_root {
            cmd.uid(65534).gid(65534);
        }
    });
    let get = request(server.addr, "GET", "/unreadable.txt", &[]);
    assert_eq!(get.status, 403);
    let head = request(server.addr, "HEAD", "/unreadable.txt", &[]);
    assert_eq!(head.status, get.status, "HEAD and GET disagree");
    assert_eq!(head.header("content-length"), get.header("content-length"));
    // Nor does a conditional or a range request describe it: no 304 with its ETag, no 416 with
    // its length.
    for extra in ["If-None-Match: *", "Range: bytes=100-", "Range: bytes=0-0"] {
        for method in ["GET", "HEAD"] {
            let r = request(server.addr, method, "/unreadable.txt", &[extra]);
            assert_eq!(r.status, 403, "{method} {extra}");
            assert_eq!(r.header("etag"), None, "{method} {extra}");
            assert_eq!(r.header("content-range"), None, "{method} {extra}");
        }
    }
    // A readable file is still 200 to both.
    assert_eq!(request(server.addr, "HEAD", "/hello.txt", &[]).status, 200);
}

#[test]
fn the_access_log_line_cannot_be_forged_by_a_quote_in_the_path() {
    let dir = site();
    let mut server = Serve::start(dir.path(), 1, &["--access-log"]);
    let r = request(server.addr, "GET", r#"/x"_200_0.1ms_"\y"#, &[]);
    assert_eq!(r.status, 400); // the backslash
    let line = server.proc.wait_line("nodus::access");
    assert!(
        line.contains(r#""GET /x\x22_200_0.1ms_\x22\x5Cy HTTP/1.1" 400 "#),
        "{line}"
    );
}

/// `--access-log` asks for the access log: a `RUST_LOG` that leaves INFO out (`warn`) does not
/// silence it; one that names its target does.
#[test]
fn the_access_log_is_written_whatever_level_rust_log_sets() {
    let dir = site();
    for (rust_log, logged) in [("warn", true), ("warn,nodus::access=off", false)] {
        let out = serve_logs(dir.path(), 1, rust_log, &["--access-log"]);
        let access = out.iter().any(|l| l.contains("nodus::access"));
        assert_eq!(access, logged, "RUST_LOG={rust_log}: {out:#?}");
        assert!(
            access
                == out
                    .iter()
                    .any(|l| l.contains(r#""GET /hello.txt HTTP/1.1" 200 "#)),
            "{out:#?}"
        );
    }
}

/// A `RUST_LOG` that does not parse is said in one WARN line at the start (its value and the
/// parse error) and logging goes on at info, the access log included; a cluster's workers, which
/// run with the primary's environment, leave that line to the primary.
#[test]
fn a_rust_log_that_does_not_parse_is_said_once_and_info_is_logged() {
    let dir = site();
    for workers in [1, 2] {
        let mut server = Serve::start_with(dir.path(), workers, &["--access-log"], |cmd| {
            cmd.env("RUST_LOG", "info,nodus=loud");
        });
        // Started: its INFO start line was read.
        assert_eq!(request(server.addr, "GET", "/hello.txt", &[]).status, 200);
        server.proc.wait_line(r#""GET /hello.txt HTTP/1.1" 200 "#);
        server.proc.signal(rustix::process::Signal::TERM);
        assert_eq!(server.proc.wait_exit(Duration::from_secs(30)), Some(0));
        let out = server.proc.output();
        let said: Vec<&String> = out.iter().filter(|l| l.contains("RUST_LOG=")).collect();
        assert_eq!(said.len(), 1, "--workers {workers}: {out:#?}");
        let line = said[0];
        assert!(line.contains(" WARN "), "{line}");
        assert!(
            line.contains(r#"RUST_LOG="info,nodus=loud" does not parse (error parsing level"#),
            "{line}"
        );
        assert!(line.ends_with("logging at info instead"), "{line}");
        assert!(!line.starts_with("[worker"), "{line}");
    }
}

/// `nodus serve DIR --workers WORKERS EXTRA...` under `RUST_LOG=rust_log`, started (its address
/// answers a request for `/hello.txt`), then stopped with SIGTERM, which it must exit 0 on: its
/// stderr lines.
fn serve_logs(dir: &Path, workers: u32, rust_log: &str, extra: &[&str]) -> Vec<String> {
    let addr = free_addr();
    let mut server = Proc::spawn(
        Command::new(NODUS)
            .arg("serve")
            .arg(dir)
            .args([
                "--listen",
                &addr.to_string(),
                "--workers",
                &workers.to_string(),
            ])
            .args(extra)
            .env("RUST_LOG", rust_log)
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    // No start line under every value: the address answers once it listens.
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{rust_log}: it never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(request(addr, "GET", "/hello.txt", &[]).status, 200);
    server.signal(rustix::process::Signal::TERM);
    assert_eq!(
        server.wait_exit(Duration::from_secs(30)),
        Some(0),
        "{rust_log}"
    );
    server.output().to_vec()
}

/// A `RUST_LOG` that parses but is likely a mistake is kept, and said in one WARN line at the
/// start, written though the value silences everything else: a bare word near a level (taken
/// for a target: `infoo` logs nothing at all), or no directive for nodus's targets. A cluster's
/// workers leave the line to the primary. Values that are right, `off` among them, are not said.
#[test]
fn a_rust_log_that_is_likely_a_mistake_is_said_once_and_a_right_one_is_not() {
    let dir = site();
    for (rust_log, workers, said) in [
        (
            "infoo",
            1,
            Some(r#""infoo" is a target, not a level (did you mean "info"?)"#),
        ),
        (
            "infoo",
            2,
            Some(r#""infoo" is a target, not a level (did you mean "info"?)"#),
        ),
        (
            "wran",
            1,
            Some(r#""wran" is a target, not a level (did you mean "warn"?)"#),
        ),
        (
            "debgu",
            1,
            Some(r#""debgu" is a target, not a level (did you mean "debug"?)"#),
        ),
        ("hyper=debug", 1, None),
    ] {
        let out = serve_logs(dir.path(), workers, rust_log, &[]);
        let shown = format!("RUST_LOG={rust_log} --workers {workers}: {out:#?}");
        let said_lines: Vec<&String> = out.iter().filter(|l| l.contains("RUST_LOG")).collect();
        assert_eq!(said_lines.len(), 1, "{shown}");
        if workers == 1 {
            // The warning is all there is: the value silences every other line.
            assert_eq!(out.len(), 1, "{shown}");
        }
        let line = said_lines[0];
        assert!(!line.starts_with("[worker"), "{line}");
        assert!(line.contains(" WARN nodus::rust_log: "), "{line}");
        assert!(line.contains(&format!("RUST_LOG={rust_log:?}: ")), "{line}");
        if let Some(said) = said {
            assert!(line.contains(said), "{line}");
        }
        assert!(
            line.contains("nodus logs nothing under it, not even errors"),
            "{line}"
        );
    }
    // A typo beside a level: nodus logs at that level, the typo alone is said.
    let out = serve_logs(dir.path(), 1, "info,wran", &[]);
    let said: Vec<&String> = out.iter().filter(|l| l.contains("RUST_LOG=")).collect();
    assert_eq!(said.len(), 1, "{out:#?}");
    assert!(said[0].contains(r#"(did you mean "warn"?)"#), "{}", said[0]);
    assert!(!said[0].contains("nodus logs nothing"), "{}", said[0]);
    assert!(out.iter().any(|l| l.contains(" INFO ")), "{out:#?}");
    for rust_log in ["info", "nodus=debug", "hyper=warn,info", "off"] {
        let out = serve_logs(dir.path(), 1, rust_log, &[]);
        assert!(
            !out.iter().any(|l| l.contains("RUST_LOG")),
            "RUST_LOG={rust_log}: {out:#?}"
        );
        assert_eq!(
            out.is_empty(),
            rust_log == "off",
            "RUST_LOG={rust_log}: {out:#?}"
        );
    }
}

/// A request written raw on a new connection, its response read: the connection's local
/// address (the peer the access log names) and the status.
fn raw_request(addr: SocketAddr, head: &[u8], body_len: usize) -> (SocketAddr, u16) {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    let peer = s.local_addr().unwrap();
    let mut w = s.try_clone().unwrap();
    w.write_all(head).unwrap();
    // The body from a thread: the server answers without reading it, and closes.
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&vec![b'x'; body_len]);
    });
    let reply = nodus_testkit::http::read_reply(&mut BufReader::new(s), false).unwrap();
    writer.join().unwrap();
    (peer, reply.status)
}

/// The value of the sample `name` in the metrics text `text`.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}")) as u64
}

#[test]
fn every_request_refused_before_the_handler_has_one_access_log_line_and_counts_as_4xx() {
    let dir = site();
    let mut server = Serve::start(dir.path(), 1, &["--access-log"]);
    let a = server.addr;
    let big = format!(
        "GET /hello.txt HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "a".repeat(17 * 1024)
    );
    let long = format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "a".repeat(17 * 1000));
    let cases: [(&[u8], usize, u16, &str); 5] = [
        (
            b"GET /hello.txt HTTP/1.1\r\n\r\n",
            0,
            400,
            "\"GET /hello.txt HTTP/1.1\" 400 40 ",
        ),
        (big.as_bytes(), 0, 431, "\"- - -\" 431 0 -"),
        // A request line over the head limit: URI Too Long, as from nginx.
        (long.as_bytes(), 0, 414, "\"- - -\" 414 0 -"),
        (
            b"POST /hello.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 2097152\r\n\r\n",
            2 << 20,
            413,
            "\"POST /hello.txt HTTP/1.1\" 413 23 ",
        ),
        (
            b"GET /hello.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 2000000\r\n\r\n",
            0,
            413,
            "\"GET /hello.txt HTTP/1.1\" 413 23 ",
        ),
    ];
    let mut expected = Vec::new();
    for (head, body_len, status, logged) in cases {
        let (peer, got) = raw_request(a, head, body_len);
        assert_eq!(got, status, "{logged}");
        expected.push((format!("{peer} {logged}"), peer));
    }
    let r = request(a, "GET", "/_nodus/metrics", &[]);
    let text = String::from_utf8(r.body).unwrap();
    assert_eq!(
        metric(&text, "nodus_http_requests_total{status=\"4xx\"}"),
        5,
        "{text}"
    );
    server.proc.signal(rustix::process::Signal::TERM);
    assert_eq!(server.proc.wait_exit(Duration::from_secs(10)), Some(0));
    let log = server.proc.output();
    for (line, peer) in &expected {
        let lines: Vec<_> = log
            .iter()
            .filter(|l| l.contains(&format!("{peer} ")))
            .collect();
        assert!(
            lines.len() == 1 && lines[0].contains("nodus::access") && lines[0].contains(line),
            "one access-log line {line:?} wanted: {lines:#?}"
        );
    }
}

/// The access log's BYTES: the body bytes sent, none for HEAD or 304, and as far as a download
/// got when its client went away (with the status it was sent with, as nginx logs it, and
/// ` incomplete`).
#[test]
fn the_access_log_says_how_many_body_bytes_each_response_sent() {
    let dir = site();
    let mut server = Serve::start(dir.path(), 1, &["--access-log"]);
    let a = server.addr;
    let etag = request(a, "GET", "/hello.txt", &[])
        .header("etag")
        .unwrap()
        .to_owned();
    assert_eq!(request(a, "HEAD", "/hello.txt", &[]).status, 200);
    let inm = format!("If-None-Match: {etag}");
    assert_eq!(request(a, "GET", "/hello.txt", &[&inm]).status, 304);
    assert_eq!(request(a, "GET", "/nope", &[]).status, 404);
    // A 64 MiB download its client reads 1 MiB of (its head, of less than 512 bytes, too), then
    // closes (a reset: unread data). BYTES is what the socket took: at least what the client
    // read, and not what hyper was handed but could not write.
    let mut download = stalled_download(dir.path(), a);
    download.read_exact(&mut vec![0u8; 1 << 20]).unwrap();
    drop(download);
    let cut = server.proc.wait_line("\"GET /big.bin HTTP/1.1\" 200 ");
    let bytes: u64 = cut
        .split("\" 200 ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no byte count in {cut:?}"));
    assert!(((1 << 20) - 512..64 << 20).contains(&bytes), "{cut}");
    assert!(cut.ends_with("ms incomplete"), "a cut body says so: {cut}");
    server.proc.signal(rustix::process::Signal::TERM);
    assert_eq!(server.proc.wait_exit(Duration::from_secs(10)), Some(0));
    let log = server.proc.output();
    let access: Vec<_> = log.iter().filter(|l| l.contains("nodus::access")).collect();
    for expected in [
        "\"GET /hello.txt HTTP/1.1\" 200 13 ",
        "\"HEAD /hello.txt HTTP/1.1\" 200 0 ",
        "\"GET /hello.txt HTTP/1.1\" 304 0 ",
        "\"GET /nope HTTP/1.1\" 404 10 ",
    ] {
        let n = access
            .iter()
            .filter(|l| l.contains(expected) && l.ends_with("ms"))
            .count();
        assert_eq!(n, 1, "one complete line with {expected:?}: {access:#?}");
    }
    assert_eq!(access.len(), 5, "{access:#?}");
}

/// RFC 9110 section 9.1: 501 for a method the server does not know, 405 with `Allow` for one it
/// knows but does not allow here; and an answer that leaves the request's body unread (an early
/// 405, an `Expect: 100-continue` refused) says `Connection: close`, since the connection closes.
#[test]
fn an_unknown_method_is_501_a_known_one_405_and_an_unread_body_is_discarded_or_ends_the_connection()
{
    let dir = site();
    let server = Serve::start(dir.path(), 1, &[]);
    let a = server.addr;
    for (method, status, allow) in [
        ("FOO", 501, None),
        ("PROPFIND", 501, None),
        ("DELETE", 405, Some("GET, HEAD")),
        ("OPTIONS", 405, Some("GET, HEAD")),
    ] {
        for path in ["/hello.txt", "/nope", "/_nodus/metrics"] {
            let r = request(a, method, path, &[]);
            assert_eq!(
                (r.status, r.header("allow")),
                (status, allow),
                "{method} {path}"
            );
        }
    }
    // A short body is read and discarded: the connection serves on.
    let mut s = TcpStream::connect(a).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    s.write_all(b"POST /hello.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
        .unwrap();
    let reply = nodus_testkit::http::read_reply(&mut r, false).unwrap();
    assert_eq!(reply.status, 405);
    assert!(!reply.closes(), "{:?}", reply.headers);
    s.write_all(&[b'x'; 1000]).unwrap();
    s.write_all(b"GET /hello.txt HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    assert_eq!(
        nodus_testkit::http::read_reply(&mut r, false)
            .unwrap()
            .status,
        200
    );
    // One that waits for a `100 Continue`, or a large one, is not read: the connection ends.
    for head in [
        "POST /hello.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n",
        "PUT /hello.txt HTTP/1.1\r\nHost: t\r\nContent-Length: 9\r\nExpect: 100-continue\r\n\r\n",
    ] {
        let mut s = TcpStream::connect(a).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        let mut r = BufReader::new(s);
        let reply = nodus_testkit::http::read_reply(&mut r, false).unwrap();
        assert_eq!(reply.status, 405, "{head:?}");
        assert!(reply.closes(), "{head:?}: {:?}", reply.headers);
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap();
        assert!(
            rest.is_empty(),
            "{head:?}: {}",
            String::from_utf8_lossy(&rest)
        );
    }
}

#[test]
fn the_dev_directory_attack_does_not_hang() {
    let server = Serve::start(Path::new("/dev"), 1, &[]);
    for path in ["/random", "/urandom", "/zero", "/null"] {
        let r = request(server.addr, "GET", path, &[]);
        assert!([403, 404].contains(&r.status), "{path}: {}", r.status);
    }
}

#[test]
fn oversized_heads_and_bodies() {
    let dir = site();
    let server = Serve::start(dir.path(), 1, &[]);
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
    let server = Serve::start(dir.path(), 1, &[]);
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
    // Relayed by a reverse proxy on this host: the proxy's client is not a loopback one.
    for relayed in [
        "X-Forwarded-For: 203.0.113.9",
        "Forwarded: for=203.0.113.9",
        "X-Real-IP: 203.0.113.9",
    ] {
        let r = request(a, "GET", "/_nodus/stats", &[relayed]);
        assert_eq!(r.status, 403, "{relayed}");
    }
    let r = request(a, "GET", "/_nodus/stats", &[]);
    let stats: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(stats["pid"].as_u64(), Some(u64::from(server.proc.id())));
    assert!(stats["http"]["responses_by_class"][1].as_u64().unwrap() >= 1);
    let r = request(a, "GET", "/_nodus/", &[]);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let page = String::from_utf8(r.body).unwrap();
    assert!(page.contains("/_nodus/stats") && !page.contains("<script src"));
}

#[test]
fn every_spelling_of_nodus_is_the_admin_space_unless_admin_moves_it() {
    let dir = site();
    std::fs::create_dir(dir.path().join("_nodus")).unwrap();
    std::fs::write(dir.path().join("_nodus/file.txt"), "a file").unwrap();
    let server = Serve::start(dir.path(), 1, &[]);
    let a = server.addr;
    for path in [
        "/_nodus/file.txt",
        "/%5Fnodus/file.txt",
        "/%5fnodus/file.txt",
    ] {
        let r = request(a, "GET", path, &[]);
        assert_eq!(
            (r.status, r.body.as_slice()),
            (404, &b"no such admin endpoint\n"[..]),
            "{path}"
        );
    }
    let r = request(a, "GET", "/%5Fnodus/healthz", &[]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"ok\n"[..]));
    // From a client the admin endpoints refuse, still not the file.
    let r = request(
        a,
        "GET",
        "/%5Fnodus/file.txt",
        &["X-Forwarded-For: 203.0.113.9"],
    );
    assert_eq!(r.status, 403);
    // With --admin ADDR the public listener serves the directory like any other.
    drop(server);
    let admin_addr = free_addr();
    let server = Serve::start(dir.path(), 1, &["--admin", &admin_addr.to_string()]);
    for path in ["/_nodus/file.txt", "/%5Fnodus/file.txt"] {
        let r = request(server.addr, "GET", path, &[]);
        assert_eq!(
            (r.status, r.body.as_slice()),
            (200, &b"a file"[..]),
            "{path}"
        );
    }
}

#[test]
fn a_separate_admin_listener() {
    let dir = site();
    let admin_addr = free_addr();
    let server = Serve::start(dir.path(), 1, &["--admin", &admin_addr.to_string()]);
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

/// `--admin-on-public on|off`: whether the public listener answers `/_nodus/*`; by default on
/// without an admin listener, off with one. The start line says where they answer.
#[test]
fn admin_on_public_turns_the_admin_endpoints_on_the_public_listener_on_or_off() {
    let dir = site();
    std::fs::create_dir(dir.path().join("_nodus")).unwrap();
    std::fs::write(dir.path().join("_nodus/healthz"), "a file").unwrap();
    let get = |a: SocketAddr, path: &str| {
        let r = request(a, "GET", path, &[]);
        (r.status, String::from_utf8(r.body).unwrap())
    };
    let (ok, file) = ((200, "ok\n".to_owned()), (200, "a file".to_owned()));

    // The default: on, and the start line says what a same-host proxy must do.
    let mut server = Serve::start(dir.path(), 1, &[]);
    let line = server.proc.wait_line("on http://");
    assert!(
        line.contains("admin endpoints at /_nodus/ for loopback clients")
            && line.contains("adds no X-Forwarded-For, every client is one")
            && line.contains("--admin-on-public off"),
        "{line}"
    );
    assert_eq!(get(server.addr, "/_nodus/healthz"), ok);
    drop(server);

    // Off: even a loopback client gets the directory's files there, and no admin endpoint.
    let mut server = Serve::start(dir.path(), 1, &["--admin-on-public", "off"]);
    let line = server.proc.wait_line("on http://");
    assert!(line.contains("no admin endpoints"), "{line}");
    assert_eq!(get(server.addr, "/_nodus/healthz"), file);
    assert_eq!(get(server.addr, "/%5Fnodus/metrics").0, 404);
    drop(server);

    // On, with --admin: both listeners answer, the public one loopback clients only.
    let admin = free_addr();
    let mut server = Serve::start(
        dir.path(),
        1,
        &["--admin", &admin.to_string(), "--admin-on-public", "on"],
    );
    let line = server.proc.wait_line("on http://");
    assert!(
        line.contains(&format!(
            "admin endpoints on http://{admin}/_nodus/ and at /_nodus/"
        )),
        "{line}"
    );
    assert_eq!(get(admin, "/_nodus/healthz"), ok);
    assert_eq!(get(server.addr, "/_nodus/healthz"), ok);
    let relayed = request(
        server.addr,
        "GET",
        "/_nodus/healthz",
        &["X-Forwarded-For: 203.0.113.9"],
    );
    assert_eq!(relayed.status, 403);
    drop(server);

    // Off, with --admin: as --admin alone.
    let admin = free_addr();
    let server = Serve::start(
        dir.path(),
        1,
        &["--admin", &admin.to_string(), "--admin-on-public", "off"],
    );
    assert_eq!(get(admin, "/_nodus/healthz"), ok);
    assert_eq!(get(server.addr, "/_nodus/healthz"), file);
    drop(server);

    let stderr = usage_error(["serve", "--admin-on-public", "yes"]);
    assert!(stderr.contains("invalid value 'yes'"), "{stderr}");
}

/// A cluster's workers read `--admin-on-public` from the command line they re-execute: off, no
/// worker answers `/_nodus/*` on the public listener; on with `--admin`, they do, beside the
/// primary's admin listener.
#[test]
fn a_clusters_workers_follow_admin_on_public() {
    let dir = site();
    std::fs::create_dir(dir.path().join("_nodus")).unwrap();
    std::fs::write(dir.path().join("_nodus/healthz"), "a file").unwrap();
    let mut server = Serve::start(dir.path(), 2, &["--admin-on-public", "off"]);
    let line = server.proc.wait_line("on http://");
    assert!(line.contains("no admin endpoints"), "{line}");
    // Whichever worker answers: the file, never the endpoint.
    for _ in 0..4 {
        let r = request(server.addr, "GET", "/_nodus/healthz", &[]);
        assert_eq!((r.status, r.body.as_slice()), (200, &b"a file"[..]));
    }
    drop(server);
    let admin = free_addr();
    let server = Serve::start(
        dir.path(),
        2,
        &["--admin", &admin.to_string(), "--admin-on-public", "on"],
    );
    for _ in 0..4 {
        let r = request(server.addr, "GET", "/_nodus/stats", &[]);
        assert_eq!(r.status, 200);
        // The whole cluster's figures, as on the admin listener.
        let stats: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert!(stats["workers"].is_array(), "{stats}");
    }
    assert_eq!(request(admin, "GET", "/_nodus/healthz", &[]).status, 200);
}

#[test]
fn sigterm_turns_readyz_to_503_then_drains_and_exits_0() {
    let dir = site();
    let mut server = Serve::start(
        dir.path(),
        1,
        &["--shutdown-delay", "0.5", "--drain-timeout", "2"],
    );
    let a = server.addr;
    let ready = request(a, "GET", "/_nodus/readyz", &[]);
    assert_eq!((ready.status, &ready.body[..]), (200, &b"ready\n"[..]));
    server.proc.signal(rustix::process::Signal::TERM);
    std::thread::sleep(Duration::from_millis(150));
    let stopping = request(a, "GET", "/_nodus/readyz", &[]);
    assert_eq!(
        (stopping.status, &stopping.body[..]),
        (503, &b"shutting down\n"[..])
    );
    assert_eq!(
        request(a, "GET", "/hello.txt", &[]).status,
        200,
        "still serving during the delay"
    );
    assert_eq!(server.proc.wait_exit(Duration::from_secs(10)), Some(0));
    assert!(TcpStream::connect(a).is_err());
    let log = server.proc.output();
    assert!(log.iter().any(|l| l.contains("SIGTERM")), "{log:?}");
}

/// A file of `len` bytes (sparse) in `dir`, fetched by a client that reads only the status line:
/// its response stays half written in the server.
fn stalled_download(dir: &Path, addr: SocketAddr) -> TcpStream {
    let f = std::fs::File::create(dir.join("big.bin")).unwrap();
    f.set_len(64 << 20).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /big.bin HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut status = [0u8; 12];
    s.read_exact(&mut status).unwrap();
    assert_eq!(&status, b"HTTP/1.1 200");
    s
}

/// Starts `nodus serve` with `workers` and `drain_timeout`, leaves a download stalled in it,
/// sends SIGTERM, then `second` (if any) 200 ms later; checks the exit code and a log line.
fn stop_during_a_stalled_download(
    workers: u32,
    drain_timeout: &str,
    second: Option<rustix::process::Signal>,
    code: i32,
    logged: &str,
) {
    let dir = site();
    let mut server = Serve::start(dir.path(), workers, &["--drain-timeout", drain_timeout]);
    let _client = stalled_download(dir.path(), server.addr);
    server.proc.signal(rustix::process::Signal::TERM);
    if let Some(signal) = second {
        std::thread::sleep(Duration::from_millis(200));
        server.proc.signal(signal);
    }
    let exit = server.proc.wait_exit(Duration::from_secs(10));
    let log = server.proc.output();
    assert_eq!(exit, Some(code), "{log:#?}");
    assert!(log.iter().any(|l| l.contains(logged)), "{log:?}");
}

#[test]
fn a_drain_deadline_that_cuts_a_response_exits_124() {
    stop_during_a_stalled_download(
        1,
        "0.3",
        None,
        124,
        "the drain deadline cut 1 request in flight",
    );
}

#[test]
fn a_cluster_whose_worker_cut_a_response_at_its_drain_deadline_exits_124() {
    stop_during_a_stalled_download(2, "0.3", None, 124, "cut requests at its drain deadline");
}

#[test]
fn a_second_signal_during_the_drain_exits_at_once_with_128_plus_its_number() {
    let int = Some(rustix::process::Signal::INT);
    stop_during_a_stalled_download(1, "60", int, 130, "second SIGINT");
}

#[test]
fn bad_flags_and_a_busy_address_fail_clearly() {
    let out = Command::new(NODUS)
        .args(["serve", "--bogus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--bogus"));

    let out = Command::new(NODUS)
        .args(["serve", "--workers", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--workers"));

    let err = usage_error(["serve", "--max-connections", "0"]);
    assert!(
        err.contains("--max-connections")
            && err.contains("a whole number of connections, 1 or more"),
        "{err}"
    );

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = Command::new(NODUS)
        .args(["serve", "--listen", &addr])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already in use") && err.lines().count() == 1,
        "{err}"
    );

    // A busy admin address is named as the admin listener's (two addresses are given).
    let public = free_addr().to_string();
    let out = Command::new(NODUS)
        .args([
            "serve",
            "--listen",
            &public,
            "--admin",
            &addr,
            "--workers",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "cannot listen on {addr} (--admin): the address is already in use"
        )) && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn a_busy_address_fails_before_any_worker_under_every_policy() {
    let dir = site();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    for policy in ["rr", "shared", "reuseport", "least"] {
        let mut proc = Proc::spawn_group(
            Command::new(NODUS)
                .arg("serve")
                .arg(dir.path())
                .args(["--listen", &addr, "--workers", "2", "--policy", policy])
                .env("RUST_LOG", "info")
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
        );
        assert_eq!(proc.wait_exit(Duration::from_secs(10)), Some(1), "{policy}");
        // The watchdog's and slow-poll lines aside: on a loaded machine the start may be
        // reported as a stall or a slow poll.
        let out: Vec<&String> = proc
            .output()
            .iter()
            .filter(|l| !l.contains("nodus::watchdog") && !l.contains("nodus::slow_poll"))
            .collect();
        assert!(
            out.len() == 1 && out[0].contains("the address is already in use"),
            "{policy}: one line, no false 'serving on', no worker: {out:#?}"
        );
    }
}

#[test]
fn cluster_flags_with_one_worker_are_said_to_be_ignored() {
    let dir = site();
    let events = dir.path().join("events.jsonl");
    let events = events.to_str().unwrap();
    let mut one = Serve::start(dir.path(), 1, &["--policy", "shared", "--events", events]);
    one.proc.wait_line("--policy applies to a cluster");
    one.proc.wait_line("--events applies to a cluster");
}

#[test]
fn a_second_reuseport_cluster_on_the_same_port_is_refused() {
    let dir = site();
    let first = Serve::start(dir.path(), 2, &["--policy", "reuseport"]);
    let addr = first.addr.to_string();
    let mut second = Proc::spawn_group(
        Command::new(NODUS)
            .arg("serve")
            .arg(dir.path())
            .args(["--listen", &addr, "--workers", "2", "--policy", "reuseport"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    assert_eq!(
        second.wait_exit(Duration::from_secs(10)),
        Some(1),
        "it would have joined the first one's reuse-port group: {:#?}",
        second.output()
    );
    assert!(second.output()[0].contains("the address is already in use"));
}

#[test]
fn reuseport_workers_share_the_one_port_that_port_0_resolved_to() {
    let dir = site();
    let mut server = Serve::start(dir.path(), 2, &["--policy", "reuseport"]);
    assert_ne!(
        server.addr.port(),
        0,
        "the startup line shows the real port"
    );
    // Until a worker listens, nothing does (the primary holds the port without listening).
    server.proc.wait_line("2 workers ready");
    for _ in 0..20 {
        assert_eq!(request(server.addr, "GET", "/hello.txt", &[]).status, 200);
    }
}

#[test]
fn an_admin_address_that_is_also_the_listen_address_is_a_usage_error() {
    let dir = site();
    let addr = free_addr().to_string();
    let out = Command::new(NODUS)
        .arg("serve")
        .arg(dir.path())
        .args(["--listen", &addr, "--admin", &addr, "--workers", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.trim(),
        format!("nodus serve: --admin {addr} is also a --listen address")
    );
}

#[test]
fn a_1gib_sparse_file_streams_in_bounded_memory_while_healthz_answers() {
    let dir = TempDir::new("sparse");
    let f = std::fs::File::create(dir.path().join("big.bin")).unwrap();
    f.set_len(1 << 30).unwrap();
    drop(f);
    let server = Serve::start(dir.path(), 1, &[]);
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
        max_rss = max_rss.max(rss_kib(server.proc.id()));
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
    let server = Serve::start(dir.path(), 1, &["--gzip"]);
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
    // HTTP/1.0 has no chunked coding: the gzip body (no length) ends with the connection, and
    // the answer to a keep-alive request says so (nginx keeps no such connection either).
    let mut s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(
        b"GET /big.txt HTTP/1.0\r\nConnection: keep-alive\r\nAccept-Encoding: gzip\r\n\r\n",
    )
    .unwrap();
    let r = nodus_testkit::http::read_reply(&mut BufReader::new(s), false).unwrap();
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(r.header("content-length"), None);
    assert!(r.closes(), "{:?}", r.headers);
    let mut plain = String::new();
    flate2::read::GzDecoder::new(&r.body[..])
        .read_to_string(&mut plain)
        .unwrap();
    assert_eq!(plain, text);
}

#[test]
fn gzip_head_304_and_identity_responses_agree_with_the_gzip_get() {
    let dir = TempDir::new("gzip-agree");
    let text = "a compressible line of text\n".repeat(200);
    std::fs::write(dir.path().join("big.txt"), &text).unwrap();
    let server = Serve::start(dir.path(), 1, &["--gzip"]);
    let a = server.addr;
    let get = request(a, "GET", "/big.txt", &["Accept-Encoding: gzip"]);
    assert_eq!(get.header("content-encoding"), Some("gzip"));
    let etag = get.header("etag").unwrap().to_owned();
    // HEAD: the GET's headers.
    let head = request(a, "HEAD", "/big.txt", &["Accept-Encoding: gzip"]);
    for name in ["etag", "content-encoding", "vary", "accept-ranges"] {
        assert_eq!(head.header(name), get.header(name), "{name}");
    }
    assert_eq!(head.header("content-length"), None);
    assert_eq!(get.header("accept-ranges"), None);
    // A revalidation of the gzip response: the gzip response's tag and Vary.
    let inm = format!("If-None-Match: {etag}");
    let r = request(a, "GET", "/big.txt", &["Accept-Encoding: gzip", &inm]);
    assert_eq!(r.status, 304);
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    assert_eq!(r.header("vary"), Some("Accept-Encoding"));
    // The identity response of the same URL says it varies too.
    let r = request(a, "GET", "/big.txt", &[]);
    assert_eq!((r.status, r.header("vary")), (200, Some("Accept-Encoding")));
    assert_eq!(r.body, text.as_bytes());
    // An explicit q=0 for gzip wins over `*`, and `Q` is `q`.
    for refusal in ["gzip;q=0, *", "gzip;Q=0"] {
        let ae = format!("Accept-Encoding: {refusal}");
        let r = request(a, "GET", "/big.txt", &[&ae]);
        assert_eq!(r.header("content-encoding"), None, "{refusal}");
        assert_eq!(r.body, text.as_bytes(), "{refusal}");
    }
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
    let mut child = Proc::spawn(
        Command::new("python3")
            .args(["-c", script, NODUS])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let port = child.lines.recv_timeout(Duration::from_secs(20)).unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", port.trim()).parse().unwrap();
    // The listener exists before nodus starts: the connection queues until it serves it.
    let reply = request(addr, "GET", "/hello.txt", &[]);
    child.signal(rustix::process::Signal::TERM);
    let code = child.wait_exit(Duration::from_secs(20));
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, b"hello, nodus\n");
    assert_eq!(code, Some(0));
}

/// `nodus ARGS...` started the way systemd socket activation starts it: Python binds one
/// loopback socket per `(name, SO_REUSEPORT)`, puts them at fds 3.. with `LISTEN_FDS`,
/// `LISTEN_PID` and `LISTEN_FDNAMES`, and becomes nodus (so, unlike systemd, it keeps no copy).
/// The process (stdout and stderr lines) and the sockets' addresses.
fn socket_activated(sockets: &[(&str, bool)], args: &[&str]) -> (Proc, Vec<SocketAddr>) {
    let script = r#"
import fcntl, os, socket, sys
specs, argv = sys.argv[1], sys.argv[2:]
names, ports, socks = [], [], []
for spec in specs.split(","):
    name, reuse = spec.split(":")
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse == "1": s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(("127.0.0.1", 0)); s.listen(16)
    names.append(name); ports.append(str(s.getsockname()[1])); socks.append(s)
# Copies above the fds to fill first (a socket may sit on one of them), then in place.
high = [fcntl.fcntl(s.fileno(), fcntl.F_DUPFD_CLOEXEC, 100) for s in socks]
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i)
print("ports: " + " ".join(ports), flush=True)
env = dict(os.environ, LISTEN_FDS=str(len(names)), LISTEN_PID=str(os.getpid()),
           LISTEN_FDNAMES=":".join(names), RUST_LOG="info")
os.execve(argv[0], argv, env)
"#;
    let specs: Vec<String> = sockets
        .iter()
        .map(|(name, reuse)| format!("{name}:{}", u8::from(*reuse)))
        .collect();
    let mut child = Proc::spawn(
        Command::new("python3")
            .args(["-c", script, &specs.join(","), NODUS])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    // By its mark, not as the first line: nodus's stderr may come through before it (two pipes),
    // and `wait_line` keeps what it passes over for the test's own waits.
    let line = child.wait_line("ports: ");
    let addrs = line["ports: ".len()..]
        .split(' ')
        .map(|p| format!("127.0.0.1:{p}").parse().unwrap())
        .collect();
    (child, addrs)
}

/// Under reuseport each worker binds a socket of its own beside the listener: a socket passed
/// by a service manager is refused at the start, by `serve` and `run`, with its address and
/// what to use instead, whether it lacks `SO_REUSEPORT` (the workers could not bind) or has it
/// (systemd would keep its copy listening, where connections would wait for nobody).
#[test]
fn reuseport_refuses_a_passed_socket_with_its_address_and_what_to_use() {
    if !common::have("python3") {
        return;
    }
    let dir = site();
    let serve = [
        "serve",
        dir.path().to_str().unwrap(),
        "--workers",
        "2",
        "--policy",
        "reuseport",
    ];
    let run = [
        "run",
        "-w",
        "1",
        "--policy",
        "reuseport",
        "--",
        "sleep",
        "10",
    ];
    for (reuse, why) in [
        (false, "it has no SO_REUSEPORT"),
        (true, "keeps its own copy"),
    ] {
        for command in [&serve[..], &run[..]] {
            let (mut nodus, addrs) = socket_activated(&[("http", reuse)], command);
            let code = nodus.wait_exit(Duration::from_secs(20));
            let out = nodus.output().join("\n");
            assert_eq!(code, Some(1), "{command:?} {reuse}: {out}");
            let said = format!(
                "--policy reuseport cannot serve the socket passed on {} (socket activation): ",
                addrs[0]
            );
            assert!(out.contains(&said), "{command:?} {reuse}: {out}");
            assert!(out.contains(why), "{command:?} {reuse}: {out}");
            assert!(out.contains("use --policy rr or shared"), "{out}");
        }
    }
}

/// Socket activation decides the addresses: an explicit `--listen` (and `--admin`, when a socket
/// named `admin` is passed) is ignored, and a warning says so and what is served instead.
#[test]
fn addresses_given_for_passed_sockets_are_ignored_with_a_warning() {
    if !common::have("python3") {
        return;
    }
    let dir = site();
    let (listen, admin) = (free_addr(), free_addr());
    let (mut nodus, addrs) = socket_activated(
        &[("http", false), ("admin", false)],
        &[
            "serve",
            dir.path().to_str().unwrap(),
            "--workers",
            "1",
            "--listen",
            &listen.to_string(),
            "--admin",
            &admin.to_string(),
        ],
    );
    let line = nodus.wait_line("--listen");
    assert!(
        line.contains("WARN")
            && line.contains(&format!(
                "--listen {listen} ignored: serving the socket the service manager passed ({})",
                addrs[0]
            )),
        "{line}"
    );
    let line = nodus.wait_line("--admin");
    assert!(
        line.contains("WARN")
            && line.contains(&format!(
                "--admin {admin} ignored: serving /_nodus/ on the socket named admin the service \
                 manager passed ({})",
                addrs[1]
            )),
        "{line}"
    );
    assert_eq!(request(addrs[0], "GET", "/hello.txt", &[]).status, 200);
    assert_eq!(request(addrs[1], "GET", "/_nodus/healthz", &[]).status, 200);
    nodus.signal(rustix::process::Signal::TERM);
    assert_eq!(nodus.wait_exit(Duration::from_secs(20)), Some(0));
}

#[test]
fn the_service_manager_hears_ready_and_stopping() {
    let dir = site();
    let (sock_path, manager) = notify_manager("nodus-notify");
    let mut child = Proc::spawn(
        Command::new(NODUS)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .arg(dir.path())
            .env("NOTIFY_SOCKET", &sock_path)
            .stderr(Stdio::null()),
    );
    let mut buf = [0u8; 256];
    let n = common::recv_datagram(&manager, &mut buf).unwrap();
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    child.signal(rustix::process::Signal::TERM);
    let n = common::recv_datagram(&manager, &mut buf).unwrap();
    let stopping = String::from_utf8_lossy(&buf[..n]).into_owned();
    let code = child.wait_exit(Duration::from_secs(20));
    let _ = std::fs::remove_file(&sock_path);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    assert_eq!(code, Some(0));
}

/// A terminal's hangup (the kernel's SIGHUP) stops a foreground single process as SIGTERM
/// does (exit code 0): it does not take it for a reload's SIGHUP and serve on detached.
#[test]
fn a_terminal_hangup_stops_a_single_process_as_sigterm_does() {
    if !common::have("python3") {
        return;
    }
    let dir = site();
    let addr = free_addr().to_string();
    let root = dir.path().to_str().unwrap();
    let outcome = common::hang_up(
        "serving",
        &["serve", "--workers", "1", "--listen", &addr, root],
    );
    assert_eq!(outcome, "exit 0");
}

/// The usual hangup: an interactive shell forwards the kernel's SIGHUP to its foreground job
/// with `killpg` (`SI_USER`, as bash does). The terminal is hung up by then: the single process
/// stops (exit code 0) rather than take it for a reload's SIGHUP.
#[test]
fn a_hangup_a_shell_forwards_stops_a_single_process() {
    if !common::have("python3") {
        return;
    }
    let dir = site();
    let addr = free_addr().to_string();
    let root = dir.path().to_str().unwrap();
    let hung_up = common::hang_up_as(
        common::Tty::Shell,
        "serving",
        &["serve", "--workers", "1", "--listen", &addr, root],
        30,
    );
    assert_eq!(hung_up.outcome, "exit 0");
}

/// SIGHUP to a single process (`--workers 1`, the default on one core): nothing to reload, but
/// it must not stop it. A download in flight across it completes, new requests are served, one
/// line says so, and SIGTERM afterwards drains and exits 0.
#[test]
fn sighup_to_a_single_process_reloads_nothing_and_loses_nothing() {
    let dir = site();
    let len: usize = 16 << 20; // more than the socket buffers hold: still being written
    std::fs::File::create(dir.path().join("big.bin"))
        .unwrap()
        .set_len(len as u64)
        .unwrap();
    let mut server = Serve::start(dir.path(), 1, &[]);
    let s = TcpStream::connect(server.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    (&s).write_all(b"GET /big.bin HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut download = BufReader::new(s);
    let head = nodus_testkit::http::read_reply(&mut download, true).unwrap();
    assert_eq!(head.status, 200);

    server.proc.signal(rustix::process::Signal::HUP);
    let line = server.proc.wait_line("SIGHUP");
    assert!(
        line.contains("nothing reloaded") && line.contains("--workers 2 or more"),
        "{line}"
    );
    assert!(
        server
            .proc
            .exited_within(Duration::from_millis(300))
            .is_none(),
        "SIGHUP stopped it: {:#?}",
        server.proc.output()
    );
    assert_eq!(request(server.addr, "GET", "/hello.txt", &[]).status, 200);
    // The download goes on to its last byte, read slowly.
    let (mut total, mut buf) = (0, vec![0u8; 256 * 1024]);
    loop {
        match download.read(&mut buf).unwrap() {
            0 => break,
            n => total += n,
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(total, len, "the download was cut");

    server.proc.signal(rustix::process::Signal::TERM);
    assert_eq!(server.proc.wait_exit(Duration::from_secs(10)), Some(0));
}

#[test]
fn a_service_manager_reloading_a_single_process_hears_reloading_then_ready() {
    let dir = site();
    let (sock_path, manager) = notify_manager("nodus-notify-reload");
    let mut child = Proc::spawn(
        Command::new(NODUS)
            .args(["serve", "--listen", "127.0.0.1:0", "--workers", "1"])
            .arg(dir.path())
            .env("NOTIFY_SOCKET", &sock_path)
            .stderr(Stdio::null()),
    );
    let mut buf = [0u8; 256];
    let mut next = || {
        let n = common::recv_datagram(&manager, &mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let ready = next();
    let asked = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let asked_usec = asked.tv_sec as u64 * 1_000_000 + asked.tv_nsec as u64 / 1000;
    child.signal(rustix::process::Signal::HUP);
    let reloading = next();
    let ready_again = next();
    child.signal(rustix::process::Signal::TERM);
    let stopping = next();
    let code = child.wait_exit(Duration::from_secs(20));
    let _ = std::fs::remove_file(&sock_path);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(
        reloading.lines().any(|l| l == "RELOADING=1"),
        "{reloading:?}"
    );
    // systemd (Type=notify-reload) wants the reload's start on CLOCK_MONOTONIC, after its signal.
    let usec: u64 = reloading
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no MONOTONIC_USEC: {reloading:?}"));
    assert!(
        (asked_usec..asked_usec + 20_000_000).contains(&usec),
        "{usec} vs {asked_usec}"
    );
    assert!(
        ready_again.lines().any(|l| l == "READY=1"),
        "{ready_again:?}"
    );
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    assert_eq!(code, Some(0));
}

#[test]
fn a_listen_fds_count_beyond_the_passed_sockets_is_refused_with_the_fd_named() {
    if !common::have("python3") {
        return;
    }
    let site = site();
    // One real socket at fd 3, but LISTEN_FDS says 2: fd 4 is whatever nodus opens first.
    let script = "import os, socket, sys\n\
                  s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n\
                  os.dup2(s.fileno(), 3); os.set_inheritable(3, True)\n\
                  os.environ['LISTEN_PID'] = str(os.getpid()); os.environ['LISTEN_FDS'] = '2'\n\
                  os.execv(sys.argv[1], sys.argv[1:])\n";
    let out = Command::new("python3")
        .args(["-c", script, NODUS, "serve"])
        .arg(site.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("LISTEN_FDS names fd 4"), "{stderr}");
}

/// With `WATCHDOG_USEC` (systemd's `WatchdogSec=`), the single process sends `WATCHDOG=1` every
/// half period; not when `WATCHDOG_PID` names another process.
#[test]
fn a_single_process_pings_the_watchdog_that_is_its_own() {
    let dir = site();
    for watchdog_pid in [None, Some("1")] {
        let (sock_path, manager) = notify_manager("nodus-notify-watchdog");
        let mut cmd = Command::new(NODUS);
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--workers", "1"])
            .arg(dir.path())
            .env("NOTIFY_SOCKET", &sock_path)
            .env("WATCHDOG_USEC", "300000")
            .stderr(Stdio::null());
        match watchdog_pid {
            Some(pid) => cmd.env("WATCHDOG_PID", pid),
            None => cmd.env_remove("WATCHDOG_PID"),
        };
        let mut child = Proc::spawn(&mut cmd);
        let mut buf = [0u8; 256];
        let mut next = || {
            common::recv_datagram(&manager, &mut buf)
                .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
        };
        let ready = next().unwrap();
        assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
        let mut heard = Vec::new();
        if watchdog_pid.is_none() {
            // Every 150 ms.
            while heard.len() < 3 {
                heard.push(next().expect("WATCHDOG=1 within 20 s"));
            }
            assert!(heard.iter().all(|m| m == "WATCHDOG=1"), "{heard:?}");
        } else {
            // Six periods go by in silence.
            manager
                .set_read_timeout(Some(Duration::from_millis(900)))
                .unwrap();
            heard.extend(next().ok());
            assert!(heard.is_empty(), "{heard:?}");
        }
        child.signal(rustix::process::Signal::TERM);
        assert_eq!(child.wait_exit(Duration::from_secs(20)), Some(0));
        let _ = std::fs::remove_file(&sock_path);
    }
}

/// Two inherited sockets, neither named `admin` (two `ListenStream=` in one `.socket` unit):
/// one public listener is served, so the start is refused (exit code 1), in a line that names
/// the second socket by its name and address.
#[test]
fn a_second_public_inherited_socket_is_refused_with_its_address() {
    if !common::have("python3") {
        return;
    }
    let site = site();
    let script = "import os, socket, sys\n\
                  a = socket.socket(); a.bind(('127.0.0.1', 0)); a.listen()\n\
                  b = socket.socket(); b.bind(('127.0.0.1', 0)); b.listen()\n\
                  print(b.getsockname()[1], flush=True)\n\
                  os.dup2(a.fileno(), 3); os.dup2(b.fileno(), 4)\n\
                  os.set_inheritable(3, True); os.set_inheritable(4, True)\n\
                  os.environ['LISTEN_PID'] = str(os.getpid()); os.environ['LISTEN_FDS'] = '2'\n\
                  os.execv(sys.argv[1], sys.argv[1:])\n";
    let out = Command::new("python3")
        .args(["-c", script, NODUS, "serve", "--workers", "1"])
        .arg(site.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let port = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot serve the inherited socket 'unknown' on 127.0.0.1:{port}: one public TCP \
             listener (and one named admin) is supported"
        )),
        "{stderr}"
    );
}

#[test]
fn listings_off_answers_a_directory_without_index_404_and_on_lists_it() {
    let dir = site();
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    let off = Serve::start(dir.path(), 1, &["--listings", "off"]);
    for (path, status) in [
        ("/docs/", 404),
        ("/empty/", 404),
        ("/docs", 301),
        ("/", 200),
        ("/hello.txt", 200),
    ] {
        let r = request(off.addr, "GET", path, &[]);
        assert_eq!(r.status, status, "--listings off: GET {path}");
    }
    let r = request(off.addr, "HEAD", "/docs/", &[]);
    assert_eq!(r.status, 404);
    // The default: listed, the same page twice (the second from the cache, or built again).
    let on = Serve::start(dir.path(), 1, &[]);
    for _ in 0..2 {
        let r = request(on.addr, "GET", "/docs/", &[]);
        assert_eq!(r.status, 200);
        assert!(
            String::from_utf8(r.body)
                .unwrap()
                .contains("a&amp;b &lt;c&gt;.txt")
        );
    }
    let r = request(on.addr, "HEAD", "/empty/", &[]);
    assert_eq!((r.status, r.body.len()), (200, 0));
}

/// At its open-files limit (lowered with `prlimit` once it listens, connections holding the
/// rest), `nodus serve` answers `GET /` of a site with an `index.html` 200 or 503 with
/// `Retry-After`: never 403, 404 or the directory's listing. The 503s are one log line however
/// many there are, and so are the accepts that fail meanwhile; once the connections close it
/// serves again.
#[test]
fn out_of_fds_answers_503_never_403_404_or_a_listing_and_logs_it_once() {
    use nodus_testkit::http::{Timeouts, connect, read_reply, write_request};
    use rustix::process::{Pid, Resource, Rlimit, prlimit};
    let dir = TempDir::new("serve-out-of-fds");
    std::fs::write(dir.path().join("index.html"), "hello\n").unwrap();
    std::fs::write(dir.path().join("other.txt"), "other\n").unwrap();
    let mut server = Serve::start(dir.path(), 1, &[]);
    let pid = Pid::from_raw(server.proc.id() as i32).unwrap();
    // Room for 24 more: the kernel gives the lowest free number, refused at the limit.
    let open: std::collections::HashSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let limit = (0..).filter(|n| !open.contains(n)).nth(24);
    prlimit(
        Some(pid),
        Resource::Nofile,
        Rlimit {
            current: limit,
            maximum: limit,
        },
    )
    .unwrap();
    let t = Timeouts {
        connect: Duration::from_secs(5),
        io: Duration::from_secs(1),
    };
    let ask = |s: &mut TcpStream| {
        write_request(s, "GET", "/", &[])?;
        read_reply(&mut BufReader::new(s), false)
    };
    // New keep-alive connections, each asking for `/`, until one is not even accepted.
    let (mut held, mut statuses) = (Vec::new(), Vec::new());
    let mut retry_after = None;
    loop {
        assert!(held.len() < 200, "no accept failed: {statuses:?}");
        let mut s = connect(server.addr, t).unwrap();
        let Ok(reply) = ask(&mut s) else { break };
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        assert!(
            matches!((reply.status, body.as_str()), (200, "hello\n") | (503, _)),
            "{} {body:?} after {statuses:?}",
            reply.status
        );
        if reply.status == 503 {
            retry_after = reply.header("retry-after").map(str::to_owned);
        }
        statuses.push(reply.status);
        held.push(s);
    }
    assert!(statuses.contains(&503), "{statuses:?}");
    assert_eq!(retry_after.as_deref(), Some("5"));
    // Out of fds for a while: every request on the connections held is 503, and the accept of
    // the last one fails every 100 ms.
    let deadline = Instant::now() + Duration::from_millis(600);
    while Instant::now() < deadline {
        let status = ask(&mut held[0]).map(|r| r.status);
        assert!(matches!(status, Ok(200 | 503)), "{status:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(held);
    let recovered = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        common::http::try_request(server.addr, "GET", "/", &[]).is_ok_and(|r| r.status == 200)
    });
    assert!(recovered, "not serving again once the connections closed");
    server.proc.signal(rustix::process::Signal::TERM);
    assert_eq!(server.proc.wait_exit(Duration::from_secs(20)), Some(0));
    let out = server.proc.output();
    let said: Vec<&String> = out
        .iter()
        .filter(|l| l.contains("answered 503 (further failures are counted"))
        .collect();
    assert_eq!(said.len(), 1, "{out:#?}");
    assert!(said[0].contains("Too many open files"), "{out:#?}");
    let accepts = out.iter().filter(|l| l.contains("accept failed")).count();
    assert_eq!(accepts, 1, "{out:#?}");
}

/// Starts `cmd` with `limit` open files at most (soft and hard).
fn limit_open_files(cmd: &mut Command, limit: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Started with an open-files limit of 64 (a container's, `LimitNOFILE=64`), `nodus serve`
/// keeps fewer connections open than the limit, the cap it says at the start, so clients that
/// hold more keep-alive connections than the limit do not starve its file opens: every request
/// on the connections it took is answered 200 (not 503), a newcomer waits in the backlog, and
/// is served once a held connection closes.
///
/// Counted, not timed, so that a loaded host (a CI run) cannot fail it: the test may be
/// descheduled or frozen for seconds anywhere. A held connection it leaves silent for the
/// keep-alive timeout the server closes, as it should (never sooner: that fails the test), and
/// the slot goes to the first waiting connection (the backlog is first in, first out). So the
/// waiting connection `j` may be answered only once `j + 1` held ones were closed; one answered
/// before is one past the cap, and fails the test. A wait a signal cuts short (a stop and
/// continue, a freezer's thaw) is waited again.
#[test]
fn connections_past_the_fd_limit_wait_in_the_backlog_and_those_held_are_served() {
    use nodus_testkit::http::{Timeouts, connect, read_reply, write_request};
    const LIMIT: u64 = 64;
    // `nodus serve` keeps nodus-http's defaults.
    let defaults = nodus_http::Config::default();
    let keep_alive = defaults.keep_alive_timeout;
    let dir = TempDir::new("serve-fd-cap");
    std::fs::write(dir.path().join("index.html"), "hello\n").unwrap();
    let mut server = Serve::start_with(dir.path(), 1, &[], |cmd| limit_open_files(cmd, LIMIT));
    let said = server.proc.wait_line("connection cap");
    let cap: usize = said
        .split("connection cap ")
        .nth(1)
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no cap in {said:?}"));
    assert!((1..32).contains(&cap), "{said}");
    assert!(
        said.contains("WARN") && said.contains("open-files limit 64"),
        "{said}"
    );
    let t = Timeouts {
        connect: Duration::from_secs(5),
        io: Duration::from_secs(5),
    };
    let hello = |reply: &nodus_testkit::http::Reply| {
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        assert_eq!((reply.status, body.as_str()), (200, "hello\n"));
    };
    // The cap's worth, each answered once: the server holds them.
    let mut held: Vec<Held> = (0..cap)
        .map(|i| {
            let mut h = Held {
                s: connect(server.addr, t).unwrap(),
                asked: Instant::now(),
            };
            let reply = h
                .ask("/", keep_alive)
                .unwrap_or_else(|| panic!("connection {i} closed"));
            hello(&reply);
            h
        })
        .collect();
    // More than the limit in all: the rest wait in the backlog (the kernel completes their
    // handshake). The first of them asks at once.
    let connected = Instant::now();
    let mut waiting: Vec<TcpStream> = (cap..LIMIT as usize + 6)
        .map(|_| connect(server.addr, t).unwrap())
        .collect();
    write_request(&mut waiting[0], "GET", "/", &[]).unwrap();
    let mut waiting_asked = Instant::now();
    // The held connections the server closed, and the waiting ones answered since (held now).
    let (mut closed, mut served) = (0, 0);
    // Asks each held connection (the first for the stats, which say the cap): each answered,
    // or closed after the keep-alive timeout (counted and dropped).
    let mut stats_seen = false;
    let mut ask_all = |held: &mut Vec<Held>, closed: &mut usize| {
        let mut first = true;
        held.retain_mut(|h| {
            let path = if first { "/_nodus/stats" } else { "/" };
            let Some(reply) = h.ask(path, keep_alive) else {
                *closed += 1;
                return false;
            };
            if first {
                let stats: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
                assert_eq!(stats["http"]["connections_max"], cap, "{stats}");
                stats_seen = true;
            } else {
                hello(&reply);
            }
            first = false;
            true
        });
    };
    // Every held connection is still served, again and again, for a while.
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        ask_all(&mut held, &mut closed);
    }
    // Not accepted meanwhile: no answer, while every connection the server took is held.
    let mut rounds = 0;
    loop {
        rounds += 1;
        assert!(rounds < 200, "{closed} closed, {served} served");
        closed += reap(&mut held, keep_alive);
        let early = answered_within(&waiting[0], Duration::from_millis(300));
        closed += reap(&mut held, keep_alive);
        if early {
            // The close that made room may reach this end after the answer (each is a
            // loopback softirq, maybe on another CPU): looked for again, for a second.
            let by = Instant::now() + Duration::from_secs(1);
            while served >= closed && Instant::now() < by {
                std::thread::sleep(Duration::from_millis(10));
                closed += reap(&mut held, keep_alive);
            }
            assert!(
                served < closed,
                "a connection past the cap was answered: {served} waiting ones were before, \
                 {closed} held ones closed"
            );
            let mut s = waiting.remove(0);
            s.set_read_timeout(Some(t.io)).unwrap();
            match read_reply(&mut BufReader::new(&mut s), false) {
                Ok(reply) => {
                    hello(&reply);
                    held.push(Held {
                        s,
                        asked: waiting_asked,
                    });
                }
                // Taken while the test was stopped, before it asked, and closed for that: no
                // head within the header-read timeout (never sooner). Its slot is free again.
                Err(e) if is_close(&e) => {
                    let silent = connected.elapsed();
                    assert!(
                        silent >= defaults.header_read_timeout,
                        "a connection taken from the backlog closed ({e}) {silent:?} after it \
                         connected, within the header-read timeout"
                    );
                    closed += 1;
                }
                Err(e) => panic!("a connection taken from the backlog: {e}"),
            }
            served += 1;
            assert!(
                !waiting.is_empty(),
                "every waiting connection was taken: the test was stopped for too long"
            );
            write_request(&mut waiting[0], "GET", "/", &[]).unwrap();
            waiting_asked = Instant::now();
        } else if closed == served {
            break;
        }
        // A slot freed, or another round: the held ones asked again, so they stay open.
        ask_all(&mut held, &mut closed);
    }
    assert!(stats_seen, "no stats: every held connection closed at once");
    // One held connection closes: the first waiting one is accepted and served.
    drop(held.remove(0));
    waiting[0].set_read_timeout(Some(t.io)).unwrap();
    hello(&read_reply(&mut BufReader::new(&mut waiting[0]), false).unwrap());
    drop((held, waiting));
    server.proc.signal(rustix::process::Signal::TERM);
    assert_eq!(server.proc.wait_exit(Duration::from_secs(20)), Some(0));
    let out = server.proc.output();
    assert!(
        !out.iter()
            .any(|l| l.contains("answered 503") || l.contains("accept failed")),
        "{out:#?}"
    );
}

/// A keep-alive connection the server took, and when its last request was sent.
struct Held {
    s: TcpStream,
    asked: Instant,
}

impl Held {
    /// `GET path` and its reply; `None` when the server had closed the connection, which it
    /// does only once it was silent for `keep_alive` (sooner fails the test).
    fn ask(&mut self, path: &str, keep_alive: Duration) -> Option<nodus_testkit::http::Reply> {
        use nodus_testkit::http::{read_reply, write_request};
        let before = std::mem::replace(&mut self.asked, Instant::now());
        let got = write_request(&mut self.s, "GET", path, &[])
            .and_then(|()| read_reply(&mut BufReader::new(&mut self.s), false));
        match got {
            Ok(reply) => Some(reply),
            Err(e) if is_close(&e) => {
                assert_silent(before, keep_alive, &e.to_string());
                None
            }
            Err(e) => panic!("a held connection, GET {path}: {e}"),
        }
    }

    /// Whether the server closed it (its end or a reset waits to be read); as for `ask`, only
    /// once it was silent for `keep_alive`.
    fn closed(&self, keep_alive: Duration) -> bool {
        self.s.set_nonblocking(true).unwrap();
        let peeked = self.s.peek(&mut [0u8; 1]);
        self.s.set_nonblocking(false).unwrap();
        match peeked {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Ok(0) => {
                assert_silent(self.asked, keep_alive, "its end");
                true
            }
            Err(e) if is_close(&e) => {
                assert_silent(self.asked, keep_alive, &e.to_string());
                true
            }
            other => panic!("a held connection with no request: {other:?}"),
        }
    }
}

/// Drops the held connections the server closed (see [`Held::closed`]); how many.
fn reap(held: &mut Vec<Held>, keep_alive: Duration) -> usize {
    let before = held.len();
    held.retain(|h| !h.closed(keep_alive));
    before - held.len()
}

/// An error that says the peer closed or reset the connection.
fn is_close(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted
    )
}

/// A close seen (`what`) on a connection whose last request was sent at `asked`: the server
/// closes one only once it was silent for its keep-alive timeout, which began after that.
fn assert_silent(asked: Instant, keep_alive: Duration, what: &str) {
    let silent = asked.elapsed();
    assert!(
        silent >= keep_alive,
        "a held connection closed ({what}) {silent:?} after its last request, before the \
         keep-alive timeout ({keep_alive:?})"
    );
}

/// Whether `s` has something to read (an answer, or its end) within `wait`. Looked at again
/// when a signal cuts the wait short: with a receive timeout set the kernel never restarts
/// `recv` (signal(7)), so a stop and continue of the test process (a freezer's thaw too) fails
/// it with `EINTR` (looked at once more, however late).
fn answered_within(s: &TcpStream, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        match s.peek(&mut [0u8; 1]) {
            Ok(_) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(e) => panic!("a waiting connection: {e}"),
        }
    }
}

/// The same in a 2-worker cluster under rr, each worker with the limit it inherits (320): each
/// says its own cap and holds that many connections, whose requests are all answered 200, while
/// twice the limit's worth of clients wait (what the primary hands a worker at its cap and the
/// worker has not accepted is bounded: it refuses batches past `HANDOFF_QUEUE_MAX`, so its fds
/// are not spent on connections it does not serve). Once the held ones close, those waiting are
/// served, never 503.
#[test]
fn a_cluster_worker_at_its_connection_cap_takes_no_more_than_it_serves() {
    use nodus_testkit::http::read_reply;
    const LIMIT: u64 = 320;
    let dir = TempDir::new("serve-fd-cap-cluster");
    std::fs::write(dir.path().join("index.html"), "hello\n").unwrap();
    let mut server = Serve::start_with(dir.path(), 2, &["--policy", "rr"], |cmd| {
        limit_open_files(cmd, LIMIT)
    });
    // Each worker's first line: its cap, at WARN (low).
    for id in [1, 2] {
        server.proc.wait_line(&format!("[worker {id} "));
    }
    let caps: Vec<usize> = server
        .proc
        .seen()
        .iter()
        .filter_map(|l| {
            l.split("connection cap ")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(caps.len(), 2, "{:#?}", server.proc.seen());
    let cap: usize = caps.iter().sum();
    assert!((2..200).contains(&cap), "{caps:?}");
    let answer =
        |r: &nodus_testkit::http::Reply| (r.status, String::from_utf8_lossy(&r.body).into_owned());
    // Twice the limit's worth of clients, each asking once.
    let mut clients: Vec<TcpStream> = (0..2 * LIMIT as usize + 20)
        .map(|_| {
            let mut s = TcpStream::connect(server.addr).unwrap();
            nodus_testkit::http::write_request(&mut s, "GET", "/", &[]).unwrap();
            s
        })
        .collect();
    // Answered by now: the caps' worth; the others wait.
    let answered = |clients: &mut [TcpStream], wait: Duration| {
        std::thread::sleep(wait);
        clients
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| {
                s.set_nonblocking(true).unwrap();
                let mut byte = [0u8; 1];
                let ready = s.peek(&mut byte).is_ok();
                s.set_nonblocking(false).unwrap();
                ready.then_some(i)
            })
            .collect::<Vec<usize>>()
    };
    let first = answered(&mut clients, Duration::from_secs(2));
    assert_eq!(first.len(), cap, "answered {first:?}");
    let (mut held, mut waiting) = (Vec::new(), Vec::new());
    for (i, s) in clients.into_iter().enumerate() {
        if first.contains(&i) {
            held.push(s);
        } else {
            waiting.push(s);
        }
    }
    let io = Some(Duration::from_secs(5));
    for s in held.iter_mut().chain(&mut waiting) {
        s.set_read_timeout(io).unwrap();
        s.set_write_timeout(io).unwrap();
    }
    let read = |s: &mut TcpStream| read_reply(&mut BufReader::new(s), false);
    for (i, s) in held.iter_mut().enumerate() {
        let reply = read(s).unwrap_or_else(|e| panic!("held connection {i}: {e}"));
        assert_eq!(
            answer(&reply),
            (200, "hello\n".into()),
            "held connection {i}"
        );
    }
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        for (i, s) in held.iter_mut().enumerate() {
            nodus_testkit::http::write_request(s, "GET", "/", &[]).unwrap();
            let reply = read(s).unwrap_or_else(|e| panic!("held connection {i}: {e}"));
            assert_eq!(
                answer(&reply),
                (200, "hello\n".into()),
                "held connection {i}"
            );
        }
    }
    // The held ones close: as many waiting ones are served in their place, with 200.
    drop(held);
    let next = answered(&mut waiting, Duration::from_secs(2));
    assert_eq!(next.len(), cap, "answered {next:?}");
    for i in next {
        let reply = read(&mut waiting[i]).unwrap();
        assert_eq!(
            answer(&reply),
            (200, "hello\n".into()),
            "waiting connection {i}"
        );
    }
    drop(waiting);
    server.proc.signal(rustix::process::Signal::TERM);
    assert_eq!(server.proc.wait_exit(Duration::from_secs(30)), Some(0));
    let out = server.proc.output();
    assert!(
        !out.iter()
            .any(|l| l.contains("answered 503") || l.contains("fd limit?")),
        "{out:#?}"
    );
}
