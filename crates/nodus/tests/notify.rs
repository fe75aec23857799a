//! `nodus::notify`: parsing notify messages, and a `NotifySocket` receiving them from a python3
//! child, from a nodus child through `notify()`, and from this process (oversized, non-UTF-8,
//! with fds attached). Every test bounded in time.

mod common;

use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

use common::{bounded, have};
use nodus::notify::{NotifyMessage, NotifySocket};
use nodus::process::{Command, Stdio};

fn address_of(socket: &NotifySocket) -> SocketAddr {
    let name = socket
        .env_value()
        .strip_prefix('@')
        .expect("an abstract name");
    SocketAddr::from_abstract_name(name).unwrap()
}

#[test]
fn parse_known_keys_and_keep_the_rest() {
    let m = NotifyMessage::parse(
        "READY=1\nSTATUS=warming up\nSTATUS=serving\nMAINPID=42\nWATCHDOG=trigger\n\
         no equals sign\n\nX_CUSTOM=a=b\nSTOPPING=0\nMAINPID=oops\nRELOADING=1",
    );
    assert!(m.ready && m.reloading);
    assert!(!m.stopping && !m.watchdog);
    assert_eq!(m.status.as_deref(), Some("serving"));
    assert_eq!(m.main_pid, Some(42));
    assert_eq!(
        m.other,
        [
            ("WATCHDOG", "trigger"),
            ("X_CUSTOM", "a=b"),
            ("STOPPING", "0"),
            ("MAINPID", "oops")
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
    );
    assert_eq!(m.sender_pid, None);
}

#[test]
fn names_are_unique_and_abstract() {
    bounded(async {
        let a = NotifySocket::bind_unique().unwrap();
        let b = NotifySocket::bind_unique().unwrap();
        assert!(
            a.env_value()
                .starts_with(&format!("@nodus/{}/", std::process::id()))
        );
        assert_ne!(a.env_value(), b.env_value());
    });
}

#[test]
fn a_python_child_notifies_through_notify_socket() {
    if !have("python3") {
        return;
    }
    bounded(async {
        let socket = NotifySocket::bind_unique().unwrap();
        let script = "import os, socket\n\
                      s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
                      s.sendto(b'READY=1\\nSTATUS=x', '\\0' + os.environ['NOTIFY_SOCKET'][1:])\n";
        let child = Command::new("python3")
            .args(["-c", script])
            .env("NOTIFY_SOCKET", socket.env_value())
            .stdin(Stdio::Null)
            .spawn()
            .unwrap();
        let m = socket.recv().await.unwrap();
        assert!(m.ready);
        assert_eq!(m.status.as_deref(), Some("x"));
        assert_eq!(m.sender_pid, Some(child.id()));
        assert!(child.wait().await.unwrap().success());
    });
}

#[test]
fn a_nodus_child_notifies_with_notify() {
    bounded(async {
        let socket = NotifySocket::bind_unique().unwrap();
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "notify_sender_child", "--ignored"])
            .env("NOTIFY_SOCKET", socket.env_value())
            .stdin(Stdio::Null)
            .spawn()
            .unwrap();
        let m = socket.recv().await.unwrap();
        assert!(m.ready);
        assert_eq!(m.status.as_deref(), Some("from nodus"));
        assert_eq!(m.main_pid, Some(child.id()));
        assert_eq!(m.sender_pid, Some(child.id()));
        let mut out = Vec::new();
        let stdout = child.stdout.as_ref().unwrap();
        stdout.read_to_end(&mut out).await.unwrap();
        let out = String::from_utf8_lossy(&out);
        assert!(child.wait().await.unwrap().success(), "{out}");
        assert!(out.contains("1 passed"), "{out}");
    });
}

#[test]
#[ignore = "run by a_nodus_child_notifies_with_notify, with NOTIFY_SOCKET set for it"]
fn notify_sender_child() {
    let state = format!("READY=1\nSTATUS=from nodus\nMAINPID={}", std::process::id());
    assert!(nodus::notify::notify(&state).unwrap());
}

#[test]
fn bad_datagrams_are_errors_and_the_socket_goes_on() {
    bounded(async {
        let socket = NotifySocket::bind_unique().unwrap();
        let to = address_of(&socket);
        let sender = UnixDatagram::unbound().unwrap();
        sender.send_to_addr(&[b'x'; 5000], &to).unwrap();
        sender.send_to_addr(b"STATUS=\xff\xfe", &to).unwrap();
        sender.send_to_addr(b"STOPPING=1", &to).unwrap();

        let big = socket.recv().await.unwrap_err();
        assert_eq!(big.kind(), std::io::ErrorKind::InvalidData);
        assert!(big.to_string().contains("5000 bytes"), "{big}");
        let bad = socket.recv().await.unwrap_err();
        assert_eq!(bad.kind(), std::io::ErrorKind::InvalidData);
        assert!(bad.to_string().contains("UTF-8"), "{bad}");
        let m = socket.recv().await.unwrap();
        assert!(m.stopping);
        assert_eq!(m.sender_pid, Some(std::process::id()));
    });
}

#[test]
fn fds_sent_along_are_closed() {
    bounded(async {
        let socket = NotifySocket::bind_unique().unwrap();
        let name = socket.env_value().strip_prefix('@').unwrap();
        let to = rustix::net::SocketAddrUnix::new_abstract_name(name.as_bytes()).unwrap();
        let sender = UnixDatagram::unbound().unwrap();
        let (reader, writer) = std::io::pipe().unwrap();
        let fds = [writer.as_fd()];
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = rustix::net::SendAncillaryBuffer::new(&mut space);
        assert!(control.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
        rustix::net::sendmsg_addr(
            &sender,
            &to,
            &[IoSlice::new(b"READY=1\nFDSTORE=1")],
            &mut control,
            rustix::net::SendFlags::empty(),
        )
        .unwrap();
        drop(writer);

        let m = socket.recv().await.unwrap();
        assert!(m.ready);
        assert_eq!(m.other, [("FDSTORE".to_owned(), "1".to_owned())]);
        // Every write end is closed (ours above, the received copy by `recv`): end of file.
        rustix::io::ioctl_fionbio(&reader, true).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(rustix::io::read(&reader, &mut buf), Ok(0));
    });
}
