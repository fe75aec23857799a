//! nodus: Node.js's process and event-loop model in Rust, observable by design.
//!
//! One single-threaded loop per thread, with libuv's phases (timers, pending, idle, prepare,
//! poll, check, close) and Node's next-tick and microtask rules, running `!Send` async tasks.
//! Every loop measures, always, whether its tasks cooperate: schedule delay, run-queue length,
//! busy and idle time, timer lateness, poll durations per task name; a watchdog thread names a
//! task while it is still blocking the loop.
//!
//! ```
//! use nodus::{Runtime, set_timeout, set_immediate, next_tick};
//!
//! let rt = Runtime::new();
//! rt.block_on(async {
//!     set_timeout(1, || println!("timeout"));
//!     set_immediate(|| println!("immediate"));
//!     next_tick(|| println!("tick"));
//!     nodus::sleep(5).await;
//! });
//! ```
//!
//! See `ARCHITECTURE.md` for the module map and the invariants that cross modules.

mod atfork;
pub mod clock;
pub mod cluster;
pub mod crypto;
pub mod dns;
pub mod fs;
pub mod io;
pub mod ipc;
pub mod json;
pub mod log_limit;
pub mod metrics;
pub mod net;
pub mod notify;
mod parent_env;
pub mod pool;
pub mod process;
pub mod rt;
pub mod signal;
pub mod task;
pub mod time;
pub mod watchdog;
pub mod zlib;

pub use pool::{Offload, OffloadError, offload_cpu, offload_io};
pub use rt::{
    Builder, Immediate, LoopHandle, Runtime, clear_immediate, next_tick, queue_microtask,
    set_immediate,
};
pub use task::{JoinError, JoinHandle, spawn, spawn_named, spawn_named_at, yield_now};
pub use time::{
    Elapsed, Interval, Sleep, Timer, clear_interval, clear_timeout, interval, set_interval,
    set_timeout, sleep, timeout,
};
