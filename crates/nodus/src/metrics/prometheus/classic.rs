//! The Prometheus text format 0.0.4 (the classic one), rewritten from the OpenMetrics text the
//! encoder writes, for scrapers and tools that do not ask for OpenMetrics: `promtool check
//! metrics`, a plain `curl`, older agents. Prometheus itself asks for OpenMetrics
//! (`Accept: application/openmetrics-text...`) and gets it unchanged.
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

/// Whether an HTTP `Accept` header value asks for OpenMetrics (a media range
/// `application/openmetrics-text` with a non-zero `q`), as Prometheus's scrapes do.
pub fn accepts_openmetrics(accept: &str) -> bool {
    accept.split(',').any(|range| {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default();
        let refused = parts.any(|p| {
            p.strip_prefix("q=")
                .and_then(|q| q.parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
    })
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
    fn openmetrics_is_chosen_only_when_asked_for() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(accepts_openmetrics(prometheus));
        assert!(accepts_openmetrics("Application/OpenMetrics-Text"));
        assert!(!accepts_openmetrics("*/*"));
        assert!(!accepts_openmetrics("text/plain;version=0.0.4"));
        assert!(!accepts_openmetrics("application/openmetrics-text;q=0"));
    }
}
