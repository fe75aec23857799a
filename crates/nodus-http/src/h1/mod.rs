//! nodus's own HTTP/1 engine: head parsing, chunked bodies, response heads, connections.

pub(crate) mod chunked;
pub(crate) mod conn;
pub(crate) mod encode;
pub(crate) mod head;
pub(crate) mod wire;
