//! One scrape of the manager's `/metrics`, read simply: `name{labels} value`
//! lines and the `# TYPE` of each family, and its samples written back as
//! the series of a promtool unit test.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// One sample of a scrape.
#[derive(Clone, Debug)]
pub struct Sample {
    pub name: String,
    /// In the order the exposition gave them.
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether every pair of `want` is one of its labels.
    pub fn has(&self, want: &[(&str, &str)]) -> bool {
        want.iter().all(|(k, v)| self.label(k) == Some(v))
    }

    /// The series in promtool's notation, `name{k="v",...}`.
    pub fn series(&self) -> String {
        let labels: Vec<String> = self
            .labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
            .collect();
        format!("{}{{{}}}", self.name, labels.join(","))
    }

    /// The upper bound of a histogram bucket.
    pub fn le(&self) -> f64 {
        let le = self.label("le").expect("a bucket has le");
        le.parse()
            .unwrap_or_else(|_| panic!("le={le:?} of {}", self.series()))
    }
}

/// A scrape and when it was taken.
pub struct Scrape {
    pub text: String,
    pub samples: Vec<Sample>,
    /// The `# TYPE` of each family.
    types: BTreeMap<String, String>,
    /// Unix seconds when it was read: promtool's time 0 stands for it.
    pub at: f64,
}

impl Scrape {
    pub fn parse(text: String) -> Scrape {
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let mut samples = Vec::new();
        let mut types = BTreeMap::new();
        for line in text.lines() {
            if let Some(t) = line.strip_prefix("# TYPE ") {
                let mut words = t.split(' ');
                if let (Some(family), Some(kind)) = (words.next(), words.next()) {
                    types.insert(family.to_string(), kind.to_string());
                }
                continue;
            }
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            samples.push(parse_line(line));
        }
        Scrape {
            text,
            samples,
            types,
            at,
        }
    }

    /// The samples named `name` with all the labels of `want`.
    pub fn find<'a>(
        &'a self,
        name: &'a str,
        want: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples
            .iter()
            .filter(move |s| s.name == name && s.has(want))
    }

    /// The value of the one sample `name` with the labels `want`.
    pub fn value(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        self.find(name, want).next().map(|s| s.value)
    }

    /// The `# TYPE` of the family a sample belongs to (`captf_jobs_total`
    /// is of `captf_jobs`, a counter).
    pub fn type_of(&self, sample: &str) -> &str {
        self.types
            .iter()
            .filter(|(family, _)| {
                sample
                    .strip_prefix(family.as_str())
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('_'))
            })
            .max_by_key(|(family, _)| family.len())
            .map(|(_, t)| t.as_str())
            .unwrap_or_else(|| panic!("no # TYPE for {sample}"))
    }

    /// Only the lines of the families whose names contain `part`, for a
    /// failure message.
    pub fn lines_of(&self, part: &str) -> String {
        self.text
            .lines()
            .filter(|l| l.contains(part))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// `name{k="v",...} value` (OpenMetrics may add a timestamp or exemplar
/// after the value; the manager writes neither, and they are ignored).
fn parse_line(line: &str) -> Sample {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => panic!("a sample line without a value: {line}"),
    };
    let mut labels = Vec::new();
    let mut rest = rest;
    if let Some(mut inner) = rest.strip_prefix('{') {
        loop {
            if let Some(after) = inner.strip_prefix('}') {
                rest = after;
                break;
            }
            inner = inner.trim_start_matches(',');
            let eq = inner.find("=\"").unwrap_or_else(|| panic!("{line}"));
            let key = inner[..eq].to_string();
            let mut value = String::new();
            let mut chars = inner[eq + 2..].char_indices();
            let end = loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, c)) => value.push(c),
                        None => panic!("{line}"),
                    },
                    Some((i, '"')) => break i,
                    Some((_, c)) => value.push(c),
                    None => panic!("an unterminated label value: {line}"),
                }
            };
            labels.push((key, value));
            inner = &inner[eq + 2 + end + 1..];
        }
    }
    let value = rest
        .split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("no value: {line}"));
    Sample {
        name: name.to_string(),
        labels,
        value: value
            .parse()
            .unwrap_or_else(|_| panic!("value {value:?}: {line}")),
    }
}

/// A number as promtool's series notation takes it.
pub fn num(v: f64) -> String {
    assert!(v.is_finite(), "{v}");
    format!("{v}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read() {
        let s = Scrape::parse(
            "# TYPE captf_jobs counter\n\
             captf_jobs_total{kind=\"TerraformMachine\",op=\"apply\",result=\"failed\"} 3\n\
             # TYPE captf_job_duration_seconds histogram\n\
             captf_job_duration_seconds_bucket{kind=\"TerraformCluster\",le=\"+Inf\"} 2\n\
             build_info{v=\"a\\\"b\"} 1.5\n\
             # EOF\n"
                .to_string(),
        );
        assert_eq!(s.samples.len(), 3);
        assert_eq!(
            s.value("captf_jobs_total", &[("result", "failed")]),
            Some(3.0)
        );
        assert_eq!(s.type_of("captf_jobs_total"), "counter");
        assert_eq!(s.type_of("captf_job_duration_seconds_bucket"), "histogram");
        assert_eq!(s.samples[1].le(), f64::INFINITY);
        assert_eq!(s.samples[2].label("v"), Some("a\"b"));
        assert_eq!(s.samples[2].series(), "build_info{v=\"a\\\"b\"}");
    }
}
