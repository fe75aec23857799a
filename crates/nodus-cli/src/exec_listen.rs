//! `nodus __exec-listen PROGRAM ARGS...` (hidden): the step between a supervisor and a program
//! that takes systemd-style sockets. `LISTEN_PID` must be the program's own pid, which the
//! supervisor cannot know before it forks; this process can, and the program keeps it.
//!
//! Invariants: it sets `LISTEN_PID` to its own pid when `LISTEN_FDS` is set (and touches nothing
//! else; a nodus primary sets `LISTEN_FDS` for its worker only with listeners of its own, and
//! removes any it inherited, so the variable is never one meant for another process), then replaces itself with PROGRAM (`execvp`): same pid, fds 3.. untouched (nothing
//! runs before the exec that opens one without close-on-exec), parent-death signal kept. It
//! returns only on failure, with 127 when PROGRAM is not found (as a shell would), 126
//! otherwise, after saying `cannot run PROGRAM: ...`: to the nodus primary whose worker it is
//! (`NODUS_WORKER_ID` and `NOTIFY_SOCKET` set: `nodus::cluster::report_exec_failure`), which
//! logs it and may end the run, or else on stderr (`nodus: cannot run ...`).

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::process::CommandExt;
use std::path::Path;

use nodus::fs::quote;

/// Runs `args[0]` with `args[1..]` in place of this process; returns an exit code on failure.
pub fn exec_listen(args: Vec<OsString>) -> i32 {
    let Some((program, rest)) = args.split_first() else {
        say!("nodus: __exec-listen needs a program to run");
        return 2;
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest);
    if std::env::var_os("LISTEN_FDS").is_some() {
        cmd.env("LISTEN_PID", std::process::id().to_string());
    }
    let err = cmd.exec();
    let path = Path::new(program);
    // ENOENT for a file that is there: what is missing is what it needs to run.
    let hint = if err.kind() == ErrorKind::NotFound
        && program.as_encoded_bytes().contains(&b'/')
        && path.is_file()
    {
        " (the file exists: its interpreter, the ELF loader or the #! line's, does not)"
    } else {
        ""
    };
    let message = format!("cannot run {}: {err}{hint}", quote(path));
    let primary = std::env::var_os("NODUS_WORKER_ID").is_some()
        && nodus::cluster::report_exec_failure(&err, &message).unwrap_or(false);
    if !primary {
        say!("nodus: {message}");
    }
    match err.kind() {
        ErrorKind::NotFound => 127,
        _ => 126,
    }
}
