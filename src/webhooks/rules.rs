//! The validating rules of CONTRACT.md "Webhooks", as pure functions over
//! plain data. Each refusal is a [`Violation`] whose message has the form
//! `<field path>: <rule> (got <value>)`.

use crate::api::Variables;
use crate::names::Kind;
use k8s_openapi::api::core::v1::{
    AppArmorProfile, EnvVar, PodSecurityContext, SELinuxOptions, SeccompProfile, SecurityContext,
    WindowsSecurityContextOptions,
};

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

/// The SELinux types a Job may ask for: those of the Pod Security Standards'
/// baseline profile. Any other type (`spc_t`, the type of privileged
/// containers, above all) may run unconfined.
const SELINUX_TYPES: &[&str] = &[
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Rule 3, stricter (ref Appendix B "Stricter WH"), for the main container's
/// context: the root filesystem stays read-only and /proc stays masked, and
/// the rules every context shares ([`pod_security_context_strict`]).
pub fn security_context_strict(path: &str, context: &SecurityContext) -> Vec<Violation> {
    let mut violations = Vec::new();
    if context.read_only_root_filesystem == Some(false) {
        violations.push(Violation::invalid(
            format!("{path}.readOnlyRootFilesystem"),
            "must not be false: a Job writes only to its volumes",
            Some("false".into()),
        ));
    }
    if let Some(proc_mount) = context.proc_mount.as_deref()
        && proc_mount == "Unmasked"
    {
        violations.push(Violation::invalid(
            format!("{path}.procMount"),
            "must not be Unmasked: /proc stays masked",
            Some(echo(proc_mount)),
        ));
    }
    violations.extend(shared_strict(
        path,
        Shared {
            seccomp: context.seccomp_profile.as_ref(),
            app_armor: context.app_armor_profile.as_ref(),
            se_linux: context.se_linux_options.as_ref(),
            run_as_user: context.run_as_user,
            run_as_non_root: context.run_as_non_root,
            windows: context.windows_options.as_ref(),
        },
    ));
    violations
}

/// Rule 3, stricter (ref Appendix B "Stricter WH"), for the pod's context:
/// the same rules as the main container's, for the fields a pod context has.
pub fn pod_security_context_strict(path: &str, context: &PodSecurityContext) -> Vec<Violation> {
    shared_strict(
        path,
        Shared {
            seccomp: context.seccomp_profile.as_ref(),
            app_armor: context.app_armor_profile.as_ref(),
            se_linux: context.se_linux_options.as_ref(),
            run_as_user: context.run_as_user,
            run_as_non_root: context.run_as_non_root,
            windows: context.windows_options.as_ref(),
        },
    )
}

/// The fields a container and a pod context share.
struct Shared<'a> {
    seccomp: Option<&'a SeccompProfile>,
    app_armor: Option<&'a AppArmorProfile>,
    se_linux: Option<&'a SELinuxOptions>,
    run_as_user: Option<i64>,
    run_as_non_root: Option<bool>,
    windows: Option<&'a WindowsSecurityContextOptions>,
}

/// No unconfined seccomp or AppArmor profile, no SELinux type outside the
/// baseline's, no root user, no host process.
fn shared_strict(path: &str, context: Shared<'_>) -> Vec<Violation> {
    let mut violations = Vec::new();
    if let Some(seccomp) = context.seccomp
        && seccomp.type_ == "Unconfined"
    {
        violations.push(Violation::invalid(
            format!("{path}.seccompProfile.type"),
            "must not be Unconfined: use RuntimeDefault or Localhost",
            Some(echo(&seccomp.type_)),
        ));
    }
    if let Some(app_armor) = context.app_armor
        && app_armor.type_ == "Unconfined"
    {
        violations.push(Violation::invalid(
            format!("{path}.appArmorProfile.type"),
            "must not be Unconfined: use RuntimeDefault or Localhost",
            Some(echo(&app_armor.type_)),
        ));
    }
    if let Some(se_type) = context.se_linux.and_then(|o| o.type_.as_deref())
        && !se_type.is_empty()
        && !SELINUX_TYPES.contains(&se_type)
    {
        violations.push(Violation::invalid(
            format!("{path}.seLinuxOptions.type"),
            format!(
                "must be unset or one of {}: other types, such as spc_t, may run unconfined",
                SELINUX_TYPES.join(", ")
            ),
            Some(echo(se_type)),
        ));
    }
    if context.run_as_user == Some(0) {
        violations.push(Violation::invalid(
            format!("{path}.runAsUser"),
            "must not be 0: a Job does not run as root",
            Some("0".into()),
        ));
    }
    if context.run_as_non_root == Some(false) {
        violations.push(Violation::invalid(
            format!("{path}.runAsNonRoot"),
            "must not be false: a Job does not run as root",
            Some("false".into()),
        ));
    }
    if context.windows.and_then(|w| w.host_process) == Some(true) {
        violations.push(Violation::invalid(
            format!("{path}.windowsOptions.hostProcess"),
            "must not be true: a Job never runs as a host process",
            Some("true".into()),
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
/// meta-argument; values nested at most 128 levels deep (as the manager
/// reads them). Values are never echoed. (That it is a JSON object is the
/// schema's part: an object whose variables are not one is not decoded.)
pub fn variables(path: &str, variables: &Variables, role: Kind) -> Vec<Violation> {
    let Ok(names) = variables.names() else {
        return vec![Violation::invalid(
            path,
            "must nest its values at most 128 levels deep",
            None,
        )];
    };
    let mut violations = Vec::new();
    if names.len() > MAX_VARIABLES {
        violations.push(Violation::invalid(
            path,
            format!("must have at most {MAX_VARIABLES} keys"),
            Some(format!("{} keys", names.len())),
        ));
    }
    for key in &names {
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
    // By bytes: the pattern is ASCII, and no byte of a multi-byte
    // character is.
    let mut bytes = key.bytes();
    let identifier = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
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
mod tests;
