//! `nodus::json`: limits on size and depth, and where parsing runs (inline below the threshold,
//! on the CPU pool above it).

use std::sync::Mutex;

use nodus::Runtime;
use nodus::json::{self, Error, Limits};
use nodus::metrics::snapshot;
use serde_json::Value;

/// The tests compare CPU-pool job counts: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn cpu_jobs() -> u64 {
    snapshot()
        .pools
        .iter()
        .find(|p| p.pool == "cpu")
        .map_or(0, |p| p.completed_total)
}

fn big_document(min_len: usize) -> String {
    let mut s = String::from("[");
    let mut i = 0;
    while s.len() < min_len {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&format!(
            r#"{{"id":{i},"name":"item {i}","tags":["a","b"]}}"#
        ));
        i += 1;
    }
    s.push(']');
    s
}

#[test]
fn a_document_over_the_threshold_is_parsed_on_the_cpu_pool() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = Runtime::new();
    rt.block_on(async {
        nodus::offload_cpu(|| ()).await.unwrap(); // the pool exists
        let doc = big_document(json::DEFAULT_OFFLOAD_THRESHOLD + 1);
        let n = doc.matches("\"id\"").count();
        let before = cpu_jobs();
        let v: Value = json::parse(doc).await.unwrap();
        assert_eq!(v.as_array().unwrap().len(), n);
        assert_eq!(cpu_jobs(), before + 1);
    });
}

#[test]
fn a_document_under_the_threshold_is_parsed_inline() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = Runtime::new();
    rt.block_on(async {
        nodus::offload_cpu(|| ()).await.unwrap();
        let before = cpu_jobs();
        let v: Value = json::parse(big_document(1000)).await.unwrap();
        assert!(v.is_array());
        #[derive(serde::Deserialize)]
        struct Point {
            x: i32,
            y: i32,
        }
        let p: Point = json::parse(r#"{"x": 1, "y": -2}"#).await.unwrap();
        assert_eq!((p.x, p.y), (1, -2));
        assert_eq!(cpu_jobs(), before);
        // A lower threshold moves the same document to the pool.
        let limits = Limits {
            offload_threshold: 10,
            ..Limits::default()
        };
        let _: Value = json::parse_with(big_document(1000), limits).await.unwrap();
        assert_eq!(cpu_jobs(), before + 1);
    });
}

#[test]
fn too_deep_json_is_refused_inline_and_on_the_pool() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = Runtime::new();
    rt.block_on(async {
        let nest = |d: usize| format!("{}{}", "[".repeat(d), "]".repeat(d));
        let ok: Value = json::parse(nest(json::DEFAULT_MAX_DEPTH)).await.unwrap();
        assert!(ok.is_array());
        let err = json::parse::<Value, _>(nest(json::DEFAULT_MAX_DEPTH + 1))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::TooDeep { limit: 64 }), "{err}");
        assert!(err.to_string().contains("64 levels"));
        // Brackets inside strings do not count.
        let quoted = format!("[\"{}\\\"{}\"]", "[".repeat(500), "{".repeat(500));
        let v: Value = json::parse(quoted).await.unwrap();
        assert!(v[0].as_str().unwrap().starts_with("[[["));
        // A deep document big enough to go to the pool.
        let deep = format!(
            "{}{}{}",
            "{\"a\":".repeat(100_000),
            "1",
            "}".repeat(100_000)
        );
        assert!(deep.len() > json::DEFAULT_OFFLOAD_THRESHOLD);
        let err = json::parse::<Value, _>(deep).await.unwrap_err();
        assert!(matches!(err, Error::TooDeep { .. }), "{err}");
    });
}

#[test]
fn max_depth_above_the_cap_acts_as_the_cap_exactly() {
    let rt = Runtime::new();
    rt.block_on(async {
        let cap = json::MAX_DEPTH_CAP;
        let arrays = |d: usize| format!("{}{}", "[".repeat(d), "]".repeat(d));
        let objects = |d: usize| format!("{}1{}", "{\"a\":".repeat(d), "}".repeat(d));
        for max_depth in [cap, cap + 1, 10_000] {
            let limits = Limits {
                max_depth,
                ..Limits::default()
            };
            for nest in [arrays, objects] {
                let ok: Value = json::parse_with(nest(cap), limits).await.unwrap();
                assert!(!ok.is_null());
                // One level more: TooDeep naming the cap, not serde_json's recursion error.
                let err = json::parse_with::<Value, _>(nest(cap + 1), limits)
                    .await
                    .unwrap_err();
                assert!(matches!(err, Error::TooDeep { limit: 127 }), "{err}");
            }
        }
    });
}

#[test]
fn too_large_and_malformed_json_are_errors() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = Runtime::new();
    rt.block_on(async {
        let limits = Limits {
            max_bytes: 100,
            ..Limits::default()
        };
        let err = json::parse_with::<Value, _>(big_document(101), limits)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::TooLarge { limit: 100, .. }), "{err}");
        let err = json::parse::<Value, _>("{\"a\": tru}").await.unwrap_err();
        assert!(matches!(err, Error::Syntax(_)), "{err}");
        let err = json::parse::<Value, _>(big_document(100_000) + "x")
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Syntax(_)), "{err}");
    });
}

#[test]
fn stringify_stops_at_its_size_limit() {
    let v: Value = serde_json::from_str(&big_document(10_000)).unwrap();
    assert!(json::stringify(&v, 1 << 20).unwrap().len() >= 10_000);
    let err = json::stringify(&v, 1000).unwrap_err();
    assert!(matches!(err, Error::TooLarge { limit: 1000, .. }), "{err}");
}

#[test]
fn where_parse_differs_from_node_json_parse() {
    let rt = Runtime::new();
    rt.block_on(async {
        let syntax = |r: Result<Value, Error>| matches!(r, Err(Error::Syntax(_)));
        // Node: Infinity, a lone surrogate, U+FFFD for the bad byte. Here: errors.
        assert!(syntax(json::parse("1e400").await));
        assert!(syntax(json::parse("[1e308, 1.8e308]").await));
        assert!(syntax(json::parse(r#""\ud800""#).await));
        assert!(syntax(json::parse(b"\"\xff\"".to_vec()).await));
        // Node rounds every integer to a double; here i64 and u64 stay exact, larger ones round.
        let v: Value =
            json::parse("[9007199254740993, 18446744073709551615, -9223372036854775808]")
                .await
                .unwrap();
        assert_eq!(v[0].as_u64(), Some(9_007_199_254_740_993));
        assert_eq!(v[1].as_u64(), Some(u64::MAX));
        assert_eq!(v[2].as_i64(), Some(i64::MIN));
        let v: Value = json::parse("18446744073709551616").await.unwrap();
        assert_eq!(v.as_f64(), Some(18_446_744_073_709_551_616.0));
        // Node keeps an object's keys in insertion order (integer keys first); a Value's are sorted.
        let v: Value = json::parse(r#"{"b":1,"a":2,"1":3}"#).await.unwrap();
        assert_eq!(v.to_string(), r#"{"1":3,"a":2,"b":1}"#);
    });
}

/// Numbers parse to the double Node's `JSON.parse` gives, bit for bit: the correctly rounded
/// one (ties to even; serde_json's `float_roundtrip`), where serde_json's default parser can be
/// a unit in the last place off (`9007199254740993.0` was `9007199254740994`). The bits are
/// Node 20's (`Buffer.writeDoubleBE(JSON.parse(s))`).
#[test]
fn numbers_parse_to_the_double_node_gives() {
    let node = [
        ("9007199254740993.0", 0x4340_0000_0000_0000_u64),
        ("9.0071992547409915e15", 0x4340_0000_0000_0000),
        ("2.2250738585072011e-308", 0x000f_ffff_ffff_ffff),
        ("1.7976931348623157e308", 0x7fef_ffff_ffff_ffff),
        ("5e-324", 0x0000_0000_0000_0001),
        ("2.4703282292062328e-324", 0x0000_0000_0000_0001),
        ("0.30000000000000004", 0x3fd3_3333_3333_3334),
        ("123456789012345678901234567890", 0x45f8_ee90_ff6c_373e),
        (
            "1.00000000000000011102230246251565404236316680908203125",
            0x3ff0_0000_0000_0000,
        ),
        ("7.038531e-26", 0x3ab5_c87f_b000_0000),
        ("8.41e21", 0x447c_7e83_209e_90b2),
        ("3.0540412e5", 0x4112_a3f0_7ae1_47ae),
    ];
    Runtime::new().block_on(async {
        for (text, bits) in node {
            let v: f64 = json::parse(text.as_bytes()).await.unwrap();
            assert_eq!(
                v.to_bits(),
                bits,
                "{text}: {v:e} ({:#018x}), Node gives {:e} ({bits:#018x})",
                v.to_bits(),
                f64::from_bits(bits)
            );
        }
    });
}
