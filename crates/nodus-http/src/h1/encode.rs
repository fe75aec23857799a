//! stub
pub(crate) enum Framing { Length(u64), Chunked, CloseDelimited, NoBody }
pub(crate) struct Head<'a> { pub status: http::StatusCode, pub headers: &'a http::HeaderMap, pub version: http::Version,
    pub request_version: http::Version, pub request_is_head: bool, pub body_len: Option<u64>, pub body_empty: bool, pub keep_alive: bool }
pub(crate) fn encode_head(_head: &Head<'_>, _date: &[u8], _out: &mut Vec<u8>) -> (Framing, bool) { todo!() }
pub(crate) fn chunk_head(_len: usize, _out: &mut Vec<u8>) { todo!() }
pub(crate) const CHUNK_END: &[u8] = b"\r\n";
pub(crate) const LAST_CHUNK: &[u8] = b"0\r\n\r\n";
pub(crate) fn date_now<R>(f: impl FnOnce(&[u8]) -> R) -> R { f(b"") }
