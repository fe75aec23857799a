//! A local executor for hyper's HTTP/2 streams: each stream is a nodus task on the current loop.

use std::future::Future;

/// Spawns hyper's background futures as nodus tasks named after the server's handler class.
#[derive(Debug, Clone, Copy)]
pub struct LocalExec {
    pub(crate) name: &'static str,
}

impl LocalExec {
    pub fn new(name: &'static str) -> LocalExec {
        LocalExec { name }
    }
}

impl<F> hyper::rt::Executor<F> for LocalExec
where
    F: Future + 'static,
    F::Output: 'static,
{
    fn execute(&self, future: F) {
        nodus::spawn_named(self.name, future).detach();
    }
}
