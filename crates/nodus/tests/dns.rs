//! `nodus::dns`: real lookups of names that resolve locally, IPv6 literals with a zone (kept, and
//! shown as Node shows them), refused input, errors naming the host, and libuv's rule that slow
//! DNS never holds more than `(n + 1) / 2` I/O threads.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nodus::net::IntoSocketAddr;
use nodus::{Runtime, dns, fs, pool, spawn};
use nodus_testkit::net::loopback_index;

#[test]
fn localhost_resolves_to_a_loopback_address() {
    let rt = Runtime::new();
    let addrs: Vec<IpAddr> = rt
        .block_on(dns::lookup("localhost"))
        .unwrap()
        .iter()
        .map(dns::Address::ip)
        .collect();
    assert!(!addrs.is_empty());
    assert!(addrs.iter().all(IpAddr::is_loopback), "{addrs:?}");
    let mut dedup = addrs.clone();
    dedup.dedup();
    assert_eq!(dedup.len(), addrs.len());
    assert!(
        rt.block_on(dns::lookup_one("localhost"))
            .unwrap()
            .ip()
            .is_loopback()
    );
}

#[test]
fn literal_addresses_come_back_as_they_are() {
    let rt = Runtime::new();
    rt.block_on(async {
        assert_eq!(
            dns::lookup("127.0.0.1").await.unwrap(),
            [IpAddr::V4(Ipv4Addr::LOCALHOST).into()]
        );
        assert_eq!(
            dns::lookup("::1").await.unwrap(),
            [IpAddr::V6(Ipv6Addr::LOCALHOST).into()]
        );
    });
}

fn one_ip(a: &dns::Address) -> Ipv6Addr {
    match a.ip() {
        IpAddr::V6(ip) => ip,
        IpAddr::V4(ip) => panic!("{ip}"),
    }
}

/// The scope id of the socket address `a` gives for `port` (0 for IPv4).
fn scope(a: &dns::Address, port: u16) -> u32 {
    match a.socket_addr(port) {
        SocketAddr::V6(v6) => {
            assert_eq!(v6.port(), port);
            v6.scope_id()
        }
        SocketAddr::V4(_) => 0,
    }
}

#[test]
fn an_ipv6_literal_keeps_its_zone_as_node_does() {
    let rt = Runtime::new();
    rt.block_on(async {
        // Node 20: dns.lookup('fe80::1%lo', console.log) prints `null fe80::1%lo 6`, and the
        // zone as written for `%1`. A literal: the resolver is never asked.
        let never = |_: &str| -> io::Result<Vec<dns::Address>> { panic!("resolver asked") };
        for (host, shown, scope_id) in [
            ("fe80::1%lo", "fe80::1%lo", loopback_index()),
            ("fe80::1%1", "fe80::1%1", 1),
            ("::1%lo", "::1%lo", loopback_index()),
        ] {
            let addrs = dns::lookup_with(host, never).await.unwrap();
            assert_eq!(addrs.len(), 1, "{host}: {addrs:?}");
            let a = &addrs[0];
            assert_eq!(a.to_string(), shown);
            assert_eq!(a.family(), 6);
            assert_eq!(a.scope_id(), scope_id, "{host}");
            assert_eq!(scope(a, 8080), scope_id, "{host}");
            assert_eq!(
                a.ip(),
                host.split('%').next().unwrap().parse::<IpAddr>().unwrap()
            );
        }
        let one = dns::lookup_one("fe80::1%lo").await.unwrap();
        assert_eq!(
            (one.to_string(), one.zone(), scope(&one, 1)),
            ("fe80::1%lo".to_string(), Some("lo"), loopback_index())
        );
        // So does the socket address a connect or bind is given.
        let to = (&one, 8080).into_socket_addr().unwrap();
        assert_eq!(
            to,
            SocketAddrV6::new(one_ip(&one), 8080, 0, loopback_index()).into()
        );
        // The system lookup keeps it as well.
        let addrs = dns::lookup("fe80::1%lo").await.unwrap();
        assert_eq!(
            addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            ["fe80::1%lo"]
        );
        // No interface has that name: getaddrinfo's ENOTFOUND, not an address with scope 0.
        let err = dns::lookup_with("fe80::1%nodus-no-if", never)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        assert!(
            err.to_string()
                .starts_with("getaddrinfo 'fe80::1%nodus-no-if': ENOTFOUND"),
            "{err}"
        );
        // Without a zone: scope 0, no `%`.
        let plain = dns::lookup_one("fe80::1").await.unwrap();
        assert_eq!(
            (plain.to_string(), plain.scope_id(), plain.zone()),
            ("fe80::1".into(), 0, None)
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
    fn resolve(&self) -> io::Result<Vec<dns::Address>> {
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
        Ok(vec![IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)).into()])
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
                [IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)).into()]
            );
        }
    });
    assert_eq!(gate.most_inside.load(Ordering::SeqCst), limit);
}
