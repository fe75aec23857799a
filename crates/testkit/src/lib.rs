//! Test support shared by the integration tests of `nodus`, `nodus-cli` and `nodus-http` (each
//! test file is its own crate, so the helpers live here, a dev-dependency of all three).
//!
//! Everything is blocking std code, bounded in time, on 127.0.0.1, and cleans up on drop: a
//! temporary directory ([`tmp`]), free loopback ports ([`net`]), a child process stopped by PID
//! ([`proc`]), one test alone in a fresh process ([`alone`]), the process tree as `/proc` shows
//! it ([`tree`]), a minimal HTTP/1.1 client ([`http`]), a Prometheus exposition read as a
//! scraper reads it ([`scrape`]) and the count of open fds ([`fds`]).

pub mod alone;
pub mod fds;
pub mod http;
pub mod net;
pub mod proc;
pub mod scrape;
pub mod tmp;
pub mod tree;
