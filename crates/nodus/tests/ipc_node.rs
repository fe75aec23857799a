//! Interop with real Node over the IPC channel, both ways, plus the `ipc_echo` example forked by a
//! nodus parent. The Node scripts are in `tests/ipc/`.
//!
//! Without `node`, the Node tests print "skipped: node is not installed" and pass, unless `CI` is
//! set: then they fail (`.ci/run` installs Node). The `ipc_echo` binary is the example built by
//! `cargo test`; if it is missing (`cargo test --tests`), it is built first.

mod common;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::net::read_to_end;
use common::{bounded_for, have};
use nodus::ipc::Channel;
use nodus::net::{TcpListener, TcpStream, UnixStream};
use nodus::process::{Child, Command, ExecOptions, Stdio, exec_file, fork};
use serde::Serialize;

/// 60 s: longer than the 30 s `exec_file` timeout inside a test, so that one reports first.
fn bounded<F: Future>(f: F) -> F::Output {
    bounded_for(Duration::from_secs(60), f)
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/ipc")
        .join(name)
}

/// `target/<profile>/examples/ipc_echo`, built if missing.
fn ipc_echo() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let path = profile_dir.join("examples/ipc_echo");
    if !path.is_file() {
        let target_dir = profile_dir.parent().unwrap();
        let mut cargo = std::process::Command::new(option_env!("CARGO").unwrap_or("cargo"));
        cargo.args([
            "build",
            "-p",
            "nodus",
            "--example",
            "ipc_echo",
            "--target-dir",
        ]);
        cargo.arg(target_dir);
        if profile_dir.file_name() == Some("release".as_ref()) {
            cargo.arg("--release");
        }
        let status = cargo.status().unwrap();
        assert!(status.success(), "building the ipc_echo example failed");
    }
    path
}

async fn read_all(s: &TcpStream) -> String {
    String::from_utf8(read_to_end(s).await).unwrap()
}

#[derive(Serialize)]
struct Hello {
    hello: &'static str,
    n: u32,
    u: &'static str,
}

#[test]
fn a_nodus_parent_forks_a_node_child_and_passes_sockets() {
    if !have("node") {
        return;
    }
    bounded(async move {
        let (child, ch) = fork("node", [script("child.js")]).unwrap();
        let ready = ch.recv().await.unwrap().unwrap();
        assert_eq!(
            ready.json(),
            format!(r#"{{"ready":{},"channelFd":true}}"#, child.id()),
            "Node removed NODE_CHANNEL_FD from its env"
        );

        ch.send(&Hello {
            hello: "node",
            n: 1,
            u: "é€😀",
        })
        .unwrap();
        let m = ch.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#"{"echo":{"hello":"node","n":1,"u":"é€😀"}}"#);

        // A listening socket: the Node child serves it.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        ch.send_handle(&"server", listener).unwrap();
        let m = ch.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#"{"echo":"server","serving":true}"#);
        for _ in 0..3 {
            let c = TcpStream::connect(addr).await.unwrap();
            assert_eq!(
                read_all(&c).await,
                format!("hello from node {}\n", child.id())
            );
        }

        // An accepted connection: the Node child answers on it.
        let l2 = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(l2.local_addr().unwrap()).await.unwrap();
        let (accepted, _) = l2.accept().await.unwrap();
        ch.send_handle(&serde_json::json!({ "conn": 1 }), accepted)
            .unwrap();
        let m = ch.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#"{"echo":{"conn":1},"answered":true}"#);
        assert_eq!(read_all(&client).await, "answered by node\n");
        // Our end closes too, so the Node child's socket is done and its loop can empty.
        drop(client);

        ch.send(&"exit").unwrap();
        assert!(ch.recv().await.is_none(), "the Node child disconnected");
        assert!(child.wait().await.unwrap().success());
    });
}

#[test]
fn a_node_parent_forks_a_nodus_child_and_passes_a_server() {
    if !have("node") {
        return;
    }
    let echo = ipc_echo();
    bounded(async move {
        let opts = ExecOptions {
            timeout: Some(Duration::from_secs(30)),
            ..Default::default()
        };
        let out = exec_file("node", [script("parent.js"), echo], &opts).await;
        let out = out.unwrap_or_else(|e| {
            panic!(
                "{e}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&e.stdout),
                String::from_utf8_lossy(&e.stderr)
            )
        });
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(stdout.starts_with("ok close_ms="), "{stdout}");
    });
}

#[test]
fn a_node_parent_using_advanced_serialization_gets_a_clear_error() {
    if !have("node") {
        return;
    }
    let echo = ipc_echo();
    bounded(async move {
        let out = exec_file(
            "node",
            [script("advanced.js"), echo],
            &ExecOptions::default(),
        )
        .await
        .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["code"], 2, "{v}");
        let stderr = v["stderr"].as_str().unwrap();
        assert!(
            stderr.contains("serialization 'advanced'") && stderr.contains("'json'"),
            "{stderr}"
        );
    });
}

/// Hands the echo child on `ch` a listening socket on 127.0.0.1 (the message `"srv"`) and waits
/// for its echo: the socket's address.
async fn hand_a_server(ch: &Channel) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    ch.send_handle(&"srv", listener).unwrap();
    assert_eq!(
        ch.recv().await.unwrap().unwrap().json(),
        r#"{"echo":"srv"}"#
    );
    addr
}

/// Sends the echo child `"exit"`: it disconnects and exits 0.
async fn tell_to_exit(child: Child, ch: Channel) {
    ch.send(&"exit").unwrap();
    assert!(ch.recv().await.is_none());
    assert!(child.wait().await.unwrap().success());
}

#[test]
fn a_nodus_parent_forks_the_nodus_echo_child() {
    let echo = ipc_echo();
    bounded(async move {
        let (child, ch) = fork(&echo, ["ignored"]).unwrap();
        ch.send(&Hello {
            hello: "nodus",
            n: 2,
            u: "ü",
        })
        .unwrap();
        let m = ch.recv().await.unwrap().unwrap();
        assert_eq!(m.json(), r#"{"echo":{"hello":"nodus","n":2,"u":"ü"}}"#);

        let addr = hand_a_server(&ch).await;
        let c = TcpStream::connect(addr).await.unwrap();
        assert_eq!(
            read_all(&c).await,
            format!("hello from nodus {}\n", child.id())
        );

        tell_to_exit(child, ch).await;

        // EOF: the child exits 0 when the parent disconnects.
        let (child, ch) = fork(&echo, Vec::<String>::new()).unwrap();
        ch.disconnect();
        assert!(child.wait().await.unwrap().success());
    });
}

/// The echo child's open fds.
fn open_fds_of(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as u64
}

/// Sets the soft open-files limit of process `pid`; returns the one it had.
fn set_fd_limit(pid: u32, soft: Option<u64>) -> rustix::process::Rlimit {
    use rustix::process::{Pid, Resource, Rlimit, getrlimit, prlimit};
    let pid = Pid::from_raw(pid as i32).unwrap();
    let limit = Rlimit {
        current: soft,
        maximum: getrlimit(Resource::Nofile).maximum,
    };
    prlimit(Some(pid), Resource::Nofile, limit).unwrap()
}

/// An accept that fails for want of fds (`EMFILE`) does not end the echo child's listener: once
/// fds are free again, the connection that waited is served (libuv keeps listening).
#[test]
fn the_echo_child_keeps_listening_through_an_accept_out_of_fds() {
    let echo = ipc_echo();
    bounded(async move {
        let (child, ch) = fork(&echo, Vec::<String>::new()).unwrap();
        let addr = hand_a_server(&ch).await;
        // No fd free in the child: its accept of this connection fails (EMFILE).
        let old = set_fd_limit(child.id(), Some(open_fds_of(child.id())));
        let c = TcpStream::connect(addr).await.unwrap();
        nodus::sleep(500).await;
        set_fd_limit(child.id(), old.current);
        assert_eq!(
            read_all(&c).await,
            format!("hello from nodus {}\n", child.id()),
            "served once fds were free"
        );
        tell_to_exit(child, ch).await;
    });
}

#[test]
fn the_echo_child_survives_a_malformed_frame_and_exits_0_at_eof() {
    let echo = ipc_echo();
    bounded(async move {
        // Hand the channel over as stdin (NODE_CHANNEL_FD may name any fd), keeping a raw end.
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut child = Command::new(&echo)
            .env("NODE_CHANNEL_FD", "0")
            .env("NODE_CHANNEL_SERIALIZATION_MODE", "json")
            .stdin(Stdio::Fd(theirs.into()))
            .stdout(Stdio::Null)
            .spawn()
            .unwrap();
        let raw = UnixStream::from_std(ours).unwrap();
        raw.write_all(b"{\"a\":1}\n").await.unwrap();
        let mut buf = [0u8; 256];
        let mut line = async || {
            let mut got = Vec::new();
            while !got.ends_with(b"\n") {
                let n = raw.read(&mut buf).await.unwrap();
                assert!(n > 0);
                got.extend_from_slice(&buf[..n]);
            }
            got
        };
        assert_eq!(line().await, b"{\"echo\":{\"a\":1}}\n");
        // The bad frame is dropped; the next one is answered.
        raw.write_all(b"{bad json\n{\"b\":2}\n").await.unwrap();
        assert_eq!(line().await, b"{\"echo\":{\"b\":2}}\n");
        raw.shutdown(std::net::Shutdown::Write).unwrap();
        let mut stderr = Vec::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_end(&mut stderr)
            .await
            .unwrap();
        let stderr = String::from_utf8(stderr).unwrap();
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("malformed IPC frame"), "{stderr}");
        assert_eq!(child.wait().await.unwrap().code(), Some(0));
        assert_eq!(raw.read(&mut buf).await.unwrap(), 0, "its channel closed");
    });
}
