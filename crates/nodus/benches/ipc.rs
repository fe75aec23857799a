//! IPC benchmarks, nodus↔nodus against Node↔Node in one run: message round trips per second and
//! fd handoffs per second over the channel. Not a test: it runs only when asked
//! (`harness = false`).
//!
//! Usage: `cargo bench -p nodus --bench ipc [-- <bench> [n]]`; benches `roundtrip` (default
//! 100k sequential round trips of `{"i":k}` → `{"echo":{"i":k}}`) and `fd_handoff` (default 20k
//! sequential handoffs of a listening TCP socket, received as a listener, closed, answered).
//! Without arguments it runs both, for nodus and then for Node (`bench/node/ipc.js`, skipped if
//! `node` is missing), and prints one JSON line per run plus a `ratio` line per bench.
//!
//! The parent forks this same executable as its child (`NODUS_IPC_BENCH_CHILD=1`), as the Node
//! peer forks its own script.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::Instant;

use nodus::Runtime;
use nodus::ipc::{Channel, Message};
use nodus::net::TcpListener;
use nodus::process::fork;
use serde::Serialize;

#[derive(Serialize)]
struct Echo<'a> {
    echo: &'a Message,
}

#[derive(Serialize)]
struct Ping {
    i: u64,
}

fn child() {
    let rt = Runtime::new();
    rt.block_on(async {
        let ch = Channel::from_env().unwrap().expect("forked with a channel");
        while let Some(Ok(mut m)) = ch.recv().await {
            if let Some(h) = m.take_handle() {
                drop(h.into_tcp_listener().unwrap());
                ch.send("ok").unwrap();
            } else if m.json() == "\"exit\"" {
                break;
            } else {
                ch.send(&Echo { echo: &m }).unwrap();
            }
        }
    });
}

fn run_nodus(bench: &str, n: u64) -> f64 {
    let rt = Runtime::new();
    rt.block_on(async {
        let exe = std::env::current_exe().unwrap();
        // SAFETY: set before any thread of this program reads the environment for the fork;
        // the runtime's threads never read it.
        unsafe { std::env::set_var("NODUS_IPC_BENCH_CHILD", "1") };
        let (child, ch) = fork(&exe, Vec::<String>::new()).unwrap();
        // SAFETY: as above.
        unsafe { std::env::remove_var("NODUS_IPC_BENCH_CHILD") };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let start = Instant::now();
        for i in 0..n {
            if bench == "roundtrip" {
                ch.send(&Ping { i }).unwrap();
            } else {
                let dup = listener.as_fd().try_clone_to_owned().unwrap();
                ch.send_handle(&Ping { i }, TcpListener::from_owned_fd(dup).unwrap())
                    .unwrap();
            }
            ch.recv().await.unwrap().unwrap();
        }
        let elapsed = start.elapsed();
        ch.send("exit").unwrap();
        child.wait().await.unwrap();
        let ns = elapsed.as_nanos() as f64;
        let features = if cfg!(feature = "measure") {
            "measure"
        } else {
            ""
        };
        println!(
            "{{\"impl\":\"nodus\",\"features\":\"{features}\",\"bench\":\"{bench}\",\"n\":{n},\
             \"total_ms\":{:.3},\"ns_per_op\":{:.2},\"ops_per_s\":{:.0}}}",
            ns / 1e6,
            ns / n as f64,
            n as f64 / (ns / 1e9)
        );
        n as f64 / (ns / 1e9)
    })
}

fn run_node(bench: &str, n: u64) -> Option<f64> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/node/ipc.js");
    let out = std::process::Command::new("node")
        .arg(script)
        .arg(bench)
        .arg(n.to_string())
        .output();
    let out = match out {
        Ok(out) if out.status.success() => out,
        Ok(out) => {
            eprintln!(
                "ipc bench: node failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        Err(e) => {
            eprintln!("ipc bench: node not run ({e}); skipped");
            return None;
        }
    };
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    println!("{line}");
    let v: serde_json::Value = serde_json::from_str(&line).ok()?;
    v["ops_per_s"].as_f64()
}

fn main() {
    if std::env::var_os("NODUS_IPC_BENCH_CHILD").is_some() {
        return child();
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let benches: Vec<&str> = match args.first() {
        Some(b) => vec![b.as_str()],
        None => vec!["roundtrip", "fd_handoff"],
    };
    for bench in benches {
        let default_n = if bench == "roundtrip" {
            100_000
        } else {
            20_000
        };
        let n = args
            .get(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(default_n);
        assert!(
            matches!(bench, "roundtrip" | "fd_handoff"),
            "unknown bench {bench}"
        );
        let nodus = run_nodus(bench, n);
        if let Some(node) = run_node(bench, n) {
            println!(
                "{{\"ratio\":\"nodus/node\",\"bench\":\"{bench}\",\"value\":{:.2}}}",
                nodus / node
            );
        }
    }
}
