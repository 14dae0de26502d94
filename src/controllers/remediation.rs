//! Machine remediation (ref §8.8, `spec.remediation.annotateMachine`):
//! unhealthy health samples are counted, and after `unhealthyThreshold` in a
//! row, or at once for a terminated instance, the owner Machine gets
//! `cluster.x-k8s.io/remediate-machine` with CAPTF's marker
//! `captf.io/remediation-requested`; both go when the instance reads
//! healthy again. An annotation without the marker is never touched. Pure.

/// A health reading, as remediation counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sample {
    Healthy,
    /// Unhealthy, degraded or stopped: counts.
    Unhealthy,
    Terminated,
    /// Pending or unknown: leaves the count as it is.
    Neutral,
}

/// The reading of an InfrastructureHealthy reason.
pub fn sample(reason: &str) -> Sample {
    match reason {
        "Healthy" => Sample::Healthy,
        "InstanceUnhealthy" | "InstanceDegraded" | "InstanceStopped" => Sample::Unhealthy,
        "InstanceTerminated" => Sample::Terminated,
        _ => Sample::Neutral,
    }
}

/// The count after one more sample.
pub fn count(before: u32, s: Sample) -> u32 {
    match s {
        Sample::Healthy => 0,
        Sample::Unhealthy => before.saturating_add(1),
        Sample::Terminated | Sample::Neutral => before,
    }
}

pub const DEFAULT_THRESHOLD: u32 = 3;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts<'a> {
    pub annotate: bool,
    pub threshold: u32,
    /// Unhealthy samples in a row, this pass's included.
    pub samples: u32,
    /// The health the object reads now.
    pub now: Sample,
    /// The InfrastructureHealthy reason, for the marker's text.
    pub reason: &'a str,
    /// The Machine carries `cluster.x-k8s.io/remediate-machine`.
    pub annotated: bool,
    /// ... and CAPTF's marker.
    pub marked: bool,
    pub machine_deleting: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Set both annotations; the marker says why.
    Request(String),
    /// Remove both.
    Withdraw,
}

pub fn decide(f: &Facts) -> Option<Change> {
    if !f.annotate {
        return None;
    }
    let ours = f.annotated && f.marked;
    match f.now {
        Sample::Healthy if ours && !f.machine_deleting => Some(Change::Withdraw),
        _ if f.annotated => None,
        Sample::Terminated => Some(Change::Request("the instance is terminated".into())),
        _ if f.samples >= f.threshold.max(1) => Some(Change::Request(format!(
            "{} for {} consecutive samples",
            f.reason, f.samples
        ))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting() {
        let mut n = 0;
        let mut seen = Vec::new();
        for reason in [
            "InstanceUnhealthy",
            "InstancePending",
            "InstanceDegraded",
            "HealthUnknown",
            "InstanceStopped",
            "InstanceTerminated",
            "Healthy",
            "InstanceUnhealthy",
        ] {
            n = count(n, sample(reason));
            seen.push(n);
        }
        assert_eq!(seen, [1, 1, 2, 2, 3, 3, 0, 1]);
    }

    #[test]
    fn requests_and_withdrawals() {
        let base = Facts {
            annotate: true,
            threshold: 3,
            samples: 0,
            now: Sample::Healthy,
            reason: "Healthy",
            annotated: false,
            marked: false,
            machine_deleting: false,
        };
        let request = |s: &str| Some(Change::Request(s.to_string()));
        // (case, facts, change)
        for (case, f, want) in [
            ("healthy", base.clone(), None),
            (
                "below the threshold",
                Facts {
                    samples: 2,
                    now: Sample::Unhealthy,
                    reason: "InstanceStopped",
                    ..base.clone()
                },
                None,
            ),
            (
                "at the threshold",
                Facts {
                    samples: 3,
                    now: Sample::Unhealthy,
                    reason: "InstanceStopped",
                    ..base.clone()
                },
                request("InstanceStopped for 3 consecutive samples"),
            ),
            (
                "terminated at once",
                Facts {
                    now: Sample::Terminated,
                    ..base.clone()
                },
                request("the instance is terminated"),
            ),
            (
                "already requested",
                Facts {
                    samples: 5,
                    now: Sample::Unhealthy,
                    annotated: true,
                    marked: true,
                    ..base.clone()
                },
                None,
            ),
            (
                "recovered: withdrawn",
                Facts {
                    annotated: true,
                    marked: true,
                    ..base.clone()
                },
                Some(Change::Withdraw),
            ),
            (
                "someone else's annotation stays",
                Facts {
                    annotated: true,
                    ..base.clone()
                },
                None,
            ),
            (
                "not while the Machine is deleted",
                Facts {
                    annotated: true,
                    marked: true,
                    machine_deleting: true,
                    ..base.clone()
                },
                None,
            ),
            (
                "off",
                Facts {
                    annotate: false,
                    now: Sample::Terminated,
                    ..base.clone()
                },
                None,
            ),
        ] {
            assert_eq!(decide(&f), want, "{case}");
        }
    }
}
