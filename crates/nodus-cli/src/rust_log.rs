//! The log filter from `RUST_LOG`, and the one WARN line at the start about a value that is
//! likely a mistake.
//!
//! - A value that does not parse (or is not UTF-8) is `info`, said with the value and why.
//! - White space around each directive is taken off (`EnvFilter` would take `info, nodus=debug`
//!   for the level `info` and a target ` nodus`).
//! - A value that parses is the filter as written (`--access-log`'s target added unless it names
//!   it). Two mistakes are said, in one line: a bare word that is no level but within two edits
//!   of one (`infoo`, which `EnvFilter` takes for the target `infoo` at TRACE: did you mean
//!   `info`?), and a filter under which nodus logs nothing, not even errors, because no directive
//!   covers its targets (`hyper=debug` alone). Silence asked for is not said: a level for every
//!   target (`off`), or a directive for nodus's targets (`nodus=off`). That line's target,
//!   [`TARGET`], is given a directive of its own so that the filter it warns about lets it through.
//!
//! Whether nodus logs anything is asked of the filter itself (`EnvFilter`'s own matching, not a
//! copy of it): an event at ERROR of each of nodus's target roots (`nodus`, `nodus_http`) and of
//! each target under them that the value names. nodus opens no span, so a span directive
//! (`[name]=info`) lets none of its events through, and the question has one answer per target.

use tracing::level_filters::LevelFilter;
use tracing::{Level, Metadata};
use tracing_core::callsite::{Callsite, Identifier};
use tracing_core::field::FieldSet;
use tracing_core::metadata::Kind;
use tracing_core::subscriber::Interest;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;

/// The target of the WARN line about `RUST_LOG`.
pub const TARGET: &str = "nodus::rust_log";

/// The roots of every target nodus logs under: its explicit ones (`nodus::cluster`, ...) and
/// module paths (`nodus::serve::app`, `nodus_http::server`).
const ROOTS: [&str; 2] = ["nodus", "nodus_http"];

/// The level names a bare word is compared with.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// The log lines written: `RUST_LOG`'s directives (`info` without it, empty, or when they do
/// not parse), and with `--access-log` the access log (target `nodus::access`, INFO) whatever they
/// say, unless they name that target themselves: `RUST_LOG=warn` alone would silence it. Also the
/// line to log at WARN (target [`TARGET`]) once logging is set up, if the value is likely a
/// mistake: one that does not parse (or is not UTF-8), with the value and why, so a typo is not
/// mistaken for a quiet service, or one that parses but is likely not what was meant
/// ([`parsed_mistakes`]).
pub fn log_filter(
    rust_log: Option<&std::ffi::OsStr>,
    access_log: bool,
) -> (EnvFilter, Option<String>) {
    let info = || EnvFilter::new("info");
    // Empty is unset (`Environment=RUST_LOG=`): no directive at all would silence every line.
    let rust_log = rust_log.filter(|v| !v.as_encoded_bytes().trim_ascii().is_empty());
    let rust_log = rust_log.map(|v| v.to_str().map(trim_directives).ok_or(v));
    let (filter, names_access, warning) = match rust_log {
        None => (info(), false, None),
        Some(Ok(value)) => match EnvFilter::try_new(&value) {
            Ok(filter) => match parsed_mistakes(&value) {
                Some(why) => {
                    let own = format!("{TARGET}=warn").parse().expect("a valid directive");
                    (
                        filter.add_directive(own),
                        names_access_log(&value),
                        Some(why),
                    )
                }
                None => (filter, names_access_log(&value), None),
            },
            Err(e) => (
                info(),
                false,
                Some(format!(
                    "RUST_LOG={value:?} does not parse ({e}): logging at info instead"
                )),
            ),
        },
        Some(Err(raw)) => (
            info(),
            false,
            Some(format!(
                "RUST_LOG={raw:?} is not UTF-8: logging at info instead"
            )),
        ),
    };
    let filter = if access_log && !names_access {
        filter.add_directive("nodus::access=info".parse().expect("a valid directive"))
    } else {
        filter
    };
    (filter, warning)
}

/// `value` with the white space around each directive taken off: `EnvFilter` keeps it, so
/// `info, nodus=debug` (a common way to write it) would make ` nodus` a target that matches
/// nothing and leave nodus at `info`.
fn trim_directives(value: &str) -> String {
    value
        .split(',')
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether a `RUST_LOG` value has a directive for the access log's target itself
/// (`nodus::access=off`, `nodus::access[...]=debug`), not through a level for every target or
/// a shorter prefix (`warn`, `nodus=warn`).
fn names_access_log(rust_log: &str) -> bool {
    rust_log.split(',').any(|directive| {
        let target = directive.split(['[', '=']).next().unwrap_or_default();
        target.trim() == "nodus::access"
    })
}

/// What is likely a mistake in a `RUST_LOG` value that parses, said in one line: its bare words
/// within two edits of a level (taken for targets), and whether nodus logs nothing under it, not
/// even errors, for want of a directive that covers its targets. `None` when neither.
fn parsed_mistakes(value: &str) -> Option<String> {
    // Split as `EnvFilter` splits: a bare word with spaces around it (`info, hyper=warn` is
    // fine, `hyper=warn, info` is not) is no level to it but a target, spaces included.
    let directives: Vec<&str> = value.split(',').filter(|d| !d.is_empty()).collect();
    let bare = || {
        directives
            .iter()
            .filter(|d| !d.contains(['=', '[']))
            .map(|d| (*d, d.parse::<LevelFilter>().is_ok()))
    };
    let mut said: Vec<String> = bare()
        .filter(|&(_, level)| !level)
        .filter_map(|(word, _)| {
            let level = near_level(word.trim())?;
            Some(format!(
                "{word:?} is a target, not a level (did you mean {level:?}?)"
            ))
        })
        .collect();
    // A bare level is every target's: one that leaves nodus nothing (`off`), or leaves it to more
    // specific directives that silence it (`nodus=off,info`), was asked for.
    if !bare().any(|(_, level)| level) {
        // Targets under nodus's roots that the value names (`nodus::cluster=error` alone logs).
        let named: Vec<&str> = directives
            .iter()
            .map(|d| d.split(['[', '=']).next().unwrap_or_default().trim())
            .filter(|t| ROOTS.iter().any(|root| t.starts_with(root)))
            .collect();
        let silent = |filter: &EnvFilter| {
            !ROOTS
                .iter()
                .chain(&named)
                .any(|target| logs_error(filter, target))
        };
        // Silence that an ERROR for every other target ends is for want of a directive; silence
        // it leaves is the value's own directives for nodus's targets (`nodus=off,hyper=debug`).
        let filter = EnvFilter::try_new(value).ok()?;
        if silent(&filter) && !silent(&filter.add_directive(LevelFilter::ERROR.into())) {
            said.push(
                "nodus logs nothing under it, not even errors: no directive covers its targets \
                 (nodus, nodus_http)"
                    .to_owned(),
            );
        }
    }
    (!said.is_empty()).then(|| format!("RUST_LOG={value:?}: {}", said.join("; ")))
}

/// The level `word` is likely a typo of: the nearest within two edits (case aside).
fn near_level(word: &str) -> Option<&'static str> {
    let word = word.to_ascii_lowercase();
    LEVELS
        .into_iter()
        .map(|level| (edit_distance(&word, level), level))
        .filter(|&(d, _)| d <= 2)
        .min_by_key(|&(d, _)| d)
        .map(|(_, level)| level)
}

/// Levenshtein distance (insertions, deletions, substitutions) between `a` and `b`, by chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// Whether `filter` writes an event at ERROR of target `target` (outside any span: nodus opens
/// none).
fn logs_error(filter: &EnvFilter, target: &str) -> bool {
    let subscriber = tracing_subscriber::registry().with(filter.clone());
    tracing::Subscriber::enabled(&subscriber, &probe_event(target))
}

/// An ERROR event of `target` at the [`Probe`] callsite.
const fn probe_event(target: &str) -> Metadata<'_> {
    Metadata::new(
        "probe",
        target,
        Level::ERROR,
        None,
        None,
        None,
        FieldSet::new(&[], Identifier(&PROBE)),
        Kind::EVENT,
    )
}

/// The callsite [`logs_error`]'s events name: they are asked about, never recorded.
struct Probe;

static PROBE: Probe = Probe;

static PROBE_METADATA: Metadata<'static> = probe_event("nodus");

impl Callsite for Probe {
    fn set_interest(&self, _: Interest) {}

    fn metadata(&self) -> &Metadata<'_> {
        &PROBE_METADATA
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    use super::{edit_distance, log_filter, names_access_log, parsed_mistakes};

    #[test]
    fn a_rust_log_that_does_not_parse_is_info_and_said_with_its_value_and_why() {
        let (filter, why) = log_filter(Some(OsStr::new("info,nodus=loud")), false);
        assert_eq!(filter.to_string(), "info");
        let why = why.expect("a warning");
        assert!(
            why.starts_with(r#"RUST_LOG="info,nodus=loud" does not parse ("#),
            "{why}"
        );
        assert!(why.contains("level"), "the parse error: {why}");
        assert!(why.ends_with("logging at info instead"), "{why}");
        // The access log is still written (info covers it, and it is asked for).
        let (filter, _) = log_filter(Some(OsStr::new("nodus::access=off,[")), true);
        assert_eq!(filter.to_string(), "nodus::access=info,info");
        let (filter, why) = log_filter(Some(OsStr::from_bytes(b"warn\xff")), false);
        assert_eq!(filter.to_string(), "info");
        assert!(why.unwrap().contains("is not UTF-8"));
    }

    #[test]
    fn a_rust_log_that_parses_or_none_is_not_warned_about() {
        for value in [
            None,
            Some(""),
            Some(" "),
            Some("warn"),
            Some("nodus::cluster=debug,info"),
        ] {
            let (filter, why) = log_filter(value.map(OsStr::new), false);
            assert_eq!(why, None, "{value:?}");
            let expected = value.filter(|v| !v.trim().is_empty()).unwrap_or("info");
            assert_eq!(filter.to_string(), expected);
        }
        let (filter, _) = log_filter(Some(OsStr::new("warn")), true);
        assert_eq!(filter.to_string(), "nodus::access=info,warn");
        let (filter, _) = log_filter(Some(OsStr::new("warn,nodus::access=off")), true);
        assert_eq!(filter.to_string(), "nodus::access=off,warn");
    }

    #[test]
    fn only_a_directive_for_the_access_log_target_names_it() {
        assert!(names_access_log("nodus::access=off"));
        assert!(names_access_log("warn, nodus::access = debug"));
        assert!(names_access_log("nodus::access[conn]=info"));
        assert!(!names_access_log("warn"));
        assert!(!names_access_log("nodus=warn,nodus::cluster=debug"));
        assert!(!names_access_log("nodus::accessory=off"));
    }

    #[test]
    fn a_bare_word_near_a_level_is_said_with_the_level_it_is_likely_a_typo_of() {
        for (value, word, level) in [
            ("infoo", "infoo", "info"),
            ("wran", "wran", "warn"),
            ("debgu", "debgu", "debug"),
            ("hyper=warn,Eror", "Eror", "error"),
            // nodus logs at info here: the typo alone is said.
            ("info,trce", "trce", "trace"),
        ] {
            let why = parsed_mistakes(value).unwrap_or_else(|| panic!("{value}: no warning"));
            let said = format!("{word:?} is a target, not a level (did you mean {level:?}?)");
            assert!(why.starts_with(&format!("RUST_LOG={value:?}: ")), "{why}");
            assert!(why.contains(&said), "{value}: {why}");
        }
        // The filter stays the value's, with the warning's own target let through.
        let (filter, why) = log_filter(Some(OsStr::new("infoo")), false);
        assert!(why.is_some());
        assert_eq!(filter.to_string(), "nodus::rust_log=warn,infoo=trace");
    }

    #[test]
    fn spaces_around_directives_are_taken_off_so_they_mean_what_they_say() {
        // EnvFilter itself keeps them: " info" would be a target, leaving nodus silent.
        let raw = tracing_subscriber::EnvFilter::try_new("hyper=warn, info").unwrap();
        assert!(raw.to_string().contains(" info=trace"), "{raw}");
        for (value, expected) in [
            ("hyper=warn, info", "hyper=warn,info"),
            (" info , nodus=debug ", "nodus=debug,info"),
        ] {
            let (filter, why) = log_filter(Some(OsStr::new(value)), false);
            assert_eq!(why, None, "{value:?}");
            assert_eq!(filter.to_string(), expected, "{value:?}");
        }
    }

    #[test]
    fn a_filter_that_leaves_nodus_nothing_for_want_of_a_directive_is_said() {
        for value in [
            "infoo",
            "hyper=debug",
            "hyper=off",
            "nodus_http=off,hyper=info",
            "[conn]=info",
        ] {
            let why = parsed_mistakes(value).unwrap_or_else(|| panic!("{value}: no warning"));
            assert!(
                why.contains("nodus logs nothing under it, not even errors"),
                "{value}: {why}"
            );
        }
        let why = parsed_mistakes("info,trce").unwrap();
        assert!(!why.contains("nodus logs nothing"), "{why}");
    }

    #[test]
    fn legitimate_values_and_silence_asked_for_are_not_said() {
        for value in [
            "info",
            "INFO",
            "nodus=debug",
            "hyper=warn,info",
            "off",
            "0",
            "error",
            "nodus=off",
            "nodus=off,nodus_http=off,hyper=debug",
            "nodus=off,info",
            "nodus::cluster=error",
            "nodus::process::reaper=debug",
            "nodus_http=info",
            "warn,hyper",
            "mio",
        ] {
            let said = parsed_mistakes(value);
            // `mio` alone leaves nodus nothing: said, but as silence, not as a typo.
            if value == "mio" {
                assert!(!said.unwrap().contains("did you mean"));
                continue;
            }
            assert_eq!(said, None, "{value}");
        }
    }

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("info", "info"), 0);
        assert_eq!(edit_distance("infoo", "info"), 1);
        assert_eq!(edit_distance("wran", "warn"), 2);
        assert_eq!(edit_distance("debgu", "debug"), 2);
        assert_eq!(edit_distance("", "off"), 3);
        assert_eq!(edit_distance("hyper", "error"), 4);
    }
}
