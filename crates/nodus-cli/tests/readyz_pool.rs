//! readyz while a process-wide pool cannot start a thread: `nodus serve`'s file requests then
//! answer 503, and so does readyz, naming the pool (`pool io: no thread could be started`), in a
//! single process and, from a cluster primary's `--admin`, once every ready worker is so; both
//! answer 200 again once a thread can start (a cluster, once one worker's can), with no file
//! request to start it (a load balancer that took the process out of rotation sends none).
//!
//! The pool is made to fail as `nodus/tests/pool_start.rs` makes it: the serving process's
//! address-space limit (`prlimit`, from here) leaves no room for a pool thread's stack, then is
//! lifted again.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::http::get;
use common::serve::Serve;
use nodus_testkit::net::free_addr;
use nodus_testkit::tmp::TempDir;
use serde_json::Value;

/// A temporary directory holding `index.html`, for `nodus serve`.
fn site(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    std::fs::write(dir.path().join("index.html"), "hello\n").unwrap();
    dir
}

/// Sets `pid`'s soft address-space limit: its virtual size now and 4 MiB (room for small
/// allocations, none for an 8 MiB thread stack), or no limit.
fn limit_as(pid: u32, tight: bool) {
    let soft = if tight {
        let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap();
        let pages: u64 = statm.split_whitespace().next().unwrap().parse().unwrap();
        pages * rustix::param::page_size() as u64 + (4 << 20)
    } else {
        libc::RLIM_INFINITY
    };
    let new = libc::rlimit {
        rlim_cur: soft,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: `new` is a valid rlimit to read; no old limit is asked for.
    let rc = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_AS,
            &new,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit {pid}: {}", std::io::Error::last_os_error());
}

/// Polls `GET /_nodus/readyz` until its status is `status` (20 s at most); its body then.
fn readyz_until(addr: SocketAddr, status: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = get(addr, "/_nodus/readyz");
        let body = String::from_utf8(r.body).unwrap();
        if r.status == status {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "readyz stayed {} {body:?}",
            r.status
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn readyz_is_503_while_the_io_pool_cannot_start_a_thread_then_200() {
    let dir = site("readyz-pool");
    let server = Serve::start(dir.path(), 1, &[]);
    assert_eq!(readyz_until(server.addr, 200), "ready\n");
    limit_as(server.proc.id(), true);
    let r = get(server.addr, "/index.html");
    assert_eq!(r.status, 503, "{r:?}");
    let r = get(server.addr, "/_nodus/readyz");
    assert_eq!(
        (r.status, String::from_utf8(r.body).unwrap().as_str()),
        (503, "pool io: no thread could be started\n")
    );
    // Threads can start again: readyz's own try starts the pool, no file request needed.
    limit_as(server.proc.id(), false);
    assert_eq!(readyz_until(server.addr, 200), "ready\n");
    assert_eq!(get(server.addr, "/index.html").status, 200);
}

#[test]
fn a_primary_is_not_ready_while_no_workers_io_pool_can_start_a_thread() {
    let dir = site("readyz-pool-cluster");
    let admin = free_addr();
    let server = Serve::start(dir.path(), 2, &["--admin", &admin.to_string()]);
    assert_eq!(readyz_until(admin, 200), "ready\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    let pids: Vec<u32> = loop {
        let stats: Value = serde_json::from_slice(&get(admin, "/_nodus/stats").body).unwrap();
        let pids: Vec<u32> = stats["workers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["state"] == "ready")
            .filter_map(|w| Some(w["pid"].as_u64()? as u32))
            .collect();
        if pids.len() == 2 {
            break pids;
        }
        assert!(Instant::now() < deadline, "not 2 ready workers: {stats}");
        std::thread::sleep(Duration::from_millis(100));
    };
    // Neither worker's pool can start (file requests to both find so): readyz says why, once
    // the probes' answers have said so.
    for pid in &pids {
        limit_as(*pid, true);
    }
    let mut failed = 0;
    while failed < 4 {
        assert!(Instant::now() < deadline, "{failed} file requests failed");
        failed += u32::from(get(server.addr, "/index.html").status == 503);
    }
    assert_eq!(
        readyz_until(admin, 503),
        "no worker takes connections (2 unready: pool io: no thread could be started)\n"
    );
    // One worker's threads can start again: its answer to a probe starts its pool, and the
    // cluster is ready with it alone.
    limit_as(pids[0], false);
    assert_eq!(readyz_until(admin, 200), "ready\n");
    // The other one, still unready, gets no new connection meanwhile: nothing is answered 503.
    for _ in 0..10 {
        assert_eq!(get(server.addr, "/index.html").status, 200);
    }
    limit_as(pids[1], false);
    assert_eq!(get(server.addr, "/index.html").status, 200);
}
