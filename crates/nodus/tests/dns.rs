//! `nodus::dns`: real lookups of names that resolve locally, refused input, errors naming the
//! host, and libuv's rule that slow DNS never holds more than `(n + 1) / 2` I/O threads.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nodus::{Runtime, dns, fs, pool, spawn};

#[test]
fn localhost_resolves_to_a_loopback_address() {
    let rt = Runtime::new();
    let addrs = rt.block_on(dns::lookup("localhost")).unwrap();
    assert!(!addrs.is_empty());
    assert!(addrs.iter().all(IpAddr::is_loopback), "{addrs:?}");
    let mut dedup = addrs.clone();
    dedup.dedup();
    assert_eq!(dedup.len(), addrs.len());
    assert!(
        rt.block_on(dns::lookup_one("localhost"))
            .unwrap()
            .is_loopback()
    );
}

#[test]
fn literal_addresses_come_back_as_they_are() {
    let rt = Runtime::new();
    rt.block_on(async {
        assert_eq!(
            dns::lookup("127.0.0.1").await.unwrap(),
            [IpAddr::V4(Ipv4Addr::LOCALHOST)]
        );
        assert_eq!(
            dns::lookup("::1").await.unwrap(),
            [IpAddr::V6(Ipv6Addr::LOCALHOST)]
        );
    });
}

#[test]
fn bad_host_names_are_refused_before_the_resolver() {
    let rt = Runtime::new();
    rt.block_on(async {
        let long = "a".repeat(254);
        for host in ["", long.as_str(), "nul\0host"] {
            let err = dns::lookup(host).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{host:?}: {err}");
        }
    });
}

#[test]
fn a_resolver_error_names_the_host() {
    let rt = Runtime::new();
    let err = rt
        .block_on(dns::lookup_with("nowhere.invalid", |_| {
            Err(io::Error::new(io::ErrorKind::NotFound, "no such host"))
        }))
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert_eq!(
        err.to_string(),
        "getaddrinfo 'nowhere.invalid': no such host"
    );
}

/// A resolver that blocks until opened, counting how many threads are inside it.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cond: Condvar,
    inside: AtomicUsize,
    most_inside: AtomicUsize,
}

impl Gate {
    fn resolve(&self) -> io::Result<Vec<IpAddr>> {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_inside.fetch_max(now, Ordering::SeqCst);
        let open = self.open.lock().unwrap();
        let (open, timeout) = self
            .cond
            .wait_timeout_while(open, Duration::from_secs(10), |open| !*open)
            .unwrap();
        drop(open);
        self.inside.fetch_sub(1, Ordering::SeqCst);
        if timeout.timed_out() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "gate never opened"));
        }
        Ok(vec![IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))])
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cond.notify_all();
    }
}

#[test]
fn a_blocking_resolver_never_holds_more_than_half_the_io_threads() {
    let threads = pool::io().threads();
    let limit = pool::io().slow_limit();
    assert_eq!(limit, threads.div_ceil(2));
    let gate = Arc::new(Gate::default());
    let rt = Runtime::new();
    rt.block_on(async {
        let lookups: Vec<_> = (0..threads * 3)
            .map(|i| {
                let g = gate.clone();
                spawn(async move {
                    dns::lookup_with(&format!("blocked-{i}.test"), move |_| g.resolve()).await
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        while gate.inside.load(Ordering::SeqCst) < limit {
            assert!(Instant::now() < deadline, "lookups never started");
            nodus::sleep(1).await;
        }
        // The others wait in the queue, and file I/O still gets threads.
        nodus::sleep(50).await;
        assert_eq!(gate.inside.load(Ordering::SeqCst), limit);
        let stats = pool::io().stats();
        assert!(
            stats.queue_depth as usize >= threads * 3 - limit,
            "{stats:?}"
        );
        let start = Instant::now();
        for _ in 0..20 {
            fs::metadata("/").await.unwrap();
        }
        assert!(start.elapsed() < Duration::from_secs(1));

        gate.open();
        for l in lookups {
            assert_eq!(
                l.await.unwrap().unwrap(),
                [IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))]
            );
        }
    });
    assert_eq!(gate.most_inside.load(Ordering::SeqCst), limit);
}
