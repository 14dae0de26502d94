//! Reading a plan from `show -json` (book: inside-the-job.md "Steps by
//! operation"): its changes, counts and hash (ref §9.2 "Plan hash"), and
//! what the guard of a TerraformCluster apply looks at (ref §8.2). Pure.
//!
//! The document holds every planned value, sensitive or not; only
//! addresses and actions are kept, and the reader streams, so a large plan
//! costs the runner no more than its list of changes.

use std::io::Read;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The scheme of [`Plan::hash`].
pub const PLAN_HASH_SCHEME: &str = "p1";

/// At most this many changes are listed by address in a report.
pub const REPORT_RESOURCES: usize = 50;

/// What one change does, as the status lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Action {
    Create,
    Update,
    Delete,
    Replace,
    Read,
    Forget,
}

impl Action {
    pub const fn as_str(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Update => "update",
            Action::Delete => "delete",
            Action::Replace => "replace",
            Action::Read => "read",
            Action::Forget => "forget",
        }
    }

    /// A delete or a replace: what the guard stops.
    pub const fn destructive(self) -> bool {
        matches!(self, Action::Delete | Action::Replace)
    }
}

/// One planned change of a resource (never a no-op).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub address: String,
    /// The runtime's own list, e.g. `delete,create`: what the hash covers.
    pub actions: String,
    pub action: Action,
    pub importing: bool,
}

/// A plan's changes, sorted by address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub changes: Vec<Change>,
    /// Whether any output changes.
    pub output_changes: bool,
}

/// `show -json` could not be read as a plan.
#[derive(Debug, thiserror::Error)]
#[error("the plan from show -json cannot be read: {0}")]
pub struct Unreadable(String);

#[derive(Deserialize)]
struct Shown {
    #[serde(default)]
    resource_changes: Vec<ResourceChange>,
    #[serde(default)]
    output_changes: Option<std::collections::BTreeMap<String, OutputChange>>,
    #[serde(default)]
    errored: bool,
}

#[derive(Deserialize)]
struct ResourceChange {
    address: String,
    change: ChangeBody,
}

#[derive(Deserialize)]
struct ChangeBody {
    actions: Vec<String>,
    #[serde(default)]
    importing: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct OutputChange {
    actions: Vec<String>,
}

fn action(actions: &[String]) -> Result<Option<Action>, Unreadable> {
    let list: Vec<&str> = actions.iter().map(String::as_str).collect();
    Ok(Some(match list.as_slice() {
        ["no-op"] => return Ok(None),
        ["create"] => Action::Create,
        ["update"] => Action::Update,
        ["delete"] => Action::Delete,
        ["delete", "create"] | ["create", "delete"] => Action::Replace,
        ["read"] => Action::Read,
        ["forget"] => Action::Forget,
        other => return Err(Unreadable(format!("unknown actions {other:?}"))),
    }))
}

/// Reads `show -json` of a saved plan.
pub fn read(from: impl Read) -> Result<Plan, Unreadable> {
    let shown: Shown = serde_json::from_reader(std::io::BufReader::new(from))
        .map_err(|e| Unreadable(e.to_string()))?;
    if shown.errored {
        return Err(Unreadable("the runtime marked the plan as errored".into()));
    }
    let mut changes = Vec::new();
    for rc in shown.resource_changes {
        let importing = rc.change.importing.is_some();
        match action(&rc.change.actions)? {
            Some(action) => changes.push(Change {
                actions: rc.change.actions.join(","),
                address: rc.address,
                action,
                importing,
            }),
            // An import with nothing else to do still changes the state.
            None if importing => changes.push(Change {
                actions: "import".into(),
                address: rc.address,
                action: Action::Update,
                importing,
            }),
            None => {}
        }
    }
    changes.sort_by(|a, b| a.address.cmp(&b.address));
    let output_changes = shown
        .output_changes
        .unwrap_or_default()
        .values()
        .any(|o| o.actions.iter().any(|a| a != "no-op"));
    Ok(Plan {
        changes,
        output_changes,
    })
}

impl Plan {
    /// `p1:<sha256 hex>` over the sorted `address|actions` lines of every
    /// change; an empty plan hashes the empty list.
    pub fn hash(&self) -> String {
        let mut lines: Vec<String> = self
            .changes
            .iter()
            .map(|c| format!("{}|{}", c.address, c.actions))
            .collect();
        lines.sort();
        let mut h = Sha256::new();
        for line in &lines {
            h.update(line.as_bytes());
            h.update(b"\n");
        }
        format!("{PLAN_HASH_SCHEME}:{:x}", h.finalize())
    }

    pub fn destructive(&self) -> impl Iterator<Item = &Change> {
        self.changes.iter().filter(|c| c.action.destructive())
    }

    fn count(&self, f: impl Fn(&Change) -> bool) -> i32 {
        i32::try_from(self.changes.iter().filter(|c| f(c)).count()).unwrap_or(i32::MAX)
    }

    /// The plan as the result document reports it.
    pub fn report(&self) -> PlanReport {
        let listed: Vec<String> = self
            .changes
            .iter()
            .take(REPORT_RESOURCES)
            .map(|c| format!("{} ({})", c.address, c.action.as_str()))
            .collect();
        PlanReport {
            plan_hash: self.hash(),
            add: self.count(|c| matches!(c.action, Action::Create | Action::Replace)),
            change: self.count(|c| c.action == Action::Update),
            destroy: self.count(|c| c.action.destructive()),
            import: self.count(|c| c.importing),
            truncated: self.changes.len() > listed.len(),
            resources: listed,
            destructive: self.destructive().count() > 0,
        }
    }

    /// The destructive changes, for a message: `a (replace), b (delete)`.
    pub fn destructive_summary(&self) -> String {
        let all: Vec<String> = self
            .destructive()
            .map(|c| format!("{} ({})", c.address, c.action.as_str()))
            .collect();
        let shown = all.len().min(10);
        let mut text = all[..shown].join(", ");
        if all.len() > shown {
            text.push_str(&format!(" and {} more", all.len() - shown));
        }
        text
    }
}

/// A plan in the result document: counts, hash and the changes by address.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanReport {
    pub plan_hash: String,
    pub add: i32,
    pub change: i32,
    pub destroy: i32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub import: i32,
    /// `<address> (<action>)`, sorted, at most [`REPORT_RESOURCES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// Whether `resources` lists fewer changes than the plan has.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// Whether the plan deletes or replaces anything.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub destructive: bool,
}

impl PlanReport {
    /// Whether the plan changes nothing.
    pub fn empty(&self) -> bool {
        self.add == 0 && self.change == 0 && self.destroy == 0 && self.import == 0
    }
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape `tofu show -json` prints (trimmed from a real 1.12 plan).
    const SHOWN: &str = r#"{"format_version":"1.2","terraform_version":"1.12.6",
        "variables":{"gen":{"value":2}},"planned_values":{"root_module":{}},
        "resource_changes":[
          {"address":"terraform_data.u","mode":"managed","type":"terraform_data","name":"u",
           "change":{"actions":["update"],"before":{"input":"a"},"after":{"input":"secret-b"}}},
          {"address":"terraform_data.r","mode":"managed","type":"terraform_data","name":"r",
           "change":{"actions":["delete","create"],"before":{},"after":{}},
           "action_reason":"replace_because_cannot_update"},
          {"address":"terraform_data.x[0]","mode":"managed","change":{"actions":["create"]}},
          {"address":"terraform_data.keep","mode":"managed","change":{"actions":["no-op"]}},
          {"address":"terraform_data.gone","mode":"managed","change":{"actions":["delete"]}},
          {"address":"terraform_data.imp","mode":"managed",
           "change":{"actions":["no-op"],"importing":{"id":"i-1"}}}],
        "output_changes":{"o":{"actions":["update"],"before":"a","after":"b"}},
        "prior_state":{},"configuration":{},"errored":false}"#;

    #[test]
    fn reads_changes_counts_and_destructive_ones() {
        let plan = read(SHOWN.as_bytes()).unwrap();
        let listed: Vec<(&str, &str, Action)> = plan
            .changes
            .iter()
            .map(|c| (c.address.as_str(), c.actions.as_str(), c.action))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("terraform_data.gone", "delete", Action::Delete),
                ("terraform_data.imp", "import", Action::Update),
                ("terraform_data.r", "delete,create", Action::Replace),
                ("terraform_data.u", "update", Action::Update),
                ("terraform_data.x[0]", "create", Action::Create),
            ]
        );
        assert!(plan.output_changes);
        let report = plan.report();
        assert_eq!(
            (
                report.add,
                report.change,
                report.destroy,
                report.import,
                report.destructive
            ),
            (2, 2, 2, 1, true)
        );
        assert_eq!(
            plan.destructive_summary(),
            "terraform_data.gone (delete), terraform_data.r (replace)"
        );
        // No value of the plan reaches the report.
        let json = serde_json::to_string(&report).unwrap();
        assert!(!json.contains("secret-b"), "{json}");
    }

    #[test]
    fn the_hash_covers_addresses_and_actions_only() {
        let plan = read(SHOWN.as_bytes()).unwrap();
        let h = plan.hash();
        assert!(h.starts_with("p1:") && h.len() == 3 + 64, "{h}");
        // Order and values do not matter; an action does.
        let mut reordered = plan.clone();
        reordered.changes.reverse();
        assert_eq!(reordered.hash(), h);
        let mut other = plan.clone();
        other.changes[3].actions = "delete,create".into();
        assert_ne!(other.hash(), h);
        // The empty plan hashes the empty list: sha256 of nothing.
        assert_eq!(
            Plan::default().hash(),
            "p1:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert!(Plan::default().report().empty());
    }

    #[test]
    fn unreadable_plans() {
        for (doc, why) in [
            ("", "EOF"),
            (
                "{\"resource_changes\":[{\"address\":\"a\"}]}",
                "missing field",
            ),
            (
                "{\"resource_changes\":[{\"address\":\"a\",\"change\":{\"actions\":[\"explode\"]}}]}",
                "unknown actions",
            ),
            ("{\"errored\":true}", "errored"),
        ] {
            let e = read(doc.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(why), "{doc}: {e}");
        }
    }

    #[test]
    fn long_plans_are_listed_in_part() {
        let changes = (0..60)
            .map(|i| format!(r#"{{"address":"r.a[{i:02}]","change":{{"actions":["create"]}}}}"#))
            .collect::<Vec<_>>()
            .join(",");
        let plan = read(format!(r#"{{"resource_changes":[{changes}]}}"#).as_bytes()).unwrap();
        let report = plan.report();
        assert_eq!(report.add, 60);
        assert_eq!(report.resources.len(), REPORT_RESOURCES);
        assert!(report.truncated && !report.destructive);
        assert_eq!(report.resources[0], "r.a[00] (create)");
    }
}
