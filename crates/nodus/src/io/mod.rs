//! I/O readiness on the loop: a reactor over mio (epoll), `AsyncFd` for any file descriptor,
//! and the per-poll cooperative budget that keeps an always-ready source from starving the loop.

mod async_fd;
pub(crate) mod coop;
pub(crate) mod reactor;
mod return_stack;

pub use async_fd::{AsyncFd, AsyncFdMut};
pub use coop::consume_budget;
pub use return_stack::{after_syscall, refill_return_stack, refills_return_stack};
