//! `nodus run --node` workers listening on a Unix socket path (`server.listen('/path/app.sock')`,
//! nginx in front over a socket), as under Node's own cluster primary: under every policy both
//! workers serve HTTP over the socket, `server.address()` is the path, a rolling reload keeps
//! serving, and the socket file is removed when the primary stops; a stale socket file fails the
//! worker's `listen` with the error a stock Node primary gives (`EADDRINUSE`, the file kept); an
//! abstract socket (`listen('\0name')`) is served as under Node's primary, with no file.
//!
//! Node is needed: under `CI` a missing one fails the tests, elsewhere they are skipped. Every
//! primary is started in its own process group, and the whole group is killed by PID when the
//! test ends. The clients are the test's own, over the socket.

mod common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::cluster::assert_exit;
use common::have;
use rustix::process::Signal;

/// A stock Node app on the socket path `SOCK`: each response is `PID ADDRESS` (`ADDRESS`:
/// `server.address()` as JSON); `/busy` first blocks the worker's loop 50 ms, so that under
/// shared the other worker accepts meanwhile; `/slow` is answered 1.5 s later. A listen error is
/// printed and exits 3.
const APP: &str = r#"
const http = require('http');
const server = http.createServer((req, res) => {
  if (req.url === '/busy') { const end = Date.now() + 50; while (Date.now() < end); }
  res.setHeader('Connection', 'close');
  const body = `${process.pid} ${JSON.stringify(server.address())}\n`;
  if (req.url === '/slow') setTimeout(() => res.end(body), 1500); else res.end(body);
});
server.on('error', (e) => { console.log(`listen error ${e.code} ${e.syscall} ${e.message}`); process.exit(3); });
server.listen(process.env.SOCK);
"#;

/// One request over the socket at `path`: the response's body.
fn get(path: &Path, url: &str) -> std::io::Result<String> {
    get_over(UnixStream::connect(path)?, url)
}

/// One request on the connection `s`: the response's body (an error unless its status is 200).
fn get_over(mut s: UnixStream, url: &str) -> std::io::Result<String> {
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    match reply.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_owned()),
        _ => Err(std::io::Error::other(format!("bad response {reply:?}"))),
    }
}

/// The pids serving `/busy` from 4 concurrent clients, 10 requests each; every body names the
/// socket path as `server.address()`.
fn pids_serving(path: &Path) -> HashSet<String> {
    let want = format!("{:?}", path.to_str().unwrap());
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let path = path.to_owned();
            std::thread::spawn(move || {
                (0..10)
                    .map(|_| get(&path, "/busy").unwrap())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut pids = HashSet::new();
    for body in clients.into_iter().flat_map(|c| c.join().unwrap()) {
        let (pid, address) = body.trim().split_once(' ').unwrap();
        assert_eq!(address, want, "server.address()");
        pids.insert(pid.to_owned());
    }
    pids
}

/// Whether the listening socket bound on `path` that process `pid` holds is non-blocking
/// (`None`: it holds none). Two workers woken for one connection on a blocking one would leave
/// the loser's loop stuck in `accept`.
fn listener_nonblocking(pid: &str, path: &Path) -> Option<bool> {
    let path = path.to_str().unwrap();
    // /proc/net/unix: `Num RefCount Protocol Flags Type St Inode Path`; flags 00010000: listening.
    let table = std::fs::read_to_string("/proc/net/unix").unwrap();
    let inodes: HashSet<String> = table
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 8 && f[3] == "00010000" && f[7] == path).then(|| f[6].to_owned())
        })
        .collect();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()? {
        let entry = entry.ok()?;
        let target = std::fs::read_link(entry.path()).ok()?;
        let target = target.to_string_lossy();
        let Some(inode) = target
            .strip_prefix("socket:[")
            .and_then(|t| t.strip_suffix(']'))
        else {
            continue;
        };
        if inodes.contains(inode) {
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                entry.file_name().to_string_lossy()
            ))
            .ok()?;
            let flags = info.lines().find_map(|l| l.strip_prefix("flags:"))?.trim();
            let flags = u32::from_str_radix(flags, 8).ok()?;
            return Some(flags & libc::O_NONBLOCK as u32 != 0);
        }
    }
    None
}

/// Under rr and shared (and least, and reuseport: a Unix socket is shared there): both workers
/// serve over the socket, a reload under a client that keeps connecting loses no request (a
/// slow one in flight on an old worker is answered: its drain counts its Unix connections) and
/// the new workers serve, and a stop removes the socket file.
#[test]
fn node_workers_serve_a_unix_socket_path_under_every_policy_across_a_reload() {
    if !have("node") {
        return;
    }
    for policy in ["rr", "shared", "least", "reuseport"] {
        let dir = nodus_testkit::tmp::TempDir::new("node-unix");
        std::fs::write(dir.path().join("app.js"), APP).unwrap();
        let sock = dir.path().join("app.sock");
        let mut primary = common::cluster::spawn(
            Command::new(common::NODUS)
                .args(["run", "--node", "-w", "2", "--policy", policy])
                .args(["--", "node"])
                .arg(dir.path().join("app.js"))
                .env("SOCK", &sock)
                .env("RUST_LOG", "info"),
        );
        primary.wait_line("2 workers ready");
        let before = pids_serving(&sock);
        assert_eq!(before.len(), 2, "{policy}: {before:?}");
        if matches!(policy, "shared" | "reuseport") {
            for pid in &before {
                assert_eq!(
                    listener_nonblocking(pid, &sock),
                    Some(true),
                    "{policy}: worker {pid}'s listening socket"
                );
            }
        }

        let stop = Arc::new(AtomicBool::new(false));
        let client = {
            let (stop, sock) = (stop.clone(), sock.clone());
            std::thread::spawn(move || {
                let (mut done, mut failed) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match get(&sock, "/") {
                        Ok(_) => done += 1,
                        Err(e) => failed.push(e.to_string()),
                    }
                }
                (done, failed)
            })
        };
        let slow = {
            let sock = sock.clone();
            std::thread::spawn(move || get(&sock, "/slow"))
        };
        std::thread::sleep(Duration::from_millis(300));
        primary.signal(Signal::HUP);
        primary.wait_line("reload to generation 1: the old workers have exited");
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
        let (done, failed) = client.join().unwrap();
        assert!(
            failed.is_empty() && done > 0,
            "{policy}: {done} served, failed: {failed:#?}\n{:#?}",
            primary.output()
        );
        let slow = slow.join().unwrap();
        assert!(slow.is_ok(), "{policy}: {slow:?}\n{:#?}", primary.output());
        let after = pids_serving(&sock);
        assert_eq!(after.len(), 2, "{policy}: {after:?}");
        assert!(before.is_disjoint(&after), "{policy}: {before:?} {after:?}");

        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(30), 0);
        assert!(!sock.exists(), "{policy}: the socket file is left");
    }
}

/// A stock Node cluster primary running the app in one worker.
const NODE_PRIMARY: &str = r#"
const cluster = require('cluster');
if (cluster.isPrimary) cluster.fork().on('exit', (code) => process.exit(code));
else require('./app.js');
"#;

/// A stale socket file (its server gone) fails the worker's listen as under Node's own primary:
/// the same `EADDRINUSE` error, and the file is not removed (the app must).
#[test]
fn a_stale_socket_file_fails_the_listen_as_under_a_node_primary() {
    if !have("node") {
        return;
    }
    let dir = nodus_testkit::tmp::TempDir::new("node-unix-stale");
    std::fs::write(dir.path().join("app.js"), APP).unwrap();
    std::fs::write(dir.path().join("primary.js"), NODE_PRIMARY).unwrap();
    let sock = dir.path().join("app.sock");
    drop(UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());

    let node = Command::new("node")
        .arg(dir.path().join("primary.js"))
        .env("SOCK", &sock)
        .output()
        .unwrap();
    assert_eq!(node.status.code(), Some(3), "{node:?}");
    let node_line = String::from_utf8_lossy(&node.stdout).trim().to_owned();
    assert!(node_line.contains("EADDRINUSE"), "{node_line}");

    let mut primary = common::cluster::spawn(
        Command::new(common::NODUS)
            .args(["run", "--node", "-w", "1", "--", "node"])
            .arg(dir.path().join("app.js"))
            .env("SOCK", &sock),
    );
    let line = primary.wait_line("listen error");
    assert!(
        line.ends_with(&node_line),
        "nodus: {line:?}, node: {node_line:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        assert!(sock.exists(), "the stale socket file was removed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A stock Node app on the abstract Unix socket named `\0` + `ABSTRACT` (Linux's abstract
/// namespace: no file); each response is its pid.
const APP_ABSTRACT: &str = r#"
const http = require('http');
const server = http.createServer((req, res) => {
  if (req.url === '/busy') { const end = Date.now() + 50; while (Date.now() < end); }
  res.setHeader('Connection', 'close');
  res.end(`${process.pid}\n`);
});
server.on('error', (e) => { console.log(`listen error ${e.code} ${e.message}`); process.exit(3); });
server.listen('\0' + process.env.ABSTRACT, () => console.log('listening on the abstract socket'));
"#;

/// One request to the abstract socket `name`: the response's body.
fn get_abstract(name: &str, url: &str) -> std::io::Result<String> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
    get_over(UnixStream::connect_addr(&addr)?, url)
}

/// `server.listen('\0name')`, an abstract socket, is served by both workers under rr and
/// shared, as under Node's own primary (the worker sends it resolved against its working
/// directory, `CWD/\0name`; the name is bound as is, no file made).
#[test]
fn node_workers_serve_an_abstract_unix_socket() {
    if !have("node") {
        return;
    }
    for policy in ["rr", "shared"] {
        let dir = nodus_testkit::tmp::TempDir::new("node-abstract");
        std::fs::write(dir.path().join("app.js"), APP_ABSTRACT).unwrap();
        let name = format!("nodus-test-{}-{policy}", std::process::id());
        let mut primary = common::cluster::spawn(
            Command::new(common::NODUS)
                .args(["run", "--node", "-w", "2", "--policy", policy])
                .args(["--", "node"])
                .arg(dir.path().join("app.js"))
                .current_dir(dir.path())
                .env("ABSTRACT", &name)
                .env("RUST_LOG", "info"),
        );
        primary.wait_line("2 workers ready");
        let clients: Vec<_> = (0..4)
            .map(|_| {
                let name = name.clone();
                std::thread::spawn(move || {
                    (0..10)
                        .map(|_| get_abstract(&name, "/busy"))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut pids = HashSet::new();
        for body in clients.into_iter().flat_map(|c| c.join().unwrap()) {
            let body = body.unwrap_or_else(|e| panic!("{policy}: {e}: {:#?}", primary.output()));
            pids.insert(body.trim().to_owned());
        }
        assert_eq!(pids.len(), 2, "{policy}: {pids:?}");
        // No file was made for it.
        let entries = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(entries, 1, "{policy}: only app.js");
        primary.signal(Signal::TERM);
        assert_exit(&mut primary, Duration::from_secs(30), 0);
        assert!(get_abstract(&name, "/").is_err(), "{policy}: still served");
    }
}
