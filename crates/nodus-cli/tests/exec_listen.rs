//! `nodus __exec-listen`: LISTEN_PID is the program's own pid (set only with LISTEN_FDS), passed
//! fds survive the step, and a program that cannot run is exit code 127 or 126 with a message
//! (an ELF file the kernel refuses too: never run by `/bin/sh`).

mod common;

use std::process::Command;
use std::time::Duration;

use common::NODUS;
use nodus_testkit::tmp::TempDir;

fn run(cmd: &mut Command) -> (Option<i32>, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn listen_pid_is_the_programs_own_pid() {
    let (code, out, err) = run(Command::new(NODUS)
        .args(["__exec-listen", "sh", "-c", "echo $$ $LISTEN_PID"])
        .env("LISTEN_FDS", "1")
        .env_remove("LISTEN_PID"));
    assert_eq!(code, Some(0), "{err}");
    let pids: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(pids.len(), 2, "{out}");
    assert_eq!(pids[0], pids[1]);
}

#[test]
fn without_listen_fds_listen_pid_is_left_alone() {
    let (code, out, err) = run(Command::new(NODUS)
        .args([
            "__exec-listen",
            "sh",
            "-c",
            "echo \"[${LISTEN_PID-unset}]\" \"$@\"",
            "sh",
            "--flag",
            "-x",
        ])
        .env_remove("LISTEN_FDS")
        .env_remove("LISTEN_PID"));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "[unset] --flag -x\n");
}

#[test]
fn a_missing_program_is_127_and_a_non_executable_one_126() {
    let (code, _, err) = run(Command::new(NODUS).args(["__exec-listen", "nodus-no-such-program"]));
    assert_eq!(code, Some(127));
    assert!(
        err.starts_with("nodus: cannot run 'nodus-no-such-program': "),
        "{err}"
    );

    let dir = TempDir::new("not-executable");
    let file = dir.path().join("not-executable");
    std::fs::write(&file, "echo hi\n").unwrap();
    let (code, _, err) = run(Command::new(NODUS).arg("__exec-listen").arg(&file));
    assert_eq!(code, Some(126));
    assert!(err.starts_with("nodus: cannot run "), "{err}");

    // A control character in the name is escaped (Node's quoting, as `nodus run` says it).
    let (code, _, err) = run(Command::new(NODUS).args(["__exec-listen", "no\nsuch"]));
    assert_eq!(code, Some(127));
    assert!(err.starts_with("nodus: cannot run 'no\\nsuch': "), "{err}");
}

/// An ELF file the kernel refuses to execute (`ENOEXEC`; a corrupt header, refused whatever
/// binfmt_misc holds), by its path or found in `PATH`, is an exec failure (126, one line saying
/// what the file is), not a script for `/bin/sh` (whose exec of it writes its own errors and
/// exits 127 or 2). A file with no `#!` line still runs with `/bin/sh`.
#[test]
fn an_elf_file_the_kernel_refuses_is_an_exec_failure_not_a_shell_script() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("exec-listen-enoexec");
    let elf = dir.path().join("corrupt-elf");
    let script = dir.path().join("no-shebang");
    std::fs::write(&elf, b"\x7fELF\n").unwrap();
    std::fs::write(&script, "echo ran by sh\n").unwrap();
    for file in [&elf, &script] {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!("{}:/usr/bin:/bin", dir.path().display());
    for (program, named) in [
        (elf.to_str().unwrap(), elf.to_str().unwrap()),
        ("corrupt-elf", "corrupt-elf"),
    ] {
        let (code, out, err) = run(Command::new(NODUS)
            .args(["__exec-listen", program])
            .env("PATH", &path));
        assert_eq!(code, Some(126), "{program}: {out}{err}");
        assert_eq!(
            err,
            format!(
                "nodus: cannot run '{named}': Exec format error (os error 8): an ELF file of no \
                 valid class (32 or 64-bit): corrupt\n"
            )
        );
        assert_eq!(out, "");
    }
    let (code, out, err) = run(Command::new(NODUS).arg("__exec-listen").arg(&script));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out, "ran by sh\n");
}

#[test]
fn a_passed_listener_reaches_the_program_at_fd_3() {
    let rt = nodus::Runtime::new();
    rt.block_on(async {
        nodus::timeout(Duration::from_secs(30), async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let inode = rustix::fs::fstat(&listener).unwrap().st_ino;
            let child = nodus::process::Command::new(NODUS)
                .args([
                    "__exec-listen",
                    "sh",
                    "-c",
                    "echo $$ $LISTEN_PID $(readlink /proc/$$/fd/3)",
                ])
                .env("LISTEN_FDS", "1")
                .pass_fd(3, std::os::fd::OwnedFd::from(listener))
                .spawn()
                .unwrap();
            let mut out = Vec::new();
            child
                .stdout
                .as_ref()
                .unwrap()
                .read_to_end(&mut out)
                .await
                .unwrap();
            assert!(child.wait().await.unwrap().success());
            let out = String::from_utf8(out).unwrap();
            let pid = child.id().to_string();
            assert_eq!(out, format!("{pid} {pid} socket:[{inode}]\n"));
        })
        .await
        .expect("test timed out")
    });
}
