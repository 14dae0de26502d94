//! The validating rules of CONTRACT.md "Webhooks", as pure functions over
//! plain data. Each refusal is a [`Violation`] whose message has the form
//! `<field path>: <rule> (got <value>)`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, SecurityContext};
use serde_json::Value;

use crate::names::Kind;

/// Built-in defaults of a jobs policy that the rules compare against.
pub const DEFAULT_LOCK_TIMEOUT_SECONDS: i64 = 300;
pub const DEFAULT_ACTIVE_DEADLINE_SECONDS: i64 = 3600;

/// Terraform meta-arguments that cannot be module inputs.
const META_ARGUMENTS: &[&str] = &[
    "source",
    "version",
    "providers",
    "count",
    "for_each",
    "depends_on",
    "lifecycle",
    "locals",
];
const MAX_VARIABLES: usize = 256;
/// Values longer than this are cut in messages.
const MAX_ECHO: usize = 64;

/// One refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub path: String,
    pub rule: String,
    /// The offending value as shown to the user; `None` where echoing it
    /// could leak something.
    pub got: Option<String>,
    /// A forbidden operation (403) rather than an invalid object (422).
    pub forbidden: bool,
}

impl Violation {
    pub fn invalid(path: impl Into<String>, rule: impl Into<String>, got: Option<String>) -> Self {
        Self {
            path: path.into(),
            rule: rule.into(),
            got,
            forbidden: false,
        }
    }

    pub fn forbidden(
        path: impl Into<String>,
        rule: impl Into<String>,
        got: Option<String>,
    ) -> Self {
        Self {
            forbidden: true,
            ..Self::invalid(path, rule, got)
        }
    }

    pub fn message(&self) -> String {
        match &self.got {
            Some(got) => format!("{}: {} (got {got})", self.path, self.rule),
            None => format!("{}: {}", self.path, self.rule),
        }
    }

    /// The HTTP status code inside the AdmissionReview response.
    pub fn code(&self) -> u16 {
        if self.forbidden { 403 } else { 422 }
    }
}

/// A value as shown in a message: quoted, and cut when long.
pub fn echo(value: &str) -> String {
    if value.chars().count() > MAX_ECHO {
        let cut: String = value.chars().take(MAX_ECHO).collect();
        format!("{cut:?}...")
    } else {
        format!("{value:?}")
    }
}

/// Rule 1: the effective lock timeout is less than the effective deadline of
/// the same policy; an unset field takes its built-in default, and an
/// activeDeadlineSeconds of 0 means unset.
pub fn lock_timeout_below_deadline(
    path: &str,
    lock_timeout_seconds: Option<i64>,
    active_deadline_seconds: Option<i64>,
) -> Option<Violation> {
    let lock = lock_timeout_seconds.unwrap_or(DEFAULT_LOCK_TIMEOUT_SECONDS);
    let deadline = active_deadline_seconds
        .filter(|d| *d != 0)
        .unwrap_or(DEFAULT_ACTIVE_DEADLINE_SECONDS);
    (lock >= deadline).then(|| {
        let lock_shown = match lock_timeout_seconds {
            Some(v) => v.to_string(),
            None => format!("{DEFAULT_LOCK_TIMEOUT_SECONDS} by default"),
        };
        let deadline_shown = match active_deadline_seconds.filter(|d| *d != 0) {
            Some(v) => v.to_string(),
            None => format!("{DEFAULT_ACTIVE_DEADLINE_SECONDS} by default"),
        };
        Violation::invalid(
            format!("{path}.lockTimeoutSeconds"),
            "must be less than activeDeadlineSeconds, so that waiting for the state lock cannot use up the Job's deadline",
            Some(format!("lockTimeoutSeconds {lock_shown}, activeDeadlineSeconds {deadline_shown}")),
        )
    })
}

/// Rule 3: the main container may not be privileged, escalate privileges or
/// add capabilities.
pub fn security_context_hardened(path: &str, context: &SecurityContext) -> Vec<Violation> {
    let mut violations = Vec::new();
    if context.privileged == Some(true) {
        violations.push(Violation::invalid(
            format!("{path}.privileged"),
            "must not be true",
            Some("true".into()),
        ));
    }
    if context.allow_privilege_escalation == Some(true) {
        violations.push(Violation::invalid(
            format!("{path}.allowPrivilegeEscalation"),
            "must not be true",
            Some("true".into()),
        ));
    }
    if let Some(add) = context.capabilities.as_ref().and_then(|c| c.add.as_ref())
        && !add.is_empty()
    {
        violations.push(Violation::invalid(
            format!("{path}.capabilities.add"),
            "must be empty: a Job adds no capabilities",
            Some(format!("{add:?}")),
        ));
    }
    violations
}

/// Rule 4: entries of spec.jobs.env whose names begin with TF_ or KUBE_ are
/// dropped from the Job; each gives an admission warning naming it.
pub fn dropped_env_warnings(path: &str, env: &[EnvVar]) -> Vec<String> {
    env.iter()
        .enumerate()
        .filter(|(_, var)| var.name.starts_with("TF_") || var.name.starts_with("KUBE_"))
        .map(|(i, var)| {
            format!(
                "{path}[{i}].name: {:?} begins with TF_ or KUBE_ and is dropped: the Job never receives it",
                var.name
            )
        })
        .collect()
}

/// The shape of `captf.io/restore-state`: `[1-9][0-9]*` within u64.
pub fn parse_restore_serial(value: &str) -> Option<u64> {
    let shaped = value
        .as_bytes()
        .first()
        .is_some_and(|b| (b'1'..=b'9').contains(b))
        && value.bytes().all(|b| b.is_ascii_digit());
    if shaped { value.parse().ok() } else { None }
}

pub const RESTORE_STATE_PATH: &str = "metadata.annotations[captf.io/restore-state]";

/// Rule 2 for `captf.io/restore-state`. `old` is the annotation before an
/// UPDATE (`None` on CREATE), `backups` the serials listed in the object's
/// status.stateBackups.
pub fn restore_state(
    new: Option<&str>,
    old: Option<Option<&str>>,
    backups: &[u64],
    deleting: bool,
) -> Option<Violation> {
    let value = new?;
    let Some(serial) = parse_restore_serial(value) else {
        return Some(Violation::invalid(
            RESTORE_STATE_PATH,
            "must be a state serial: a decimal number without leading zeros, from 1 to 18446744073709551615",
            Some(echo(value)),
        ));
    };
    let Some(old) = old else {
        // CREATE: status does not survive a clusterctl move, so only the
        // shape can be checked.
        return None;
    };
    if old == Some(value) {
        return None;
    }
    if deleting {
        return Some(Violation::forbidden(
            RESTORE_STATE_PATH,
            "cannot be added or changed while the object is being deleted: deletion wins over a restore",
            Some(echo(value)),
        ));
    }
    if !backups.contains(&serial) {
        let listed = if backups.is_empty() {
            "none".to_string()
        } else {
            backups
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        return Some(Violation::invalid(
            RESTORE_STATE_PATH,
            format!("must name a serial listed in status.stateBackups (listed: {listed})"),
            Some(echo(value)),
        ));
    }
    None
}

/// Rule 3 for `spec.variables`: at most 256 keys, each an identifier that
/// is neither `captf_*`, a contract input of the role, nor a Terraform
/// meta-argument. Values are never echoed. (That it is a JSON object is the
/// schema's part: an object whose variables are not one is not decoded.)
pub fn variables(path: &str, object: &BTreeMap<String, Value>, role: Kind) -> Vec<Violation> {
    let mut violations = Vec::new();
    if object.len() > MAX_VARIABLES {
        violations.push(Violation::invalid(
            path,
            format!("must have at most {MAX_VARIABLES} keys"),
            Some(format!("{} keys", object.len())),
        ));
    }
    for key in object.keys() {
        if let Some(rule) = variable_key_rule(key, role) {
            violations.push(Violation::invalid(
                format!("{path}.{key}"),
                rule,
                Some(echo(key)),
            ));
        }
    }
    violations
}

/// Why `key` cannot be a user variable of `role`, if it cannot.
pub fn variable_key_rule(key: &str, role: Kind) -> Option<&'static str> {
    let mut chars = key.chars();
    let identifier = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !identifier {
        Some("must match ^[a-zA-Z_][a-zA-Z0-9_-]*$")
    } else if key.starts_with("captf_") {
        Some("must not begin with captf_, which is reserved for the contract's inputs")
    } else if role.inputs().contains(&key) {
        Some("must not be a contract input of the module's role")
    } else if META_ARGUMENTS.contains(&key) {
        Some("must not be a Terraform meta-argument")
    } else {
        None
    }
}

/// Rule 3 for `spec.variablesFrom[i]`: exactly one of configMapRef and secretRef.
pub fn variables_source_exactly_one(
    path: &str,
    config_map: bool,
    secret: bool,
) -> Option<Violation> {
    match (config_map, secret) {
        (true, false) | (false, true) => None,
        (both, _) => Some(Violation::invalid(
            path,
            "must set exactly one of configMapRef and secretRef",
            Some(if both {
                "both".into()
            } else {
                "neither".into()
            }),
        )),
    }
}

/// Rule 3: a field that may not change once set.
pub fn immutable<T: PartialEq>(path: &str, old: &T, new: &T, rule: &str) -> Option<Violation> {
    (old != new).then(|| Violation::invalid(path, rule.to_string(), None))
}

/// Rule 3: a field that may go from empty to a value once, then never change.
pub fn set_once(path: &str, old: Option<&str>, new: Option<&str>) -> Option<Violation> {
    let old = old.filter(|v| !v.is_empty())?;
    (new != Some(old)).then(|| {
        Violation::invalid(
            path,
            format!("may be set once and then never change (was {})", echo(old)),
            Some(new.map_or("unset".into(), echo)),
        )
    })
}

/// Rule 3 for TerraformClusterIdentity: allowedNamespaces needs a list or a
/// selector when present (`{}` would silently allow nothing).
pub fn allowed_namespaces_not_empty(
    path: &str,
    has_list: bool,
    has_selector: bool,
) -> Option<Violation> {
    (!has_list && !has_selector).then(|| {
        Violation::invalid(
            path,
            "must set list, selector or both (selector: {} allows every namespace; omit the field to allow none)",
            Some("{}".into()),
        )
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Capabilities;

    use super::*;

    #[test]
    fn lock_timeout_against_deadline() {
        // (lock, deadline, refused)
        let table = [
            (Some(600), Some(300), true),
            (Some(3600), None, true),
            (None, Some(200), true),
            (None, Some(300), true),
            (Some(60), Some(300), false),
            (None, None, false),
            (Some(3599), None, false),
            (None, Some(301), false),
            (Some(0), Some(1), false),
            (Some(1), Some(1), true),
            // 0 means unset: the default of 3600 applies.
            (Some(3000), Some(0), false),
            (Some(3600), Some(0), true),
        ];
        for (lock, deadline, refused) in table {
            let got = lock_timeout_below_deadline("spec.jobs", lock, deadline);
            assert_eq!(got.is_some(), refused, "{lock:?} {deadline:?}: {got:?}");
        }
        let message = lock_timeout_below_deadline("spec.jobs", Some(3600), None)
            .unwrap()
            .message();
        assert_eq!(
            message,
            "spec.jobs.lockTimeoutSeconds: must be less than activeDeadlineSeconds, so that waiting for the state lock cannot use up the Job's deadline (got lockTimeoutSeconds 3600, activeDeadlineSeconds 3600 by default)"
        );
    }

    #[test]
    fn restore_serial_shapes() {
        let table = [
            ("7", Some(7)),
            ("1", Some(1)),
            ("18446744073709551615", Some(u64::MAX)),
            ("18446744073709551616", None),
            ("07", None),
            ("0", None),
            ("-1", None),
            ("+1", None),
            ("abc", None),
            ("", None),
            (" 7", None),
            ("7 ", None),
            ("٣", None),
        ];
        for (value, want) in table {
            assert_eq!(parse_restore_serial(value), want, "{value:?}");
        }
    }

    #[test]
    fn restore_state_on_create_and_update() {
        let backups = [5, 7];
        // (new, old on UPDATE, deleting, refused, forbidden)
        type Row<'a> = (Option<&'a str>, Option<Option<&'a str>>, bool, bool, bool);
        let table: &[Row] = &[
            (None, None, false, false, false),
            (Some("7"), None, false, false, false),
            // CREATE checks only the shape, listed or not.
            (Some("9"), None, false, false, false),
            (Some("07"), None, false, true, false),
            (Some("7"), Some(None), false, false, false),
            (Some("9"), Some(None), false, true, false),
            (Some("9"), Some(Some("7")), false, true, false),
            // Unchanged: not re-checked (the backup may have been pruned since).
            (Some("9"), Some(Some("9")), false, false, false),
            (Some("7"), Some(None), true, true, true),
            (Some("9"), Some(Some("9")), true, false, false),
            (Some("abc"), Some(Some("abc")), false, true, false),
            (None, Some(Some("7")), false, false, false),
        ];
        for (new, old, deleting, refused, forbidden) in table {
            let got = restore_state(*new, *old, &backups, *deleting);
            assert_eq!(
                got.is_some(),
                *refused,
                "{new:?} {old:?} {deleting}: {got:?}"
            );
            if let Some(v) = got {
                assert_eq!(v.forbidden, *forbidden, "{new:?} {old:?}");
                assert_eq!(v.code(), if *forbidden { 403 } else { 422 });
                assert!(v.message().starts_with(RESTORE_STATE_PATH));
            }
        }
        let message = restore_state(Some("9"), Some(None), &backups, false)
            .unwrap()
            .message();
        assert!(message.contains("(listed: 5, 7)"), "{message}");
    }

    #[test]
    fn variable_keys() {
        let table = [
            ("region", Kind::Machine, None),
            ("_x", Kind::Machine, None),
            ("a-b_c9", Kind::Machine, None),
            ("9lives", Kind::Machine, Some("must match")),
            ("a.b", Kind::Machine, Some("must match")),
            ("", Kind::Machine, Some("must match")),
            ("captf_anything", Kind::Cluster, Some("captf_")),
            ("bootstrap_data", Kind::Machine, Some("contract input")),
            ("bootstrap_data", Kind::Cluster, None),
            ("replicas", Kind::MachinePool, Some("contract input")),
            ("replicas", Kind::Machine, None),
            (
                "control_plane_endpoint",
                Kind::Cluster,
                Some("contract input"),
            ),
            ("count", Kind::Cluster, Some("meta-argument")),
            ("lifecycle", Kind::MachinePool, Some("meta-argument")),
        ];
        for (key, role, want) in table {
            let got = variable_key_rule(key, role);
            match want {
                None => assert_eq!(got, None, "{key}"),
                Some(fragment) => {
                    assert!(got.is_some_and(|r| r.contains(fragment)), "{key}: {got:?}")
                }
            }
        }
    }

    #[test]
    fn variables_object_rules_never_echo_values() {
        let object =
            |json: Value| -> BTreeMap<String, Value> { serde_json::from_value(json).unwrap() };
        let ok = object(serde_json::json!({"region": "eu", "size": 3}));
        assert!(variables("spec.variables", &ok, Kind::Machine).is_empty());
        let secretish = object(serde_json::json!({"count": "hunter2"}));
        let v = variables("spec.variables", &secretish, Kind::Machine);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].path, "spec.variables.count");
        assert!(!v[0].message().contains("hunter2"));
        let many: BTreeMap<String, Value> =
            (0..257).map(|i| (format!("v{i}"), Value::Null)).collect();
        let v = variables("spec.variables", &many, Kind::Cluster);
        assert_eq!(
            v[0].message(),
            "spec.variables: must have at most 256 keys (got 257 keys)"
        );
    }

    #[test]
    fn security_context_rules() {
        let hardened = SecurityContext {
            privileged: Some(false),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: Some(vec![]),
            }),
            ..Default::default()
        };
        assert!(security_context_hardened("spec.jobs.securityContext", &hardened).is_empty());
        let loose = SecurityContext {
            privileged: Some(true),
            allow_privilege_escalation: Some(true),
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into()]),
                drop: None,
            }),
            ..Default::default()
        };
        let paths: Vec<String> = security_context_hardened("spec.jobs.securityContext", &loose)
            .into_iter()
            .map(|v| v.path)
            .collect();
        assert_eq!(
            paths,
            [
                "spec.jobs.securityContext.privileged",
                "spec.jobs.securityContext.allowPrivilegeEscalation",
                "spec.jobs.securityContext.capabilities.add",
            ]
        );
    }

    #[test]
    fn env_warnings_name_each_dropped_entry() {
        let env: Vec<EnvVar> = ["TF_LOG", "REGION", "KUBE_CONFIG", "TFX", "KUBECONFIG"]
            .iter()
            .map(|n| EnvVar {
                name: n.to_string(),
                ..Default::default()
            })
            .collect();
        let warnings = dropped_env_warnings("spec.jobs.env", &env);
        assert_eq!(warnings.len(), 2);
        assert!(warnings[0].starts_with("spec.jobs.env[0].name: \"TF_LOG\""));
        assert!(warnings[1].starts_with("spec.jobs.env[2].name: \"KUBE_CONFIG\""));
    }

    #[test]
    fn set_once_and_immutable() {
        assert!(set_once("spec.providerID", None, Some("aws:///i-1")).is_none());
        assert!(set_once("spec.providerID", Some(""), Some("aws:///i-1")).is_none());
        assert!(set_once("spec.providerID", Some("aws:///i-1"), Some("aws:///i-1")).is_none());
        assert!(set_once("spec.providerID", Some("aws:///i-1"), Some("aws:///i-2")).is_some());
        assert!(set_once("spec.providerID", Some("aws:///i-1"), None).is_some());
        assert!(immutable("spec.source", &"a", &"a", "is immutable").is_none());
        assert_eq!(
            immutable("spec.source", &"a", &"b", "is immutable")
                .unwrap()
                .message(),
            "spec.source: is immutable"
        );
    }

    #[test]
    fn exactly_one_source_and_allowed_namespaces() {
        assert!(variables_source_exactly_one("spec.variablesFrom[0]", true, false).is_none());
        assert!(variables_source_exactly_one("spec.variablesFrom[0]", false, true).is_none());
        assert!(variables_source_exactly_one("spec.variablesFrom[0]", true, true).is_some());
        assert!(variables_source_exactly_one("spec.variablesFrom[0]", false, false).is_some());
        assert!(allowed_namespaces_not_empty("spec.allowedNamespaces", false, false).is_some());
        assert!(allowed_namespaces_not_empty("spec.allowedNamespaces", true, false).is_none());
        assert!(allowed_namespaces_not_empty("spec.allowedNamespaces", false, true).is_none());
    }

    #[test]
    fn long_values_are_cut() {
        let long = "x".repeat(100);
        assert!(echo(&long).ends_with("\"..."));
        assert_eq!(echo("7"), "\"7\"");
    }
}
