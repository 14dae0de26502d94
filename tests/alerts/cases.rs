//! The promtool unit tests of the shipped alerts, built from real scrapes.
//!
//! Every input series is a sample of a scrape, with its name and labels as
//! the manager exported them. Only its evolution is synthesized, from the
//! scraped value, as the comment of each case says; promtool's time 0
//! stands for the moment of the scrape and its samples are a minute apart.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::scrape::{Sample, Scrape, num};

pub const CLUSTER: &str = "TerraformCluster";
pub const MACHINE: &str = "TerraformMachine";

/// The alerting rules of config/prometheus/rules.yaml.
pub struct Rules(pub Vec<Value>);

impl Rules {
    fn rule(&self, alert: &str) -> &Value {
        self.0
            .iter()
            .find(|r| r["alert"] == alert)
            .unwrap_or_else(|| panic!("no alert {alert} in the rules file"))
    }

    pub fn names(&self) -> Vec<String> {
        self.0
            .iter()
            .map(|r| r["alert"].as_str().unwrap().to_string())
            .collect()
    }

    /// The metric names the expressions read (as `every_alert_uses_a_registered_family`
    /// in src/metrics finds them).
    pub fn metrics_read(&self) -> BTreeSet<String> {
        self.0
            .iter()
            .flat_map(|r| {
                r["expr"]
                    .as_str()
                    .unwrap()
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| w.starts_with("captf_") || w.starts_with("controller_runtime_"))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The alert promtool should report for `alert` with the series'
    /// labels `labels`: those, the rule's own labels, and its annotations
    /// expanded with them.
    fn expected(&self, alert: &str, labels: &[(&str, String)]) -> Value {
        let rule = self.rule(alert);
        let mut all = serde_json::Map::new();
        for (k, v) in labels {
            all.insert(k.to_string(), json!(v));
        }
        for (k, v) in rule["labels"].as_object().into_iter().flatten() {
            all.insert(k.clone(), v.clone());
        }
        let annotations: serde_json::Map<String, Value> = rule["annotations"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), json!(expand(v.as_str().unwrap(), labels))))
            .collect();
        json!({"exp_labels": all, "exp_annotations": annotations})
    }
}

/// A template with `{{ $labels.x }}` only, as the shipped annotations are.
fn expand(template: &str, labels: &[(&str, String)]) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find("{{") {
        out.push_str(&rest[..open]);
        let close = rest[open..].find("}}").expect("a closed {{") + open;
        let inner = rest[open + 2..close].trim();
        let key = inner
            .strip_prefix("$labels.")
            .unwrap_or_else(|| panic!("only $labels in annotations: {template}"));
        let value = labels
            .iter()
            .find(|(k, _)| *k == key)
            .unwrap_or_else(|| panic!("{template} names {key}, not an expected label"));
        out.push_str(&value.1);
        rest = &rest[close + 2..];
    }
    out.push_str(rest);
    out
}

/// One alert's unit test: its input series, a time before `for:` has
/// elapsed (or before the situation) when it must be silent, and a time
/// when it must fire with `labels`.
pub struct Case {
    pub alert: &'static str,
    pub series: Vec<(String, String)>,
    pub quiet_at: &'static str,
    pub fires_at: &'static str,
    pub labels: Vec<(&'static str, String)>,
}

impl Case {
    pub fn document(&self, rules: &Rules) -> Value {
        json!({
            "rule_files": ["rules.yaml"],
            "evaluation_interval": "1m",
            "tests": [{
                "name": self.alert,
                "interval": "1m",
                "input_series": input(&self.series),
                "alert_rule_test": [
                    {"eval_time": self.quiet_at, "alertname": self.alert, "exp_alerts": []},
                    {"eval_time": self.fires_at, "alertname": self.alert,
                     "exp_alerts": [rules.expected(self.alert, &self.labels)]},
                ],
            }],
        })
    }
}

fn input(series: &[(String, String)]) -> Vec<Value> {
    series
        .iter()
        .map(|(s, v)| json!({"series": s, "values": v}))
        .collect()
}

/// `v` for `n` more minutes.
fn held(v: f64, n: u32) -> String {
    format!("{}x{n}", num(v))
}

/// 0 for five minutes (before the situation; a counter starts at 0), then
/// `v` for `n` minutes.
fn from_zero(v: f64, n: u32) -> String {
    format!("0x4 {}x{n}", num(v))
}

/// Every sample `name` of `scrape`: those with the labels `pick` evolve
/// by `picked`, the others by `rest`. At least one must be picked.
fn family(
    scrape: &Scrape,
    name: &str,
    pick: &[(&str, &str)],
    picked: impl Fn(&Sample) -> String,
    rest: impl Fn(&Sample) -> String,
) -> Vec<(String, String)> {
    let all: Vec<&Sample> = scrape.find(name, &[]).collect();
    assert!(
        all.iter().any(|s| s.has(pick)),
        "the scrape has no {name} with {pick:?}:\n{}",
        scrape.lines_of(name)
    );
    all.iter()
        .map(|s| {
            let values = if s.has(pick) { picked(s) } else { rest(s) };
            (s.series(), values)
        })
        .collect()
}

/// The eleven cases, from the scrape taken when every situation was in
/// place in namespace `ns`.
pub fn cases(bad: &Scrape, ns: &str) -> Vec<Case> {
    let obj = |kind: &str, name: &str| {
        vec![
            ("kind", kind.to_string()),
            ("namespace", ns.to_string()),
            ("name", name.to_string()),
        ]
    };
    let kind_op = |kind: &str, op: &str| vec![("kind", kind.to_string()), ("op", op.to_string())];
    let apply = [("kind", MACHINE), ("op", "apply")];
    vec![
        Case {
            alert: "CAPTFJobFailing",
            // The failing machines' failed applies, as scraped from minute 5
            // on; every other Job count stays as scraped (no more Jobs end).
            series: family(
                bad,
                "captf_jobs_total",
                &[("kind", MACHINE), ("op", "apply"), ("result", "failed")],
                |s| from_zero(s.value, 30),
                |s| held(s.value, 34),
            ),
            quiet_at: "3m",
            fires_at: "10m",
            labels: kind_op(MACHINE, "apply"),
        },
        Case {
            alert: "CAPTFDestroyStuck",
            // The failed destroys as scraped, then one more failure every
            // 10 minutes (the retry backoff's cap) for 80 minutes.
            series: family(
                bad,
                "captf_jobs_total",
                &[("kind", MACHINE), ("op", "destroy"), ("result", "failed")],
                |s| {
                    (0..8)
                        .map(|k| format!("{}x9", num(s.value + f64::from(k))))
                        .collect::<Vec<_>>()
                        .join(" ")
                },
                |s| held(s.value, 79),
            ),
            quiet_at: "30m",
            fires_at: "60m",
            labels: vec![("kind", MACHINE.to_string())],
        },
        Case {
            alert: "CAPTFClusterDrift",
            // Every drift gauge held as scraped for 80 minutes: the drift
            // of cluster c is neither remediated nor resolved.
            series: family(
                bad,
                "captf_drift_detected",
                &[("kind", CLUSTER), ("name", "c")],
                |s| held(s.value, 80),
                |s| held(s.value, 80),
            ),
            quiet_at: "30m",
            fires_at: "70m",
            labels: obj(CLUSTER, "c"),
        },
        Case {
            alert: "CAPTFStateUnreadable",
            // The read error of the corrupt state, as scraped from minute 5.
            series: family(
                bad,
                "captf_state_read_errors_total",
                &[("kind", MACHINE), ("reason", "corrupt")],
                |s| from_zero(s.value, 30),
                |s| held(s.value, 34),
            ),
            quiet_at: "3m",
            fires_at: "10m",
            labels: vec![
                ("kind", MACHINE.to_string()),
                ("reason", "corrupt".to_string()),
            ],
        },
        Case {
            alert: "CAPTFForceUnlocks",
            // The force-unlock of the stale lock, as scraped from minute 5.
            series: family(
                bad,
                "captf_lock_force_unlocks_total",
                &[("kind", MACHINE)],
                |s| from_zero(s.value, 30),
                |s| held(s.value, 34),
            ),
            quiet_at: "3m",
            fires_at: "10m",
            labels: vec![("kind", MACHINE.to_string())],
        },
        reconcile_errors(bad),
        Case {
            alert: "CAPTFJobSlow",
            // The machine applies' duration buckets as scraped; from then
            // on a 40-minute apply ends every minute: the buckets above
            // 1800 s (le 2700 and up, +Inf) grow by one, the others hold.
            series: family(
                bad,
                "captf_job_duration_seconds_bucket",
                &[("kind", MACHINE), ("op", "apply"), ("result", "succeeded")],
                |s| grow_above(s, 1800.0, 50),
                |s| held(s.value, 50),
            ),
            quiet_at: "20m",
            fires_at: "40m",
            labels: kind_op(MACHINE, "apply"),
        },
        Case {
            alert: "CAPTFJobQueueSlow",
            // The machine applies' queue buckets as scraped; from then on
            // an apply that waited 10 minutes starts every minute: the
            // buckets above 300 s grow by one, the others hold.
            series: family(
                bad,
                "captf_job_queue_seconds_bucket",
                &apply,
                |s| grow_above(s, 300.0, 30),
                |s| held(s.value, 30),
            ),
            quiet_at: "5m",
            fires_at: "20m",
            labels: kind_op(MACHINE, "apply"),
        },
        Case {
            alert: "CAPTFStateNearSecretLimit",
            // Real sizes: machine big's state was written 940 KiB large.
            // Every gauge held as scraped.
            series: family(
                bad,
                "captf_state_bytes",
                &[("kind", MACHINE), ("name", "big")],
                |s| held(s.value, 30),
                |s| held(s.value, 30),
            ),
            quiet_at: "10m",
            fires_at: "20m",
            labels: obj(MACHINE, "big"),
        },
        Case {
            alert: "CAPTFInputsNearLimit",
            // Real sizes: machine big has a 950,000-character variable.
            // Every gauge held as scraped.
            series: family(
                bad,
                "captf_inputs_bytes",
                &[("kind", MACHINE), ("name", "big")],
                |s| held(s.value, 30),
                |s| held(s.value, 30),
            ),
            quiet_at: "10m",
            fires_at: "20m",
            labels: obj(MACHINE, "big"),
        },
        Case {
            alert: "CAPTFNoRecentSuccess",
            // Cluster c's last drift success as scraped (a Unix time made
            // relative to the scrape), never renewed for 6 h 50 m; the other
            // objects' drift and refresh checks keep succeeding (their time
            // advances with the clock), other ops hold.
            series: family(
                bad,
                "captf_last_success_timestamp_seconds",
                &[("kind", CLUSTER), ("name", "c"), ("op", "drift")],
                |s| held(s.value - bad.at, 410),
                |s| last_success(s, bad.at, 410),
            ),
            quiet_at: "6h15m",
            fires_at: "6h45m",
            labels: {
                let mut l = obj(CLUSTER, "c");
                l.push(("op", "drift".to_string()));
                l
            },
        },
    ]
}

/// A bucket that grows by one a minute when its bound is above `bound`.
fn grow_above(s: &Sample, bound: f64, n: u32) -> String {
    if s.le() > bound {
        format!("{}+1x{n}", num(s.value))
    } else {
        held(s.value, n)
    }
}

/// A success time relative to the scrape at `at`, advancing with the clock
/// for the ops checked on a schedule, held for the others.
fn last_success(s: &Sample, at: f64, n: u32) -> String {
    let relative = s.value - at;
    match s.label("op") {
        Some("drift" | "refresh") => format!("{}+60x{n}", num(relative)),
        _ => held(relative, n),
    }
}

/// The machine reconciler failing 12 times a minute (0.2/s) from the
/// scrape on. Its error counter as scraped, or, when no reconcile of it
/// failed yet (controller-runtime's counter appears with the first error),
/// the label set of its `controller_runtime_reconcile_total` series (the
/// same `controller` label, without `result`) starting at 0.
fn reconcile_errors(bad: &Scrape) -> Case {
    let name = "controller_runtime_reconcile_errors_total";
    let controller = [("controller", "terraformmachine")];
    let errors = match bad.find(name, &controller).next() {
        Some(s) => s.clone(),
        None => {
            let total = bad
                .find("controller_runtime_reconcile_total", &controller)
                .next()
                .unwrap_or_else(|| {
                    panic!(
                        "no reconcile of the machines:\n{}",
                        bad.lines_of("controller_runtime")
                    )
                });
            Sample {
                name: name.to_string(),
                labels: total
                    .labels
                    .iter()
                    .filter(|(k, _)| k != "result")
                    .cloned()
                    .collect(),
                value: 0.0,
            }
        }
    };
    let mut series = vec![(errors.series(), format!("{}+12x40", num(errors.value)))];
    series.extend(
        bad.find(name, &[])
            .filter(|s| !s.has(&controller))
            .map(|s| (s.series(), held(s.value, 40))),
    );
    Case {
        alert: "CAPTFReconcileErrors",
        series,
        quiet_at: "5m",
        fires_at: "20m",
        labels: vec![("controller", "terraformmachine".to_string())],
    }
}

/// The healthy manager's test: every series the rules read, from the
/// scrape taken before anything went wrong, for 7 h 10 m. The manager
/// keeps its pace: each counter and histogram bucket gains its scraped
/// value again every 10 minutes, the scheduled checks keep succeeding,
/// other gauges hold. No alert fires at any of the times checked.
pub fn healthy(scrape: &Scrape, rules: &Rules) -> Value {
    let n = 430;
    let mut series = Vec::new();
    for name in rules.metrics_read() {
        for s in scrape.find(&name, &[]) {
            let values = if name == "captf_last_success_timestamp_seconds" {
                last_success(s, scrape.at, n)
            } else {
                match scrape.type_of(&s.name) {
                    "counter" | "histogram" => {
                        format!("{}+{}x{n}", num(s.value), num(s.value / 10.0))
                    }
                    _ => held(s.value, n),
                }
            };
            series.push((s.series(), values));
        }
    }
    let checks: Vec<Value> = ["15m", "2h", "7h"]
        .iter()
        .flat_map(|at| {
            rules
                .names()
                .into_iter()
                .map(move |alert| json!({"eval_time": at, "alertname": alert, "exp_alerts": []}))
        })
        .collect();
    json!({
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "name": "healthy",
            "interval": "1m",
            "input_series": input(&series),
            "alert_rule_test": checks,
        }],
    })
}
