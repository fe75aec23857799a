//! `nodus run`: supervise any program as a cluster, with the same rules as `nodus serve
//! --workers N` (restart budget, backoff, SIGHUP rolling reload, SIGTERM/SIGINT drain).
//!
//! Two kinds of workers:
//! - A plain program (the default): the listeners of `-l` (and the ones systemd passed to nodus,
//!   refused under reuseport: `listen::reuseport_refused`) reach it the systemd way, fds 3.. with `LISTEN_FDS`/`LISTEN_FDNAMES`; `LISTEN_PID` is set by
//!   the `__exec-listen` step, which runs in the worker's own process and then executes the
//!   program. It is ready once it has stayed up `--ready-after` (1 s), whatever it sends, or
//!   at its `READY=1` on its `NOTIFY_SOCKET` if that comes first; with `--wait-ready`, at its
//!   `READY=1` only. `STOPPING=1` is its "going down" notice. It is stopped with
//!   `--kill-signal` (SIGTERM by default; SIGINT for an app written for PM2).
//! - `--node`: stock Node programs, with nodus as their cluster primary over `NODE_CLUSTER`
//!   (`cluster.isWorker` is true in them): `server.listen(...)` gets its socket or its
//!   connections from nodus. Each gets a `NOTIFY_SOCKET` of its own too, never nodus's own (a
//!   Node app's `sd-notify` talks to nodus, not to systemd): `READY=1` there makes it ready,
//!   `STOPPING=1` is its "going down" notice, and so is its closing the last listener it holds
//!   unasked (`cluster.worker.disconnect()` or `server.close()` in the worker). Ready at their first `listening` (or, with
//!   `--ready-after`, once up that long without one: a worker that never listens), or with
//!   `--wait-ready` only at its word: PM2's `process.send('ready')` (the string `'ready'` on the
//!   channel) or `READY=1`; stopped with a `disconnect` (then `--kill-signal` past its drain
//!   deadline, or once it holds no inbound connection).
//!   `-l` passes nothing to them: it binds ADDR before they start, and a worker's `listen` on its
//!   port on an address ADDR covers (any host, ADDR's, or with ADDR a wildcard its family's)
//!   gets that socket; port 0 names no port and is refused (usage), and the primary warns about
//!   a `-l` socket no worker asked for and a `listen` on its port it does not cover. A `node`
//!   command with no script (`node -e CODE` alone) is refused (usage): Node makes a process a
//!   cluster worker only when `process.argv[1]` is set ([`no_argv1`]). So is a launcher that is a
//!   Node program itself ([`launcher`]: npm, npx, yarn, pnpm, corepack, by file name or a
//!   symlink's target; or given as `node`'s script, [`node_launcher`]: `node
//!   .../npm-cli.js start`): it would take the cluster channel, and the app it starts would
//!   bind its port itself; the usage error says what to run instead, quoting package.json's
//!   script when it is a plain `node FILE` ([`launcher_refused`]). A `listen` with no host
//!   is bound `::` dual-stack (`0.0.0.0` without IPv6), as Node binds it. The primary logs the
//!   first application message of the run (`process.send()`: nodus runs no JavaScript, so none
//!   is handled) and warns about a worker that has not listened within `--ready-timeout`
//!   (without `--ready-after` it is not ready until it does).
//! - With `--wait-ready`, a worker (of either kind) that has not said it is ready within
//!   `--ready-timeout` is warned about, once: it is not ready until it does.
//!
//! The program is checked before any worker starts (`check_runnable`: found as `execvp` finds
//! it, executable, and so is a script's `#!` interpreter, or `env`'s command), so the usual
//! mistakes are one line and exit code 1. The start line names the restart budget, what was
//! bound (port 0 resolved) and the admin address. The budget's default grows with the workers
//! ([`Config::new`]); a `--max-restarts` below the worker count is a warning at the start (one
//! event that restarts every worker once would give up).
//!
//! `--raw-output` writes the workers' lines without their `[worker ID PID] ` prefix
//! ([`Config::raw_output`]). Signals are the primary's ([`Primary::run`]: SIGTERM/SIGINT stop,
//! SIGHUP reloads, SIGUSR1/SIGUSR2 are one line each and change nothing).
//!
//! With `--admin ADDR`, the primary serves the cluster's `/_nodus/` endpoints there, as `nodus
//! serve --workers N --admin` does (a plain program's workers send no snapshots: the cluster's
//! own figures, per worker pid, restarts, budget, generation).

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nodus::cluster::{
    Backoff, Config, Policy, Primary, Readiness, RestartPolicy, RestartType, WorkerCommand,
};
use nodus::fs::quote;
use nodus::net::TcpListener;

/// What `nodus run` was asked to do (parsed and checked by the command line).
#[derive(Debug)]
pub struct RunOptions {
    pub workers: usize,
    pub listen: Vec<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub policy: Option<Policy>,
    /// `--max-restarts`; when not given, [`Config::new`]'s default (5 or twice the workers).
    pub max_restarts: Option<u32>,
    pub restart_window: Duration,
    pub min_uptime: Duration,
    pub backoff: Backoff,
    pub kill_timeout: Duration,
    /// `--kill-signal`: the signal that stops a worker ([`Config::kill_signal`]).
    pub kill_signal: i32,
    pub ready_timeout: Duration,
    /// `--ready-after`: for a plain program 1 s when not given; under `--node`, none.
    pub ready_after: Option<Duration>,
    /// `--wait-ready`: ready only when the worker says so (clap refuses it with `--ready-after`).
    pub wait_ready: bool,
    pub restart: RestartType,
    pub node: bool,
    pub events: Option<PathBuf>,
    /// `--raw-output`: the workers' lines without their prefix ([`Config::raw_output`]).
    pub raw_output: bool,
    /// `--defer-accept`: [`Config::defer_accept`].
    pub defer_accept: bool,
    pub command: Vec<OsString>,
}

/// A usage error (exit code 2, as for a flag clap refuses).
fn usage(message: impl std::fmt::Display) -> i32 {
    say!("nodus run: {message}");
    2
}

/// A failure to start (a listener cannot be bound, no worker can start): exit code 1.
fn fail(message: impl std::fmt::Display) -> i32 {
    say!("nodus run: {message}");
    1
}

/// Whether `program` can be run as the workers' `execvp` will look for it: a name with a slash
/// must be an executable file, a bare name one in a `PATH` directory; a script's `#!`
/// interpreter must be one too (and the command `#!/usr/bin/env NAME` runs, NAME, in `PATH`).
/// Checked once at the start, so a mistyped program is one clear line and exit code 1, not a
/// restart budget spent on exit code 127. (A program that disappears later fails its workers,
/// and a reload, as any crash.)
fn check_runnable(program: &OsStr) -> Result<(), String> {
    check_interpreter(&find_in_path(program)?, 0)
}

/// The file `execvp` runs for `name`: `name` itself when it has a slash, else the first
/// executable file of that name in a `PATH` directory.
pub fn find_in_path(name: &OsStr) -> Result<PathBuf, String> {
    if name.as_encoded_bytes().contains(&b'/') {
        executable_file(Path::new(name))?;
        return Ok(PathBuf::from(name));
    }
    // glibc's execvp searches "/bin:/usr/bin" when PATH is unset.
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| executable_file(candidate).is_ok())
        .ok_or_else(|| "not found in PATH".into())
}

fn executable_file(path: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(path).map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a file".into());
    }
    rustix::fs::access(path, rustix::fs::Access::EXEC_OK)
        .map_err(|e| std::io::Error::from(e).to_string())
}

/// The kernel reads this much of a file for its `#!` line (`BINPRM_BUF_SIZE`), and follows at
/// most this many interpreters that are scripts themselves.
const SHEBANG_MAX: usize = 256;
const SHEBANG_DEPTH: usize = 4;

/// If `file` is a script, whether its `#!` interpreter can run, as the kernel reads the line:
/// the interpreter is the first word (a path, absolute or from the working directory), the rest
/// of the line one argument. For `env`, that argument (or the first word after `-S`) is the
/// command it looks for in `PATH`. An ELF file must be one the kernel executes
/// ([`check_elf`]). An unreadable file, or one that is neither (a shell script with no `#!`
/// line, which `execvp` runs with `/bin/sh`, as Node's `child_process` does), is left to `exec`.
fn check_interpreter(file: &Path, depth: usize) -> Result<(), String> {
    // Zeros past what the file holds, as in the kernel's buffer (`binfmt_misc` matches on it).
    let mut head = [0u8; SHEBANG_MAX];
    let n = match std::fs::File::open(file).and_then(|mut f| {
        use std::io::Read;
        f.read(&mut head)
    }) {
        Ok(n) => n,
        Err(_) => return Ok(()),
    };
    if head.starts_with(ELF_MAGIC) {
        return check_elf(file, &head, n);
    }
    let Some(line) = head[..n].strip_prefix(b"#!") else {
        return Ok(());
    };
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    // Blanks trimmed at both ends, as the kernel does (a `\r` stays: a CRLF script's
    // interpreter is `/bin/sh\r`).
    let line = line.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = &line[..line.len() - line.iter().rev().take_while(|b| blank(b)).count()];
    let line = &line[line.iter().take_while(|b| blank(b)).count()..];
    let end = line.iter().position(blank).unwrap_or(line.len());
    let (interpreter, rest) = line.split_at(end);
    if interpreter.is_empty() {
        // ENOEXEC: execvp runs the file with /bin/sh.
        return Ok(());
    }
    let interpreter = Path::new(OsStr::from_bytes(interpreter));
    let argument = &rest[rest.iter().take_while(|b| blank(b)).count()..];
    let named = quote(interpreter);
    match executable_file(interpreter) {
        Err(_) if !interpreter.exists() => {
            return Err(format!("its interpreter {named} (#! line) does not exist"));
        }
        Err(why) => return Err(format!("its interpreter {named} (#! line): {why}")),
        Ok(()) => {}
    }
    if depth + 1 < SHEBANG_DEPTH {
        check_interpreter(interpreter, depth + 1)
            .map_err(|why| format!("its interpreter {named} (#! line) cannot run: {why}"))?;
    }
    if interpreter.file_name() == Some(OsStr::new("env")) {
        check_env_command(interpreter, argument)?;
    }
    Ok(())
}

const ELF_MAGIC: &[u8] = b"\x7fELF";

/// An ELF file whose `exec` would fail with `ENOEXEC` (bash's "cannot execute binary file: Exec
/// format error", systemd's 203/EXEC) is refused here, before a worker's exec fails on it.
/// `head` is its first bytes (`len` read, zeros after). The decision is [`elf_refusal`]'s, with
/// what `/proc/sys/fs/binfmt_misc` shows: not mounted (most containers), another architecture's
/// program is left to the exec, since an emulator the host registered may run it; if none does,
/// the worker's exec fails (`ENOEXEC`: the launcher and the cluster execute an ELF program with
/// `execve` alone, never with `/bin/sh`), and the primary exits with one line
/// ([`why_exec_refused`] says what the file is).
fn check_elf(file: &Path, head: &[u8; SHEBANG_MAX], len: usize) -> Result<(), String> {
    match judge_elf(file, head, len, &read_binfmt_misc()) {
        Some(why) => Err(format!("Exec format error: {why}")),
        None => Ok(()),
    }
}

/// After an exec of `file` failed with `ENOEXEC` (no `binfmt_misc` entry took it, mounted here
/// or not): what makes it a file the kernel does not run, if it is an ELF file whose header says
/// (another architecture, an object file, ...).
pub fn why_exec_refused(file: &Path) -> Option<String> {
    let mut head = [0u8; SHEBANG_MAX];
    let n = std::fs::File::open(file)
        .and_then(|mut f| {
            use std::io::Read;
            f.read(&mut head)
        })
        .ok()?;
    if !head.starts_with(ELF_MAGIC) {
        return None;
    }
    judge_elf(file, &head, n, &Binfmt::Enabled(Vec::new()))
}

/// [`elf_refusal`] on this machine's kernel: uname(2)'s machine, not nodus's own binary's (a
/// 32-bit nodus may run on a 64-bit kernel), and its personality.
fn judge_elf(file: &Path, head: &[u8], len: usize, binfmt: &Binfmt) -> Option<String> {
    let uname = rustix::system::uname();
    let machine = uname.machine().to_string_lossy();
    // `/proc/self/personality`: hex. Unreadable, it may be `linux32` (the wider judgement).
    let linux32 = std::fs::read_to_string("/proc/self/personality")
        .ok()
        .and_then(|p| u32::from_str_radix(p.trim(), 16).ok())
        .is_none_or(|p| p & PER_MASK == PER_LINUX32);
    let kernel = Kernel {
        machine: &machine,
        linux32,
        order: if cfg!(target_endian = "big") { 2 } else { 1 },
    };
    elf_refusal(file, head, len, &kernel, binfmt)
}

/// personality(2)'s persona bits, and the `linux32` persona (`setarch linux32`; Docker sets it
/// for a 32-bit platform's container).
const PER_MASK: u32 = 0xff;
const PER_LINUX32: u32 = 0x0008;

/// The kernel as far as running an ELF file goes.
struct Kernel<'a> {
    /// uname(2)'s `machine`: `x86_64`, `aarch64`, `armv7l`, ...
    machine: &'a str,
    /// Whether this process runs under the `linux32` personality, under which a 64-bit kernel
    /// names its 32-bit compat machine (`i686` on x86-64, `armv8l` on AArch64, `ppc`, `s390`,
    /// ...).
    linux32: bool,
    /// Its byte order, ELF's `EI_DATA` (1: little-endian, 2: big): nodus's own, as the kernel
    /// runs programs of its own byte order only.
    order: u8,
}

/// What `/proc/sys/fs/binfmt_misc` shows ([`read_binfmt_misc`]).
enum Binfmt {
    /// Not mounted or not readable: unknown. In a container it is usually not mounted, yet the
    /// host's entries (qemu-user's, with the `F` flag) still run foreign programs.
    Unknown,
    /// `status` says `disabled`: the kernel uses no entry.
    Disabled,
    /// Enabled, with the text of each entry.
    Enabled(Vec<String>),
}

/// Reads `/proc/sys/fs/binfmt_misc`: its `status`, and every entry's text (any of them
/// unreadable: [`Binfmt::Unknown`]).
fn read_binfmt_misc() -> Binfmt {
    let dir = Path::new("/proc/sys/fs/binfmt_misc");
    match std::fs::read_to_string(dir.join("status"))
        .as_deref()
        .map(str::trim)
    {
        Ok("enabled") => {}
        Ok("disabled") => return Binfmt::Disabled,
        _ => return Binfmt::Unknown,
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Binfmt::Unknown;
    };
    let mut texts = Vec::new();
    for entry in entries {
        let Ok(entry) = entry else {
            return Binfmt::Unknown;
        };
        let name = entry.file_name();
        if name == "status" || name == "register" {
            continue;
        }
        match std::fs::read_to_string(entry.path()) {
            Ok(text) => texts.push(text),
            Err(_) => return Binfmt::Unknown,
        }
    }
    Binfmt::Enabled(texts)
}

/// ELF's `e_machine` numbers nodus names (the others are said by number).
const MACHINES: &[(u16, &str)] = &[
    (2, "SPARC"),
    (3, "x86 (i386)"),
    (8, "MIPS"),
    (18, "SPARC32+"),
    (20, "PowerPC"),
    (21, "PowerPC64"),
    (22, "S/390"),
    (40, "ARM"),
    (42, "SuperH"),
    (43, "SPARC V9"),
    (50, "IA-64"),
    (62, "x86-64"),
    (183, "AArch64"),
    (243, "RISC-V"),
    (258, "LoongArch"),
];

/// The ELF classes and machines (`(class, e_machine)`; class 1: 32-bit, 2: 64-bit) a kernel
/// whose uname(2) `machine` is `machine` runs: its own and its compat modes' (i386 and x32 on
/// x86-64, 32-bit ARM on AArch64, ...). Under `linux32`, a 32-bit name may be a 64-bit kernel's
/// compat one: its family's 64-bit programs are taken too. Generous: a kernel built without a
/// compat mode (or a CPU without AArch32) is left to `exec`. `None`: a machine not known here,
/// not judged.
fn kernel_machines(machine: &str, linux32: bool) -> Option<&'static [(u8, u16)]> {
    const X86_64: &[(u8, u16)] = &[(2, 62), (1, 3), (1, 62)];
    const AARCH64: &[(u8, u16)] = &[(2, 183), (1, 40)];
    const PPC64: &[(u8, u16)] = &[(2, 21), (1, 20)];
    const S390X: &[(u8, u16)] = &[(2, 22), (1, 22)];
    const SPARC64: &[(u8, u16)] = &[(2, 43), (1, 2), (1, 18)];
    const MIPS64: &[(u8, u16)] = &[(2, 8), (1, 8)];
    const RISCV64: &[(u8, u16)] = &[(2, 243), (1, 243)];
    let narrow = |wide: &'static [(u8, u16)], own: &'static [(u8, u16)]| {
        Some(if linux32 { wide } else { own })
    };
    match machine {
        "x86_64" => Some(X86_64),
        "i386" | "i486" | "i586" | "i686" => narrow(X86_64, &[(1, 3)]),
        "aarch64" | "aarch64_be" | "arm64" => Some(AARCH64),
        m if m.starts_with("arm") => narrow(AARCH64, &[(1, 40)]),
        "ppc64" | "ppc64le" => Some(PPC64),
        "ppc" | "ppcle" => narrow(PPC64, &[(1, 20)]),
        "s390x" => Some(S390X),
        "s390" => narrow(S390X, &[(1, 22)]),
        "sparc64" => Some(SPARC64),
        "sparc" => narrow(SPARC64, &[(1, 2), (1, 18)]),
        "mips64" => Some(MIPS64),
        "mips" => narrow(MIPS64, &[(1, 8)]),
        "riscv64" => Some(RISCV64),
        "riscv32" | "riscv" => narrow(RISCV64, &[(1, 243)]),
        "loongarch64" => Some(&[(2, 258)]),
        _ => None,
    }
}

/// Why the kernel cannot execute the ELF file `file`, or `None`: a pure function of what was
/// read of it (`head`, magic included: `len` bytes read, zeros after), the kernel and
/// `binfmt_misc`. A file an enabled `binfmt_misc` entry takes is the entry's (the kernel tries
/// those first). Otherwise it must be a whole ELF header of an executable (or a shared object:
/// PIE programs are): a corrupt or truncated file, an object file or a core dump is refused.
/// One for another architecture or byte order ([`kernel_machines`]) is refused only when
/// `binfmt_misc` is known to have no entry that takes it (enabled and none matches, or
/// disabled): an unknown one may (errs towards running).
fn elf_refusal(
    file: &Path,
    head: &[u8],
    len: usize,
    kernel: &Kernel<'_>,
    binfmt: &Binfmt,
) -> Option<String> {
    if let Binfmt::Enabled(entries) = binfmt
        && entries
            .iter()
            .any(|text| binfmt_entry_takes(text, file, head))
    {
        return None;
    }
    let head = &head[..len.min(head.len())];
    let (class, header) = match head.get(4) {
        Some(1) => (1, 52),
        Some(2) => (2, 64),
        _ => return Some("an ELF file of no valid class (32 or 64-bit): corrupt".into()),
    };
    if head.len() < header {
        return Some(format!(
            "a truncated ELF file ({} bytes, less than its {header}-byte header)",
            head.len()
        ));
    }
    let order = match head[5] {
        o @ (1 | 2) => o,
        _ => return Some("an ELF file of no valid byte order: corrupt".into()),
    };
    let half = |at: usize| {
        let pair = [head[at], head[at + 1]];
        match order {
            2 => u16::from_be_bytes(pair),
            _ => u16::from_le_bytes(pair),
        }
    };
    match half(16) {
        2 | 3 => {}
        1 => return Some("an ELF relocatable object (a .o file), not a program".into()),
        4 => return Some("an ELF core dump, not a program".into()),
        other => return Some(format!("an ELF file of type {other}, not a program")),
    }
    if matches!(binfmt, Binfmt::Unknown) {
        return None;
    }
    let machine = half(18);
    let runs = order == kernel.order
        && kernel_machines(kernel.machine, kernel.linux32)
            .is_none_or(|runs| runs.contains(&(class, machine)));
    if runs {
        return None;
    }
    let name = MACHINES
        .iter()
        .find(|&&(m, _)| m == machine)
        .map_or_else(|| format!("machine {machine}"), |&(_, n)| n.to_owned());
    let bits = if class == 1 { 32 } else { 64 };
    let endian = if order == 2 { "big" } else { "little" };
    let kernel_endian = if kernel.order == 2 { "big" } else { "little" };
    Some(format!(
        "an ELF program for {name} ({bits}-bit, {endian}-endian), which this machine's kernel \
         ({}, {kernel_endian}-endian) does not run, and no binfmt_misc entry takes it",
        kernel.machine
    ))
}

/// Whether one `binfmt_misc` entry (its file's text: `enabled`, `offset N`, `magic HEX`, `mask
/// HEX`, or `extension .EXT`) takes `file`, whose first bytes are `head`, as the kernel matches.
fn binfmt_entry_takes(text: &str, file: &Path, head: &[u8]) -> bool {
    let mut lines = text.lines();
    if lines.next() != Some("enabled") {
        return false;
    }
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
    };
    if let Some(ext) = field("extension") {
        let ext = ext.strip_prefix('.').unwrap_or(ext);
        return file
            .extension()
            .is_some_and(|e| e.as_encoded_bytes() == ext.as_bytes());
    }
    let hex = |text: &str| -> Option<Vec<u8>> {
        (0..text.len() / 2)
            .map(|i| u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok())
            .collect()
    };
    let Some(magic) = field("magic").and_then(hex) else {
        return false;
    };
    let mask = field("mask").and_then(hex).unwrap_or_default();
    let offset: usize = field("offset").and_then(|o| o.parse().ok()).unwrap_or(0);
    magic.iter().enumerate().all(|(i, m)| {
        let byte = head.get(offset + i).copied().unwrap_or(0);
        (byte ^ m) & mask.get(i).copied().unwrap_or(0xff) == 0
    })
}

/// `#!/usr/bin/env ARGUMENT`: whether the command env is to run is found as env's `execvp`
/// finds it. The kernel passes the whole rest of the line as one argument, so without `-S` a
/// name with a space in it is looked for as it is. Other options or assignments are not judged.
fn check_env_command(env: &Path, argument: &[u8]) -> Result<(), String> {
    let (name, split) = match argument.strip_prefix(b"-S") {
        Some(words) => (
            words
                .split(|b| b.is_ascii_whitespace())
                .find(|w| !w.is_empty()),
            true,
        ),
        None => (Some(argument), false),
    };
    let Some(name) = name.filter(|n| !n.is_empty() && !n.starts_with(b"-") && !n.contains(&b'='))
    else {
        return Ok(());
    };
    let name = OsStr::from_bytes(name);
    find_in_path(name).map(drop).map_err(|why| {
        let named = quote(Path::new(name));
        let named = format!("its interpreter {named} (#!{} line)", env.display());
        if name.as_bytes().contains(&b'/') {
            format!("{named}: {why}")
        } else if !split && name.as_bytes().contains(&b' ') {
            format!(
                "{named} is {why} (env takes the rest of the #! line as one name; `env -S` \
                 splits it)"
            )
        } else {
            format!("{named} is {why}")
        }
    })
}

/// Whether `program` is Node by its name: `node` or `nodejs`, maybe with a version (`node20`).
fn is_node(program: &OsStr) -> bool {
    let Some(name) = Path::new(program).file_name() else {
        return false;
    };
    let name = name.as_bytes();
    name.strip_prefix(b"nodejs")
        .or_else(|| name.strip_prefix(b"node"))
        .is_some_and(|version| version.iter().all(|b| b.is_ascii_digit() || *b == b'.'))
}

/// The package managers and runners that are Node programs themselves: under `--node` the one
/// started takes the cluster channel (`NODE_CHANNEL_FD`, `NODE_UNIQUE_ID`) and becomes the
/// "worker", and the app it starts, with no channel, is no cluster worker and binds its port
/// itself ([`launcher`]).
const LAUNCHERS: &[&str] = &["npm", "npx", "yarn", "yarnpkg", "pnpm", "pnpx", "corepack"];

/// The launcher `program` is ([`LAUNCHERS`]), by its file name as given (`npm`,
/// `/usr/bin/npm`) or, the file `execvp` would run being a symlink, by its target's
/// (`/usr/bin/npm` → `npm-cli.js`, corepack's `yarn.js`): see [`launcher_named`].
fn launcher(program: &OsStr) -> Option<&'static str> {
    launcher_named(Path::new(program)).or_else(|| {
        let file = find_in_path(program).ok()?;
        launcher_named(&std::fs::canonicalize(file).ok()?)
    })
}

/// The launcher a file is by its name: the name without a `.js`, `.cjs` or `.mjs` extension,
/// then without a `-cli` or `-VERSION` suffix (`npm-cli.js`, `yarn-1.22.22.cjs`), one of
/// [`LAUNCHERS`].
fn launcher_named(path: &Path) -> Option<&'static str> {
    let name = path.file_name()?.to_str()?;
    let stem = [".js", ".cjs", ".mjs"]
        .iter()
        .find_map(|ext| name.strip_suffix(ext))
        .unwrap_or(name);
    let stem = match stem.split_once('-') {
        Some((base, "cli")) => base,
        Some((base, version)) if version.bytes().all(|b| b.is_ascii_digit() || b == b'.') => base,
        _ => stem,
    };
    LAUNCHERS.iter().copied().find(|&l| l == stem)
}

/// The launcher `node ARGS...` runs as its script ([`node_script`]:
/// `node /usr/lib/node_modules/npm/bin/npm-cli.js start`), by the script's file name as given
/// or, a symlink (Node resolves the script from the working directory, not `PATH`), by its
/// target's ([`launcher_named`]); with the launcher's own arguments, those after it.
fn node_launcher(args: &[OsString]) -> Option<(&'static str, &[OsString])> {
    let at = node_script(args)?;
    let script = Path::new(&args[at]);
    let name =
        launcher_named(script).or_else(|| launcher_named(&std::fs::canonicalize(script).ok()?))?;
    Some((name, &args[at + 1..]))
}

/// The usage error for `--node` with a launcher (`npm start`): what goes wrong, and what to run
/// instead, quoting package.json's script (in the working directory, the workers' too) when the
/// launcher's arguments name one (`start`, `run NAME`, `run-script NAME`; yarn's and pnpm's
/// `NAME`) and it is a plain `node FILE ...` command.
fn launcher_refused(name: &str, args: &[OsString]) -> String {
    let why = format!(
        "--node: {name} is a Node program itself: it would take the cluster channel and be the \
         worker, and the app it starts would be no cluster worker and bind its port itself \
         (EADDRINUSE with -w 2 or more, never ready with -w 1)"
    );
    let scripts = std::fs::read("package.json")
        .ok()
        .and_then(|text| serde_json::from_slice::<serde_json::Value>(&text).ok())
        .and_then(|doc| doc.get("scripts").cloned());
    let words: Vec<&str> = args
        .iter()
        .filter_map(|a| a.to_str())
        .filter(|a| !a.starts_with('-'))
        .collect();
    let script = match (name, words.as_slice()) {
        ("npx" | "pnpx" | "corepack", _) => None,
        (_, ["start", ..]) => Some("start"),
        (_, ["run" | "run-script", script, ..]) => Some(*script),
        ("yarn" | "yarnpkg" | "pnpm", [script, ..]) => Some(*script),
        _ => None,
    };
    let command = script.and_then(|script| {
        let text = scripts.as_ref()?.get(script)?.as_str()?;
        Some((script, text.to_owned()))
    });
    let instead = match command {
        Some((script, text)) if plain_node_command(&text) => format!(
            "run it with node directly: nodus run --node [OPTIONS] -- {text} (package.json's \
             scripts.{script})"
        ),
        Some((script, text)) => format!(
            "run the file it ends up running with node directly: nodus run --node [OPTIONS] -- \
             node FILE (package.json's scripts.{script} is `{text}`, not a plain `node FILE` \
             command)"
        ),
        None => "run the app's script with node directly: nodus run --node [OPTIONS] -- node \
                 FILE (for `npm start`, the file package.json's scripts.start runs)"
            .to_owned(),
    };
    format!("{why}; {instead}")
}

/// Whether a package.json script is `node FILE ...` with nothing a shell would read otherwise
/// (no variable, quote, operator, redirection or glob): then it runs the same as nodus's
/// workers' command.
fn plain_node_command(text: &str) -> bool {
    let words: Vec<OsString> = text.split_whitespace().map(OsString::from).collect();
    !text.contains(|c: char| "|&;<>()$`\\\"'*?{}[]~#".contains(c))
        && words.first().is_some_and(|w| is_node(w))
        && !no_argv1(&words[1..])
}

/// Node's options that take the next argument as their value (unless given as `--name=value`):
/// those sure to; an option missing here makes [`no_argv1`] take its value for the script, so it
/// errs towards answering false.
const NODE_VALUE_OPTIONS: &[&[u8]] = &[
    b"-e",
    b"-p",
    b"-pe",
    b"-r",
    b"-C",
    b"--eval",
    b"--print",
    b"--require",
    b"--import",
    b"--loader",
    b"--experimental-loader",
    b"--conditions",
    b"--input-type",
    b"--inspect-port",
    b"--debug-port",
    b"--env-file",
    b"--disable-warning",
    b"--unhandled-rejections",
    b"--dns-result-order",
    b"--title",
];

/// Node's options that make it run the code they give (`-e`, `-p`, also as `--eval=CODE`), so
/// that `process.argv[1]` is no script but the code's first argument.
const NODE_CODE_OPTIONS: &[&[u8]] = &[b"-e", b"-p", b"-pe", b"--eval", b"--print"];

/// Where `process.argv[1]` is in `args` (node's arguments), as Node reads its command line:
/// options up to the first other argument (or the one after `--`), which is `process.argv[1]`:
/// its index, if there is one; and whether an option gave code to run (`-e`, `-p`), making it
/// the code's first argument rather than the script.
fn node_argv1(args: &[OsString]) -> (Option<usize>, bool) {
    let mut code = false;
    let mut i = 0;
    while let Some(arg) = args.get(i).map(|a| a.as_bytes()) {
        if arg == b"--" {
            return (Some(i + 1).filter(|&at| at < args.len()), code);
        }
        code |= NODE_CODE_OPTIONS.contains(&arg)
            || arg.starts_with(b"--eval=")
            || arg.starts_with(b"--print=");
        if NODE_VALUE_OPTIONS.contains(&arg) {
            i += 1;
        } else if !arg.starts_with(b"-") || arg == b"-" {
            return (Some(i), code);
        }
        i += 1;
    }
    (None, code)
}

/// Whether Node, given `args`, leaves `process.argv[1]` unset or empty ([`node_argv1`]): the
/// script, or with `-e`/`-p` the code's first argument. Node sets a process with
/// `NODE_UNIQUE_ID` up as a cluster worker only when `process.argv[1]` is set (its
/// `initializeClusterIPC`); stock Node's `cluster.fork()` always passes a script path, even with
/// `-e` in `execArgv`.
fn no_argv1(args: &[OsString]) -> bool {
    node_argv1(args).0.is_none_or(|at| args[at].is_empty())
}

/// The index in `args` (node's arguments) of the script Node runs: `process.argv[1]`
/// ([`node_argv1`]) when no `-e`/`-p` code is given (`node --inspect app.js`, `node -r mod
/// app.js`; not `node -e CODE app.js`, where `app.js` is the code's argument).
fn node_script(args: &[OsString]) -> Option<usize> {
    match node_argv1(args) {
        (Some(at), false) if !args[at].is_empty() => Some(at),
        _ => None,
    }
}

/// Node's options that can make a main module that is no file resolve (a loader's hooks).
const NODE_HOOK_OPTIONS: &[&[u8]] = &[b"--loader", b"--experimental-loader", b"--import"];

/// The script of `node ARGS` ([`node_script`]) when no file Node would look for as its main
/// module exists, in the working directory the workers share with nodus: the script as given,
/// with each extension Node tries, or as a directory; `None` too for stdin (`-`) or with a
/// loader that could resolve it otherwise.
fn missing_node_script(args: &[OsString]) -> Option<&OsString> {
    let at = node_script(args)?;
    let hooked = args[..at].iter().any(|a| {
        let a = a.as_bytes();
        NODE_HOOK_OPTIONS
            .iter()
            .any(|o| a == *o || (a.starts_with(o) && a.get(o.len()) == Some(&b'=')))
    });
    let script = &args[at];
    if hooked || script.as_bytes() == b"-" {
        return None;
    }
    let found = ["", ".js", ".mjs", ".cjs", ".json", ".node"]
        .iter()
        .any(|ext| {
            let mut path = script.clone();
            path.push(ext);
            Path::new(&path).exists()
        });
    (!found).then_some(script)
}

/// Runs the supervisor until it stops; returns the exit code.
pub fn run(options: RunOptions) -> i32 {
    let policy = match (options.policy, options.node) {
        (Some(p @ (Policy::RoundRobin | Policy::Least)), false) => {
            return usage(format!(
                "--policy {} needs --node: a plain program cannot take connections handed over \
                 by nodus (use shared or reuseport)",
                p.name()
            ));
        }
        (Some(p), _) => p,
        (None, true) => Policy::RoundRobin,
        (None, false) => Policy::Shared,
    };
    let Some((program, args)) = options.command.split_first() else {
        return usage("no program to run: nodus run [OPTIONS] [--] PROGRAM [ARGS]...");
    };
    if program.is_empty() {
        return usage("the program's name is empty: nodus run [OPTIONS] [--] PROGRAM [ARGS]...");
    }
    let mut flagged: Vec<_> = options.listen.iter().map(|&a| ("-l", a)).collect();
    flagged.extend(options.admin.map(|a| ("--admin", a)));
    if let Some(clash) = crate::listen::first_clash(&flagged) {
        return usage(clash);
    }
    if options.node
        && let Some(any) = options.listen.iter().find(|a| a.port() == 0)
    {
        return usage(format!(
            "-l {any}: with --node, a worker's listen(PORT) takes the socket bound on PORT, and \
             port 0 is none (give -l the port the program listens on)"
        ));
    }
    if options.node && is_node(program) && no_argv1(args) {
        return usage(
            "--node: node with no script (-e or -p code alone) has no process.argv[1], and Node \
             sets a process up as a cluster worker only with one (its listen would go unanswered \
             and it would exit at once): put the code in a file, or give it an argument (node -e \
             CODE -- ARG)",
        );
    }
    if options.node {
        let refused = match launcher(program) {
            Some(name) => Some((name, args)),
            None if is_node(program) => node_launcher(args),
            None => None,
        };
        if let Some((name, args)) = refused {
            return usage(launcher_refused(name, args));
        }
    }
    let (program, args) = (program.clone(), args.to_vec());
    if let Err(why) = check_runnable(&program) {
        return fail(format!("cannot run {}: {why}", quote(Path::new(&program))));
    }
    if is_node(&program)
        && let Some(script) = missing_node_script(&args)
    {
        return fail(format!(
            "cannot run node's script {}: no such file, nor with .js, .mjs, .cjs, .json or \
             .node (Node would exit at once with MODULE_NOT_FOUND in every worker)",
            quote(Path::new(script))
        ));
    }
    nodus::process::raise_fd_limit();
    let rt = nodus::Runtime::new();
    rt.block_on(async move {
        let listeners = match bind_listeners(&options.listen, policy) {
            Ok(l) => l,
            Err(e) => return fail(e),
        };
        let admin_listener = match options.admin.map(crate::listen::bind_admin) {
            Some(Err(e)) => return fail(e),
            Some(Ok(l)) => Some(l),
            None => None,
        };
        // What was bound, port 0 resolved, for the start line.
        let bound = listening_line(&listeners, options.node);
        let admin_addr = admin_listener.as_ref().and_then(|l| l.local_addr().ok());
        let command = if options.node {
            WorkerCommand {
                program: PathBuf::from(&program),
                args,
                env: Vec::new(),
                ipc: true,
            }
        } else {
            let exe = match std::env::current_exe() {
                Ok(p) => p,
                Err(e) => return fail(format!("cannot find the nodus executable: {e}")),
            };
            let mut launcher_args: Vec<OsString> = vec!["__exec-listen".into()];
            launcher_args.extend(options.command.iter().cloned());
            WorkerCommand {
                program: exe,
                args: launcher_args,
                env: Vec::new(),
                ipc: false,
            }
        };
        let mut config = Config::new(options.workers, command);
        config.policy = policy;
        config.listeners = listeners;
        config.defer_accept = options.defer_accept;
        if let Some(r) = options.max_restarts {
            config.max_restarts = r;
            if (r as usize) < options.workers {
                tracing::warn!(
                    "--max-restarts {r} is below the worker count ({}): one event that restarts \
                     every worker once (a database restart, say) gives up (exit 75)",
                    options.workers
                );
            }
        }
        config.restart_window = options.restart_window;
        config.restart = RestartPolicy {
            restart: options.restart,
            backoff: options.backoff,
            min_uptime: options.min_uptime,
        };
        config.kill_timeout = options.kill_timeout;
        config.kill_signal = options.kill_signal;
        // The deadline a worker that drains itself is given (a nodus worker's `disconnect`): a
        // little inside the kill timeout, so it ends its drain before the SIGKILL, not with it.
        config.drain_timeout = options
            .kill_timeout
            .saturating_sub((options.kill_timeout / 10).min(Duration::from_secs(1)));
        config.ready_timeout = options.ready_timeout;
        config.readiness = match (options.wait_ready, options.node, options.ready_after) {
            (true, _, _) => Readiness::Message,
            (false, true, None) => Readiness::Listening,
            (false, true, Some(after)) => Readiness::ListeningOrAlive(after),
            (false, false, after) => Readiness::Alive(after.unwrap_or(Duration::from_secs(1))),
        };
        warn_if_never_ready_in_time(config.readiness, options.ready_timeout);
        config.event_log = options.events;
        config.raw_output = options.raw_output;
        // The primary is the init of what its workers leave behind (every child of this process
        // is a nodus::process one): adopted orphans are reaped, and stopped with the cluster.
        config.subreaper = true;
        let budget = format!(
            "at most {} restart{} within {:?}",
            config.max_restarts,
            if config.max_restarts == 1 { "" } else { "s" },
            config.restart_window
        );
        let primary = match Primary::start(config) {
            Ok(p) => p,
            Err(e) => return fail(start_failure(e, &program)),
        };
        // A stop takes the kill timeout for the workers, another for the processes they left
        // behind (the subreaper's), then its exit: the exit's flush of queued output takes what
        // is left of that.
        let stop_bound = 2 * options.kill_timeout + crate::EXIT_MARGIN;
        primary.on_event(move |e| {
            if let nodus::cluster::EventKind::Shutdown { .. } = e.kind {
                crate::stop_began(stop_bound);
            }
        });
        let admin = admin_listener.map(|l| crate::serve::admin::serve_primary(l, primary.clone()));
        tracing::info!(
            "supervising {} worker{} of {} (policy {}; {budget}){bound}{}",
            options.workers,
            if options.workers == 1 { "" } else { "s" },
            quote(Path::new(&program)),
            policy.name(),
            admin_addr.map_or_else(String::new, |a| format!(
                "; admin endpoints on http://{a}/_nodus/"
            ))
        );
        let code = primary.run().await;
        if let Some(server) = admin {
            server.drain(Duration::from_secs(1)).await;
        }
        code
    })
}

/// The line for a cluster that could not start (`e`). A `--node` worker runs the program itself,
/// an ELF one with `execve` alone: a kernel's refusal of it (`ENOEXEC`, binfmt_misc not mounted
/// here to judge it before) ends the spawn's message, and what the file's header says follows.
/// Warns at the start when a worker ready only by time (`--ready-after`, 1 s by default for a
/// plain program) cannot be ready within `--ready-timeout`: every reload would then fail, its new
/// workers never ready in time, unless they say READY=1 (or, with `--node`, listen) sooner.
fn warn_if_never_ready_in_time(readiness: Readiness, ready_timeout: Duration) {
    let (after, sooner) = match readiness {
        Readiness::Alive(after) => (after, "sends READY=1"),
        Readiness::ListeningOrAlive(after) => (after, "listens"),
        Readiness::Listening | Readiness::Message => return,
    };
    if after >= ready_timeout {
        tracing::warn!(
            "--ready-after {after:?} is not below --ready-timeout {ready_timeout:?}: a reload \
             fails unless each new worker {sooner} before the ready timeout"
        );
    }
}

fn start_failure(e: std::io::Error, program: &OsStr) -> String {
    let enoexec = std::io::Error::from_raw_os_error(libc::ENOEXEC).to_string();
    let why = e
        .to_string()
        .ends_with(&enoexec)
        .then(|| why_exec_refused(&find_in_path(program).ok()?))
        .flatten();
    match why {
        Some(why) => format!("{e}: {why}"),
        None => e.to_string(),
    }
}

/// The start line's account of the listeners (empty without any): each bound address (port 0
/// resolved) with the fd and name a plain program gets it as, or, under `--node`, the port a
/// worker's `listen` takes it with.
fn listening_line(listeners: &[(String, TcpListener)], node: bool) -> String {
    let each: Vec<String> = listeners
        .iter()
        .enumerate()
        .map(|(i, (name, l))| match l.local_addr() {
            Ok(a) if node => format!("{a} (for a worker's listen on port {})", a.port()),
            Ok(a) => format!("{a} (fd {}, {name})", 3 + i),
            Err(e) => format!("{name} (its address: {e})"),
        })
        .collect();
    if each.is_empty() {
        String::new()
    } else {
        format!("; listening on {}", each.join(", "))
    }
}

/// The sockets a service manager passed to nodus (`LISTEN_FDS`; refused under reuseport), and
/// the `-l` listeners.
fn bind_listeners(
    addrs: &[SocketAddr],
    policy: Policy,
) -> Result<Vec<(String, TcpListener)>, String> {
    let inherited =
        nodus::net::listen_fds().map_err(|e| format!("cannot use the inherited sockets: {e}"))?;
    let mut out = Vec::new();
    for socket in inherited {
        match socket {
            nodus::net::Inherited::Tcp(_, l) if policy == Policy::ReusePort => {
                return Err(crate::listen::reuseport_refused(&l));
            }
            nodus::net::Inherited::Tcp(name, l) => out.push((name, l)),
            other => {
                return Err(format!(
                    "cannot pass on the inherited socket {other}: only TCP listeners are supported"
                ));
            }
        }
    }
    for (i, addr) in addrs.iter().enumerate() {
        let l = crate::listen::bind(*addr, policy == Policy::ReusePort)?;
        out.push((format!("listen{i}"), l));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::ffi::{OsStr, OsString};

    use std::path::Path;

    use super::{
        Binfmt, Kernel, binfmt_entry_takes, elf_refusal, is_node, launcher, missing_node_script,
        no_argv1, node_launcher, node_script, plain_node_command,
    };

    /// The start of an ELF header: class, byte order, version 1, type and machine set, the
    /// rest zeros.
    fn elf(class: u8, order: u8, kind: u16, machine: u16) -> Vec<u8> {
        let mut head = vec![0u8; 64];
        head[..4].copy_from_slice(b"\x7fELF");
        head[4] = class;
        head[5] = order;
        head[6] = 1;
        let half = |v: u16| match order {
            2 => v.to_be_bytes(),
            _ => v.to_le_bytes(),
        };
        head[16..18].copy_from_slice(&half(kind));
        head[18..20].copy_from_slice(&half(machine));
        head
    }

    /// `elf_refusal` for `head` (all of it read) on `kernel` with `binfmt`.
    fn refusal(head: &[u8], kernel: (&str, bool), binfmt: &Binfmt) -> Option<String> {
        let (machine, linux32) = kernel;
        let kernel = Kernel {
            machine,
            linux32,
            order: 1,
        };
        elf_refusal(Path::new("app"), head, head.len(), &kernel, binfmt)
    }

    /// `binfmt_misc` mounted and enabled, with no entry.
    fn no_entry() -> Binfmt {
        Binfmt::Enabled(Vec::new())
    }

    #[test]
    fn an_elf_file_the_kernel_cannot_execute_is_refused_and_one_it_can_is_not() {
        for runs in [
            elf(2, 1, 2, 62),
            elf(2, 1, 3, 62),
            elf(1, 1, 2, 3),
            elf(1, 1, 3, 62),
        ] {
            assert_eq!(refusal(&runs, ("x86_64", false), &no_entry()), None);
        }
        assert_eq!(
            refusal(&elf(1, 1, 2, 40), ("aarch64", false), &no_entry()),
            None
        );
        // A machine not known here is not judged.
        assert_eq!(
            refusal(&elf(2, 1, 2, 40), ("m68k", false), &no_entry()),
            None
        );
        for (head, kernel, why) in [
            (
                elf(2, 1, 3, 40),
                "x86_64",
                "an ELF program for ARM (64-bit, little-endian), which this machine's kernel \
                 (x86_64, little-endian) does not run, and no binfmt_misc entry takes it",
            ),
            (
                elf(1, 1, 2, 40),
                "x86_64",
                "for ARM (32-bit, little-endian)",
            ),
            (
                elf(2, 2, 2, 62),
                "x86_64",
                "for x86-64 (64-bit, big-endian)",
            ),
            (elf(2, 1, 2, 4242), "x86_64", "for machine 4242 (64-bit"),
            // A 32-bit kernel (not under linux32, it names its own machine).
            (elf(2, 1, 2, 62), "i686", "for x86-64 (64-bit"),
            (elf(2, 1, 2, 183), "armv7l", "for AArch64 (64-bit"),
        ] {
            let refused = refusal(&head, (kernel, false), &no_entry());
            assert!(
                refused.as_ref().is_some_and(|r| r.contains(why)),
                "{refused:?}: {why}"
            );
            // With binfmt_misc disabled, no entry could take it either.
            assert!(refusal(&head, (kernel, false), &Binfmt::Disabled).is_some());
        }
    }

    #[test]
    fn a_64_bit_kernel_runs_its_64_bit_programs_for_a_32_bit_nodus() {
        // A 32-bit nodus (i386, armhf) on a 64-bit kernel: uname names the kernel's machine,
        // or under the linux32 personality (setarch, Docker's 32-bit platforms) its compat one.
        for (head, kernel) in [
            (elf(2, 1, 2, 62), ("x86_64", false)),
            (elf(2, 1, 3, 62), ("i686", true)),
            (elf(2, 1, 2, 183), ("aarch64", false)),
            (elf(2, 1, 3, 183), ("armv8l", true)),
            (elf(1, 1, 2, 40), ("armv8l", true)),
            (elf(1, 1, 2, 3), ("i686", true)),
        ] {
            assert_eq!(refusal(&head, kernel, &no_entry()), None, "{kernel:?}");
        }
    }

    #[test]
    fn another_architecture_is_refused_only_when_binfmt_misc_is_known_to_have_no_entry_for_it() {
        let aarch64 = elf(2, 1, 2, 183);
        // Not mounted (a container, where the host's qemu-user entries apply), unreadable.
        assert_eq!(refusal(&aarch64, ("x86_64", false), &Binfmt::Unknown), None);
        // An entry that takes it (qemu-user's, as update-binfmts registers it), or none.
        let qemu = "enabled\ninterpreter /usr/bin/qemu-aarch64-static\nflags: OCF\noffset 0\n\
                    magic 7f454c460201010000000000000000000200b700\n\
                    mask ffffffffffffff00fffffffffffffffffeffffff\n";
        let with_qemu = Binfmt::Enabled(vec![qemu.to_owned()]);
        assert_eq!(refusal(&aarch64, ("x86_64", false), &with_qemu), None);
        let arm = elf(1, 1, 2, 40);
        assert!(refusal(&arm, ("x86_64", false), &with_qemu).is_some());
        // Whatever binfmt_misc holds, a file no kernel runs is refused.
        for (head, why) in [
            (elf(2, 1, 1, 62), "relocatable object"),
            (elf(2, 1, 4, 183), "core dump"),
            (b"\x7fELFgarbage".to_vec(), "no valid class"),
            (
                elf(2, 1, 2, 62)[..40].to_vec(),
                "truncated ELF file (40 bytes",
            ),
            (elf(2, 7, 2, 62), "no valid byte order"),
        ] {
            for binfmt in [&Binfmt::Unknown, &with_qemu, &no_entry()] {
                let refused = refusal(&head, ("x86_64", false), binfmt);
                assert!(
                    refused.as_ref().is_some_and(|r| r.contains(why)),
                    "{refused:?}: {why}"
                );
            }
        }
    }

    #[test]
    fn a_binfmt_misc_entry_takes_a_file_by_its_masked_magic_or_its_extension() {
        // qemu-user's entry for AArch64 (as update-binfmts registers it).
        let qemu = "enabled\ninterpreter /usr/bin/qemu-aarch64-static\nflags: OCF\noffset 0\n\
                    magic 7f454c460201010000000000000000000200b700\n\
                    mask ffffffffffffff00fffffffffffffffffeffffff\n";
        let file = Path::new("app");
        assert!(binfmt_entry_takes(qemu, file, &elf(2, 1, 2, 183)));
        assert!(binfmt_entry_takes(qemu, file, &elf(2, 1, 3, 183)));
        assert!(!binfmt_entry_takes(qemu, file, &elf(2, 1, 2, 40)));
        assert!(!binfmt_entry_takes(qemu, file, &elf(1, 1, 2, 183)));
        let disabled = qemu.replacen("enabled", "disabled", 1);
        assert!(!binfmt_entry_takes(&disabled, file, &elf(2, 1, 2, 183)));
        let wine = "enabled\ninterpreter /usr/bin/wine\nflags: \nextension .exe\n";
        assert!(binfmt_entry_takes(wine, Path::new("dir/app.exe"), b""));
        assert!(!binfmt_entry_takes(wine, Path::new("app.sh"), b""));
    }

    #[test]
    fn node_is_known_by_its_name() {
        for name in [
            "node",
            "/usr/bin/node",
            "nodejs",
            "./node20",
            "/opt/nodejs18.19",
        ] {
            assert!(is_node(OsStr::new(name)), "{name}");
        }
        for name in [
            "nodemon",
            "node-dev",
            "/usr/bin/env",
            "sh",
            "/node/bin/python3",
        ] {
            assert!(!is_node(OsStr::new(name)), "{name}");
        }
    }

    #[test]
    fn node_launchers_are_known_by_their_file_names() {
        for (name, expected) in [
            ("npm", "npm"),
            ("/opt/node/bin/npx", "npx"),
            ("npm-cli.js", "npm"),
            ("./yarn.js", "yarn"),
            ("yarnpkg", "yarnpkg"),
            (".yarn/releases/yarn-1.22.22.cjs", "yarn"),
            ("pnpm.cjs", "pnpm"),
            ("pnpx", "pnpx"),
            ("corepack", "corepack"),
        ] {
            assert_eq!(launcher(OsStr::new(name)), Some(expected), "{name}");
        }
        for name in [
            "node",
            "nodemon",
            "npm-check",
            "yarn-dev",
            "sh",
            "/no/such/npmx",
        ] {
            assert_eq!(launcher(OsStr::new(name)), None, "{name}");
        }
    }

    #[test]
    fn a_plain_node_command_is_node_and_a_script_with_nothing_for_a_shell() {
        for plain in [
            "node server.js",
            "node server.js --port 3000",
            "nodejs -r dotenv/config dist/main.js",
            "node --max-old-space-size=4096 app.js",
        ] {
            assert!(plain_node_command(plain), "{plain}");
        }
        for not in [
            "node",
            "node -e 'x'",
            "NODE_ENV=production node app.js",
            "node app.js && echo done",
            "node $SCRIPT",
            "next start",
            "nodemon app.js",
            "node app.js > log",
        ] {
            assert!(!plain_node_command(not), "{not}");
        }
    }

    #[test]
    fn process_argv1_is_the_first_argument_after_the_options() {
        let args = |line: &[&str]| line.iter().map(OsString::from).collect::<Vec<_>>();
        for unset in [
            &[][..],
            &["-i"],
            &["-e", "X"],
            &["-p", "X"],
            &["-pe", "X"],
            &["--eval=X"],
            &["--eval", "X", "--"],
            &["-e", "X", "--", ""],
            &["-e", "X", ""],
            &[
                "-r",
                "fs",
                "-e",
                "X",
                "--import",
                "y",
                "--title",
                "t",
                "--no-warnings",
            ],
        ] {
            assert!(no_argv1(&args(unset)), "{unset:?}");
        }
        for set in [
            &["app.js"][..],
            &["-"],
            &["-e", "X", "w"],
            &["-e", "X", "--", "w"],
            &["-e", "X", "--", "--"],
            &["--no-warnings", "app.js", "-e", "X"],
            &["-r", "fs", "app.js"],
            // An option not known to take a value: its value counts as the script.
            &["-e", "X", "--some-new-option", "v"],
        ] {
            assert!(!no_argv1(&args(set)), "{set:?}");
        }
    }

    #[test]
    fn nodes_script_is_its_first_argument_after_the_options_unless_code_is_given() {
        let args = |line: &[&str]| line.iter().map(OsString::from).collect::<Vec<_>>();
        for (line, script) in [
            (&["app.js"][..], 0),
            (&["--inspect", "x.js"], 1),
            (&["--inspect=0", "x.js", "--port", "3"], 1),
            (&["-r", "mod", "x.js"], 2),
            (&["--require", "dotenv/config", "--no-warnings", "x.js"], 3),
            (&["--", "x.js"], 1),
            (&["--title", "t", "--", "--", "x"], 3),
        ] {
            assert_eq!(node_script(&args(line)), Some(script), "{line:?}");
        }
        for line in [
            &[][..],
            &["-e", "X", "x.js"],
            &["-p", "X", "--", "x.js"],
            &["--eval=X", "x.js"],
            &["--print", "X", "x.js"],
            &["-r", "x.js"],
            &["--", ""],
            &["--inspect"],
        ] {
            assert_eq!(node_script(&args(line)), None, "{line:?}");
        }
    }

    #[test]
    fn a_launcher_given_as_nodes_script_is_known_with_its_own_arguments() {
        let args = |line: &[&str]| line.iter().map(OsString::from).collect::<Vec<_>>();
        for (line, name, rest) in [
            (
                &["/usr/lib/node_modules/npm/bin/npm-cli.js", "start"][..],
                "npm",
                &["start"][..],
            ),
            (&["--inspect", "npx-cli.js", "serve"], "npx", &["serve"]),
            (&["-r", "mod", ".yarn/releases/yarn-4.1.0.cjs"], "yarn", &[]),
            (&["--", "pnpm.cjs", "run", "dev"], "pnpm", &["run", "dev"]),
            (
                &["/usr/bin/corepack", "yarn", "start"],
                "corepack",
                &["yarn", "start"],
            ),
        ] {
            let line = args(line);
            assert_eq!(
                node_launcher(&line),
                Some((name, &args(rest)[..])),
                "{line:?}"
            );
        }
        for line in [
            &["app.js", "npm-cli.js"][..],
            &["-e", "X", "npm-cli.js"],
            &["-r", "npm-cli.js", "app.js"],
            &["--eval=require('npm')", "npm"],
            &["npm-check.js"],
        ] {
            assert_eq!(node_launcher(&args(line)), None, "{line:?}");
        }
    }

    /// The main module Node would look for: the script as given, with an extension Node tries,
    /// or a directory; stdin, `-e` code and a loader's hooks are not looked at.
    #[test]
    fn a_missing_node_script_is_known_before_any_worker() {
        let dir = std::env::temp_dir().join(format!("nodus-node-script-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("pkg")).unwrap();
        std::fs::write(dir.join("app.js"), "").unwrap();
        let path = |name: &str| dir.join(name).into_os_string();
        let args = |line: &[OsString]| line.to_vec();
        for found in [
            args(&[path("app.js")]),
            args(&[path("app")]),
            args(&[path("pkg")]),
            args(&["--inspect".into(), path("app")]),
            args(&["-".into()]),
            args(&["-e".into(), "1".into(), "missing.js".into()]),
            args(&["--import=./hooks.mjs".into(), path("missing")]),
            args(&["--loader".into(), "./l.mjs".into(), path("missing")]),
        ] {
            assert_eq!(missing_node_script(&found), None, "{found:?}");
        }
        for missing in [
            args(&[path("missing.js")]),
            args(&["-r".into(), "mod".into(), path("apps")]),
            args(&["--".into(), path("nope")]),
        ] {
            assert_eq!(missing_node_script(&missing), missing.last(), "{missing:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
