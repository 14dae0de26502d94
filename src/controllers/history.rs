//! Job history (ref §1.2): of each op's finished and accounted Jobs, an
//! object keeps the newest `successfulJobsHistoryLimit` that succeeded and
//! the newest `failedJobsHistoryLimit` that did not; the rest are deleted
//! with their pods. The newest success of an op is always kept, and so is
//! its newest failure while no newer success exists: the next decision
//! reads them (ref §8.4). An active Job, or one this manager has not
//! accounted yet, is never pruned. Pure.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::ledger::{self, Outcome};
use crate::names::Op;

/// A Job that may be pruned.
struct Kept<'a> {
    name: &'a str,
    at: Timestamp,
    attempt: u32,
    succeeded: bool,
}

/// The names of the Jobs in `namespace` that fall out of the history.
pub fn prune(
    jobs: &[Job],
    namespace: &str,
    successful_limit: i32,
    failed_limit: i32,
) -> Vec<String> {
    let limit = |n: i32| usize::try_from(n).unwrap_or(0);
    let mut pruned = Vec::new();
    for op in Op::ALL {
        let mut finished: Vec<Kept> = jobs
            .iter()
            .filter(|j| j.namespace().as_deref() == Some(namespace))
            .filter(|j| ledger::op(j) == Some(op))
            .filter_map(|j| {
                let end = ledger::job_end(j)?;
                let outcome = ledger::bookkept(j)?;
                Some(Kept {
                    name: j.metadata.name.as_deref()?,
                    at: end.at,
                    attempt: ledger::attempt(j),
                    succeeded: outcome == Outcome::Succeeded,
                })
            })
            .collect();
        // Newest first; ends within one second are told apart by attempt.
        finished.sort_by_key(|k| std::cmp::Reverse((k.at, k.attempt)));
        let newest_success = finished.iter().find(|k| k.succeeded).map(|k| k.at);
        let (mut successes, mut failures) = (0, 0);
        for k in &finished {
            let keep = match k.succeeded {
                true => {
                    successes += 1;
                    successes <= limit(successful_limit).max(1)
                }
                false => {
                    failures += 1;
                    failures <= limit(failed_limit)
                        || (failures == 1 && newest_success.is_none_or(|s| k.at > s))
                }
            };
            if !keep {
                pruned.push(k.name.to_string());
            }
        }
    }
    pruned
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::ATTEMPT_LABEL;

    /// A Job of `op` attempt `attempt` in the namespace `ns` (see
    /// [`ledger::tests::job`]).
    fn job(
        name: &str,
        op: &str,
        attempt: u32,
        end: Option<(&str, i64)>,
        kept: Option<&str>,
    ) -> Job {
        let mut j = ledger::tests::job(name, op, end, kept);
        j.metadata.namespace = Some("ns".into());
        j.metadata
            .labels
            .get_or_insert_default()
            .insert(ATTEMPT_LABEL.to_string(), attempt.to_string());
        j
    }

    fn ok(name: &str, attempt: u32, at: i64) -> Job {
        job(
            name,
            "apply",
            attempt,
            Some(("Complete", at)),
            Some("succeeded"),
        )
    }

    fn failed(name: &str, attempt: u32, at: i64) -> Job {
        job(name, "apply", attempt, Some(("Failed", at)), Some("failed"))
    }

    #[test]
    fn each_op_keeps_its_newest_successes_and_failures() {
        // (jobs, successful limit, failed limit, pruned)
        let rows: Vec<(Vec<Job>, i32, i32, Vec<&str>)> = vec![
            (vec![], 3, 3, vec![]),
            // Five failures, two kept.
            (
                (1..=5)
                    .map(|n| failed(&format!("f{n}"), n, i64::from(n)))
                    .collect(),
                3,
                2,
                vec!["f3", "f2", "f1"],
            ),
            // The newest success is kept at a limit of 0.
            (
                vec![ok("s1", 1, 1), ok("s2", 2, 2), failed("f3", 3, 3)],
                0,
                3,
                vec!["s1"],
            ),
            // The newest failure is kept at 0 while no success is newer...
            (
                vec![ok("s1", 1, 1), failed("f2", 2, 2), failed("f3", 3, 3)],
                3,
                0,
                vec!["f2"],
            ),
            // ... and goes once one is.
            (vec![failed("f1", 1, 1), ok("s2", 2, 2)], 3, 0, vec!["f1"]),
            // An interrupted run is a failed Job.
            (
                vec![
                    job("i1", "apply", 1, Some(("Failed", 1)), Some("interrupted")),
                    failed("f2", 2, 2),
                ],
                3,
                1,
                vec!["i1"],
            ),
            // Ends within the same second: the higher attempt is newer.
            (vec![ok("s1", 1, 5), ok("s2", 2, 5)], 1, 1, vec!["s1"]),
            // Active, not yet accounted, or of no known op: never pruned.
            (
                vec![
                    job("run", "apply", 4, None, None),
                    job("new", "apply", 3, Some(("Failed", 3)), None),
                    job("odd", "apply", 2, Some(("Failed", 2)), Some("someone")),
                    job("other", "", 1, Some(("Failed", 1)), Some("failed")),
                ],
                0,
                0,
                vec![],
            ),
            // Ops count apart.
            (
                vec![
                    ok("a1", 1, 1),
                    ok("a2", 2, 2),
                    job("d1", "destroy", 1, Some(("Failed", 3)), Some("failed")),
                    job("d2", "destroy", 2, Some(("Failed", 4)), Some("failed")),
                ],
                1,
                1,
                vec!["a1", "d1"],
            ),
        ];
        for (jobs, successful, failed_limit, want) in rows {
            assert_eq!(
                prune(&jobs, "ns", successful, failed_limit),
                want,
                "{:?}",
                jobs.iter().map(|j| j.name_any()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn jobs_in_another_namespace_are_left_alone() {
        let mut away = failed("away", 1, 1);
        away.metadata.namespace = Some("captf-system".into());
        assert!(prune(&[away, failed("f2", 2, 2)], "ns", 3, 0).is_empty());
    }
}
