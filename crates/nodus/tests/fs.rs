//! `nodus::fs` against real files: every operation, errors that name their path (escaped, as
//! Node's `util.inspect` shows a string), a path with a NUL byte refused before any pool job with
//! Node's `ERR_INVALID_ARG_VALUE` message, permission denied, partitioned reads, and the I/O pool
//! staying responsive while the CPU pool is saturated.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use nodus::fs::{self, File, OpenOptions, PathError};
use nodus::metrics::{prometheus, snapshot};
use nodus::{Runtime, offload_cpu, pool, spawn};
use nodus_testkit::tmp::TempDir;

fn path_error(e: &std::io::Error) -> &PathError {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<PathError>())
        .unwrap_or_else(|| panic!("not a PathError: {e:?}"))
}

#[test]
fn write_read_append_stat_rename_copy_remove() {
    let dir = TempDir::new("fs-basic");
    let rt = Runtime::new();
    rt.block_on(async {
        let a = dir.join("a.txt");
        fs::write(&a, "hello").await.unwrap();
        fs::append(&a, b", world").await.unwrap();
        assert_eq!(fs::read_to_string(&a).await.unwrap(), "hello, world");
        assert_eq!(fs::metadata(&a).await.unwrap().len(), 12);

        let link = dir.join("link");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        assert!(
            fs::symlink_metadata(&link)
                .await
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(fs::metadata(&link).await.unwrap().is_file());

        let sub = dir.join("x/y/z");
        fs::create_dir_all(&sub).await.unwrap();
        fs::create_dir(dir.join("x/w")).await.unwrap();
        let b = sub.join("b.txt");
        fs::rename(&a, &b).await.unwrap();
        assert!(fs::metadata(&a).await.is_err());

        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o640)).unwrap();
        let c = dir.join("c.txt");
        assert_eq!(fs::copy(&b, &c).await.unwrap(), 12);
        assert_eq!(fs::read(&c).await.unwrap(), b"hello, world");
        let mode = fs::metadata(&c).await.unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o640);

        let mut names: Vec<_> = fs::read_dir(dir.path())
            .await
            .unwrap()
            .into_iter()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.file_type().is_dir(),
                )
            })
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                ("c.txt".into(), false),
                ("link".into(), false),
                ("x".into(), true)
            ]
        );

        fs::remove_file(&c).await.unwrap();
        fs::remove_file(&link).await.unwrap();
        fs::remove_dir(dir.join("x/w")).await.unwrap();
        assert!(fs::remove_dir(dir.join("x")).await.is_err(), "not empty");
        fs::remove_dir_all(dir.join("x")).await.unwrap();
        assert!(fs::read_dir(dir.path()).await.unwrap().is_empty());
    });
}

#[test]
fn copying_a_file_onto_itself_leaves_it_as_node_does() {
    let dir = TempDir::new("fs-copy-self");
    let rt = Runtime::new();
    rt.block_on(async {
        let a = dir.join("a.txt");
        fs::write(&a, "keep me").await.unwrap();
        // The same path, a hard link and a symlink all name the same file: Node's copyFile
        // does nothing; truncating the destination would empty the source.
        let hard = dir.join("hard");
        std::fs::hard_link(&a, &hard).unwrap();
        let soft = dir.join("soft");
        std::os::unix::fs::symlink(&a, &soft).unwrap();
        for to in [&a, &hard, &soft] {
            assert_eq!(fs::copy(&a, to).await.unwrap(), 0, "{}", to.display());
            assert_eq!(fs::read(&a).await.unwrap(), b"keep me", "{}", to.display());
        }
        assert_eq!(fs::copy(&soft, &a).await.unwrap(), 0);
        assert_eq!(fs::read(&a).await.unwrap(), b"keep me");
    });
}

#[test]
fn a_failed_copy_leaves_no_destination_behind() {
    let dir = TempDir::new("fs-copy-fail");
    let rt = Runtime::new();
    rt.block_on(async {
        let src_dir = dir.join("d");
        std::fs::create_dir(&src_dir).unwrap();
        // A directory as the source: refused before the destination is created (Node removes
        // the empty file it made).
        let to = dir.join("new");
        let e = fs::copy(&src_dir, &to).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::IsADirectory, "{e}");
        assert_eq!(path_error(&e).op(), "copyfile");
        assert!(!to.exists(), "an empty destination was left behind");
        // ... and an existing destination is not truncated by it.
        let existing = dir.join("existing");
        std::fs::write(&existing, "old").unwrap();
        assert!(fs::copy(&src_dir, &existing).await.is_err());
        assert_eq!(std::fs::read(&existing).unwrap(), b"old");
        // A source that fails once it is read (`/proc/self/mem` at offset 0: EIO): the
        // destination, created and truncated by then, is removed, as libuv does.
        let e = fs::copy("/proc/self/mem", &to).await.unwrap_err();
        assert_eq!(path_error(&e).op(), "copyfile", "{e}");
        assert!(!to.exists(), "a half-copied destination was left behind");
    });
}

#[test]
fn a_missing_path_is_named_in_the_error() {
    let dir = TempDir::new("fs-missing");
    let rt = Runtime::new();
    rt.block_on(async {
        let missing = dir.join("no/such/file.txt");
        let shown = missing.display().to_string();
        for (op, err) in [
            ("open", fs::read(&missing).await.unwrap_err()),
            ("stat", fs::metadata(&missing).await.unwrap_err()),
            ("lstat", fs::symlink_metadata(&missing).await.unwrap_err()),
            (
                "scandir",
                fs::read_dir(&missing).await.map(drop).unwrap_err(),
            ),
            ("unlink", fs::remove_file(&missing).await.unwrap_err()),
            ("open", File::open(&missing).await.map(drop).unwrap_err()),
        ] {
            assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
            assert!(
                err.to_string().contains(&format!("{op} '{shown}'")),
                "{err}"
            );
            let pe = path_error(&err);
            assert_eq!((pe.op(), pe.path()), (op, missing.as_path()));
            assert_eq!(pe.os_error().raw_os_error(), Some(2));
            // What Node's error has: the errno and the code, read from the error as it comes.
            assert_eq!((pe.raw_os_error(), pe.code()), (Some(2), Some("ENOENT")));
            assert_eq!(err.raw_os_error(), None, "the message is nodus's own");
            assert_eq!(fs::os_error(&err), Some(libc::ENOENT));
            assert_eq!(fs::error_code(&err), Some("ENOENT"));
        }
        let err = fs::rename(&missing, dir.join("dest")).await.unwrap_err();
        assert!(err.to_string().contains(&shown), "{err}");
        assert!(err.to_string().contains("dest'"), "{err}");
        assert_eq!(path_error(&err).dest(), Some(dir.join("dest").as_path()));
    });
}

/// No control character in an error message: what a log line or a terminal shows is the message.
fn assert_no_control_chars(text: &str) {
    assert!(
        !text.chars().any(char::is_control),
        "raw control character in {text:?}"
    );
}

#[test]
fn a_path_with_a_nul_byte_is_refused_before_any_pool_job_as_node_refuses_it() {
    use futures_util::FutureExt;
    use std::os::unix::ffi::OsStrExt;
    let dir = TempDir::new("fs-nul");
    let a = dir.join("a");
    std::fs::write(&a, "keep").unwrap();
    // `a\0b` cut at the NUL is `a`, an existing file: no call may reach it.
    let cut = {
        let mut bytes = a.as_os_str().as_bytes().to_vec();
        bytes.extend_from_slice(b"\0b");
        PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(bytes))
    };
    let shown = format!("'{}\\x00b'", a.display());
    let node = |arg: &str| {
        format!(
            "The argument '{arg}' must be a string, Uint8Array, or URL without null bytes. \
             Received {shown}"
        )
    };
    let rt = Runtime::new();
    rt.block_on(async {
        // Each refusal is ready at the first poll: decided on the loop, no pool round trip.
        let now = |f: std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<()>>>>| {
            f.now_or_never()
                .expect("refused at the first poll, before any pool job")
                .unwrap_err()
        };
        let c = cut.clone();
        let cases: Vec<(&str, &str, std::io::Error)> = vec![
            (
                "open",
                "path",
                now(Box::pin(async { fs::read(&c).await.map(drop) })),
            ),
            (
                "open",
                "path",
                now(Box::pin(async { fs::write(&c, "x").await })),
            ),
            (
                "open",
                "path",
                now(Box::pin(async { fs::append(&c, "x").await })),
            ),
            (
                "open",
                "path",
                now(Box::pin(async { File::open(&c).await.map(drop) })),
            ),
            (
                "open",
                "path",
                now(Box::pin(async {
                    OpenOptions::new()
                        .write(true)
                        .truncate(true)
                        .open(&c)
                        .await
                        .map(drop)
                })),
            ),
            (
                "stat",
                "path",
                now(Box::pin(async { fs::metadata(&c).await.map(drop) })),
            ),
            (
                "lstat",
                "path",
                now(Box::pin(async { fs::symlink_metadata(&c).await.map(drop) })),
            ),
            (
                "mkdir",
                "path",
                now(Box::pin(async { fs::create_dir(&c).await })),
            ),
            (
                "unlink",
                "path",
                now(Box::pin(async { fs::remove_file(&c).await })),
            ),
            (
                "rm",
                "path",
                now(Box::pin(async { fs::remove_dir_all(&c).await })),
            ),
            (
                "scandir",
                "path",
                now(Box::pin(async { fs::read_dir(&c).await.map(drop) })),
            ),
            (
                "rename",
                "oldPath",
                now(Box::pin(async { fs::rename(&c, dir.join("z")).await })),
            ),
            (
                "rename",
                "newPath",
                now(Box::pin(async { fs::rename(dir.join("z"), &c).await })),
            ),
            (
                "copyfile",
                "src",
                now(Box::pin(async {
                    fs::copy(&c, dir.join("z")).await.map(drop)
                })),
            ),
            (
                "copyfile",
                "dest",
                now(Box::pin(async { fs::copy(&a, &c).await.map(drop) })),
            ),
        ];
        for (op, arg, err) in cases {
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
            assert_eq!(err.to_string(), format!("{op}: {}", node(arg)));
            assert_no_control_chars(&err.to_string());
            let pe = path_error(&err);
            assert_eq!(pe.op(), op);
            assert_eq!(pe.code(), Some(fs::ERR_INVALID_ARG_VALUE));
            assert_eq!(pe.os_error().raw_os_error(), None);
            assert_eq!(fs::os_error(&err), None);
            assert_eq!(fs::error_code(&err), Some(fs::ERR_INVALID_ARG_VALUE));
        }
    });
    // Nothing touched `a`, and nothing was created in its place.
    assert_eq!(std::fs::read(&a).unwrap(), b"keep");
    assert!(!dir.join("z").exists());
}

#[test]
fn control_characters_in_a_path_are_escaped_in_every_error_message() {
    let dir = TempDir::new("fs-ctl");
    let odd = dir.join("a\u{1}\nb\u{1b}[31m\u{7f}\u{9b}é");
    let shown = format!("'{}/a\\x01\\nb\\x1B[31m\\x7F\\x9Bé'", dir.path().display());
    let rt = Runtime::new();
    rt.block_on(async {
        for err in [
            fs::read(&odd).await.unwrap_err(),
            fs::metadata(&odd).await.map(drop).unwrap_err(),
            fs::rename(&odd, &odd).await.unwrap_err(),
        ] {
            assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
            let text = err.to_string();
            assert_no_control_chars(&text);
            assert!(text.contains(&shown), "{text}");
            assert_eq!(path_error(&err).path(), odd.as_path());
            assert_eq!(path_error(&err).code(), Some("ENOENT"));
        }
    });
}

#[test]
fn paths_are_quoted_as_node_inspects_a_string() {
    use std::os::unix::ffi::OsStrExt;
    // Node 20's `util.inspect` of each string (what its ERR_INVALID_ARG_VALUE shows).
    for (path, node) in [
        ("a\0b", r"'a\x00b'"),
        ("it's\0", r#""it's\x00""#),
        ("it's \"x\"\0", r#"`it's "x"\x00`"#),
        ("it's \"x\" `y`\0", r#"'it\'s "x" `y`\x00'"#),
        ("a\\b\0", r"'a\\b\x00'"),
        (
            "\0\x01\x07\x08\x09\x0a\x0b\x0c\x0d\x1f\x7f\u{80}\u{9f}\u{a0}\u{2028}x",
            "'\\x00\\x01\\x07\\b\\t\\n\\x0B\\f\\r\\x1F\\x7F\\x80\\x9F\u{a0}\u{2028}x'",
        ),
    ] {
        assert_eq!(fs::quote(Path::new(path)), node, "{path:?}");
    }
    // A byte that is not UTF-8 (Node would have a Buffer): escaped too.
    let bytes = std::ffi::OsStr::from_bytes(b"a\xffb");
    assert_eq!(fs::quote(Path::new(bytes)), r"'a\xFFb'");
}

#[test]
fn a_long_refused_path_is_cut_as_node_cuts_it() {
    use futures_util::FutureExt;
    let rt = Runtime::new();
    rt.block_on(async {
        let err = fs::metadata("\0".repeat(40))
            .now_or_never()
            .unwrap()
            .unwrap_err();
        // Node 20: 128 characters of the inspected value, then "...".
        let node = format!(
            "The argument 'path' must be a string, Uint8Array, or URL without null bytes. \
             Received '{}\\x0...",
            "\\x00".repeat(31)
        );
        assert_eq!(err.to_string(), format!("stat: {node}"));
    });
}

fn check_permission_denied(secret: &Path) {
    let rt = Runtime::new();
    rt.block_on(async {
        let err = fs::read(secret).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
        assert!(
            err.to_string().contains(&secret.display().to_string()),
            "{err}"
        );
        assert_eq!(path_error(&err).os_error().raw_os_error(), Some(13));
        assert_eq!(fs::error_code(&err), Some("EACCES"));
    });
}

#[test]
fn permission_denied_is_an_error_naming_the_path() {
    let dir = TempDir::new("fs-perm");
    let secret = dir.join("secret.txt");
    std::fs::write(&secret, "no").unwrap();
    if !rustix::process::geteuid().is_root() {
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o000)).unwrap();
        return check_permission_denied(&secret);
    }
    // Root reads anything: run the check as `nobody`, in a child process running this test binary.
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = std::os::unix::process::CommandExt::gid(
        std::os::unix::process::CommandExt::uid(
            &mut std::process::Command::new(std::env::current_exe().unwrap()),
            65534,
        ),
        65534,
    )
    .args([
        "--exact",
        "permission_denied_as_nobody",
        "--ignored",
        "--nocapture",
    ])
    .env("NODUS_TEST_SECRET", &secret)
    .output()
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("1 passed"), "{text}");
}

#[test]
#[ignore = "run by permission_denied_is_an_error_naming_the_path, as an unprivileged child"]
fn permission_denied_as_nobody() {
    let secret = std::env::var_os("NODUS_TEST_SECRET").expect("NODUS_TEST_SECRET");
    assert!(!rustix::process::geteuid().is_root());
    check_permission_denied(Path::new(&secret));
}

#[test]
fn files_stream_through_async_read_and_write_in_chunks() {
    let dir = TempDir::new("fs-stream");
    let path = dir.join("data.bin");
    let data: Vec<u8> = (0..1_000_003u32).map(|i| (i * 7 % 251) as u8).collect();
    let rt = Runtime::new();
    rt.block_on(async {
        let mut f = File::create(&path).await.unwrap();
        for piece in data.chunks(100_000) {
            f.write_all(piece).await.unwrap(); // AsyncWriteExt
        }
        f.close().await.unwrap();
        assert_eq!(fs::metadata(&path).await.unwrap().len(), data.len() as u64);

        // Small reads through AsyncRead.
        let mut f = File::open(&path).await.unwrap();
        let mut back = Vec::new();
        let mut buf = [0u8; 1000];
        loop {
            let n = f.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            back.extend_from_slice(&buf[..n]);
        }
        assert!(back == data);

        // Lines through AsyncBufRead.
        let text = dir.join("lines.txt");
        fs::write(&text, "one\ntwo\nthree\n").await.unwrap();
        let mut lines = File::open(&text).await.unwrap().lines();
        let mut got = Vec::new();
        while let Some(line) = futures_util::StreamExt::next(&mut lines).await {
            got.push(line.unwrap());
        }
        assert_eq!(got, ["one", "two", "three"]);
    });
}

#[test]
fn a_write_after_a_partial_read_lands_where_the_read_stopped() {
    let dir = TempDir::new("fs-mixed");
    let path = dir.join("f");
    std::fs::write(&path, "abcdefghij").unwrap();
    let rt = Runtime::new();
    rt.block_on(async {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .await
            .unwrap();
        let mut three = [0u8; 3];
        f.read_exact(&mut three).await.unwrap();
        assert_eq!(&three, b"abc");
        nodus::fs::File::write_all(&mut f, b"XY").await.unwrap();
        f.flush().await.unwrap();
        let mut rest = Vec::new();
        f.read_to_end(&mut rest, 100).await.unwrap();
        assert_eq!(rest, b"fghij");
    });
    assert_eq!(std::fs::read(&path).unwrap(), b"abcXYfghij");
}

#[test]
fn a_file_dropped_with_a_write_in_flight_still_gets_the_data() {
    let dir = TempDir::new("fs-dropped-write");
    let path = dir.join("f");
    let rt = Runtime::new();
    rt.block_on(async {
        let mut f = File::create(&path).await.unwrap();
        nodus::fs::File::write_all(&mut f, b"kept").await.unwrap();
        drop(f); // the last chunk's job is still in flight
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read(&path).unwrap() != b"kept" {
        assert!(Instant::now() < deadline, "the write never landed");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn read_to_end_stops_at_its_limit_with_an_error_naming_the_path() {
    let dir = TempDir::new("fs-limit");
    let path = dir.join("big");
    std::fs::write(&path, vec![1u8; 200_000]).unwrap();
    let rt = Runtime::new();
    rt.block_on(async {
        let err = fs::read_with_limit(&path, 100_000).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::FileTooLarge);
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        assert!(err.to_string().contains("100000"), "{err}");
        assert_eq!(
            fs::read_with_limit(&path, 200_000).await.unwrap().len(),
            200_000
        );
        // A file whose size is unknown up front (a character device) is cut at the limit.
        let mut zero = File::open("/dev/zero").await.unwrap();
        let mut buf = Vec::new();
        let err = zero.read_to_end(&mut buf, 300_000).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::FileTooLarge);
        assert!(buf.len() <= 300_000);
    });
}

#[test]
fn a_limit_far_above_memory_reserves_no_more_than_the_file() {
    let dir = TempDir::new("fs-huge-limit");
    let small = dir.join("small");
    std::fs::write(&small, b"twelve bytes").unwrap();
    // A sparse file of 1 TiB: its size is a claim no buffer could hold.
    let sparse = dir.join("sparse");
    std::fs::File::create(&sparse)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let rt = Runtime::new();
    rt.block_on(async {
        for limit in [u64::MAX, usize::MAX as u64, 1 << 60] {
            let started = Instant::now();
            let data = fs::read_with_limit(&small, limit).await.unwrap();
            assert_eq!(data, b"twelve bytes");
            assert!(data.capacity() < 4096, "reserved {}", data.capacity());
            assert!(started.elapsed() < Duration::from_secs(5));
        }
        let err = fs::read_with_limit(&sparse, 1 << 20).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::FileTooLarge);

        // No limit: reading starts at once, with the first reservation capped, and the buffer
        // grows with what was read (the read is cut short by the timeout).
        let mut f = File::open(&sparse).await.unwrap();
        let mut buf = Vec::new();
        let cut = nodus::timeout(
            Duration::from_millis(100),
            f.read_to_end(&mut buf, u64::MAX),
        )
        .await;
        assert!(cut.is_err(), "a 1 TiB read finished: {cut:?}");
        let bound = (fs::RESERVE_MAX as usize).max(2 * (buf.len() + fs::CHUNK));
        assert!(
            buf.capacity() <= bound,
            "{} bytes reserved for {} read",
            buf.capacity(),
            buf.len()
        );
    });
}

#[test]
fn a_large_directory_is_listed_in_batches() {
    let dir = TempDir::new("fs-many");
    let n = fs::DIR_BATCH * 2 + 17;
    for i in 0..n {
        std::fs::File::create(dir.join(&format!("f{i}"))).unwrap();
    }
    let rt = Runtime::new();
    let entries = rt.block_on(fs::read_dir(dir.path())).unwrap();
    assert_eq!(entries.len(), n);
    assert!(entries.iter().all(|e| e.path().starts_with(dir.path())));
}

fn io_completed(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("nodus_pool_completed_total{pool=\"io\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn reading_100_mib_takes_at_least_1600_io_pool_jobs() {
    let dir = TempDir::new("fs-100m");
    let path = dir.join("sparse");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    let rt = Runtime::new();
    rt.block_on(async {
        // The I/O pool exists, so the first snapshot shows it.
        fs::metadata(&path).await.unwrap();
        let before = io_completed(&prometheus::render(&snapshot()));
        let mut f = File::open(&path).await.unwrap();
        let mut total = 0;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            total += n;
        }
        assert_eq!(total, 100 << 20);
        let after = io_completed(&prometheus::render(&snapshot()));
        assert!(after >= before + 1600, "{before} -> {after}");
    });
}

#[test]
fn stat_stays_fast_while_the_cpu_pool_is_saturated() {
    let dir = TempDir::new("fs-apart");
    let path = dir.join("f");
    std::fs::write(&path, "x").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let rt = Runtime::new();
    rt.block_on(async {
        // Every CPU thread spins for 5 s (or until told to stop), with more work queued behind.
        let threads = pool::cpu().threads();
        for _ in 0..threads * 2 {
            let stop = stop.clone();
            offload_cpu(move || {
                let end = Instant::now() + Duration::from_secs(5);
                while Instant::now() < end && !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
            .detach();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while (pool::cpu().stats().busy_threads as usize) < threads {
            assert!(Instant::now() < deadline, "the CPU pool never filled up");
            nodus::sleep(1).await;
        }
        let start = Instant::now();
        let stats: Vec<_> = (0..100)
            .map(|_| {
                let p = path.clone();
                spawn(async move { fs::metadata(&p).await.map(|m| m.len()) })
            })
            .collect();
        for s in stats {
            assert_eq!(s.await.unwrap().unwrap(), 1);
        }
        let took = start.elapsed();
        let saturated = pool::cpu().stats();
        stop.store(true, Ordering::Relaxed);
        assert_eq!(saturated.busy_threads as usize, threads);
        assert!(took < Duration::from_secs(1), "100 stats took {took:?}");
    });
}
