//! nodus's own HTTP/1 engine: head parsing, chunked bodies, response heads.

#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod head;
