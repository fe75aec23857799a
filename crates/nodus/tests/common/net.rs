//! Byte-stream helpers for any nodus stream (`TcpStream`, `UnixStream`), through the
//! `futures_io` traits every stream implements for `&Stream`.

use futures_io::{AsyncRead, AsyncWrite};
use futures_util::{AsyncReadExt, AsyncWriteExt};

/// Everything `s` reads until EOF.
pub async fn read_to_end<S>(s: &S) -> Vec<u8>
where
    for<'a> &'a S: AsyncRead,
{
    let mut out = Vec::new();
    let mut reader = s;
    reader.read_to_end(&mut out).await.unwrap();
    out
}

/// Echoes until EOF, then closes (drops `s`).
pub async fn echo<S>(s: S)
where
    for<'a> &'a S: AsyncRead + AsyncWrite,
{
    let mut buf = [0u8; 4096];
    let (mut reader, mut writer) = (&s, &s);
    loop {
        let n = reader.read(&mut buf).await.unwrap();
        if n == 0 {
            return;
        }
        writer.write_all(&buf[..n]).await.unwrap();
    }
}
