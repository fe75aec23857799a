//! Files and directories without blocking the loop: every call runs on the I/O pool (Node's
//! `fs` promises API over libuv's threadpool).
//!
//! Invariants:
//! - Nothing here touches the file system on the loop thread.
//! - Partitioned (seed 003's `readFile` lesson): reading and writing move at most [`CHUNK`]
//!   (64 KiB) per pool job, copying at most [`COPY_CHUNK`] (1 MiB, in the kernel), listing a
//!   directory at most [`DIR_BATCH`] entries, so a large file or directory never holds a pool
//!   thread for long and other requests interleave.
//! - A whole-file read reserves memory from the file's size (a hint), capped by its limit and by
//!   [`RESERVE_MAX`], and grows with what it reads: a limit far above RAM, or a size the file
//!   only claims (sparse, `/proc`), reserves no more; a buffer that cannot grow is an
//!   `OutOfMemory` error, not an abort.
//! - Every error names the operation and the path, as Node's do (a full I/O queue or a panic on
//!   the pool too) (`open '/x': No such file or directory (os error 2)`); its
//!   [`io::ErrorKind`] is the OS error's. Its inner value (`e.get_ref()`) is a [`PathError`],
//!   which gives back what Node's error has: the operation (`syscall`, [`PathError::op`]), the
//!   path(s), the errno ([`PathError::raw_os_error`]: the outer `io::Error`'s own
//!   `raw_os_error()` is `None`, as for any error with a message of its own) and Node's code
//!   ([`PathError::code`]: `ENOENT`, `EMFILE`, ...). [`os_error`] and [`error_code`] read them
//!   from any `io::Error`, an fs error or a plain OS one. A kind std leaves uncategorized
//!   (`EMFILE`, `EIO`) is told apart by the errno or the code.
//! - A path is shown as Node's `util.inspect` shows a string (see [`quote`]): quoted, with every
//!   control character escaped (`\x00`, `\n`, `\x1B`, ...; a byte that is not UTF-8 as `\xNN`),
//!   so no error message carries a raw control byte (a NUL, a newline, a terminal escape). Node
//!   itself prints a path raw in the message of a failed system call; nodus never does.
//! - A path with a NUL byte in it is refused on the loop, before any pool job or system call (a C
//!   string ends at the NUL: a call given one would act on another path), as Node refuses it
//!   (synchronously, in its callback, sync and promise forms alike): an `InvalidInput` error with
//!   Node's `ERR_INVALID_ARG_VALUE` message, `open: The argument 'path' must be a string,
//!   Uint8Array, or URL without null bytes. Received 'a\x00b'` ([`PathError::code`] gives the
//!   code; the argument is Node's name for it: `oldPath`/`newPath` for `rename`, `src`/`dest` for
//!   `copy`, else `path`).

mod file;

use std::ffi::OsString;
use std::fmt::{self, Write as _};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub use file::{File, OpenOptions, RESERVE_MAX};

use crate::pool::offload_io;

/// Most bytes one pool job reads or writes.
pub const CHUNK: usize = 64 * 1024;

/// Most bytes one pool job copies (`copy`, through `copy_file_range` where the kernel has it).
pub const COPY_CHUNK: u64 = 1024 * 1024;

/// Most directory entries one pool job reads.
pub const DIR_BATCH: usize = 1024;

/// Largest file [`read`] and [`read_to_string`] accept (Node's `kIoMaxLength`, 2 GiB − 1).
pub const MAX_READ: u64 = (1 << 31) - 1;

/// Node's code for a path refused before any system call because it has a NUL byte in it
/// ([`PathError::code`]).
pub const ERR_INVALID_ARG_VALUE: &str = "ERR_INVALID_ARG_VALUE";

/// A file-system error with the operation and path(s) it concerns.
#[derive(Debug)]
pub struct PathError {
    op: &'static str,
    path: PathBuf,
    dest: Option<PathBuf>,
    source: io::Error,
    /// The path was refused before any system call (a NUL byte in it): `source` is Node's
    /// `ERR_INVALID_ARG_VALUE` message, which shows the path itself.
    refused: bool,
}

impl PathError {
    /// The operation (`open`, `stat`, `rename`, ...).
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// The path the operation was given (the source, for `rename` and `copy`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The destination, for `rename` and `copy`.
    pub fn dest(&self) -> Option<&Path> {
        self.dest.as_deref()
    }

    /// The underlying error (its `raw_os_error()` is the errno; none for a refused path).
    pub fn os_error(&self) -> &io::Error {
        &self.source
    }

    /// The errno (Node's `err.errno`, but positive: `libc::ENOENT`), for an error the OS
    /// returned; `None` for one nodus raised itself (a refused path, a full I/O queue, a file
    /// over its limit).
    pub fn raw_os_error(&self) -> Option<i32> {
        self.source.raw_os_error()
    }

    /// Node's `err.code`: the errno's name (`ENOENT`, `EMFILE`, ...: [`errno_code`]) for an OS
    /// error, [`ERR_INVALID_ARG_VALUE`] for a path with a NUL byte (refused before any system
    /// call), `None` for the other errors nodus raises itself.
    pub fn code(&self) -> Option<&'static str> {
        if self.refused {
            return Some(ERR_INVALID_ARG_VALUE);
        }
        self.raw_os_error().and_then(errno_code)
    }
}

/// The errno behind `e`: its own `raw_os_error()`, or the one of the [`PathError`] inside it (an
/// fs error). `None` for an error the OS did not return.
pub fn os_error(e: &io::Error) -> Option<i32> {
    e.raw_os_error()
        .or_else(|| path_error_of(e)?.raw_os_error())
}

/// Node's `err.code` for `e`: [`PathError::code`] for an fs error, else the name of its errno
/// ([`errno_code`]). `None` for an error without either.
pub fn error_code(e: &io::Error) -> Option<&'static str> {
    match path_error_of(e) {
        Some(pe) => pe.code(),
        None => e.raw_os_error().and_then(errno_code),
    }
}

fn path_error_of(e: &io::Error) -> Option<&PathError> {
    e.get_ref()?.downcast_ref::<PathError>()
}

/// Node's code for a Linux errno: its name in `<errno.h>` (`ENOENT`, `EMFILE`, `EAGAIN`), and
/// `ENOTSUP` for `EOPNOTSUPP` (the same number on Linux), as libuv names it. `None` for a number
/// Linux does not define.
pub fn errno_code(errno: i32) -> Option<&'static str> {
    macro_rules! names {
        ($($name:ident)*) => {
            match errno {
                $(libc::$name => Some(stringify!($name)),)*
                _ => None,
            }
        };
    }
    names! {
        EPERM ENOENT ESRCH EINTR EIO ENXIO E2BIG ENOEXEC EBADF ECHILD EAGAIN ENOMEM EACCES EFAULT
        ENOTBLK EBUSY EEXIST EXDEV ENODEV ENOTDIR EISDIR EINVAL ENFILE EMFILE ENOTTY ETXTBSY
        EFBIG ENOSPC ESPIPE EROFS EMLINK EPIPE EDOM ERANGE EDEADLK ENAMETOOLONG ENOLCK ENOSYS
        ENOTEMPTY ELOOP ENOMSG EIDRM ECHRNG EL2NSYNC EL3HLT EL3RST ELNRNG EUNATCH ENOCSI EL2HLT
        EBADE EBADR EXFULL ENOANO EBADRQC EBADSLT EBFONT ENOSTR ENODATA ETIME ENOSR ENONET ENOPKG
        EREMOTE ENOLINK EADV ESRMNT ECOMM EPROTO EMULTIHOP EDOTDOT EBADMSG EOVERFLOW ENOTUNIQ
        EBADFD EREMCHG ELIBACC ELIBBAD ELIBSCN ELIBMAX ELIBEXEC EILSEQ ERESTART ESTRPIPE EUSERS
        ENOTSOCK EDESTADDRREQ EMSGSIZE EPROTOTYPE ENOPROTOOPT EPROTONOSUPPORT ESOCKTNOSUPPORT
        ENOTSUP EPFNOSUPPORT EAFNOSUPPORT EADDRINUSE EADDRNOTAVAIL ENETDOWN ENETUNREACH ENETRESET
        ECONNABORTED ECONNRESET ENOBUFS EISCONN ENOTCONN ESHUTDOWN ETOOMANYREFS ETIMEDOUT
        ECONNREFUSED EHOSTDOWN EHOSTUNREACH EALREADY EINPROGRESS ESTALE EUCLEAN ENOTNAM ENAVAIL
        EISNAM EREMOTEIO EDQUOT ENOMEDIUM EMEDIUMTYPE ECANCELED ENOKEY EKEYEXPIRED EKEYREVOKED
        EKEYREJECTED EOWNERDEAD ENOTRECOVERABLE ERFKILL EHWPOISON
    }
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.refused {
            // Node's message names the argument and shows the (escaped) path already.
            return write!(f, "{}: {}", self.op, self.source);
        }
        write!(f, "{} {}", self.op, quote(&self.path))?;
        if let Some(dest) = &self.dest {
            write!(f, " -> {}", quote(dest))?;
        }
        write!(f, ": {}", self.source)
    }
}

/// `path` as Node's `util.inspect` shows a string: in single quotes (double quotes if it has a
/// `'`, backticks if it has both `'` and `"` but no `` ` `` or `${`, else single quotes with `\'`),
/// `\` doubled, control characters escaped as Node escapes them (`\b \t \n \f \r`, else
/// `\xNN`: C0, DEL and C1), and each byte that is not UTF-8 as `\xNN`. Other characters are
/// kept as they are.
pub fn quote(path: &Path) -> String {
    let bytes = path.as_os_str().as_bytes();
    let has = |c: &[u8]| bytes.windows(c.len()).any(|w| w == c);
    let q = if !has(b"'") {
        '\''
    } else if !has(b"\"") {
        '"'
    } else if !has(b"`") && !has(b"${") {
        '`'
    } else {
        '\''
    };
    let mut out = String::with_capacity(bytes.len() + 2);
    out.push(q);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\u{8}' => out.push_str("\\b"),
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\u{c}' => out.push_str("\\f"),
                '\r' => out.push_str("\\r"),
                '\\' => out.push_str("\\\\"),
                c if c == q => {
                    out.push('\\');
                    out.push(c);
                }
                c if c.is_control() => {
                    let _ = write!(out, "\\x{:02X}", u32::from(c));
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02X}");
        }
    }
    out.push(q);
    out
}

/// Refuses `refused` if it has a NUL byte in it, as Node does before any system call (a C string
/// would end at the NUL: the call would act on another path). `arg` is Node's name for that
/// argument; the error's [`PathError`] has the operation's `path` and `dest`.
fn check_path(
    op: &'static str,
    arg: &str,
    refused: &Path,
    path: &Path,
    dest: Option<&Path>,
) -> io::Result<()> {
    if !refused.as_os_str().as_bytes().contains(&0) {
        return Ok(());
    }
    // Node's `ERR_INVALID_ARG_VALUE`, whose `inspect`ed value is cut at 128 characters.
    let mut received = quote(refused);
    if let Some((cut, _)) = received.char_indices().nth(128) {
        received.truncate(cut);
        received.push_str("...");
    }
    let message = format!(
        "The argument '{arg}' must be a string, Uint8Array, or URL without null bytes. \
         Received {received}"
    );
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        PathError {
            op,
            path: path.to_path_buf(),
            dest: dest.map(Path::to_path_buf),
            source: io::Error::new(io::ErrorKind::InvalidInput, message),
            refused: true,
        },
    ))
}

/// [`check_path`] for an operation on one path (Node's argument `path`).
pub(crate) fn check_one(op: &'static str, path: &Path) -> io::Result<()> {
    check_path(op, "path", path, path, None)
}

/// [`check_path`] for both paths of `rename` or `copy`, the source first (as Node checks them).
fn check_two(op: &'static str, from: &Path, to: &Path) -> io::Result<()> {
    let (a, b) = if op == "rename" {
        ("oldPath", "newPath")
    } else {
        ("src", "dest")
    };
    check_path(op, a, from, from, Some(to))?;
    check_path(op, b, to, from, Some(to))
}

impl std::error::Error for PathError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Wraps `source` so that it names `op` and `path`, keeping its kind.
pub(crate) fn path_error(op: &'static str, path: &Path, source: io::Error) -> io::Error {
    io::Error::new(
        source.kind(),
        PathError {
            op,
            path: path.to_path_buf(),
            dest: None,
            source,
            refused: false,
        },
    )
}

fn two_path_error(op: &'static str, from: &Path, to: &Path, source: io::Error) -> io::Error {
    io::Error::new(
        source.kind(),
        PathError {
            op,
            path: from.to_path_buf(),
            dest: Some(to.to_path_buf()),
            source,
            refused: false,
        },
    )
}

/// Runs `f` on the I/O pool. `f` names its own errors; a failure of the pool itself (a full
/// queue, a panic) is passed through `name`, so that it names the operation and path too.
pub(crate) async fn blocking<T, F>(f: F, name: impl FnOnce(io::Error) -> io::Error) -> io::Result<T>
where
    F: FnOnce() -> io::Result<T> + Send + 'static,
    T: Send + 'static,
{
    match offload_io(f).await {
        Ok(result) => result,
        Err(e) => Err(name(e.into())),
    }
}

/// Runs `f(path)` on the I/O pool; an error names `op` and the path. A path with a NUL byte is
/// refused here, on the loop ([`check_path`]).
async fn on_path<T, F>(op: &'static str, path: &Path, f: F) -> io::Result<T>
where
    F: FnOnce(&Path) -> io::Result<T> + Send + 'static,
    T: Send + 'static,
{
    check_one(op, path)?;
    let owned = path.to_path_buf();
    blocking(
        move || f(&owned).map_err(|e| path_error(op, &owned, e)),
        |e| path_error(op, path, e),
    )
    .await
}

/// Runs `f(from, to)` on the I/O pool; an error names `op` and both paths. A path with a NUL
/// byte is refused here, on the loop ([`check_path`]).
async fn on_paths<T, F>(op: &'static str, from: &Path, to: &Path, f: F) -> io::Result<T>
where
    F: FnOnce(&Path, &Path) -> io::Result<T> + Send + 'static,
    T: Send + 'static,
{
    check_two(op, from, to)?;
    let (a, b) = (from.to_path_buf(), to.to_path_buf());
    blocking(
        move || f(&a, &b).map_err(|e| two_path_error(op, &a, &b, e)),
        |e| two_path_error(op, from, to, e),
    )
    .await
}

/// The metadata of `path`, following symlinks (`fs.stat`).
pub async fn metadata(path: impl AsRef<Path>) -> io::Result<std::fs::Metadata> {
    on_path("stat", path.as_ref(), |p| std::fs::metadata(p)).await
}

/// The metadata of `path` itself, not following a final symlink (`fs.lstat`).
pub async fn symlink_metadata(path: impl AsRef<Path>) -> io::Result<std::fs::Metadata> {
    on_path("lstat", path.as_ref(), |p| std::fs::symlink_metadata(p)).await
}

/// Creates one directory (`fs.mkdir`).
pub async fn create_dir(path: impl AsRef<Path>) -> io::Result<()> {
    on_path("mkdir", path.as_ref(), |p| std::fs::create_dir(p)).await
}

/// Creates a directory and any missing parents (`fs.mkdir` with `recursive: true`).
pub async fn create_dir_all(path: impl AsRef<Path>) -> io::Result<()> {
    on_path("mkdir", path.as_ref(), |p| std::fs::create_dir_all(p)).await
}

/// Renames `from` to `to`, replacing `to` if it is a file (`fs.rename`).
pub async fn rename(from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
    on_paths("rename", from.as_ref(), to.as_ref(), |a, b| {
        std::fs::rename(a, b)
    })
    .await
}

/// Removes a file or symlink (`fs.unlink`).
pub async fn remove_file(path: impl AsRef<Path>) -> io::Result<()> {
    on_path("unlink", path.as_ref(), |p| std::fs::remove_file(p)).await
}

/// Removes an empty directory (`fs.rmdir`).
pub async fn remove_dir(path: impl AsRef<Path>) -> io::Result<()> {
    on_path("rmdir", path.as_ref(), |p| std::fs::remove_dir(p)).await
}

/// Removes a directory and everything under it (`fs.rm` with `recursive: true`), in one pool
/// job: a huge tree holds one I/O thread until it is gone.
pub async fn remove_dir_all(path: impl AsRef<Path>) -> io::Result<()> {
    on_path("rm", path.as_ref(), |p| std::fs::remove_dir_all(p)).await
}

/// One directory entry.
#[derive(Debug, Clone)]
pub struct DirEntry {
    path: PathBuf,
    file_name: OsString,
    file_type: std::fs::FileType,
}

impl DirEntry {
    /// The directory's path joined with the entry's name.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file_name(&self) -> &OsString {
        &self.file_name
    }

    /// The entry's type (not following symlinks).
    pub fn file_type(&self) -> std::fs::FileType {
        self.file_type
    }
}

/// The entries of a directory, without `.` and `..`, in the order the OS gives them
/// (`fs.readdir` with `withFileTypes`). Read [`DIR_BATCH`] entries per pool job.
pub async fn read_dir(path: impl AsRef<Path>) -> io::Result<Vec<DirEntry>> {
    let path = path.as_ref().to_path_buf();
    let mut iter = on_path("scandir", &path, |p| std::fs::read_dir(p)).await?;
    let mut entries = Vec::new();
    loop {
        let dir = path.clone();
        let (back, batch, done) = blocking(
            move || {
                let mut batch = Vec::new();
                for entry in iter.by_ref() {
                    let entry = entry.map_err(|e| path_error("scandir", &dir, e))?;
                    let file_type = entry
                        .file_type()
                        .map_err(|e| path_error("scandir", &entry.path(), e))?;
                    batch.push(DirEntry {
                        path: entry.path(),
                        file_name: entry.file_name(),
                        file_type,
                    });
                    if batch.len() == DIR_BATCH {
                        return Ok((iter, batch, false));
                    }
                }
                Ok((iter, batch, true))
            },
            |e| path_error("scandir", &path, e),
        )
        .await?;
        entries.extend(batch);
        if done {
            return Ok(entries);
        }
        iter = back;
    }
}

/// The whole file, read [`CHUNK`] bytes per pool job (partitioned, unlike Node's `readFile`).
/// Fails with `FileTooLarge` above [`MAX_READ`]; see [`read_with_limit`].
pub async fn read(path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
    read_with_limit(path, MAX_READ).await
}

/// The whole file if it has at most `limit` bytes; else a `FileTooLarge` error naming the path
/// (found before reading when the size is known, else as soon as the limit is passed). Memory
/// follows what is read, not `limit`: `u64::MAX` means no limit and costs nothing up front (see
/// [`File::read_to_end`]).
pub async fn read_with_limit(path: impl AsRef<Path>, limit: u64) -> io::Result<Vec<u8>> {
    let mut file = File::open(path).await?;
    let mut buf = Vec::new();
    file.read_to_end(&mut buf, limit).await?;
    Ok(buf)
}

/// The whole file as UTF-8 (at most [`MAX_READ`] bytes).
pub async fn read_to_string(path: impl AsRef<Path>) -> io::Result<String> {
    let path = path.as_ref();
    let bytes = read(path).await?;
    String::from_utf8(bytes).map_err(|e| {
        path_error(
            "read",
            path,
            io::Error::new(io::ErrorKind::InvalidData, e.utf8_error()),
        )
    })
}

/// Creates or truncates `path` and writes `data`, [`CHUNK`] bytes per pool job.
pub async fn write(path: impl AsRef<Path>, data: impl AsRef<[u8]>) -> io::Result<()> {
    let mut file = File::create(path).await?;
    file.write_all(data.as_ref()).await?;
    file.flush().await
}

/// Appends `data` to `path`, creating it if missing (`fs.appendFile`).
pub async fn append(path: impl AsRef<Path>, data: impl AsRef<[u8]>) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .await?;
    file.write_all(data.as_ref()).await?;
    file.flush().await
}

/// Copies the contents and permissions of `from` to `to` (created or truncated); returns the
/// bytes copied. At most [`COPY_CHUNK`] bytes per pool job, in the kernel where it can.
///
/// As Node's `copyFile`: copying a file onto itself (the same path, a hard link, a symlink to it)
/// leaves it as it is and returns 0, and a copy that fails after `to` was opened removes `to`
/// (a half-copied file is never left behind). A directory as `from` is `IsADirectory` before
/// `to` is touched. `to` is truncated and given `from`'s permissions only when it is a regular
/// file (a FIFO or a device is written to as it is). A copy whose future is dropped midway
/// leaves the part already copied.
pub async fn copy(from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<u64> {
    let (from, to) = (from.as_ref(), to.as_ref());
    let Some((src, dst)) = on_paths("copyfile", from, to, open_copy).await? else {
        return Ok(0);
    };
    let mut pair = (src, dst);
    let mut total = 0;
    loop {
        let (a, b) = (from.to_path_buf(), to.to_path_buf());
        let (back, n) = blocking(
            move || {
                let (src, dst) = pair;
                let n = io::copy(&mut (&src).take(COPY_CHUNK), &mut &dst).map_err(|e| {
                    remove_failed_copy(&dst, &b);
                    two_path_error("copyfile", &a, &b, e)
                })?;
                Ok(((src, dst), n))
            },
            |e| two_path_error("copyfile", from, to, e),
        )
        .await?;
        total += n;
        if n == 0 {
            return Ok(total);
        }
        pair = back;
    }
}

/// Opens both ends of a copy: `None` when `to` is `from` itself (nothing to do). `to` is opened
/// without `O_TRUNC` and truncated only once it is known to be another file.
fn open_copy(from: &Path, to: &Path) -> io::Result<Option<(std::fs::File, std::fs::File)>> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let src = std::fs::File::open(from)?;
    let meta = src.metadata()?;
    if meta.is_dir() {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .mode(meta.mode() & 0o7777)
        .open(to)?;
    let dst_meta = dst.metadata()?;
    if (dst_meta.dev(), dst_meta.ino()) == (meta.dev(), meta.ino()) {
        return Ok(None);
    }
    if dst_meta.is_file() {
        let prepared = dst
            .set_len(0)
            .and_then(|()| dst.set_permissions(meta.permissions()));
        if let Err(e) = prepared {
            remove_failed_copy(&dst, to);
            return Err(e);
        }
    }
    Ok(Some((src, dst)))
}

/// After a failed copy, removes `to` if it is still the regular file `dst` (libuv's rule).
fn remove_failed_copy(dst: &std::fs::File, to: &Path) {
    use std::os::unix::fs::MetadataExt;
    let (Ok(open), Ok(named)) = (dst.metadata(), std::fs::symlink_metadata(to)) else {
        return;
    };
    if open.is_file() && (open.dev(), open.ino()) == (named.dev(), named.ino()) {
        let _ = std::fs::remove_file(to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_linux_errno_has_its_name_as_node_s_code() {
        let mut seen = std::collections::HashSet::new();
        for errno in 1..=133 {
            // 41 and 58 are unused on Linux (x86's EWOULDBLOCK and EDEADLOCK are aliases).
            if errno == 41 || errno == 58 {
                assert_eq!(errno_code(errno), None);
                continue;
            }
            let code = errno_code(errno).unwrap_or_else(|| panic!("no name for {errno}"));
            assert!(
                code.starts_with('E') && seen.insert(code),
                "{errno}: {code}"
            );
        }
        assert_eq!(errno_code(libc::ENOENT), Some("ENOENT"));
        assert_eq!(errno_code(libc::EMFILE), Some("EMFILE"));
        assert_eq!(errno_code(libc::EWOULDBLOCK), Some("EAGAIN"));
        assert_eq!(errno_code(libc::EOPNOTSUPP), Some("ENOTSUP"));
        assert_eq!(
            (errno_code(0), errno_code(-2), errno_code(4096)),
            (None, None, None)
        );
    }

    #[test]
    fn the_errno_and_code_are_read_from_an_fs_error_and_a_plain_one() {
        let plain = io::Error::from_raw_os_error(libc::EIO);
        assert_eq!(
            (os_error(&plain), error_code(&plain)),
            (Some(libc::EIO), Some("EIO"))
        );
        let named = path_error("read", Path::new("/x"), plain);
        assert_eq!(named.raw_os_error(), None);
        assert_eq!(
            (os_error(&named), error_code(&named)),
            (Some(libc::EIO), Some("EIO"))
        );
        let own = path_error("read", Path::new("/x"), io::ErrorKind::FileTooLarge.into());
        assert_eq!((os_error(&own), error_code(&own)), (None, None));
        let other = io::Error::other("not an fs error");
        assert_eq!((os_error(&other), error_code(&other)), (None, None));
    }
}
