//! stub
#[derive(Clone, Copy)]
pub(crate) struct Limits { pub max_head_bytes: usize, pub max_headers: usize }
pub(crate) enum BodyFraming { Empty, Length(u64), Chunked }
pub(crate) struct RequestHead {
    pub method: http::Method, pub uri: http::Uri, pub version: http::Version,
    pub headers: http::HeaderMap, pub body: BodyFraming, pub keep_alive: bool,
    pub expect_continue: bool, pub framing_refused: bool,
}
pub(crate) enum HeadError { Malformed, UriTooLong, TooLarge, Http2Preface }
impl HeadError { pub fn status(&self) -> http::StatusCode { todo!() } }
pub(crate) fn parse(_buf: &mut bytes::BytesMut, _limits: &Limits) -> Result<Option<RequestHead>, HeadError> { todo!() }
