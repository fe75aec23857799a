//! The cluster: a primary that forks and supervises worker processes, and the worker side.
//!
//! - [`Worker`] (`worker`): a process started by a primary (`NODE_UNIQUE_ID`) asks it for
//!   listeners, answers its requests and hears when to drain. Works under a nodus primary and
//!   under a stock Node primary.
//! - [`Primary`] (`primary`): forks workers (nodus, Node or any program), owns the listening
//!   sockets, balances connections (`rr`, `shared`, `reuseport`, `least`), and supervises:
//!   restart budget, backoff, "going down" notices, rolling reload on SIGHUP, graceful
//!   shutdown, no orphans (each worker's process group killed at its exit, and by the primary's
//!   orphan guard if the primary is killed).
//! - `protocol`: Node's `NODE_CLUSTER` messages and nodus's `NODE_NODUS` extensions.
//! - `board`: the page a nodus primary shares with each nodus worker, where the worker posts the
//!   connections it took (no `took` message per batch) and its load.
//! - `supervision`: the restart policy (budget, backoff, restart types), pure and deterministic.
//!
//! A process is a primary or a worker or neither; [`is_worker`] tells which before anything is
//! opened.

mod board;
mod primary;
mod protocol;
mod reply;
pub mod supervision;
mod worker;

pub use primary::{
    Config, EVENT_LOG_FLUSH, Event, EventKind, MESSAGE_LOG_MAX, Policy, Primary, Readiness,
    ReadyState, WorkerCommand, report_exec_failure,
};
pub use supervision::{
    Backoff, Decision, ExitReason, FORCED_STOP_EXIT_CODE, GIVE_UP_EXIT_CODE, RestartBudget,
    RestartPolicy, RestartType, SlotHistory, default_max_restarts,
};
pub use worker::{HANDOFF_QUEUE_MAX, HANDOFF_WINDOW_MAX, Listener, Stream, Worker};

/// Whether a cluster primary started this process (it set `NODE_UNIQUE_ID`), before or after
/// [`Worker::get`] and nodus's taking of the variable out of the environment; takes nothing.
pub fn is_worker() -> bool {
    crate::parent_env::started_as_worker()
}
