//! The result document: the runner's termination message, which the manager
//! reads back into `status.lastRun` (ref §6.2–§6.3). It must fit the 4096
//! bytes the kubelet keeps.

use serde::{Deserialize, Serialize};

use crate::api::RunError;
use crate::names::Op;

use super::plan::PlanReport;
use super::summary::bounded;

/// The most a termination message holds, in bytes.
pub const RESULT_MAX: usize = 4096;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    pub operation: Op,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// From `version -json`; informational, absent when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepRecord>,
    /// What the apply or destroy changed, from its summary line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed: Option<super::steps::Changed>,
    /// The plan a plan, drift, guarded or approved run made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanReport>,
    /// Only on failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    pub name: String,
    pub exit_code: i32,
    pub duration_milliseconds: u64,
    /// The runtime arguments as run, backend values elided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
}

impl RunResult {
    /// The document as written: at most [`RESULT_MAX`] bytes. When it would
    /// be larger, the steps' arguments go first, then the plan's listed
    /// changes from the end, then the summary's tail, then the steps,
    /// oldest first, then the echoed job and image.
    pub fn to_bounded_json(&self) -> Vec<u8> {
        let mut doc = self.clone();
        let fits = |doc: &RunResult| encode(doc).len() <= RESULT_MAX;
        if fits(&doc) {
            return encode(&doc);
        }
        doc.steps.iter_mut().for_each(|s| s.args = None);
        if fits(&doc) {
            return encode(&doc);
        }
        // Halving what is listed keeps the encodings few.
        loop {
            if fits(&doc) {
                return encode(&doc);
            }
            let Some(plan) = doc.plan.as_mut().filter(|p| !p.resources.is_empty()) else {
                break;
            };
            plan.resources.truncate(plan.resources.len() / 2);
            plan.truncated = true;
        }
        let over = encode(&doc).len() - RESULT_MAX;
        if let Some(summary) = doc.error.as_mut().and_then(|e| e.summary.as_mut()) {
            // The JSON escaping of what is cut is at least its length, so
            // cutting `over` bytes of text is enough, unless the summary is
            // shorter than that.
            let keep = summary.len().saturating_sub(over);
            *summary = bounded(summary, keep);
        }
        if let Some(error) = doc.error.as_mut() {
            error.summary.take_if(|s| s.is_empty());
        }
        while !fits(&doc) && !doc.steps.is_empty() {
            doc.steps.remove(0);
        }
        if !fits(&doc) {
            doc.job = None;
            doc.image = None;
        }
        encode(&doc)
    }
}

fn encode(doc: &RunResult) -> Vec<u8> {
    // Serializing plain strings and numbers cannot fail.
    serde_json::to_vec(doc).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RunErrorKind;

    fn step(name: &str, args: usize) -> StepRecord {
        StepRecord {
            name: name.into(),
            exit_code: 0,
            duration_milliseconds: 1234,
            args: Some((0..args).map(|i| format!("-arg-number-{i}")).collect()),
        }
    }

    fn doc(steps: Vec<StepRecord>, summary: Option<String>) -> RunResult {
        RunResult {
            operation: Op::Apply,
            job: Some("captf-m-web-0-apply-a1-abcdef".into()),
            image: Some("registry.example/roles/machine:1.0".into()),
            runtime_version: Some("1.12.6".into()),
            steps,
            changed: None,
            plan: None,
            error: summary.map(|s| RunError {
                kind: RunErrorKind::Step,
                step: Some("apply".into()),
                summary: Some(s),
            }),
        }
    }

    fn decode(bytes: &[u8]) -> RunResult {
        assert!(bytes.len() <= RESULT_MAX, "{} bytes", bytes.len());
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn the_agreed_shape() {
        let mut d = doc(vec![step("init", 0)], Some("Error: boom".into()));
        d.steps[0].args = Some(vec!["init".into(), "-backend-config=namespace".into()]);
        let value: serde_json::Value = serde_json::from_slice(&d.to_bounded_json()).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "operation": "apply",
                "job": "captf-m-web-0-apply-a1-abcdef",
                "image": "registry.example/roles/machine:1.0",
                "runtimeVersion": "1.12.6",
                "steps": [{"name": "init", "exitCode": 0, "durationMilliseconds": 1234,
                           "args": ["init", "-backend-config=namespace"]}],
                "error": {"kind": "step", "step": "apply", "summary": "Error: boom"}
            })
        );
        let ok = RunResult {
            error: None,
            runtime_version: None,
            steps: vec![],
            ..d
        };
        let value: serde_json::Value = serde_json::from_slice(&ok.to_bounded_json()).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"operation": "apply", "job": "captf-m-web-0-apply-a1-abcdef",
                               "image": "registry.example/roles/machine:1.0"})
        );
    }

    #[test]
    fn dropping_order() {
        let summary = || Some("s".repeat(512));
        // Small: untouched.
        let small = doc(vec![step("init", 3), step("apply", 3)], summary());
        assert_eq!(decode(&small.to_bounded_json()), small);

        // Many arguments: they go, everything else stays.
        let args = doc(
            vec![step("init", 100), step("validate", 2), step("apply", 100)],
            summary(),
        );
        let got = decode(&args.to_bounded_json());
        assert!(got.steps.iter().all(|s| s.args.is_none()));
        assert_eq!(got.steps.len(), 3);
        assert_eq!(got.error, args.error);

        // Still too large without arguments: the summary's tail goes next.
        let many: Vec<StepRecord> = (0..60).map(|i| step(&format!("step-{i}"), 1)).collect();
        let tail = doc(many.clone(), summary());
        let got = decode(&tail.to_bounded_json());
        assert_eq!(got.steps.len(), 60);
        let cut = got.error.as_ref().unwrap().summary.as_ref().unwrap();
        assert!(cut.len() < 512 && cut.starts_with("sss"), "{cut}");

        // Then the oldest steps.
        let more: Vec<StepRecord> = (0..80).map(|i| step(&format!("step-{i}"), 1)).collect();
        let got = decode(&doc(more, summary()).to_bounded_json());
        assert!(got.steps.len() < 80);
        assert_eq!(got.steps.last().unwrap().name, "step-79");
        assert!(got.error.as_ref().unwrap().summary.is_none());
        assert_eq!(got.error.as_ref().unwrap().kind, RunErrorKind::Step);
    }

    #[test]
    fn a_long_plan_lists_fewer_changes_before_anything_else_goes() {
        let mut d = doc(
            vec![step("init", 0), step("plan", 0)],
            Some("blocked".into()),
        );
        d.plan = Some(PlanReport {
            plan_hash: format!("p1:{}", "a".repeat(64)),
            add: 50,
            resources: (0..50)
                .map(|i| {
                    format!(
                        "module.role.terraform_data.{}[{i}] (create)",
                        "n".repeat(100)
                    )
                })
                .collect(),
            ..Default::default()
        });
        let got = decode(&d.to_bounded_json());
        let plan = got.plan.unwrap();
        assert!(plan.truncated && plan.resources.len() < 50 && !plan.resources.is_empty());
        assert_eq!((plan.add, plan.plan_hash.len()), (50, 67));
        assert_eq!(got.steps.len(), 2);
        assert_eq!(got.error.unwrap().summary.as_deref(), Some("blocked"));
    }

    #[test]
    fn even_absurd_echoes_fit() {
        let mut d = doc(vec![step("init", 1)], Some("x".into()));
        d.image = Some("i".repeat(10_000));
        let got = decode(&d.to_bounded_json());
        assert_eq!(got.image, None);
        assert_eq!(got.error.unwrap().kind, RunErrorKind::Step);
    }

    #[test]
    fn escaped_summaries_still_fit() {
        // Every quote doubles in JSON: the cut must account for escaping.
        let many: Vec<StepRecord> = (0..60).map(|i| step(&format!("step-{i}"), 1)).collect();
        let d = doc(many, Some("\"".repeat(500)));
        let got = decode(&d.to_bounded_json());
        assert_eq!(got.steps.len(), 60);
    }
}
