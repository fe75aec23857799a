//! `nodus::fs` when the process-wide I/O pool refuses work (a queue bound set with
//! `pool::init_io`): the error still names the operation and the path, as every fs error does.
//! A test binary of its own, because the I/O pool is installed once per process.

use std::io;
use std::time::Duration;

use nodus::fs;
use nodus::pool::{self, PoolBuilder};
use nodus::{Runtime, offload_io};

#[test]
fn a_full_io_queue_is_an_error_naming_the_operation_and_path() {
    let io_pool = pool::init_io(PoolBuilder::new("io").threads(1).max_queue(1))
        .unwrap_or_else(|_| panic!("the I/O pool was already installed"));
    let rt = Runtime::new();
    rt.block_on(async {
        // The one thread waits on a channel; one more job fills the queue.
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let held = offload_io(move || wait.recv_timeout(Duration::from_secs(60)).is_ok());
        for _ in 0..60_000 {
            if io_pool.stats().busy_threads == 1 {
                break;
            }
            nodus::sleep(1).await;
        }
        assert_eq!(
            io_pool.stats().busy_threads,
            1,
            "the holding job never started"
        );
        let queued = offload_io(|| ());

        let e = fs::metadata("/nodus-test/queue-full").await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
        let text = e.to_string();
        assert!(
            text.starts_with("stat '/nodus-test/queue-full': "),
            "{text}"
        );
        assert!(text.contains("is full"), "{text}");

        let e = fs::File::open("/nodus-test/queue-full").await.unwrap_err();
        assert!(
            e.to_string().starts_with("open '/nodus-test/queue-full': "),
            "{e}"
        );
        let e = fs::rename("/nodus-test/a", "/nodus-test/b")
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("rename '/nodus-test/a' -> '/nodus-test/b': "),
            "{e}"
        );

        release.send(()).unwrap();
        assert!(held.await.unwrap());
        queued.await.unwrap();
    });
}
