//! Byte-stream helpers for any nodus stream (`TcpStream`, `UnixStream`), through the
//! `futures_io` traits every stream implements for `&Stream`; a listener out of fds.

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures_io::{AsyncRead, AsyncWrite};
use futures_util::{AsyncReadExt, AsyncWriteExt};

/// Everything `s` reads until EOF.
pub async fn read_to_end<S>(s: &S) -> Vec<u8>
where
    for<'a> &'a S: AsyncRead,
{
    let mut out = Vec::new();
    let mut reader = s;
    reader.read_to_end(&mut out).await.unwrap();
    out
}

/// Echoes until EOF, then closes (drops `s`).
pub async fn echo<S>(s: S)
where
    for<'a> &'a S: AsyncRead + AsyncWrite,
{
    let mut buf = [0u8; 4096];
    let (mut reader, mut writer) = (&s, &s);
    loop {
        let n = reader.read(&mut buf).await.unwrap();
        if n == 0 {
            return;
        }
        writer.write_all(&buf[..n]).await.unwrap();
    }
}

/// Every fd this process has left, filled with `/dev/null` (the soft open-files limit lowered to
/// 256 first, so there are few): while they are held, an accept fails with `EMFILE`. For a test
/// run alone (`nodus_testkit::alone`): the limit and the fds are the whole process's.
pub fn fill_fds() -> Vec<OwnedFd> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current.is_none_or(|n| n > 256) {
        limit.current = Some(256);
        setrlimit(Resource::Nofile, limit).unwrap();
    }
    let null = std::fs::File::open("/dev/null").unwrap();
    let mut held = Vec::new();
    loop {
        match rustix::io::fcntl_dupfd_cloexec(null.as_fd(), 0) {
            Ok(fd) => held.push(fd),
            Err(rustix::io::Errno::MFILE) => break,
            Err(e) => panic!("dup: {e}"),
        }
    }
    held.push(null.into());
    held
}

/// An accept loop (`accept` until it succeeds, in a task) on a listener with a connection queued
/// and `fds` holding every fd left ([`fill_fds`]): its accepts fail with `EMFILE` a handful of
/// times in 300 ms (one per back-off), not thousands (a spin), and once `fds` are closed it
/// accepts the connection.
pub async fn accept_backs_off_out_of_fds<F, A>(accept: F, fds: Vec<OwnedFd>)
where
    F: Fn() -> A + 'static,
    A: Future<Output = io::Result<()>>,
{
    let failed = Rc::new(Cell::new(0u64));
    let f = failed.clone();
    let acceptor = nodus::spawn(async move {
        loop {
            match accept().await {
                Ok(()) => return,
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                    f.set(f.get() + 1);
                }
            }
        }
    });
    let start = Instant::now();
    nodus::sleep(300).await;
    let (n, waited) = (failed.get(), start.elapsed());
    assert!(n >= 1, "no accept failed: the fds were not all taken");
    // The first failure, then one per 100 ms back-off (twice that, for a late timer's sake).
    let most = 2 + waited.as_millis() as u64 / 50;
    assert!(
        n <= most,
        "{n} accepts failed in {waited:?}: the accept loop spins"
    );
    assert!(!acceptor.is_finished(), "accepted with no fd left");
    drop(fds);
    nodus::timeout(Duration::from_secs(10), acceptor)
        .await
        .expect("not accepted once fds were freed")
        .unwrap();
}
