//! `nodus::zlib`: round trips against flate2's own codecs, streams, concatenated gzip members,
//! partitioned jobs, and the errors: a decompression bomb, truncated and corrupt input.

use std::io::{self, Read, Write};

use nodus::zlib::{self, Compressor, Decompressor, Format};
use nodus::{Runtime, pool};

fn sample(n: usize) -> Vec<u8> {
    let words = [
        "event ", "loop ", "pool ", "worker ", "nodus ", "libuv ", "\n",
    ];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(words[(x % words.len() as u64) as usize].as_bytes());
    }
    out.truncate(n);
    out
}

#[test]
fn buffers_round_trip_and_interoperate_with_flate2() {
    let data = sample(300_000);
    let rt = Runtime::new();
    rt.block_on(async {
        let gz = zlib::gzip(data.clone()).await.unwrap();
        assert!(gz.len() < data.len() / 2);
        assert_eq!(&gz[..2], &[0x1f, 0x8b]);
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut plain)
            .unwrap();
        assert!(plain == data);
        assert!(zlib::gunzip(gz).await.unwrap() == data);

        let z = zlib::deflate(data.as_slice()).await.unwrap();
        let mut plain = Vec::new();
        flate2::read::ZlibDecoder::new(&z[..])
            .read_to_end(&mut plain)
            .unwrap();
        assert!(plain == data);
        assert!(zlib::inflate(z).await.unwrap() == data);

        let mut enc = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(&data).unwrap();
        let raw = enc.finish().unwrap();
        let back = zlib::decompress(Format::Raw, raw, 1 << 20).await.unwrap();
        assert!(back == data);
        let raw = zlib::compress(Format::Raw, 1, data.clone()).await.unwrap();
        assert!(zlib::decompress(Format::Raw, raw, 1 << 20).await.unwrap() == data);

        assert!(
            zlib::gunzip(zlib::gzip(Vec::new()).await.unwrap())
                .await
                .unwrap()
                .is_empty()
        );
    });
}

#[test]
fn streams_compress_and_decompress_chunk_by_chunk() {
    let data = sample(1_000_000);
    let rt = Runtime::new();
    rt.block_on(async {
        let mut c = Compressor::new(Format::Gzip, 6).unwrap();
        let mut gz = Vec::new();
        for piece in data.chunks(7_777) {
            gz.extend(c.write(piece).await.unwrap());
        }
        gz.extend(c.finish().await.unwrap());

        let mut d = Decompressor::new(Format::Gzip, 2_000_000);
        let mut back = Vec::new();
        for piece in gz.chunks(1_000) {
            back.extend(d.write(piece).await.unwrap());
        }
        assert_eq!(d.total_out(), data.len() as u64);
        back.extend(d.finish().await.unwrap());
        assert!(back == data);
    });
}

#[test]
fn concatenated_gzip_members_all_come_out() {
    let rt = Runtime::new();
    rt.block_on(async {
        let mut gz = zlib::gzip(&b"first "[..]).await.unwrap();
        gz.extend(zlib::gzip(&b"second"[..]).await.unwrap());
        assert_eq!(zlib::gunzip(gz).await.unwrap(), b"first second");
    });
}

#[test]
fn a_second_member_split_across_writes_still_comes_out() {
    let rt = Runtime::new();
    rt.block_on(async {
        let member = zlib::gzip(&b"member"[..]).await.unwrap();
        let two = member.repeat(2);
        // Byte by byte: the second member's magic arrives one byte per write.
        let mut d = Decompressor::new(Format::Gzip, 1 << 20);
        let mut out = Vec::new();
        for b in &two {
            out.extend(d.write(vec![*b]).await.unwrap());
        }
        out.extend(d.finish().await.unwrap());
        assert_eq!(out, b"membermember");
        // One write ends with the first byte of the next member.
        let mut d = Decompressor::new(Format::Gzip, 1 << 20);
        let mut out = d.write([&member[..], &member[..1]].concat()).await.unwrap();
        out.extend(d.write(member[1..].to_vec()).await.unwrap());
        out.extend(d.finish().await.unwrap());
        assert_eq!(out, b"membermember");
    });
}

#[test]
fn after_a_gzip_member_garbage_is_an_error_and_zeros_are_padding_as_in_node() {
    let rt = Runtime::new();
    rt.block_on(async {
        let member = zlib::gzip(&b"data"[..]).await.unwrap();
        // zlib.gunzipSync(Buffer.concat([gz, Buffer.from('garbage')])): incorrect header check.
        let err = zlib::gunzip([&member[..], b"garbage"].concat())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("incorrect header check"), "{err}");
        // Zero padding, and anything after it, is ignored.
        let padded = [&member[..], &[0u8; 8], &member[..]].concat();
        assert_eq!(zlib::gunzip(padded).await.unwrap(), b"data");
        // A zlib stream ignores what follows it.
        let z = zlib::deflate(&b"data"[..]).await.unwrap();
        assert_eq!(
            zlib::inflate([&z[..], b"xyz"].concat()).await.unwrap(),
            b"data"
        );
    });
}

#[test]
fn a_large_buffer_is_compressed_in_many_cpu_jobs() {
    let data = sample(4 * zlib::INPUT_CHUNK);
    let rt = Runtime::new();
    rt.block_on(async {
        let before = pool::cpu().stats().completed_total;
        let gz = zlib::gzip(data.clone()).await.unwrap();
        let jobs = pool::cpu().stats().completed_total - before;
        assert!(jobs >= 4, "{jobs} jobs");
        assert!(zlib::gunzip(gz).await.unwrap() == data);
    });
}

#[test]
fn a_decompression_bomb_stops_at_the_output_limit() {
    let rt = Runtime::new();
    rt.block_on(async {
        // 1 MiB of zeros gzips to about 1 KiB; 64 such members make a 64 MiB bomb.
        let member = zlib::compress(Format::Gzip, 9, vec![0u8; 1 << 20])
            .await
            .unwrap();
        let bomb = member.repeat(64);
        assert!(bomb.len() < 128 << 10, "{} bytes", bomb.len());

        let limit = 4 << 20;
        let err = zlib::decompress(Format::Gzip, bomb.clone(), limit)
            .await
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(
            err.to_string()
                .contains("exceeds the limit of 4194304 bytes"),
            "{err}"
        );

        // A stream stops at the same point, and is unusable after it.
        let mut d = Decompressor::new(Format::Gzip, limit);
        let err = d.write(bomb.as_slice()).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(d.total_out() <= limit + 1, "{}", d.total_out());
        assert!(d.write(&b""[..]).await.is_err());

        // Under the limit it decompresses.
        let small = member.repeat(3);
        assert_eq!(
            zlib::decompress(Format::Gzip, small, 3 << 20)
                .await
                .unwrap()
                .len(),
            3 << 20
        );
    });
}

#[test]
fn truncated_and_corrupt_input_are_errors() {
    let rt = Runtime::new();
    rt.block_on(async {
        let gz = zlib::gzip(sample(10_000)).await.unwrap();
        let err = zlib::gunzip(gz[..gz.len() / 2].to_vec()).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");

        let mut bad = gz.clone();
        bad[20] ^= 0xff;
        bad[21] ^= 0xff;
        bad[22] ^= 0xff;
        let err = zlib::gunzip(bad).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");

        let err = zlib::inflate(&b"not zlib at all"[..]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");

        let err = Compressor::new(Format::Gzip, 10).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    });
}
