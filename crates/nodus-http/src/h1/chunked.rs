//! stub
pub(crate) struct ChunkedDecoder;
pub(crate) enum Decoded { Data(bytes::Bytes), NeedMore, End }
#[derive(Debug)]
pub(crate) enum ChunkedError { Malformed, BareLineFeed }
impl ChunkedDecoder { pub fn new() -> Self { ChunkedDecoder } pub fn decode(&mut self, _buf: &mut bytes::BytesMut, _max: usize) -> Result<Decoded, ChunkedError> { todo!() } }
