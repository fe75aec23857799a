//! Signals arrive as a stream on the loop, and do not keep it alive unless ref'd.

use std::time::Duration;

use nodus::signal::{SIGUSR1, SIGUSR2, Signals};
use nodus::{Runtime, set_timeout};

#[test]
fn signals_are_delivered_on_the_loop() {
    let rt = Runtime::new();
    let got = rt.block_on(async {
        let mut signals = Signals::new(&[SIGUSR1, SIGUSR2]).unwrap();
        let pid = rustix::process::getpid();
        set_timeout(5, move || {
            rustix::process::kill_process(pid, rustix::process::Signal::USR2).unwrap();
        });
        let first = signals.recv().await;
        rustix::process::kill_process(pid, rustix::process::Signal::USR1).unwrap();
        let second = nodus::timeout(Duration::from_secs(5), signals.recv())
            .await
            .unwrap();
        (first, second)
    });
    assert_eq!(got, (SIGUSR2, SIGUSR1));
}

#[test]
fn a_signal_stream_does_not_keep_run_alive_unless_refd() {
    let rt = Runtime::new();
    let signals = rt.enter(|| Signals::new(&[SIGUSR2]).unwrap());
    rt.run(); // returns at once: nothing ref'd
    rt.enter(|| {
        signals.ref_();
        set_timeout(5, || nodus::rt::stop());
    });
    rt.run(); // kept alive by the ref'd stream until stop()
    rt.enter(|| drop(signals));
}
