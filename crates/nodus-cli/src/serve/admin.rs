//! The admin endpoints under `/_nodus/`: metrics, healthz, readyz, stats and the live page.
//!
//! On the public listener the admin space is decided on the decoded path (`admin_path`), as the
//! file server decides, so `/%5Fnodus/x` is the admin space as `/_nodus/x` is; the file server
//! then hides a top-level `_nodus` directory (`StaticOptions::admin_dir_hidden`).
//!
//! On the public listener they answer loopback clients only (`allowed`), and not a request a
//! proxy relayed (one with `Forwarded`, `X-Forwarded-For` or `X-Real-IP`): behind a reverse proxy
//! on the same host every client is a loopback peer, so the rule holds only behind a proxy that
//! adds one of those headers (a layer-4 proxy or TLS terminator cannot). `--admin ADDR` serves
//! them on a listener of their own instead (for a cluster primary, `serve_primary`: `nodus serve
//! --workers N` and `nodus run`); the public listener then answers none, unless
//! `--admin-on-public on` (`app::admin_on_public`; `off` without `--admin`: no admin endpoints).
//!
//! In a cluster, stats and metrics cover every worker whichever process answers: a worker asks
//! its primary over IPC, the primary (which serves `--admin` itself) builds them from its
//! workers' snapshots and its own loop's (`worker="primary"`, `primary.snapshot`: with
//! `--admin` its HTTP figures are this server's). A worker under a stock Node primary (which
//! keeps no stats) serves its own. A worker whose nodus primary does not answer within 5 s
//! (stopped, its loop stalled) answers 503 `cluster primary not answering`, never its own
//! figures in the cluster's place: the document would change shape and the metrics lose their
//! `worker` and `pid` labels, so Prometheus would see other series rather than a failed scrape
//! (`up` 0). 5 s is under Prometheus's default scrape timeout (10 s), so the scrape fails with
//! this answer.
//!
//! readyz ([`Readyz`]) answers for the process that serves it: 200 `ready` while it takes
//! traffic, 503 with why not. `shutting down` only once a shutdown began (this process's own
//! SIGTERM/SIGINT, or, for a worker, the primary's `stopping` notice or `disconnect`); a
//! cluster primary (`--admin`) with no worker ready and no shutdown (starting, or every worker
//! crashed or in backoff) says `no worker ready`, and with every ready worker stalled (its loop
//! blocked or stopped for 1 s: `Primary::ready_state`) `no worker takes connections (N
//! stalled)`; one ready worker that is not stalled is enough for 200. A process whose
//! process-wide pool has been asked for work and cannot start a thread (`nodus::pool::
//! start_failure`: its last start failed; `nodus serve` then answers file requests 503) says
//! why, `pool io: no thread could be started`, a single process and a worker alike; a primary
//! counts a worker whose last answer to a probe said so as one that takes no connections:
//! `no worker takes connections (N unready: pool io: ...)` (`N stalled, M unready: ...` when
//! some are stalled) once no ready worker is left that takes them. The pool's start is tried
//! again by each readyz (a worker's, by each probe), so a process no traffic reaches is ready
//! again as soon as a thread can start. It is computed only for a readyz request, from what
//! the primary already knows (it never waits for a worker).
//!
//! They take GET and HEAD; another method HTTP defines is 405 with `Allow`, any other 501, as
//! for static files (`static_files::known_method`).

use std::net::SocketAddr;

use http::header::{CACHE_CONTROL, CONTENT_TYPE, FORWARDED, HeaderName, LOCATION};
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use nodus_http::{Body, full, text};

use super::ADMIN_PAGE_HTML;

/// Whether a client may use the admin endpoints on the public listener: loopback peers only
/// (127.0.0.0/8, ::1, and IPv4-mapped loopback), and only for a request no proxy relayed: one
/// with `Forwarded`, `X-Forwarded-For` or `X-Real-IP` comes from the proxy's client, wherever
/// that is (a header can only take access away, never grant it).
pub fn allowed(peer: Option<SocketAddr>, headers: &HeaderMap) -> bool {
    let relayed = [FORWARDED, X_FORWARDED_FOR, X_REAL_IP]
        .iter()
        .any(|name| headers.contains_key(name));
    !relayed && peer.is_some_and(|p| p.ip().to_canonical().is_loopback())
}

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// The admin endpoint a request path names, decoded (`/%5Fnodus/stats` is `/_nodus/stats`), or
/// `None` if it is not in the admin space. Decided on the decoded path, as the file server
/// decides, so no spelling of `/_nodus/...` reaches a `_nodus` directory under the served root
/// while the admin endpoints own the public listener; a path the decoder refuses is not an admin
/// path (the file server answers it 400).
pub fn admin_path(path: &str) -> Option<String> {
    let decoded = super::uri_path::decode(path).ok()?;
    (decoded.segments.first().map(String::as_str) == Some("_nodus")).then(|| decoded.display())
}

/// What `/_nodus/readyz` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readyz {
    /// 200 `ready`: the process takes traffic (a cluster: at least one worker is ready).
    Ready,
    /// 503 `no worker ready`: a cluster primary none of whose workers is ready (they start,
    /// or every one crashed or waits in backoff), and no shutdown began.
    NoWorkerReady,
    /// 503 `no worker takes connections (N stalled)`: a cluster primary whose ready workers
    /// (`stalled` of them) are all stalled, and no shutdown began.
    NoWorkerTakes { stalled: usize },
    /// 503 with `reason` (`pool io: no thread could be started`): this process cannot take work;
    /// for a cluster primary, `no worker takes connections (N stalled, M unready: reason)`, its
    /// ready workers all stalled or unable to take work (`stalled` and `unready` of them).
    Unready {
        stalled: usize,
        unready: usize,
        reason: String,
        cluster: bool,
    },
    /// 503 `shutting down`: a shutdown began.
    ShuttingDown,
}

/// Where stats and metrics come from.
#[derive(Clone)]
pub enum Source {
    /// This process alone.
    Local,
    /// A cluster primary: the whole cluster.
    Primary(nodus::cluster::Primary),
    /// A cluster worker: the whole cluster, asked of the primary.
    Worker(nodus::cluster::Worker),
}

impl Source {
    /// What readyz says of the process it speaks for: a worker is ready until the primary stops
    /// it, a primary while no shutdown began and one of its ready workers is not stalled and can
    /// take work, this process (and a worker) while its process-wide pools can take work
    /// (`nodus::pool::start_failure`; its own shutdown flag aside).
    pub fn readiness(&self) -> Readyz {
        use nodus::cluster::ReadyState;
        match self {
            Source::Worker(w) if w.is_stopping() => Readyz::ShuttingDown,
            Source::Primary(p) => match p.ready_state() {
                ReadyState::Ready => Readyz::Ready,
                ReadyState::NoWorkerReady => Readyz::NoWorkerReady,
                ReadyState::Stalled { workers } => Readyz::NoWorkerTakes { stalled: workers },
                ReadyState::Unready {
                    stalled,
                    unready,
                    reason,
                } => Readyz::Unready {
                    stalled,
                    unready,
                    reason,
                    cluster: true,
                },
                ReadyState::ShuttingDown => Readyz::ShuttingDown,
            },
            Source::Worker(_) | Source::Local => match nodus::pool::start_failure() {
                None => Readyz::Ready,
                Some(reason) => Readyz::Unready {
                    stalled: 0,
                    unready: 1,
                    reason: reason.to_owned(),
                    cluster: false,
                },
            },
        }
    }

    /// The stats document; `Err` when the cluster primary does not answer.
    async fn stats(&self) -> Result<Vec<u8>, PrimarySilent> {
        let local =
            || serde_json::to_string(&nodus_http::snapshot()).expect("a snapshot serializes");
        Ok(match self {
            Source::Local => local().into_bytes(),
            Source::Primary(p) => p.stats_json().await.into_bytes(),
            Source::Worker(w) => from_primary(w.cluster_stats().await, local)?.into(),
        })
    }

    /// The metrics (OpenMetrics text); `Err` when the cluster primary does not answer.
    async fn metrics(&self) -> Result<String, PrimarySilent> {
        let local = || nodus::metrics::prometheus::render(&nodus_http::snapshot());
        match self {
            Source::Local => Ok(local()),
            Source::Primary(p) => Ok(p.metrics_text().await),
            Source::Worker(w) => from_primary(w.cluster_metrics().await, local),
        }
    }
}

/// A worker's nodus primary did not answer a stats request (within 5 s, or its channel ended).
struct PrimarySilent;

/// What a worker serves for the cluster: the primary's answer; `local` under a stock Node
/// primary (it keeps no stats, and says so at once); else [`PrimarySilent`].
fn from_primary(
    answer: std::io::Result<String>,
    local: impl FnOnce() -> String,
) -> Result<String, PrimarySilent> {
    match answer {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::Unsupported => Ok(local()),
        Err(_) => Err(PrimarySilent),
    }
}

/// The answer for stats or metrics while the cluster primary does not answer.
fn primary_silent() -> Response<Body> {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "cluster primary not answering\n",
    )
}

/// Serves the admin endpoints of a cluster primary on `listener`: the whole cluster's figures,
/// and readyz 200 while no shutdown began and a ready worker is not stalled (`nodus serve
/// --workers N`, `nodus run`). The primary's own loop then reports this server's HTTP figures
/// with its other ones (`worker="primary"`).
pub fn serve_primary(
    listener: nodus::net::TcpListener,
    primary: nodus::cluster::Primary,
) -> nodus_http::Server {
    primary.set_snapshot(nodus_http::snapshot);
    let source = Source::Primary(primary);
    nodus_http::serve(
        listener,
        nodus_http::Config {
            name: "http:admin",
            ..nodus_http::Config::default()
        },
        move |req| {
            let source = source.clone();
            async move {
                let accept = accept(req.headers());
                respond(
                    req.method(),
                    req.uri().path(),
                    accept,
                    || source.readiness(),
                    &source,
                )
                .await
            }
        },
    )
}

/// A request's `Accept` header, if it is text.
pub fn accept(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
}

/// Answers an admin request (`accept`: its `Accept` header, which picks the metrics format;
/// `readiness`: what readyz says, asked for a readyz request only).
pub async fn respond(
    method: &Method,
    path: &str,
    accept: Option<&str>,
    readiness: impl FnOnce() -> Readyz,
    source: &Source,
) -> Response<Body> {
    if method != Method::GET && method != Method::HEAD {
        if !super::static_files::known_method(method) {
            return text(StatusCode::NOT_IMPLEMENTED, "method not implemented\n");
        }
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "admin endpoints take GET or HEAD\n",
        );
        r.headers_mut()
            .insert(http::header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let mut r = match path {
        "/_nodus" => {
            let mut r = Response::new(nodus_http::empty());
            *r.status_mut() = StatusCode::MOVED_PERMANENTLY;
            r.headers_mut()
                .insert(LOCATION, HeaderValue::from_static("/_nodus/"));
            r
        }
        "/_nodus/" => with_type(
            Response::new(full(ADMIN_PAGE_HTML)),
            "text/html; charset=utf-8",
        ),
        // OpenMetrics for a scraper that prefers it by its `Accept` q-values (Prometheus does,
        // by default), else the classic text format (`curl`, `promtool check metrics`).
        "/_nodus/metrics" => {
            use nodus::metrics::prometheus::{self as prom, prefers_openmetrics};
            match source.metrics().await {
                Err(PrimarySilent) => primary_silent(),
                Ok(text) if accept.is_some_and(prefers_openmetrics) => {
                    with_type(Response::new(full(text)), prom::CONTENT_TYPE)
                }
                Ok(text) => {
                    let classic = prom::to_classic(&text);
                    with_type(Response::new(full(classic)), prom::CLASSIC_CONTENT_TYPE)
                }
            }
        }
        "/_nodus/stats" => match source.stats().await {
            Ok(json) => with_type(Response::new(full(json)), "application/json"),
            Err(PrimarySilent) => primary_silent(),
        },
        // Answering at all means the loop is not stalled: a stalled loop cannot answer.
        "/_nodus/healthz" => text(StatusCode::OK, "ok\n"),
        "/_nodus/readyz" => match readiness() {
            Readyz::Ready => text(StatusCode::OK, "ready\n"),
            Readyz::NoWorkerReady => text(StatusCode::SERVICE_UNAVAILABLE, "no worker ready\n"),
            Readyz::NoWorkerTakes { stalled } => text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("no worker takes connections ({stalled} stalled)\n"),
            ),
            Readyz::Unready {
                reason,
                cluster: false,
                ..
            } => text(StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
            Readyz::Unready {
                stalled,
                unready,
                reason,
                cluster: true,
            } => text(
                StatusCode::SERVICE_UNAVAILABLE,
                if stalled > 0 {
                    format!(
                        "no worker takes connections ({stalled} stalled, {unready} unready: {reason})\n"
                    )
                } else {
                    format!("no worker takes connections ({unready} unready: {reason})\n")
                },
            ),
            Readyz::ShuttingDown => text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n"),
        },
        _ => text(StatusCode::NOT_FOUND, "no such admin endpoint\n"),
    };
    r.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

fn with_type(mut r: Response<Body>, content_type: &'static str) -> Response<Body> {
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_peers_are_allowed() {
        let peer = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
        let allowed = |p| allowed(p, &HeaderMap::new());
        assert!(allowed(peer("127.0.0.1:5000")));
        assert!(allowed(peer("127.8.9.10:5000")));
        assert!(allowed(peer("[::1]:5000")));
        assert!(allowed(peer("[::ffff:127.0.0.1]:5000")));
        assert!(!allowed(peer("10.0.0.1:5000")));
        assert!(!allowed(peer("192.168.1.2:5000")));
        assert!(!allowed(peer("[::ffff:10.0.0.1]:5000")));
        assert!(!allowed(peer("[2001:db8::1]:5000")));
        assert!(!allowed(None));
    }

    #[test]
    fn a_request_a_proxy_relayed_is_not_a_loopback_client() {
        let local = Some(SocketAddr::from(([127, 0, 0, 1], 5000)));
        for (name, value) in [
            ("x-forwarded-for", "203.0.113.9"),
            ("x-forwarded-for", "127.0.0.1"),
            ("forwarded", "for=203.0.113.9"),
            ("x-real-ip", "203.0.113.9"),
        ] {
            let mut h = HeaderMap::new();
            h.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
            assert!(!allowed(local, &h), "{name}: {value}");
        }
    }

    #[test]
    fn admin_paths() {
        let admin = |p: &str| admin_path(p);
        assert_eq!(admin("/_nodus").as_deref(), Some("/_nodus"));
        assert_eq!(admin("/_nodus/").as_deref(), Some("/_nodus/"));
        assert_eq!(admin("/_nodus/metrics").as_deref(), Some("/_nodus/metrics"));
        // Every spelling of the same decoded path is the admin space.
        assert_eq!(admin("/%5Fnodus/stats").as_deref(), Some("/_nodus/stats"));
        assert_eq!(admin("/%5fnodus").as_deref(), Some("/_nodus"));
        assert_eq!(
            admin("/_nodus/file.txt").as_deref(),
            Some("/_nodus/file.txt")
        );
        assert_eq!(admin("/_nodusx"), None);
        assert_eq!(admin("/a/_nodus/"), None);
        assert_eq!(admin("/_nodus/../x"), None);
    }
}
