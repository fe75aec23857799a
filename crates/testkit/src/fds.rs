//! Counting this process's open fds, to check that something closed what it opened.

/// The process's open fds, less the nodus watchdog's: its thread opens a loop's
/// `/proc/self/task/<tid>/{schedstat,status}` when it adopts the loop and closes them when it
/// prunes it, both asynchronously, so those may come or go between any two counts. Tests that
/// count must not run beside others that open fds (a test binary of their own, or serialized).
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter(|target| !target.starts_with("/proc/"))
        .count()
}
