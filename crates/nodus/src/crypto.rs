//! Key derivation, random bytes, hashes and HMACs on the CPU pool: the parts of Node's `crypto`
//! that run on libuv's threadpool (`pbkdf2`, `scrypt`, `randomBytes`), plus SHA-2 digests and
//! HMACs, which Node runs on the loop and nodus does not.
//!
//! Invariants:
//! - Inputs and cost parameters are checked on the loop before any work is queued, against the
//!   limits below, and a refusal says which limit (`InvalidInput`). The limits bound how long
//!   one request can hold a CPU thread, and how much memory it can claim.
//! - Partitioned where the algorithm allows: hashing and HMAC feed at most [`CHUNK`] bytes per
//!   pool job (the digest state travels with the job), random bytes are made [`CHUNK`] at a
//!   time. PBKDF2 and scrypt are one job each, bounded by their cost limits.
//! - [`pbkdf2_sync`] exists for the lesson of seed 003 (Node's `pbkdf2Sync`): it blocks the
//!   calling thread, and on the loop it blocks everything.

use std::io;

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256, Sha512};

use crate::pool::offload_cpu;

/// Longest password, salt or HMAC key accepted: 1 MiB.
pub const MAX_SECRET_LEN: usize = 1 << 20;

/// Longest derived key accepted: 1 MiB.
pub const MAX_KEY_LEN: usize = 1 << 20;

/// Most PBKDF2 work accepted: iterations × output blocks (one block per digest length of key).
pub const MAX_PBKDF2_WORK: u64 = 10_000_000;

/// Most scrypt work accepted: `N × r × p` (Node's defaults cost 2^17, `N` = 2^20 with `r` = 8
/// costs 2^23; here 2^17 takes tens of milliseconds of one CPU thread).
pub const MAX_SCRYPT_WORK: u64 = 1 << 24;

/// Longest input [`hash`] and [`hmac()`] accept: 1 GiB.
pub const MAX_DATA_LEN: usize = 1 << 30;

/// Most bytes [`random_bytes`] makes in one call: 64 MiB.
pub const MAX_RANDOM_LEN: usize = 64 << 20;

/// Bytes hashed, or random bytes made, per pool job.
pub const CHUNK: usize = 1 << 20;

/// A SHA-2 digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Sha256,
    Sha512,
}

impl Algorithm {
    /// Digest length in bytes.
    pub fn output_len(self) -> usize {
        match self {
            Algorithm::Sha256 => 32,
            Algorithm::Sha512 => 64,
        }
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn check_len(what: &str, len: usize, max: usize) -> io::Result<()> {
    if len > max {
        return Err(invalid(format!(
            "{what} is {len} bytes, more than the limit of {max}"
        )));
    }
    Ok(())
}

fn check_pbkdf2(
    password: &[u8],
    salt: &[u8],
    iterations: u32,
    key_len: usize,
    alg: Algorithm,
) -> io::Result<()> {
    check_len("password", password.len(), MAX_SECRET_LEN)?;
    check_len("salt", salt.len(), MAX_SECRET_LEN)?;
    check_len("key length", key_len, MAX_KEY_LEN)?;
    if iterations == 0 {
        return Err(invalid("pbkdf2 needs at least 1 iteration".into()));
    }
    let work = u64::from(iterations) * key_len.div_ceil(alg.output_len()).max(1) as u64;
    if work > MAX_PBKDF2_WORK {
        return Err(invalid(format!(
            "pbkdf2 cost (iterations x output blocks = {work}) is more than the limit of \
             {MAX_PBKDF2_WORK}"
        )));
    }
    Ok(())
}

fn derive_pbkdf2(
    password: &[u8],
    salt: &[u8],
    iterations: u32,
    key_len: usize,
    alg: Algorithm,
) -> Vec<u8> {
    let mut key = vec![0; key_len];
    match alg {
        Algorithm::Sha256 => pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut key),
        Algorithm::Sha512 => pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut key),
    }
    key
}

/// PBKDF2-HMAC (RFC 8018) of `password` and `salt`: a `key_len`-byte key, on the CPU pool
/// (Node's `crypto.pbkdf2`).
pub async fn pbkdf2(
    password: &[u8],
    salt: &[u8],
    iterations: u32,
    key_len: usize,
    alg: Algorithm,
) -> io::Result<Vec<u8>> {
    check_pbkdf2(password, salt, iterations, key_len, alg)?;
    let (password, salt) = (password.to_vec(), salt.to_vec());
    Ok(offload_cpu(move || derive_pbkdf2(&password, &salt, iterations, key_len, alg)).await?)
}

/// [`pbkdf2()`] on the calling thread (Node's `pbkdf2Sync`). On a loop thread this blocks every
/// task, timer and connection of the loop until it returns: use [`pbkdf2()`].
pub fn pbkdf2_sync(
    password: &[u8],
    salt: &[u8],
    iterations: u32,
    key_len: usize,
    alg: Algorithm,
) -> io::Result<Vec<u8>> {
    check_pbkdf2(password, salt, iterations, key_len, alg)?;
    Ok(derive_pbkdf2(password, salt, iterations, key_len, alg))
}

/// scrypt cost parameters (Node's `N`, `r`, `p`, `maxmem`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScryptParams {
    /// log2 of `N`, the CPU/memory cost (Node's default `N` = 16384 is `log_n` 14). At least 1,
    /// and below `16 * r`: `N` < 2^(16·r), RFC 7914's bound, which Node enforces through OpenSSL
    /// (`N` = 2^16 with `r` = 1 is its "memory limit exceeded").
    pub log_n: u8,
    /// Block size (default 8), at least 1. Node reads `r: 0` as its default 8 (in its code, not
    /// its docs); nodus refuses 0, with an error naming `r`.
    pub r: u32,
    /// Parallelization (default 1), at least 1. Node reads `p: 0` as its default 1; nodus refuses
    /// 0, with an error naming `p`.
    pub p: u32,
    /// Refuse parameters needing more than this much memory: `128 * r * (N + 2 + p)` bytes, as
    /// Node (OpenSSL) counts it (default 32 MiB, Node's `maxmem`). Node reads `maxmem: 0` as its
    /// default; here 0 refuses every parameter set.
    pub max_memory: u64,
}

impl Default for ScryptParams {
    fn default() -> Self {
        ScryptParams {
            log_n: 14,
            r: 8,
            p: 1,
            max_memory: 32 << 20,
        }
    }
}

/// scrypt (RFC 7914) of `password` and `salt`: a `key_len`-byte key, on the CPU pool (Node's
/// `crypto.scrypt(password, salt, keylen, options)`, in that order). Refused (`InvalidInput`)
/// when a parameter is out of its range (see [`ScryptParams`]), above `params.max_memory` or
/// above [`MAX_SCRYPT_WORK`].
pub async fn scrypt(
    password: &[u8],
    salt: &[u8],
    key_len: usize,
    params: ScryptParams,
) -> io::Result<Vec<u8>> {
    check_len("password", password.len(), MAX_SECRET_LEN)?;
    check_len("salt", salt.len(), MAX_SECRET_LEN)?;
    check_len("key length", key_len, MAX_KEY_LEN)?;
    if params.log_n == 0 {
        return Err(invalid(
            "scrypt N must be a power of 2 greater than 1".into(),
        ));
    }
    for (name, value, node_default) in [("r", params.r, 8), ("p", params.p, 1)] {
        if value == 0 {
            return Err(invalid(format!(
                "scrypt {name} must be at least 1 (Node reads {name}: 0 as its default \
                 {node_default}; nodus does not)"
            )));
        }
    }
    // RFC 7914: N < 2^(128 * r / 8). OpenSSL (so Node) refuses past it; the scrypt crate does not.
    if u64::from(params.log_n) >= 16 * u64::from(params.r) {
        return Err(invalid(format!(
            "scrypt N = 2^{} with r = {} is refused: N must be less than 2^(16 x r) (RFC 7914)",
            params.log_n, params.r
        )));
    }
    let n = 1u128 << params.log_n.min(127);
    let (r, p) = (u128::from(params.r), u128::from(params.p));
    // OpenSSL's count, which Node's `maxmem` is checked against: `p` blocks of `128 * r` bytes
    // (B) and `N + 2` more (V).
    let memory = 128 * r * (n + 2 + p);
    if memory > u128::from(params.max_memory) {
        return Err(invalid(format!(
            "scrypt parameters need {memory} bytes of memory, more than max_memory {}",
            params.max_memory
        )));
    }
    let work = n * r * p;
    if work > u128::from(MAX_SCRYPT_WORK) {
        return Err(invalid(format!(
            "scrypt cost (N x r x p = {work}) is more than the limit of {MAX_SCRYPT_WORK}"
        )));
    }
    let p = scrypt::Params::new(params.log_n, params.r, params.p)
        .map_err(|e| invalid(format!("invalid scrypt parameters: {e}")))?;
    if key_len == 0 {
        // Node's answer once the parameters pass: an empty key.
        return Ok(Vec::new());
    }
    let (password, salt) = (password.to_vec(), salt.to_vec());
    offload_cpu(move || {
        let mut key = vec![0; key_len];
        scrypt::scrypt(&password, &salt, &p, &mut key)
            .map(|()| key)
            .map_err(|e| invalid(format!("scrypt: {e}")))
    })
    .await?
}

/// `n` cryptographically secure random bytes from the OS, [`CHUNK`] per pool job (Node's
/// `crypto.randomBytes`).
pub async fn random_bytes(n: usize) -> io::Result<Vec<u8>> {
    check_len("random byte count", n, MAX_RANDOM_LEN)?;
    let mut out = Vec::new();
    while out.len() < n {
        let want = (n - out.len()).min(CHUNK);
        out = offload_cpu(move || {
            let start = out.len();
            out.resize(start + want, 0);
            getrandom::fill(&mut out[start..])
                .map(|()| out)
                .map_err(|e| io::Error::other(format!("getrandom: {e}")))
        })
        .await??;
    }
    Ok(out)
}

/// A digest or HMAC in progress.
enum State {
    Sha256(Sha256),
    Sha512(Sha512),
    HmacSha256(Hmac<Sha256>),
    HmacSha512(Hmac<Sha512>),
}

impl State {
    fn update(&mut self, data: &[u8]) {
        match self {
            State::Sha256(h) => h.update(data),
            State::Sha512(h) => h.update(data),
            State::HmacSha256(h) => h.update(data),
            State::HmacSha512(h) => h.update(data),
        }
    }

    fn finish(self) -> Vec<u8> {
        match self {
            State::Sha256(h) => h.finalize().to_vec(),
            State::Sha512(h) => h.finalize().to_vec(),
            State::HmacSha256(h) => h.finalize().into_bytes().to_vec(),
            State::HmacSha512(h) => h.finalize().into_bytes().to_vec(),
        }
    }

    /// Feeds `data` on the pool, [`CHUNK`] bytes per job, and returns the digest.
    async fn run(self, data: Vec<u8>) -> io::Result<Vec<u8>> {
        check_len("input", data.len(), MAX_DATA_LEN)?;
        let (mut state, mut data, mut offset) = (self, data, 0);
        loop {
            let end = data.len().min(offset + CHUNK);
            if end == data.len() {
                let digest = offload_cpu(move || {
                    state.update(&data[offset..]);
                    state.finish()
                });
                return Ok(digest.await?);
            }
            (state, data) = offload_cpu(move || {
                state.update(&data[offset..end]);
                (state, data)
            })
            .await?;
            offset = end;
        }
    }
}

/// The SHA-256 or SHA-512 digest of `data`, on the CPU pool.
pub async fn hash(alg: Algorithm, data: impl Into<Vec<u8>>) -> io::Result<Vec<u8>> {
    let state = match alg {
        Algorithm::Sha256 => State::Sha256(Sha256::new()),
        Algorithm::Sha512 => State::Sha512(Sha512::new()),
    };
    state.run(data.into()).await
}

/// HMAC-SHA-256 or HMAC-SHA-512 of `data` under `key`, on the CPU pool.
pub async fn hmac(alg: Algorithm, key: &[u8], data: impl Into<Vec<u8>>) -> io::Result<Vec<u8>> {
    check_len("HMAC key", key.len(), MAX_SECRET_LEN)?;
    let bad_key = |_| invalid("HMAC key rejected".into());
    let state = match alg {
        Algorithm::Sha256 => State::HmacSha256(Hmac::new_from_slice(key).map_err(bad_key)?),
        Algorithm::Sha512 => State::HmacSha512(Hmac::new_from_slice(key).map_err(bad_key)?),
    };
    state.run(data.into()).await
}
