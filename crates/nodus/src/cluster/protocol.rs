//! The messages a primary and its workers exchange: Node's `NODE_CLUSTER` set, byte-compatible
//! with Node v20, and nodus's own extensions under `NODE_NODUS`.
//!
//! Node's messages (`lib/internal/cluster/{primary,child}.js`): every one is
//! `{"cmd":"NODE_CLUSTER", ..., "seq": n}` with one `seq` counter per process; a reply carries
//! `"ack": <request seq>`. Worker → primary: `online`, `queryServer` (address, port, addressType,
//! fd, index, flags, backlog), `listening`, `close` (key), `exitedAfterDisconnect`, and
//! `{ack, accepted}` after a `newconn`. Primary → worker: the `queryServer` reply (`errno`, `key`,
//! `data`, plus `sockname` under round-robin, or the listening fd under a shared handle),
//! `newconn` (key, with the connection's fd), `disconnect`.
//!
//! nodus's extensions are internal messages `{"cmd":"NODE_NODUS","act":...}`: a Node worker or
//! primary ignores them (Node's cluster code drops internal messages whose `cmd` is not
//! `NODE_CLUSTER`). They carry what Node's protocol has no word for: `ready`, `going_down`,
//! `load` (open connections, for the `least` policy), snapshot and cluster-stats requests and
//! replies (a `snapshot_request` with `text: "probe"` asks only whether the worker's loop runs:
//! its `snapshot` answer carries none; an older worker sends one all the same). The primary's
//! `disconnect` also carries `drainMs`, the drain deadline, which Node workers ignore.
//!
//! A nodus worker's `online` carries `"nodus":1` (Node's primary ignores it): from then on its
//! primary knows it answers snapshot requests (a Node worker never does).
//!
//! Connection handoff between nodus peers: a nodus worker's `queryServer` carries `"nodus":1`
//! (a Node primary ignores it); the primary then hands that worker its connections as
//! `newconns` (key, `peers`: each client's address) with up to 64 fds in one frame
//! (`ipc::Channel::send_fds`) instead of one `newconn` per fd. The worker answers a whole loop
//! turn's batches with one `took` (`ack`: the newest batch's `seq`; every batch up to it that was
//! not refused was taken; under `least` it also carries that turn's `load` fields), and a batch
//! it cannot take at once with `refused` (`ack`: its `seq`), always before the `took` that passes
//! it. A nodus worker whose listener closes with taken connections still queued sends its
//! pending `took`, its `close`, then the connections as `returned` (key, peers, fds), and the
//! primary hands them to the other workers: each fd only once the primary found it to be a
//! connection accepted on that key's listener (the kernel's word: socket type, family, local
//! address, connected peer, which also replaces the `peers` field); any other fd is closed. A worker closes a key this way too when a `listen`
//! is abandoned after its `queryServer` went out (a late answer is ignored), and closes every key
//! before its `exitedAfterDisconnect` when it leaves on its own (as Node's worker closes its
//! servers first).
//!
//! A worker that also sends `"board":1` gets, before the `queryServer` answer, a `board` message
//! with one fd: a shared page (`board.rs`) where it posts taken batches, refusals and its load
//! instead of `took` and `load` messages (a `refused` message still names each refused batch).
//! A primary that sends no board (an older nodus) gets the messages.
//!
//! Invariant: fields are parsed leniently (unknown fields ignored, all optional) so a message
//! from a newer or older peer never breaks the channel; what a role needs and does not find is
//! logged and the message dropped. A known field of another JSON type (`"seq":"6"`, a `port`
//! past `i64`, `addressType` nested past serde's recursion limit) makes the message one that
//! does not parse: it is logged and dropped whole, never half read.
//!
//! Version skew (ARCHITECTURE.md, "Version skew"): a rolling reload runs the binary on disk
//! under the primary that started, so a nodus primary and its nodus workers may be different
//! builds, older or newer either way, for as long as the primary runs. So, in every build:
//! - an act or a field keeps its name, JSON type and meaning; a new meaning is a new name, and
//!   an act or field a peer does not know is ignored (an older peer's answer to a newer request
//!   is one it already gives: a probe is answered with a whole snapshot, ignored);
//! - what a peer may lack is used only once it says it has it, by a number that names the
//!   version: `nodus: 1` (batched handoff, snapshot requests), `board: 1` (the board's layout,
//!   `board.rs`). A change an older peer would misread takes a new number, which such a peer
//!   does not know, so it falls back (to Node's messages, to `took`/`load` messages) rather
//!   than misread; the side that reads the number serves only the versions it knows;
//! - a limit a receiver puts on what its peer sends ([`crate::ipc`]'s 16 MiB frame and 64 fds per
//!   frame, the snapshot's wire limits, `metrics/snapshot.rs`) is a fixed number for every build,
//!   never this build's own table sizes, and never lowered; a sender stays within it.

use std::borrow::Cow;
use std::net::{SocketAddr, SocketAddrV4};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// `cmd` of Node's cluster messages.
pub(crate) const NODE_CLUSTER: &str = "NODE_CLUSTER";
/// `cmd` of nodus's own cluster messages.
pub(crate) const NODE_NODUS: &str = "NODE_NODUS";
/// The `text` of a `snapshot_request` that asks only whether the worker's loop runs: answered
/// with a `snapshot` message that carries none.
pub(crate) const SNAPSHOT_PROBE: &str = "probe";

/// Every field any cluster message may carry; what is absent is `None`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Incoming<'a> {
    #[serde(borrow)]
    pub cmd: Option<&'a str>,
    #[serde(borrow)]
    pub act: Option<&'a str>,
    pub seq: Option<u64>,
    pub ack: Option<u64>,
    pub accepted: Option<bool>,
    /// Borrowed from the message unless it has escapes.
    #[serde(borrow)]
    pub key: Option<Cow<'a, str>>,
    // queryServer / listening
    pub address: Option<String>,
    /// -1 for a pipe (Node's `listen(path)`).
    pub port: Option<i64>,
    pub address_type: Option<Value>,
    pub fd: Option<Value>,
    pub index: Option<Value>,
    /// A `queryServer`'s libuv bind flags: TCP `UV_TCP_IPV6ONLY` 1 (`ipv6Only`); UDP
    /// `UV_UDP_IPV6ONLY` 1, `UV_UDP_REUSEADDR` 4.
    pub flags: Option<u64>,
    pub errno: Option<Value>,
    // nodus extensions
    pub conns: Option<u64>,
    pub accepted_total: Option<u64>,
    pub id: Option<u64>,
    pub drain_ms: Option<u64>,
    #[serde(borrow)]
    pub snapshot: Option<&'a RawValue>,
    pub text: Option<String>,
    pub nodus: Option<u64>,
    pub board: Option<u64>,
    pub window: Option<u64>,
    pub peers: Option<Vec<Option<SocketAddr>>>,
    /// A round-robin `queryServer` answer's bound address (Node's `getsockname`): the port a
    /// port-0 listen got.
    pub sockname: Option<InSockName>,
}

/// [`SockName`] as received (`family` is not needed: the address says it).
#[derive(Debug, Deserialize)]
pub(crate) struct InSockName {
    pub address: String,
    pub port: u16,
}

impl InSockName {
    pub fn addr(&self) -> Option<SocketAddr> {
        Some(SocketAddr::new(self.address.parse().ok()?, self.port))
    }
}

impl<'a> Incoming<'a> {
    /// Parses a received message's JSON; `None` if it is not an object of this shape.
    pub fn parse(json: &'a str) -> Option<Incoming<'a>> {
        serde_json::from_str(json).ok()
    }

    pub fn is_cluster(&self) -> bool {
        self.cmd == Some(NODE_CLUSTER)
    }

    pub fn is_nodus(&self) -> bool {
        self.cmd == Some(NODE_NODUS)
    }
}

/// JavaScript's `${value}` of an optional JSON field, as Node builds server keys: an absent
/// field is `undefined`, `null` is `null`, strings are bare.
pub(crate) fn js_string(v: Option<&Value>) -> String {
    match v {
        None => "undefined".to_owned(),
        Some(Value::Null) => "null".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// A `queryServer` request: what a worker asks to listen on.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct QueryServer<'a> {
    pub cmd: &'static str,
    pub act: &'static str,
    pub index: u64,
    pub data: Option<()>,
    pub address: &'a str,
    pub port: u16,
    pub address_type: u8,
    pub flags: u32,
    pub backlog: u32,
    pub seq: u64,
    /// `1` from a nodus worker: hand connections over as `newconns` batches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodus: Option<u8>,
    /// `1` from a nodus worker that reads a board (`board.rs`) the primary sends before its
    /// answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub board: Option<u8>,
    /// From a nodus worker that takes fewer connections handed and not yet taken than the
    /// primary's default (64; a process low on fds): the most it may have so
    /// (`Worker::set_handoff_window`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u64>,
}

/// The message a worker or primary sends with only `act` and `seq` (`online`, `disconnect`,
/// `exitedAfterDisconnect`); a nodus worker's `online` also carries `"nodus":1`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Act<'a> {
    pub cmd: &'static str,
    pub act: &'a str,
    pub seq: u64,
    /// `1` in a nodus worker's `online`: it answers nodus's own messages (snapshot requests).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodus: Option<u8>,
}

/// `close` of one server key, from a worker.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CloseKey<'a> {
    pub cmd: &'static str,
    pub act: &'static str,
    pub key: &'a str,
    pub seq: u64,
}

/// A reply: `{ack, accepted}` after a `newconn`, or a bare `{ack}`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Ack {
    pub cmd: &'static str,
    pub ack: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted: Option<bool>,
    pub seq: u64,
}

/// `newconn`: a connection for the server `key` (its fd travels with it).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NewConn<'a> {
    pub cmd: &'static str,
    pub act: &'static str,
    pub key: &'a str,
    pub seq: u64,
}

/// `newconns`: connections for the server `key` from a nodus primary to a nodus worker (their
/// fds travel with it, in `peers` order).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NewConns<'a> {
    pub cmd: &'static str,
    pub act: &'static str,
    pub key: &'a str,
    pub seq: u64,
    #[serde(serialize_with = "peers_text")]
    pub peers: &'a [Option<SocketAddr>],
}

/// `peers` as serde writes them (each address's `Display` text, or `null`), an IPv4 one without
/// the formatting machinery: a handoff writes one per connection.
fn peers_text<S: serde::Serializer>(peers: &[Option<SocketAddr>], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(peers.len()))?;
    for peer in peers {
        match peer {
            Some(SocketAddr::V4(v4)) => seq.serialize_element(V4Text::new(v4).as_str())?,
            other => seq.serialize_element(other)?,
        }
    }
    seq.end()
}

/// An IPv4 socket address as its `Display` writes it (`a.b.c.d:port`), in a fixed buffer.
struct V4Text {
    buf: [u8; 21],
    len: usize,
}

impl V4Text {
    fn new(addr: &SocketAddrV4) -> V4Text {
        let mut text = V4Text {
            buf: [0; 21],
            len: 0,
        };
        for (i, octet) in addr.ip().octets().into_iter().enumerate() {
            if i > 0 {
                text.push(b'.');
            }
            text.decimal(u16::from(octet));
        }
        text.push(b':');
        text.decimal(addr.port());
        text
    }

    fn push(&mut self, byte: u8) {
        self.buf[self.len] = byte;
        self.len += 1;
    }

    /// `n` (an octet or a port) in decimal.
    fn decimal(&mut self, n: u16) {
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(n).as_bytes();
        self.buf[self.len..self.len + digits.len()].copy_from_slice(digits);
        self.len += digits.len();
    }

    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).expect("digits, dots and a colon")
    }
}

/// The primary's answer to `queryServer`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct QueryReply {
    pub cmd: &'static str,
    /// A negative libuv errno as a number-like string (Node's workers read `message.errno`).
    #[serde(serialize_with = "errno_number")]
    pub errno: Option<String>,
    pub key: String,
    pub ack: u64,
    pub data: Option<()>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sockname: Option<SockName>,
    pub seq: u64,
}

fn errno_number<S: serde::Serializer>(errno: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match errno.as_deref().and_then(|e| e.parse::<i64>().ok()) {
        Some(n) => s.serialize_i64(n),
        None => s.serialize_none(),
    }
}

/// Node's `getsockname` result in a round-robin reply.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SockName {
    pub address: String,
    pub family: &'static str,
    pub port: u16,
}

/// The primary's `disconnect`, with nodus's drain deadline.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Disconnect {
    pub cmd: &'static str,
    pub act: &'static str,
    pub seq: u64,
    pub drain_ms: u64,
}

/// A nodus extension message.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Nodus<'a> {
    pub cmd: &'static str,
    pub act: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ack: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted_total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<&'a str>,
}

impl<'a> Nodus<'a> {
    pub fn act(act: &'a str) -> Nodus<'a> {
        Nodus {
            cmd: NODE_NODUS,
            act,
            id: None,
            ack: None,
            conns: None,
            accepted_total: None,
            snapshot: None,
            text: None,
        }
    }
}

/// Node's server key: `address:port:addressType:fd:index`, each as JavaScript prints it.
pub(crate) fn server_key(m: &Incoming<'_>) -> String {
    let address = m
        .address
        .as_ref()
        .map_or_else(|| "null".to_owned(), Clone::clone);
    let port = m
        .port
        .map_or_else(|| "undefined".to_owned(), |p| p.to_string());
    format!(
        "{address}:{port}:{}:{}:{}",
        js_string(m.address_type.as_ref()),
        js_string(m.fd.as_ref()),
        js_string(m.index.as_ref())
    )
}

impl QueryServer<'_> {
    /// The key a primary (nodus's [`server_key`], or Node's) builds from this request: a worker
    /// knows it before the answer comes. It sends no `fd`, which Node prints as `undefined`.
    pub fn key(&self) -> String {
        format!(
            "{}:{}:{}:undefined:{}",
            self.address, self.port, self.address_type, self.index
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_node_query_server_and_builds_its_key() {
        let json = r#"{"cmd":"NODE_CLUSTER","act":"queryServer","index":0,"data":null,"address":"127.0.0.1","port":47001,"addressType":4,"flags":0,"backlog":0,"seq":1}"#;
        let m = Incoming::parse(json).unwrap();
        assert!(m.is_cluster());
        assert_eq!(m.act, Some("queryServer"));
        assert_eq!(m.seq, Some(1));
        // Node's key for this request, as observed on the wire.
        assert_eq!(server_key(&m), "127.0.0.1:47001:4:undefined:0");
    }

    #[test]
    fn a_worker_knows_the_key_the_primary_builds_from_its_query() {
        let query = QueryServer {
            cmd: NODE_CLUSTER,
            act: "queryServer",
            index: 0,
            data: None,
            address: "::1",
            port: 8080,
            address_type: 6,
            flags: 0,
            backlog: 511,
            seq: 4,
            nodus: Some(1),
            board: Some(1),
            window: Some(7),
        };
        let json = serde_json::to_string(&query).unwrap();
        let m = Incoming::parse(&json).unwrap();
        assert_eq!(m.window, Some(7));
        assert_eq!(query.key(), server_key(&m));
        assert_eq!(query.key(), "::1:8080:6:undefined:0");
    }

    #[test]
    fn a_listen_without_host_has_a_null_address() {
        let json = r#"{"cmd":"NODE_CLUSTER","act":"queryServer","index":0,"data":null,"address":null,"port":8080,"addressType":4,"seq":1}"#;
        let m = Incoming::parse(json).unwrap();
        assert_eq!(server_key(&m), "null:8080:4:undefined:0");
    }

    #[test]
    fn replies_serialize_as_node_writes_them() {
        let reply = QueryReply {
            cmd: NODE_CLUSTER,
            errno: None,
            key: "127.0.0.1:47001:4:undefined:0".into(),
            ack: 1,
            data: None,
            sockname: Some(SockName {
                address: "127.0.0.1".into(),
                family: "IPv4",
                port: 47001,
            }),
            seq: 0,
        };
        assert_eq!(
            serde_json::to_string(&reply).unwrap(),
            r#"{"cmd":"NODE_CLUSTER","errno":null,"key":"127.0.0.1:47001:4:undefined:0","ack":1,"data":null,"sockname":{"address":"127.0.0.1","family":"IPv4","port":47001},"seq":0}"#
        );
        let ack = Ack {
            cmd: NODE_CLUSTER,
            ack: 2,
            accepted: Some(true),
            seq: 3,
        };
        assert_eq!(
            serde_json::to_string(&ack).unwrap(),
            r#"{"cmd":"NODE_CLUSTER","ack":2,"accepted":true,"seq":3}"#
        );
    }

    #[test]
    fn newconns_writes_each_peer_as_serde_writes_a_socket_address() {
        let mut peers: Vec<Option<SocketAddr>> = [
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "10.0.100.9:80",
            "127.0.0.1:5000",
            "[::1]:8080",
            "[fe80::1%3]:1",
            "[::ffff:1.2.3.4]:9",
        ]
        .iter()
        .map(|a| Some(a.parse().unwrap()))
        .collect();
        peers.push(None);
        // Every octet and a spread of ports, by a fixed-seed LCG.
        let mut x: u32 = 12345;
        for _ in 0..2000 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            let [a, b, c, d] = x.to_be_bytes();
            let port = (x >> 7) as u16;
            peers.push(Some(SocketAddr::from(([a, b, c, d], port))));
        }
        let msg = NewConns {
            cmd: NODE_NODUS,
            act: "newconns",
            key: "k",
            seq: 1,
            peers: &peers,
        };
        let written: Value = serde_json::from_str(&serde_json::to_string(&msg).unwrap()).unwrap();
        assert_eq!(written["peers"], serde_json::to_value(&peers).unwrap());
    }

    #[test]
    fn newconns_round_trips_its_peers() {
        let peers = [Some("127.0.0.1:5000".parse().unwrap()), None];
        let msg = NewConns {
            cmd: NODE_NODUS,
            act: "newconns",
            key: "k",
            seq: 7,
            peers: &peers,
        };
        let json = serde_json::to_string(&msg).unwrap();
        assert_eq!(
            json,
            r#"{"cmd":"NODE_NODUS","act":"newconns","key":"k","seq":7,"peers":["127.0.0.1:5000",null]}"#
        );
        let m = Incoming::parse(&json).unwrap();
        assert_eq!(m.peers.as_deref(), Some(&peers[..]));
        assert_eq!(m.seq, Some(7));
    }

    #[test]
    fn lenient_about_unknown_fields_and_rejects_non_objects() {
        let m = Incoming::parse(r#"{"cmd":"NODE_NODUS","act":"load","conns":3,"future":[1,2]}"#)
            .unwrap();
        assert!(m.is_nodus());
        assert_eq!(m.conns, Some(3));
        assert!(Incoming::parse("42").is_none());
    }
}
