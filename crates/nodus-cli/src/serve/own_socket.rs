//! A reuse-port worker's public listener, for `nodus_http::serve`: a socket of the worker's own
//! (`SO_REUSEPORT`, no copy in the primary or another worker), so its drain may turn deferred
//! accept off on it and take the clients the kernel still holds for it
//! (`Accept::stop_deferring`) rather than have them reset as it closes. Under `shared` the
//! socket, and its deferral, is every worker's; under `rr` and `least` the primary accepts.

use std::io;
use std::net::SocketAddr;
use std::task::{Context, Poll};

use nodus::cluster::{Listener, Stream};
use nodus_http::server::Accept;

/// A cluster listener whose socket (if any) is this worker's alone.
pub(super) struct OwnSocket(pub(super) Listener);

impl Accept for OwnSocket {
    type Stream = Stream;

    fn poll_accept(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<(Self::Stream, Option<SocketAddr>)>> {
        Accept::poll_accept(&self.0, cx)
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        Accept::local_addr(&self.0)
    }

    fn stop_deferring(&self) -> Option<SocketAddr> {
        self.0.socket()?.stop_deferring()
    }
}
