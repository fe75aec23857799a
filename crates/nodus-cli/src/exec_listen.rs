//! `nodus __exec-listen PROGRAM ARGS...` (hidden): the step between a supervisor and a program
//! that takes systemd-style sockets. `LISTEN_PID` must be the program's own pid, which the
//! supervisor cannot know before it forks; this process can, and the program keeps it.
//!
//! Invariants: it sets `LISTEN_PID` to its own pid when `LISTEN_FDS` is set (and touches nothing
//! else; a nodus primary sets `LISTEN_FDS` for its worker only with listeners of its own, and
//! removes any it inherited, so the variable is never one meant for another process), then replaces itself with PROGRAM (`execvp`): same pid, fds 3.. untouched (nothing
//! runs before the exec that opens one without close-on-exec), parent-death signal kept.
//! PROGRAM an ELF file (the one `execvp` would run, found the same way), it is executed with
//! `execve` alone: one the kernel refuses (`ENOEXEC`, another architecture with no
//! `binfmt_misc` emulator) is an exec failure, never `execvp`'s `/bin/sh` reading machine code.
//! It returns only on failure, with 127 when PROGRAM is not found (as a shell would), 126
//! otherwise, after saying `cannot run PROGRAM: ...` (for an `ENOEXEC`, what the ELF header says
//! the file is): to the nodus primary whose worker it is (`NODUS_WORKER_ID` and `NOTIFY_SOCKET`
//! set: `nodus::cluster::report_exec_failure`), which logs it and may end the run, or else on
//! stderr (`nodus: cannot run ...`).

use std::ffi::{CString, OsString};
use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;

use nodus::fs::quote;

/// Runs `args[0]` with `args[1..]` in place of this process; returns an exit code on failure.
pub fn exec_listen(args: Vec<OsString>) -> i32 {
    let Some((program, rest)) = args.split_first() else {
        say!("nodus: __exec-listen needs a program to run");
        return 2;
    };
    let listen_pid = std::env::var_os("LISTEN_FDS")
        .is_some()
        .then(|| std::process::id().to_string());
    let elf = crate::run::find_in_path(program)
        .ok()
        .filter(|file| is_elf(file));
    let err = match &elf {
        Some(file) => execve(file, &args, listen_pid.as_deref()),
        None => {
            let mut cmd = std::process::Command::new(program);
            cmd.args(rest);
            if let Some(pid) = &listen_pid {
                cmd.env("LISTEN_PID", pid);
            }
            cmd.exec()
        }
    };
    let path = Path::new(program);
    let hint = match (err.kind(), &elf) {
        // ENOENT for a file that is there: what is missing is what it needs to run.
        (ErrorKind::NotFound, _)
            if program.as_encoded_bytes().contains(&b'/') && path.is_file() =>
        {
            " (the file exists: its interpreter, the ELF loader or the #! line's, does not)".into()
        }
        (_, Some(file)) if err.raw_os_error() == Some(libc::ENOEXEC) => {
            crate::run::why_exec_refused(file).map_or_else(String::new, |why| format!(": {why}"))
        }
        _ => String::new(),
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

/// Whether `file` starts with the ELF magic.
fn is_elf(file: &Path) -> bool {
    let mut magic = [0u8; 4];
    std::fs::File::open(file)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok_and(|()| &magic == b"\x7fELF")
}

/// Replaces this process with `file` (`args`: its argv, `args[0]` included) by `execve`, with
/// this process's environment and `LISTEN_PID` set to `listen_pid` when given. Returns only on
/// failure.
fn execve(file: &Path, args: &[OsString], listen_pid: Option<&str>) -> std::io::Error {
    let c = |bytes: &[u8]| {
        CString::new(bytes).map_err(|_| std::io::Error::from(ErrorKind::InvalidInput))
    };
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| listen_pid.is_none() || k != "LISTEN_PID")
        .collect();
    env.extend(listen_pid.map(|pid| ("LISTEN_PID".into(), pid.into())));
    let built = (|| -> std::io::Result<_> {
        let argv = args
            .iter()
            .map(|a| c(a.as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let envp = env
            .iter()
            .map(|(k, v)| c(&[k.as_bytes(), b"=", v.as_bytes()].concat()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((c(file.as_os_str().as_bytes())?, argv, envp))
    })();
    let (path, argv, envp) = match built {
        Ok(built) => built,
        Err(e) => return e,
    };
    let pointers = |s: &[CString]| -> Vec<*const libc::c_char> {
        s.iter()
            .map(|s| s.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    };
    let (argv_p, envp_p) = (pointers(&argv), pointers(&envp));
    // SAFETY: `path` is a C string and `argv_p` and `envp_p` null-terminated arrays of pointers
    // into `argv` and `envp`, C strings that live until the call returns; execve only reads them.
    unsafe { libc::execve(path.as_ptr(), argv_p.as_ptr(), envp_p.as_ptr()) };
    std::io::Error::last_os_error()
}
