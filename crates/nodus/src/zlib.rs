//! gzip, deflate (zlib) and raw deflate on the CPU pool: Node's `zlib` module, for whole buffers
//! ([`gzip`], [`gunzip`], [`deflate`], [`inflate`], [`compress`], [`decompress`]) and for streams
//! ([`Compressor`], [`Decompressor`], fed chunk by chunk).
//!
//! Invariants:
//! - Partitioned: one pool job consumes at most [`INPUT_CHUNK`] bytes of input and produces at
//!   most about [`OUTPUT_CHUNK`] bytes of output, so a large buffer (or a small bomb) never holds
//!   a CPU thread for long; the codec state travels to the pool and back with each job.
//! - Decompression output is bounded ([`DEFAULT_MAX_OUTPUT`], or the caller's limit): passing
//!   it fails with `InvalidData` as soon as it happens, before more memory is spent.
//! - A stream whose job failed or was dropped mid-way is broken: every later call fails.
//! - Decompressing concatenated gzip members yields all of them (as Node and `gunzip` do), also
//!   when a stream's writes split a member's header. After a gzip member, as in Node, a zero
//!   byte is padding that ends the data (the rest is ignored) and any other byte starts the next
//!   member, so trailing garbage is an `InvalidData` error ("incorrect header check"). Bytes
//!   after the end of a zlib or raw stream are ignored.

use std::io;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use crate::pool::offload_cpu;

/// Most input bytes one pool job consumes.
pub const INPUT_CHUNK: usize = 256 * 1024;

/// About the most output bytes one pool job produces.
pub const OUTPUT_CHUNK: usize = 1024 * 1024;

/// Compression level used by [`gzip`] and [`deflate`] (zlib's default).
pub const DEFAULT_LEVEL: u32 = 6;

/// Output limit of [`gunzip`] and [`inflate`]: 256 MiB.
pub const DEFAULT_MAX_OUTPUT: u64 = 256 << 20;

/// Most output bytes one codec call may write.
const SPARE: usize = 32 * 1024;

/// The container around deflate data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// gzip (RFC 1952): Node's `gzip`/`gunzip`.
    Gzip,
    /// zlib (RFC 1950): Node's `deflate`/`inflate`.
    Zlib,
    /// Raw deflate (RFC 1951): Node's `deflateRaw`/`inflateRaw`.
    Raw,
}

/// gzip of `data`, at the default level.
pub async fn gzip(data: impl Into<Vec<u8>>) -> io::Result<Vec<u8>> {
    compress(Format::Gzip, DEFAULT_LEVEL, data).await
}

/// The data in gzip `data` (every member), at most [`DEFAULT_MAX_OUTPUT`] bytes.
pub async fn gunzip(data: impl Into<Vec<u8>>) -> io::Result<Vec<u8>> {
    decompress(Format::Gzip, data, DEFAULT_MAX_OUTPUT).await
}

/// zlib-wrapped deflate of `data`, at the default level.
pub async fn deflate(data: impl Into<Vec<u8>>) -> io::Result<Vec<u8>> {
    compress(Format::Zlib, DEFAULT_LEVEL, data).await
}

/// The data in zlib-wrapped `data`, at most [`DEFAULT_MAX_OUTPUT`] bytes.
pub async fn inflate(data: impl Into<Vec<u8>>) -> io::Result<Vec<u8>> {
    decompress(Format::Zlib, data, DEFAULT_MAX_OUTPUT).await
}

/// `data` compressed in `format` at `level` (0–9).
pub async fn compress(format: Format, level: u32, data: impl Into<Vec<u8>>) -> io::Result<Vec<u8>> {
    let mut c = Compressor::new(format, level)?;
    let mut out = c.stream.feed(data.into(), false).await?;
    out.extend(c.stream.feed(Vec::new(), true).await?);
    Ok(out)
}

/// The data in `data`, which must be one complete `format` stream (for gzip, one or more
/// members); fails with `InvalidData` if it is corrupt or would decompress to more than
/// `max_output` bytes, and with `UnexpectedEof` if it is truncated (empty included).
pub async fn decompress(
    format: Format,
    data: impl Into<Vec<u8>>,
    max_output: u64,
) -> io::Result<Vec<u8>> {
    let mut d = Decompressor::new(format, max_output);
    let mut out = d.stream.feed(data.into(), false).await?;
    out.extend(d.stream.feed(Vec::new(), true).await?);
    Ok(out)
}

enum Codec {
    Compress(Compress),
    Decompress(Decompress),
}

impl Codec {
    fn total_in(&self) -> u64 {
        match self {
            Codec::Compress(c) => c.total_in(),
            Codec::Decompress(d) => d.total_in(),
        }
    }

    fn total_out(&self) -> u64 {
        match self {
            Codec::Compress(c) => c.total_out(),
            Codec::Decompress(d) => d.total_out(),
        }
    }

    /// One codec call on `input`, appending at most `room` bytes to `out`.
    fn call(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        room: usize,
        finish: bool,
    ) -> io::Result<Status> {
        let (len, out_before) = (out.len(), self.total_out());
        // A slice, not `*_vec`: those fill all spare capacity, which `Vec` growth can make far
        // larger than `room`.
        out.resize(len + room, 0);
        let status = match self {
            Codec::Compress(c) => {
                let flush = if finish {
                    FlushCompress::Finish
                } else {
                    FlushCompress::None
                };
                c.compress(input, &mut out[len..], flush)
                    .map_err(|e| io::Error::other(format!("compression failed: {e}")))
            }
            Codec::Decompress(d) => d
                .decompress(input, &mut out[len..], FlushDecompress::None)
                .map_err(|e| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("invalid compressed data: {e}"),
                    )
                }),
        };
        out.truncate(len + (self.total_out() - out_before) as usize);
        status
    }
}

/// What one job did.
struct Step {
    consumed: usize,
    ended: bool,
    /// The job stopped because it produced its share of output (more may be pending).
    out_full: bool,
}

/// One pool job: feeds `input` to the codec until it is consumed (and, when finishing a
/// compressor, until the stream ends), the stream ends, or `budget` output bytes were made.
fn step(
    codec: &mut Codec,
    input: &[u8],
    out: &mut Vec<u8>,
    finish: bool,
    budget: usize,
) -> io::Result<Step> {
    let start = out.len();
    let mut consumed = 0;
    loop {
        if out.len() - start >= budget {
            return Ok(Step {
                consumed,
                ended: false,
                out_full: true,
            });
        }
        let room = SPARE.min(budget - (out.len() - start));
        let (in_before, out_before) = (codec.total_in(), out.len());
        let status = codec.call(&input[consumed..], out, room, finish)?;
        consumed += (codec.total_in() - in_before) as usize;
        let progressed = codec.total_in() > in_before || out.len() > out_before;
        match status {
            Status::StreamEnd => {
                return Ok(Step {
                    consumed,
                    ended: true,
                    out_full: false,
                });
            }
            Status::Ok | Status::BufError if progressed => {}
            Status::Ok | Status::BufError => {
                return Ok(Step {
                    consumed,
                    ended: false,
                    out_full: false,
                });
            }
        }
    }
}

/// The state both stream kinds share.
struct Stream {
    /// `None` while a job holds it, and for good after a failure.
    codec: Option<Box<Codec>>,
    format: Format,
    compressing: bool,
    max_output: u64,
    produced: u64,
    ended: bool,
    /// A zero byte followed the end of a gzip member: everything after it is ignored.
    padded: bool,
}

impl Stream {
    fn new(codec: Codec, format: Format, max_output: u64) -> Stream {
        let compressing = matches!(codec, Codec::Compress(_));
        Stream {
            codec: Some(Box::new(codec)),
            format,
            compressing,
            max_output,
            produced: 0,
            ended: false,
            padded: false,
        }
    }
}

fn broken() -> io::Error {
    io::Error::other("zlib stream is unusable: an earlier call failed or was cancelled")
}

impl Stream {
    /// Feeds `input` (and, with `finish`, ends the stream), one job per input/output chunk.
    async fn feed(&mut self, mut input: Vec<u8>, finish: bool) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut offset = 0;
        loop {
            if self.ended && !self.another_member(&input[offset..]) {
                break;
            }
            let chunk_end = input.len().min(offset + INPUT_CHUNK);
            let finishing = finish && self.compressing && chunk_end == input.len();
            let mut codec = self.codec.take().ok_or_else(broken)?;
            let allowed = self
                .max_output
                .saturating_sub(self.produced)
                .saturating_add(1);
            let budget = OUTPUT_CHUNK.min(usize::try_from(allowed).unwrap_or(usize::MAX));
            let before = out.len();
            let (back, back_input, back_out, result) = offload_cpu(move || {
                let r = step(
                    &mut codec,
                    &input[offset..chunk_end],
                    &mut out,
                    finishing,
                    budget,
                );
                (codec, input, out, r)
            })
            .await?;
            let s = result?;
            (input, out) = (back_input, back_out);
            self.produced += (out.len() - before) as u64;
            if self.produced > self.max_output {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "decompressed data exceeds the limit of {} bytes",
                        self.max_output
                    ),
                ));
            }
            offset += s.consumed;
            self.codec = Some(back);
            if s.ended {
                self.ended = true;
            } else if offset >= input.len() && !s.out_full && !finishing {
                break;
            }
        }
        if finish && !self.ended {
            self.codec = None;
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "unexpected end of compressed data",
            ));
        }
        Ok(out)
    }

    /// After the end of a gzip member, whether `rest` starts another one (then the codec is
    /// reset for it): Node's rule, any byte but 0 does (its header is checked by the codec,
    /// which may need later writes to see all of it); a 0 is padding and ends the data.
    fn another_member(&mut self, rest: &[u8]) -> bool {
        if self.format != Format::Gzip || self.compressing || self.padded {
            return false;
        }
        match rest.first() {
            None => return false,
            Some(0) => {
                self.padded = true;
                return false;
            }
            Some(_) => {}
        }
        self.codec = Some(Box::new(Codec::Decompress(Decompress::new_gzip(15))));
        self.ended = false;
        true
    }
}

/// A compression stream (Node's `zlib.createGzip()` and friends): feed chunks with
/// [`Compressor::write`], end with [`Compressor::finish`].
pub struct Compressor {
    stream: Stream,
}

impl Compressor {
    /// A compressor for `format` at `level` (0 = store, 9 = smallest).
    pub fn new(format: Format, level: u32) -> io::Result<Compressor> {
        if level > 9 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("compression level {level} is not in 0..=9"),
            ));
        }
        let level = Compression::new(level);
        let codec = match format {
            Format::Gzip => Compress::new_gzip(level, 15),
            Format::Zlib => Compress::new(level, true),
            Format::Raw => Compress::new(level, false),
        };
        Ok(Compressor {
            stream: Stream::new(Codec::Compress(codec), format, u64::MAX),
        })
    }

    /// Compresses `chunk`; returns the output produced so far (often empty: zlib buffers).
    pub async fn write(&mut self, chunk: impl Into<Vec<u8>>) -> io::Result<Vec<u8>> {
        self.stream.feed(chunk.into(), false).await
    }

    /// Ends the stream; returns the rest of the output (with the format's trailer).
    pub async fn finish(mut self) -> io::Result<Vec<u8>> {
        self.stream.feed(Vec::new(), true).await
    }
}

/// A decompression stream (Node's `zlib.createGunzip()` and friends), with an output limit.
pub struct Decompressor {
    stream: Stream,
}

impl Decompressor {
    /// A decompressor for `format` that fails once its total output passes `max_output` bytes.
    pub fn new(format: Format, max_output: u64) -> Decompressor {
        let codec = match format {
            Format::Gzip => Decompress::new_gzip(15),
            Format::Zlib => Decompress::new(true),
            Format::Raw => Decompress::new(false),
        };
        Decompressor {
            stream: Stream::new(Codec::Decompress(codec), format, max_output),
        }
    }

    /// Decompresses `chunk`; returns the output it yields.
    pub async fn write(&mut self, chunk: impl Into<Vec<u8>>) -> io::Result<Vec<u8>> {
        self.stream.feed(chunk.into(), false).await
    }

    /// Checks that the stream ended; fails with `UnexpectedEof` if the input was truncated.
    pub async fn finish(mut self) -> io::Result<Vec<u8>> {
        self.stream.feed(Vec::new(), true).await
    }

    /// Decompressed bytes produced so far.
    pub fn total_out(&self) -> u64 {
        self.stream.produced
    }
}
