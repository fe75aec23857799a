//! The Prometheus text format 0.0.4 (the classic one), rewritten from the OpenMetrics text the
//! encoder writes, for scrapers and tools that do not ask for OpenMetrics: `promtool check
//! metrics`, a plain `curl`, older agents. Prometheus itself asks for OpenMetrics
//! (`Accept: application/openmetrics-text...`) and gets it unchanged, unless its
//! `scrape_protocols` put the classic format first: [`prefers_openmetrics`] weighs the `Accept`
//! header's q-values.
//!
//! For what nodus writes the two formats differ only in metadata lines:
//! - a counter family `x` is `# HELP x` / `# TYPE x counter` in OpenMetrics, with samples
//!   `x_total`; the classic format names the family after its samples, `x_total`;
//! - an `info` family `x` (samples `x_info`) is a gauge named `x_info`; `unknown` is `untyped`;
//! - `# UNIT` lines and the closing `# EOF` do not exist;
//! - HELP text escapes `\` and newlines only (OpenMetrics also escapes `"`).
//!
//! Sample lines, label escaping and histogram series (`_bucket`, `_sum`, `_count`) are the same
//! in both and pass through unchanged.

/// The HTTP `Content-Type` of [`to_classic`]'s text.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a request whose `Accept` header is `accept` gets OpenMetrics rather than the classic
/// format. Each format gets the quality (`q`, 1 when absent) of the most specific media range
/// that matches it (`application/openmetrics-text` or `text/plain`, with a `version` that is
/// the one written, 1.0.0 or 0.0.4, before the same without one, then `application/*` or
/// `text/*`, then `*/*`; a range with another version, or a `q` that is no number from 0 to 1,
/// matches nothing); OpenMetrics only when its quality is the higher: 0 is not acceptable, and
/// a tie goes to the classic format, as Prometheus's client libraries answer.
pub fn prefers_openmetrics(accept: &str) -> bool {
    quality(accept, ("application", "openmetrics-text", "1.0.0"))
        > quality(accept, ("text", "plain", "0.0.4"))
}

/// The quality `accept` gives to the media type `(type, subtype, version)` (see
/// [`prefers_openmetrics`]); 0 when no range matches it.
fn quality(accept: &str, (ty, subtype, version): (&str, &str, &str)) -> f32 {
    // (specificity, q) of the most specific range matching so far; the first one of a kind.
    let mut best: Option<(u8, f32)> = None;
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let Some((t, st)) = parts.next().and_then(|m| m.split_once('/')) else {
            continue;
        };
        let (t, st) = (t.trim(), st.trim());
        let (mut q, mut v) = (Some(1.0), None);
        for (name, value) in parts.filter_map(|p| p.split_once('=')) {
            let value = value.trim().trim_matches('"');
            match name.trim() {
                n if n.eq_ignore_ascii_case("q") => {
                    q = value.parse().ok().filter(|q| (0.0..=1.0).contains(q));
                }
                n if n.eq_ignore_ascii_case("version") => v = Some(value),
                _ => {}
            }
        }
        let specificity = match (t, st, v) {
            ("*", "*", _) => 1,
            (t, "*", _) if t.eq_ignore_ascii_case(ty) => 2,
            (t, st, None) if t.eq_ignore_ascii_case(ty) && st.eq_ignore_ascii_case(subtype) => 3,
            (t, st, Some(v))
                if t.eq_ignore_ascii_case(ty)
                    && st.eq_ignore_ascii_case(subtype)
                    && v == version =>
            {
                4
            }
            _ => continue,
        };
        if let Some(q) = q
            && best.is_none_or(|(s, _)| specificity > s)
        {
            best = Some((specificity, q));
        }
    }
    best.map_or(0.0, |(_, q)| q)
}

/// The classic text format of `openmetrics` (see the module docs).
pub fn to_classic(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // A family's `# HELP` comes before its `# TYPE`, which decides its classic name.
    let mut help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush_help(&mut out, help.take(), None);
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (classic_name, classic_kind) = classic_family(name, kind);
            let own_help = help.take_if(|(h, _)| *h == name);
            flush_help(&mut out, help.take(), None);
            flush_help(&mut out, own_help, Some(&classic_name));
            out.push_str(&format!("# TYPE {classic_name} {classic_kind}\n"));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
        } else {
            flush_help(&mut out, help.take(), None);
            out.push_str(line);
            out.push('\n');
        }
    }
    flush_help(&mut out, help, None);
    out
}

/// A family's classic name and type, from its OpenMetrics ones.
fn classic_family(name: &str, kind: &str) -> (String, &'static str) {
    match kind {
        "counter" if name.ends_with("_total") => (name.to_owned(), "counter"),
        "counter" => (format!("{name}_total"), "counter"),
        "info" => (format!("{name}_info"), "gauge"),
        "gauge" => (name.to_owned(), "gauge"),
        "histogram" => (name.to_owned(), "histogram"),
        "summary" => (name.to_owned(), "summary"),
        _ => (name.to_owned(), "untyped"),
    }
}

/// Writes a held `# HELP` line, under `rename` if given, with the classic escaping.
fn flush_help(out: &mut String, help: Option<(&str, &str)>, rename: Option<&str>) {
    if let Some((name, text)) = help {
        let name = rename.unwrap_or(name);
        out.push_str(&format!("# HELP {name} {}\n", text.replace("\\\"", "\"")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_take_their_samples_name_and_openmetrics_only_lines_go() {
        let om = "# HELP nodus_polls Task polls.\n\
                  # TYPE nodus_polls counter\n\
                  nodus_polls_total{worker=\"1\"} 5\n\
                  # HELP nodus_busy Busy time \\\"on\\\" the loop.\n\
                  # TYPE nodus_busy counter\n\
                  # UNIT nodus_busy seconds\n\
                  nodus_busy_total 0.5\n\
                  # HELP nodus_up Workers up.\n\
                  # TYPE nodus_up gauge\n\
                  nodus_up 2\n\
                  # HELP nodus_build Build.\n\
                  # TYPE nodus_build info\n\
                  nodus_build_info{version=\"1\"} 1\n\
                  # HELP nodus_delay Delay.\n\
                  # TYPE nodus_delay histogram\n\
                  nodus_delay_bucket{le=\"+Inf\"} 3\n\
                  nodus_delay_sum 1.5\n\
                  nodus_delay_count 3\n\
                  # EOF\n";
        assert_eq!(
            to_classic(om),
            "# HELP nodus_polls_total Task polls.\n\
             # TYPE nodus_polls_total counter\n\
             nodus_polls_total{worker=\"1\"} 5\n\
             # HELP nodus_busy_total Busy time \"on\" the loop.\n\
             # TYPE nodus_busy_total counter\n\
             nodus_busy_total 0.5\n\
             # HELP nodus_up Workers up.\n\
             # TYPE nodus_up gauge\n\
             nodus_up 2\n\
             # HELP nodus_build_info Build.\n\
             # TYPE nodus_build_info gauge\n\
             nodus_build_info{version=\"1\"} 1\n\
             # HELP nodus_delay Delay.\n\
             # TYPE nodus_delay histogram\n\
             nodus_delay_bucket{le=\"+Inf\"} 3\n\
             nodus_delay_sum 1.5\n\
             nodus_delay_count 3\n"
        );
    }

    #[test]
    fn every_family_of_a_real_exposition_names_its_samples() {
        let classic = to_classic(&crate::metrics::prometheus::render(
            &crate::metrics::snapshot::Snapshot::default(),
        ));
        assert!(!classic.contains("# EOF") && !classic.contains("# UNIT"));
        let mut family = None;
        for line in classic.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                family = Some((name.to_owned(), kind.to_owned()));
            } else if !line.starts_with('#') {
                let (name, kind) = family.as_ref().expect("a sample after a TYPE");
                let sample = line.split(['{', ' ']).next().unwrap();
                let ok = match kind.as_str() {
                    "histogram" => ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| sample == format!("{name}{s}")),
                    _ => sample == name,
                };
                assert!(ok, "sample {sample} under family {name} ({kind})");
            }
        }
        assert!(family.is_some(), "{classic}");
    }

    #[test]
    fn openmetrics_is_chosen_only_when_preferred() {
        // Prometheus 2's and 3's default scrape_protocols.
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(prefers_openmetrics(prometheus));
        let prometheus3 = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1";
        assert!(prefers_openmetrics(prometheus3));
        assert!(prefers_openmetrics("Application/OpenMetrics-Text"));
        assert!(prefers_openmetrics("application/*"));
        assert!(!prefers_openmetrics("*/*"));
        assert!(!prefers_openmetrics("text/plain;version=0.0.4"));
        assert!(!prefers_openmetrics("application/openmetrics-text;q=0"));
        assert!(!prefers_openmetrics(
            "application/openmetrics-text;q=0, */*"
        ));
        // A scraper that puts the classic format first (scrape_protocols).
        assert!(!prefers_openmetrics(
            "text/plain;version=0.0.4;q=0.5,application/openmetrics-text;q=0.1"
        ));
        assert!(!prefers_openmetrics(
            "text/plain;version=0.0.4, application/openmetrics-text;version=1.0.0;q=0.9"
        ));
        // A tie goes to the classic format, whatever the order.
        assert!(!prefers_openmetrics(
            "application/openmetrics-text, text/plain"
        ));
        // A version nodus does not write is not what a range asks for.
        assert!(!prefers_openmetrics(
            "application/openmetrics-text;version=2.0.0"
        ));
        assert!(prefers_openmetrics(
            "application/openmetrics-text;version=2.0.0, application/openmetrics-text;q=0.2, text/plain;q=0.1"
        ));
        // The most specific range decides, not the order.
        assert!(prefers_openmetrics(
            "*/*;q=0.9, text/*;q=0.1, application/openmetrics-text;Q=\"0.5\""
        ));
        assert!(!prefers_openmetrics(
            "application/openmetrics-text;q=nonsense, text/plain;q=0.1"
        ));
    }
}
