//! The steps of each operation (book: inside-the-job.md "Steps by
//! operation"; ref §6.3 "Runtime commands per op" and "Command flags"), and
//! how each step's outcome is judged. Everything here is pure.

use std::path::Path;

use crate::names::Op;

/// The variables file the rendered root comes with.
pub const VAR_FILE_ARG: &str = "-var-file=terraform.tfvars.json";

/// A step, by the name the result document gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepName {
    Init,
    ForceUnlock,
    Validate,
    Plan,
    Show,
    Apply,
    Destroy,
    ApplyRefreshOnly,
    StatePush,
    StateList,
}

impl StepName {
    pub const fn as_str(self) -> &'static str {
        match self {
            StepName::Init => "init",
            StepName::ForceUnlock => "force-unlock",
            StepName::Validate => "validate",
            StepName::Plan => "plan",
            StepName::Show => "show",
            StepName::Apply => "apply",
            StepName::Destroy => "destroy",
            StepName::ApplyRefreshOnly => "apply-refresh-only",
            StepName::StatePush => "state-push",
            StepName::StateList => "state-list",
        }
    }
}

/// What becomes of a step's standard output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stdout {
    /// Passed through to the runner's log.
    Log,
    /// Passed through and kept, for the runner to read.
    LogAndKeep,
    /// Passed through, and its end kept: an apply's or destroy's summary
    /// line.
    LogAndKeepTail,
    /// Read as a plan ([`super::plan::read`]) and never logged: `show -json`
    /// prints every value of the plan, sensitive or not.
    Plan,
}

/// One runtime invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub name: StepName,
    pub args: Vec<String>,
    pub stdout: Stdout,
    /// Exit code 2 means "changes present" (`-detailed-exitcode`).
    pub changes_exit_code: bool,
}

/// What the steps of a run depend on.
#[derive(Clone, Debug)]
pub struct StepInputs<'a> {
    pub op: Op,
    pub lock_timeout_seconds: u64,
    pub backend_config: &'a [String],
    pub force_unlock: Option<&'a str>,
    pub plan_file: &'a Path,
    pub restore_file: &'a Path,
    /// An apply that plans first and applies the saved plan: a guarded or
    /// an approved TerraformCluster apply.
    pub guarded: bool,
    /// The saved plan such an apply applies: its own plan, or the approved
    /// one.
    pub apply_file: &'a Path,
}

/// `version -json`, run before every other step; informational.
pub fn version_args() -> Vec<String> {
    strings(&["version", "-json"])
}

/// The steps of a run, in order.
pub fn steps(inputs: &StepInputs<'_>) -> Vec<Step> {
    let lock = format!("-lock-timeout={}s", inputs.lock_timeout_seconds);
    let plan_file = inputs.plan_file.display().to_string();
    let step = |name, args: Vec<String>| Step {
        name,
        args,
        stdout: match name {
            StepName::Show => Stdout::Plan,
            StepName::Validate | StepName::StateList => Stdout::LogAndKeep,
            StepName::Apply | StepName::Destroy => Stdout::LogAndKeepTail,
            _ => Stdout::Log,
        },
        changes_exit_code: false,
    };
    // init, plan, apply and destroy share their leading flags.
    let command = |verb: &str| strings(&[verb, "-input=false", "-no-color", &lock]);

    let mut init = command("init");
    init.extend(
        inputs
            .backend_config
            .iter()
            .map(|kv| format!("-backend-config={kv}")),
    );
    let mut out = vec![step(StepName::Init, init)];
    if let Some(id) = inputs.force_unlock {
        out.push(step(
            StepName::ForceUnlock,
            strings(&["force-unlock", "-force", id]),
        ));
    }
    let validate = || {
        step(
            StepName::Validate,
            strings(&["validate", "-json", "-no-color"]),
        )
    };
    let show = || {
        step(
            StepName::Show,
            strings(&["show", "-json", "-no-color", &plan_file]),
        )
    };
    let refresh_only = || {
        let mut args = command("apply");
        args.extend(strings(&["-refresh-only", "-auto-approve", VAR_FILE_ARG]));
        step(StepName::ApplyRefreshOnly, args)
    };
    let out_arg = format!("-out={plan_file}");
    match inputs.op {
        Op::Apply if inputs.guarded => {
            let mut plan = command("plan");
            plan.extend(strings(&["-detailed-exitcode", VAR_FILE_ARG, &out_arg]));
            let plan = Step {
                changes_exit_code: true,
                ..step(StepName::Plan, plan)
            };
            // A saved plan carries its variables: none may be given.
            let mut apply = command("apply");
            apply.push(inputs.apply_file.display().to_string());
            out.extend([validate(), plan, show(), step(StepName::Apply, apply)]);
        }
        Op::Apply => {
            let mut apply = command("apply");
            apply.extend(strings(&["-auto-approve", VAR_FILE_ARG]));
            out.extend([validate(), step(StepName::Apply, apply)]);
        }
        Op::Plan => {
            let mut plan = command("plan");
            plan.extend(strings(&[VAR_FILE_ARG, &out_arg]));
            out.extend([validate(), step(StepName::Plan, plan), show()]);
        }
        Op::Destroy => {
            let mut destroy = command("destroy");
            destroy.extend(strings(&["-auto-approve", VAR_FILE_ARG]));
            out.push(step(StepName::Destroy, destroy));
        }
        Op::Refresh => out.push(refresh_only()),
        Op::Drift => {
            let mut plan = command("plan");
            plan.extend(strings(&[
                "-refresh=false",
                "-detailed-exitcode",
                VAR_FILE_ARG,
                &out_arg,
            ]));
            let plan = Step {
                changes_exit_code: true,
                ..step(StepName::Plan, plan)
            };
            out.extend([refresh_only(), plan, show()]);
        }
        Op::Restore => {
            let file = inputs.restore_file.display().to_string();
            let push = strings(&["state", "push", "-force", &lock, &file]);
            out.extend([
                step(StepName::StatePush, push),
                step(StepName::StateList, strings(&["state", "list"])),
            ]);
        }
    }
    out
}

/// What an apply or destroy changed, from its summary line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Changed {
    #[serde(default)]
    pub import: u64,
    #[serde(default)]
    pub add: u64,
    #[serde(default)]
    pub change: u64,
    #[serde(default)]
    pub destroy: u64,
}

impl Changed {
    pub fn nothing(&self) -> bool {
        *self == Changed::default()
    }
}

/// The counts of the last `Apply complete! Resources: …` or `Destroy
/// complete! Resources: …` line of a step's output.
pub fn changed(stdout: &[u8]) -> Option<Changed> {
    let plain = strip_ansi_escapes::strip(stdout);
    let text = String::from_utf8_lossy(&plain);
    let line = text.lines().rev().find_map(|l| {
        let l = l.trim();
        l.strip_prefix("Apply complete! Resources: ")
            .or_else(|| l.strip_prefix("Destroy complete! Resources: "))
    })?;
    let mut out = Changed::default();
    for part in line.trim_end_matches('.').split(", ") {
        let (n, what) = part.split_once(' ')?;
        let n: u64 = n.parse().ok()?;
        match what {
            "imported" => out.import = n,
            "added" => out.add = n,
            "changed" => out.change = n,
            "destroyed" => out.destroy = n,
            _ => {}
        }
    }
    Some(out)
}

/// A step's arguments as the result records them: each backend setting's
/// value is elided, since it may name a token or a path.
pub fn recorded_args(args: &[String]) -> Vec<String> {
    args.iter()
        .map(|arg| match arg.strip_prefix("-backend-config=") {
            Some(kv) => match kv.split_once('=') {
                Some((key, _)) => format!("-backend-config={key}"),
                None => arg.clone(),
            },
            None => arg.clone(),
        })
        .collect()
}

/// How a finished step is judged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Succeeded,
    /// Succeeded, with a reason the runner logs.
    SucceededBecause(&'static str),
    Failed,
    /// Failed with the runner's own summary rather than the runtime's.
    FailedBecause(String),
    /// The saved plan could not be applied: the state changed after it was
    /// made.
    PlanStale,
}

/// Judges a finished step from its exit code and output.
pub fn judge(
    step: &Step,
    exit_code: i32,
    stdout: &[u8],
    stderr: &[u8],
    restore_resources: u64,
) -> Verdict {
    match (step.name, exit_code) {
        (_, 0) if step.name == StepName::StateList => {
            let listed = stdout
                .split(|&b| b == b'\n')
                .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
                .count();
            if restore_resources > 0 && listed == 0 {
                Verdict::FailedBecause(format!(
                    "the restored state lists no resource, but the backup had {restore_resources}"
                ))
            } else {
                Verdict::Succeeded
            }
        }
        (_, 0) => Verdict::Succeeded,
        (StepName::Plan, 2) if step.changes_exit_code => Verdict::Succeeded,
        (StepName::Apply, _) if plan_stale(stderr) => Verdict::PlanStale,
        (StepName::ForceUnlock, _) => match stale_lock_gone(stderr) {
            Some(reason) => Verdict::SucceededBecause(reason),
            None => Verdict::Failed,
        },
        _ => Verdict::Failed,
    }
}

/// Whether a failed force-unlock found the stale lock already gone: the state
/// is unlocked (a retried pod, or the holder released it), or the lock is
/// held under another ID (someone locked it since; not ours to clear, and
/// the next step waits for it like for any lock). The messages are the
/// kubernetes backend's as OpenTofu prints them, possibly in color.
fn stale_lock_gone(stderr: &[u8]) -> Option<&'static str> {
    let plain = strip_ansi_escapes::strip(stderr);
    let text = String::from_utf8_lossy(&plain);
    let reasons: Vec<&str> = text
        .lines()
        .filter_map(|line| line.split_once("Failed to unlock state: "))
        .map(|(_, reason)| reason.trim_end())
        .collect();
    if reasons.contains(&"state is already unlocked") {
        Some("the state is already unlocked")
    } else if reasons
        .iter()
        .any(|r| r.starts_with("lock id ") && r.ends_with(" does not match existing lock"))
    {
        Some("the lock is now held under another ID")
    } else {
        None
    }
}

/// Whether an apply refused its saved plan because the state moved on
/// (OpenTofu's and Terraform's "Saved plan is stale").
fn plan_stale(stderr: &[u8]) -> bool {
    let plain = strip_ansi_escapes::strip(stderr);
    String::from_utf8_lossy(&plain).contains("Saved plan is stale")
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests;
