//! Tasks: `!Send` futures spawned on the current loop, with names, spawn locations and
//! `JoinHandle`s.
//!
//! A task's name is a static class (`"http:app"`), so measurements per name stay bounded; what
//! it is doing now may be dynamic (the request a handler serves). [`set_note`] attaches that as a
//! short note, which the watchdog shows with the name while the task holds the loop (and the
//! slow-poll log when its poll returns), until [`clear_note`] or the task ends
//! (`metrics/meter/notes.rs` says how the loop publishes it at no cost to tasks without one).
//!
//! A task is an `async_task` task (one allocation: header, future, output) whose metadata is
//! [`TaskMeta`]. Its waker is `Send + Sync`: a wake on the loop thread queues the task on the
//! microtask queue (polling a woken task is a microtask, like a JS `await` continuation), a wake
//! from the task's own poll queues it in the check phase (a self-wake is a yield), and a wake
//! from another thread goes through the loop's remote queue and wakes its poll.
//!
//! Every task is in its loop's registry (`Core::tasks`, with a waker) from spawn until its future
//! is dropped; dropping the runtime wakes every task still there, and the wake, refused by a
//! loop that is shutting down, drops the task's future (one another thread's wake has just
//! marked scheduled is dropped when that wake's push arrives, which the drop waits for). So no
//! task outlives its runtime, whether or not anything else could wake it, and a `JoinHandle`
//! still held resolves to `JoinError::Cancelled`.
//!
//! Invariants: a task is polled and dropped only on its loop's thread (async-task's
//! `spawn_local` checks it); a panic inside a task, in a poll or in its future's drop (an abort,
//! the runtime's drop), is caught at the task boundary and never reaches the loop: a poll's
//! reaches the `JoinHandle` and is counted for the task's name (`nodus_task_panics_total`, handle
//! kept or not), a drop's leaves it `Cancelled`.

mod join;
mod yield_now;

use std::future::Future;
use std::panic::Location;
use std::sync::Arc;

use async_task::{Runnable, ScheduleInfo, WithInfo};

pub use join::{JoinError, JoinHandle};
pub use yield_now::{YieldNow, yield_now};

use crate::metrics::classes::ClassId;
use crate::rt::context::{try_with_core, with_core};
use crate::rt::core::{Core, Shared};
use crate::rt::queues::RunItem;

/// What the loop knows about a task: shown in stall reports, slow-poll logs and metrics.
#[derive(Debug, Clone, Copy)]
pub struct TaskMeta {
    pub(crate) id: u64,
    /// The task's key in its loop's registry (`Core::tasks`), which keeps its note between polls.
    pub(crate) key: usize,
    pub(crate) name: &'static str,
    pub(crate) location: &'static Location<'static>,
    pub(crate) class: ClassId,
}

impl TaskMeta {
    /// Loop-unique task id.
    pub fn id(&self) -> u64 {
        self.id
    }
    /// The task's name (`"task"` for unnamed tasks).
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// Where `spawn` was called.
    pub fn location(&self) -> &'static Location<'static> {
        self.location
    }
}

/// Spawns a task on the current loop; its first poll is a microtask.
///
/// # Panics
/// On a thread with no running nodus loop.
#[track_caller]
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let location = Location::caller();
    with_core("nodus::spawn", |core| {
        spawn_on(core, "task", location, future)
    })
}

/// Spawns a named task. Names are classes (`"http:static"`), never per-connection values:
/// measurements are kept per name for up to 64 names.
#[track_caller]
pub fn spawn_named<F>(name: &'static str, future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let location = Location::caller();
    with_core("nodus::spawn_named", |core| {
        spawn_on(core, name, location, future)
    })
}

/// Spawns a named task that measurements and stall reports place at `location` rather than at
/// this call: for a library that spawns on its user's behalf (a server's connection tasks, say)
/// and captured its user's call site with `#[track_caller]`.
///
/// # Panics
/// On a thread with no running nodus loop.
pub fn spawn_named_at<F>(
    name: &'static str,
    location: &'static Location<'static>,
    future: F,
) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    with_core("nodus::spawn_named_at", |core| {
        spawn_on(core, name, location, future)
    })
}

/// Spawns on `core` with an explicit name and location (for wrappers that capture the caller).
pub(crate) fn spawn_on<F>(
    core: &Core,
    name: &'static str,
    location: &'static Location<'static>,
    future: F,
) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    let class = core.meter.class_of(name);
    let key = core.next_task_key();
    let meta = TaskMeta {
        id: core.next_task_id(),
        key,
        name,
        location,
        class,
    };
    core.meter.spawned(class);
    let guard = TaskGuard { key, id: meta.id };
    // Built outside the async block, so that dropping the task before its first poll drops the
    // future inside `CatchUnwind` too.
    let future = join::CatchUnwind::new(future);
    let future = async move {
        let _guard = guard;
        let out = future.await;
        if out.is_err() {
            // Counted here, on the loop, whether or not the `JoinHandle` is still held.
            try_with_core(|core| core.meter.task_panicked(class));
        }
        out
    };
    let shared = core.shared.clone();
    let schedule = WithInfo(move |runnable: Runnable<TaskMeta>, info: ScheduleInfo| {
        schedule(&shared, runnable, info)
    });
    let (runnable, task) = async_task::Builder::new()
        .metadata(meta)
        .spawn_local(move |_| future, schedule);
    core.register_task(key, meta.id, runnable.waker());
    runnable.schedule();
    JoinHandle::new(task.fallible(), meta.id)
}

/// Attaches `note` to the current task: what it is doing now, which its static name cannot say
/// (`nodus-http` sets `GET /path` for the request a handler serves). While the task holds the
/// loop, the watchdog's stall report names it with the note, `task "http:app" [GET /slow/thing]
/// (src/main.rs:9:5)` (and so do [`StallReport::note`](crate::watchdog::StallReport::note), the
/// end-of-stall line and a slow poll's log line). It stays until [`clear_note`], the next
/// `set_note`, or the task's end; outside a task (in `block_on`'s future, a callback or a
/// next-tick or microtask closure) it names only the poll or callback under way.
///
/// At most 64 bytes are kept (a longer note is cut at a char boundary); control characters and
/// backslashes are escaped when it is shown. Notes appear in logs and in `/_nodus/stats`: keep
/// secrets out of them. Cheap enough for every request: a copy into the loop's watchdog slot,
/// no allocation. Does nothing on a thread with no running loop, or without the `measure`
/// feature.
#[inline]
pub fn set_note(note: &str) {
    set_note_prefixed("", note);
}

/// [`set_note`] with a static prefix, `set_note_prefixed("GET ", path)`: the prefix is shared
/// by reference and only `text` is copied (so a note made of a fixed part and a dynamic one
/// needs no buffer to join them in). The prefix and the text together are cut to 64 bytes.
#[inline(always)]
pub fn set_note_prefixed(prefix: &'static str, text: &str) {
    try_with_core(|core| core.meter.set_note(prefix, text));
}

/// Removes the current task's note (see [`set_note`]). A slow poll that set one and cleared it
/// before returning is still logged with it.
#[inline(always)]
pub fn clear_note() {
    try_with_core(|core| core.meter.clear_note());
}

/// Where a woken task goes (see the module docs).
fn schedule(shared: &Arc<Shared>, runnable: Runnable<TaskMeta>, info: ScheduleInfo) {
    let item = RunItem::Task(runnable);
    if try_with_core(|core| core.shared.loop_id == shared.loop_id) == Some(true) {
        with_core("wake", |core| {
            core.schedule_local(item, info.woken_while_running)
        });
    } else {
        // Another thread, or this loop's thread while the loop is not entered.
        shared.schedule_remote(item);
    }
}

/// Keeps the task in its loop's registry (and counted as alive) until its future is dropped.
struct TaskGuard {
    key: usize,
    id: u64,
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        try_with_core(|core| core.task_dropped(self.key, self.id));
    }
}
