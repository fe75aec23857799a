//! A Prometheus exposition read as a scraper reads it: a family's type from its `# TYPE` line,
//! and a sample's series, each with its labels (in their order, values unescaped) and value;
//! and whether every family named after a unit has its `# UNIT` line (`unit_mistakes`).
//! Both the OpenMetrics and the classic text format parse; timestamps and exemplars, which nodus
//! never writes, do not.

/// One series of a sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// The type `# TYPE` gives `family` (`counter`, `gauge`, ...) in `text`, if it has that line.
pub fn family_type(text: &str, family: &str) -> Option<String> {
    text.lines()
        .find_map(|l| {
            l.strip_prefix("# TYPE ")?
                .strip_prefix(family)?
                .strip_prefix(' ')
        })
        .map(str::to_owned)
}

/// Every series of the sample named `sample` in `text` (`x_total` for a counter family `x`),
/// in the order written.
///
/// # Panics
/// On a line of that sample that does not parse.
pub fn series(text: &str, sample: &str) -> Vec<Series> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(sample)?;
            rest.starts_with(['{', ' ']).then_some(rest)
        })
        .map(|rest| parse(rest).unwrap_or_else(|| panic!("a bad sample line: {sample}{rest}")))
        .collect()
}

/// The one series of `sample` whose labels are exactly `labels`, if there is one.
pub fn find(text: &str, sample: &str, labels: &[(&str, &str)]) -> Option<Series> {
    series(text, sample).into_iter().find(|s| {
        s.labels.len() == labels.len()
            && s.labels
                .iter()
                .zip(labels)
                .all(|(a, b)| a.0 == b.0 && a.1 == b.1)
    })
}

/// The units a family name may end in (OpenMetrics' base units, and prometheus-client's).
pub const UNITS: [&str; 9] = [
    "seconds", "bytes", "meters", "grams", "amperes", "volts", "joules", "celsius", "ratios",
];

/// What an OpenMetrics `text` says wrong about units, one line each: a family (a `# TYPE` line)
/// whose name ends in `_UNIT` (one of [`UNITS`]) without its `# UNIT NAME UNIT` line, and a
/// `# UNIT` line whose unit is not its family's suffix. Empty when all is right.
pub fn unit_mistakes(text: &str) -> Vec<String> {
    let said: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# UNIT ")?.split_once(' '))
        .collect();
    let mut wrong: Vec<String> = said
        .iter()
        .filter(|(family, unit)| !family.ends_with(&format!("_{unit}")))
        .map(|(family, unit)| format!("{family}: `# UNIT {unit}` is not its suffix"))
        .collect();
    for family in text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
    {
        if let Some(unit) = UNITS.iter().find(|u| family.ends_with(&format!("_{u}")))
            && !said.contains(&(family, unit))
        {
            wrong.push(format!("{family}: no `# UNIT {family} {unit}` line"));
        }
    }
    wrong
}

/// `{name="value",...} VALUE` (labels optional) after the sample name.
fn parse(rest: &str) -> Option<Series> {
    let mut labels = Vec::new();
    let mut rest = rest;
    if let Some(mut set) = rest.strip_prefix('{') {
        loop {
            if let Some(after) = set.strip_prefix('}') {
                rest = after;
                break;
            }
            let (name, after) = set.split_once("=\"")?;
            let mut value = String::new();
            let mut chars = after.char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    (_, c) => value.push(c),
                }
            };
            labels.push((name.to_owned(), value));
            set = after[end + 1..]
                .strip_prefix(',')
                .unwrap_or(&after[end + 1..]);
        }
    }
    let value = rest.trim().parse().ok()?;
    Some(Series { labels, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# TYPE a counter\n\
        a_total 3\n\
        # TYPE b gauge\n\
        b{worker=\"1\",pid=\"7\"} 0.5\n\
        b{worker=\"2\",task=\"x\\\"y,z\\\\\"} 1.0\n\
        bb 9\n";

    #[test]
    fn reads_types_and_series() {
        assert_eq!(family_type(TEXT, "a").as_deref(), Some("counter"));
        assert_eq!(family_type(TEXT, "b").as_deref(), Some("gauge"));
        assert_eq!(family_type(TEXT, "c"), None);
        assert_eq!(series(TEXT, "a_total")[0].value, 3.0);
        assert_eq!(series(TEXT, "b").len(), 2, "bb is another sample");
        let one = find(TEXT, "b", &[("worker", "1"), ("pid", "7")]).unwrap();
        assert_eq!(one.value, 0.5);
        let two = find(TEXT, "b", &[("worker", "2"), ("task", "x\"y,z\\")]).unwrap();
        assert_eq!(two.value, 1.0);
        assert_eq!(find(TEXT, "b", &[("worker", "1")]), None);
    }

    #[test]
    fn a_family_named_after_a_unit_needs_its_unit_line() {
        let right = "# TYPE a_seconds gauge\n# UNIT a_seconds seconds\n# TYPE b counter\n";
        assert_eq!(unit_mistakes(right), Vec::<String>::new());
        let missing = "# TYPE c_bytes counter\nc_bytes_total 1\n# TYPE d_seconds gauge\n";
        assert_eq!(
            unit_mistakes(missing),
            [
                "c_bytes: no `# UNIT c_bytes bytes` line",
                "d_seconds: no `# UNIT d_seconds seconds` line"
            ]
        );
        let other = "# TYPE e_seconds gauge\n# UNIT e_seconds bytes\n";
        assert_eq!(unit_mistakes(other).len(), 2, "{:?}", unit_mistakes(other));
    }
}
