//! The runner: the Job's entry point (book: inside-the-job.md; ref §6.2–§6.3).
//!
//! `run` checks the image, prepares the working directory, then runs the
//! operation's steps with a cleaned environment, and always writes a result
//! document. The decisions (environment, steps, verdicts, summaries,
//! redaction, the result's size) are pure functions in the submodules; this
//! file only sequences them.

pub mod api;
pub mod args;
pub mod env;
pub mod events;
pub mod exec;
pub mod layout;
pub mod plan;
mod plans;
pub mod redact;
pub mod result;
pub mod saved;
pub mod steps;
pub mod summary;

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

pub use args::RunArgs;

use crate::api::{RunError, RunErrorKind};
use crate::names::{self, Op};
use args::{Paths, whole_seconds};
use events::{Emitter, Type};
use exec::{Finished, Invocation, Signals, Stopped};
use plan::Plan;
use plans::Store;
use redact::Redactor;
use result::{RunResult, StepRecord};
use steps::{Stdout, Step, StepInputs, StepName, Verdict};
use summary::FailedStep;

/// The init container's step: copy this very binary to `dest` (on the shared
/// `runner` volume), executable, so that any role image can run it.
pub fn copy_self(dest: &Path) -> io::Result<()> {
    let me = std::env::current_exe()?;
    // Write under a temporary name first: a half-copied runner must never be
    // found at `dest` by the main container.
    let tmp = dest.with_extension("partial");
    fs::copy(&me, &tmp)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
    fs::rename(&tmp, dest)
}

/// Runs `captf-runner run` to its end and returns the exit code: 0 when the
/// operation succeeded, 1 otherwise. The result document is written in
/// every case.
pub async fn run(args: &RunArgs) -> u8 {
    // First of all, so that a stop request cannot kill the runner before it
    // has written its result.
    let signals = Signals::install();
    let paths = args.paths();
    // Without a redactor no output may pass: the run stops before any step.
    let (redactor, no_redactor) = match known_secrets(args, &paths) {
        Ok(redactor) => (redactor, None),
        Err(e) => (Redactor::none(), Some(e)),
    };
    let log = Log(Arc::new(redactor));
    let mut result = RunResult {
        operation: args.op,
        job: args.job_name.clone(),
        image: args.image.clone(),
        runtime_version: None,
        steps: Vec::new(),
        changed: None,
        plan: None,
        error: None,
    };
    let started = std::time::Instant::now();
    let mut events = Emitter::off();
    let outcome = match (signals, no_redactor) {
        (_, Some(e)) => Err(RunError {
            kind: RunErrorKind::Step,
            step: None,
            summary: Some(e.to_string()),
        }),
        (Ok(mut signals), None) => {
            let mut runner = Runner {
                args,
                paths: &paths,
                log: &log,
                signals: &mut signals,
                result: &mut result,
                shown: None,
                store: None,
                client: None,
                events: &mut events,
            };
            runner.drive().await
        }
        (Err(e), None) => Err(RunError {
            kind: RunErrorKind::Step,
            step: None,
            summary: Some(log.redact(&format!("the runner cannot catch signals: {e}"))),
        }),
    };
    let op = args.op.as_str();
    let took = format!("{:.1}s", started.elapsed().as_secs_f64());
    let (type_, finished) = match &outcome {
        Ok(()) => (Type::Normal, format!("{op} succeeded in {took}")),
        Err(e) => (
            Type::Warning,
            format!(
                "{op} failed after {took}: {}",
                e.summary.as_deref().unwrap_or("no summary")
            ),
        ),
    };
    log.say(&finished);
    if let Some(why) = events.emit(type_, "RunFinished", &finished).await {
        log.say(&why);
    }
    result.error = outcome.err();
    let failed = result.error.is_some();
    if let Err(e) = fs::write(&paths.result, result.to_bounded_json()) {
        log.say(&format!(
            "writing the result to {}: {e}",
            paths.result.display()
        ));
        return 1;
    }
    u8::from(failed)
}

/// The runner's own log lines, on standard error, redacted.
struct Log(Arc<Redactor>);

impl Log {
    fn say(&self, message: &str) {
        say(&self.0.text(message));
    }

    fn redact(&self, summary: &str) -> String {
        summary::own(summary, &self.0)
    }
}

/// Writes one log line to standard error. Unlike `eprintln!`, a closed
/// stream is not a panic: the result document still gets written.
fn say(line: &str) {
    let _ = writeln!(io::stderr().lock(), "captf-runner: {line}");
}

/// Every secret the runner knows of: the values of the variables named by
/// `--secret-env` (read from the runner's own environment, which the steps
/// inherit), the credentials mirror's files and the sensitive variables'
/// values. The values inside known formats come first, so that their
/// escaped and encoded forms are the last the budget drops. Reading them is
/// best effort; a problem is logged (names, paths and errors only, which
/// hold no secret) and what could be read is still used.
fn known_secrets(args: &RunArgs, paths: &Paths) -> Result<Redactor, redact::RedactorError> {
    let mut sources: Vec<Vec<u8>> = Vec::new();
    for name in &args.secret_env {
        match std::env::var_os(name) {
            Some(value) => sources.push(value.into_encoded_bytes()),
            None => say(&format!("--secret-env={name}: not set")),
        }
    }
    match layout::read_files(&paths.credentials) {
        Ok(files) => sources.extend(files.into_iter().map(|(_, content)| content)),
        Err(e) => say(&format!(
            "reading the credentials in {}: {e}",
            paths.credentials.display()
        )),
    }
    let mut values: Vec<Vec<u8>> = sources
        .iter()
        .flat_map(|s| redact::formats::extract(s))
        .collect();
    let json = |name: &str| -> Option<serde_json::Value> {
        let path = paths.config.join(name);
        let bytes = fs::read(&path).ok()?;
        serde_json::from_slice(&bytes)
            .inspect_err(|e| say(&format!("{} is not JSON: {e}", path.display())))
            .ok()
    };
    if let (Some(main), Some(tfvars)) = (json("main.tf.json"), json("terraform.tfvars.json")) {
        values.extend(redact::sensitive_variable_secrets(&main, &tfvars));
    }
    values.extend(sources.iter().flat_map(|s| redact::value_lines(s)));
    let redactor = Redactor::new(values)?;
    if let Some(capped) = redactor.capped() {
        say(&format!(
            "redaction: {} of {} secrets are matched only as stored, not in their escaped or \
             encoded forms, which would pass the budget of {} bytes and {} patterns",
            capped.without_forms,
            capped.secrets,
            redact::FORMS_MAX_BYTES,
            redact::FORMS_MAX_PATTERNS
        ));
    }
    Ok(redactor)
}

struct Runner<'a> {
    args: &'a RunArgs,
    paths: &'a Paths,
    log: &'a Log,
    signals: &'a mut Signals,
    result: &'a mut RunResult,
    /// The plan the last `show -json` printed.
    shown: Option<Plan>,
    /// Where a plan or an approved apply keeps the saved plan.
    store: Option<Store>,
    /// The API client, once one was needed.
    client: Option<kube::Client>,
    events: &'a mut Emitter,
}

impl Runner<'_> {
    async fn drive(&mut self) -> Result<(), RunError> {
        let (args, paths, log) = (self.args, self.paths, self.log);
        let image_layout = |summary: String| RunError {
            kind: RunErrorKind::ImageLayout,
            step: None,
            summary: Some(log.redact(&summary)),
        };
        layout::preflight(&paths.module, &paths.bin).map_err(|e| image_layout(e.to_string()))?;
        let workdir = layout::prepare(&paths.workdir, &paths.config, &paths.providers)
            .map_err(|e| image_layout(e.to_string()))?;
        let env = env::step_env(
            std::env::vars_os(),
            &paths.workdir,
            workdir.cli_config.as_deref(),
        );
        for name in &env.dropped {
            log.say(&format!("dropped {name} from the step environment"));
        }
        if let Some(tmpdir) = &env.create_tmpdir {
            layout::create_tmpdir(tmpdir).map_err(|e| image_layout(e.to_string()))?;
        }
        let plan_file = paths.workdir.join("plan.out");
        let approved_file = paths.workdir.join("approved.out");
        let restore_file = paths.workdir.join("restore.tfstate");
        if args.op == Op::Plan || args.approved_plan.is_some() {
            self.open_store(&approved_file).await?;
        }
        if args.op == Op::Restore {
            let serial = (args.restore_serial > 0).then_some(args.restore_serial);
            layout::write_restore_file(&paths.config, args.restore_chunks, serial, &restore_file)
                .map_err(|e| self.step_error(StepName::StatePush, &e.to_string()))?;
        }

        let base = Invocation {
            bin: &paths.bin,
            args: &[],
            cwd: &workdir.root,
            env: &env.vars,
            stdout: Stdout::Log,
            stop_timeout: args.stop_timeout.0,
        };
        self.interrupted_before("version").await?;
        let version_args = steps::version_args();
        let version = Invocation {
            args: &version_args,
            stdout: Stdout::LogAndKeep,
            ..base
        };
        self.version(&version).await?;
        self.open_events().await;
        let started = format!(
            "{} with image {}, runtime {}",
            args.op.as_str(),
            args.image.as_deref().unwrap_or("unknown"),
            self.result.runtime_version.as_deref().unwrap_or("unknown")
        );
        self.emit(Type::Normal, "RunStarted", &started).await;

        let plan = steps::steps(&StepInputs {
            op: args.op,
            lock_timeout_seconds: whole_seconds(args.lock_timeout.0),
            backend_config: &args.backend_config,
            force_unlock: args.force_unlock.as_deref(),
            plan_file: &plan_file,
            restore_file: &restore_file,
            guarded: args.guarded || args.approved_plan.is_some(),
            apply_file: match args.approved_plan {
                Some(_) => &approved_file,
                None => &plan_file,
            },
        });
        for step in &plan {
            self.interrupted_before(step.name.as_str()).await?;
            let inv = Invocation {
                args: &step.args,
                stdout: step.stdout,
                ..base
            };
            let mut outcome = self.step(step, &inv).await;
            if step.name == StepName::Init
                && outcome
                    .as_ref()
                    .is_err_and(|e| e.kind == RunErrorKind::Step)
                && self.release_stale_lock().await
            {
                outcome = self.step(step, &inv).await;
            }
            match outcome {
                Err(e) if e.kind == RunErrorKind::PlanChanged && self.store.is_some() => {
                    // An approved plan the state moved past: the fresh one
                    // is kept for approval instead.
                    self.save_shown(&plan_file).await?;
                    return Err(e);
                }
                other => other?,
            }
            if step.name == StepName::Show {
                self.judge_plan(&plan_file).await?;
            }
        }
        Ok(())
    }

    /// Releases the stale lock the Job was given when init failed on it:
    /// with no state yet, the backend takes the lock to create the empty
    /// state during init, so a lock an interrupted init left behind stops
    /// every later init, and force-unlock, which needs init, can never run.
    /// Only the lock under the stale ID is released; whether it was, so
    /// that init runs again.
    async fn release_stale_lock(&mut self) -> bool {
        let Some(id) = self.args.force_unlock.clone() else {
            return false;
        };
        let (Some(namespace), Some(suffix)) = (self.args.namespace(), self.args.secret_suffix())
        else {
            return false;
        };
        let (namespace, lease) = (namespace.to_owned(), names::state_lock_lease(suffix));
        let released = match self.client().await {
            Ok(client) => api::release_lock(&client, &namespace, &lease, &id)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match released {
            Ok(true) => {
                self.log.say(&format!(
                    "init failed while Lease {lease} was held under the stale lock {id}: released it, and init runs again"
                ));
                true
            }
            Ok(false) => false,
            Err(e) => {
                self.log
                    .say(&format!("releasing the stale lock on Lease {lease}: {e}"));
                false
            }
        }
    }

    /// The API client, made once: with the backend's credentials.
    async fn client(&mut self) -> Result<kube::Client, String> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let client = api::client(&self.args.backend_config)
            .await
            .map_err(|e| format!("reaching the API server: {e}"))?;
        self.client = Some(client.clone());
        Ok(client)
    }

    /// Starts the progress events when the Job asks for them.
    async fn open_events(&mut self) {
        let Some(regarding) = self.args.events_for.clone() else {
            return;
        };
        let (Some(namespace), Some(job)) = (self.args.namespace(), self.args.job_name.clone())
        else {
            self.log
                .say("no events: the backend's namespace or the Job's name is missing");
            return;
        };
        let namespace = namespace.to_owned();
        match self.client().await {
            Ok(client) => {
                let instance = std::env::var("HOSTNAME").unwrap_or_else(|_| job.clone());
                *self.events = Emitter::new(client, &namespace, regarding, &job, &instance);
            }
            Err(e) => self.log.say(&format!("no events: {e}")),
        }
    }

    async fn emit(&mut self, type_: Type, reason: &str, note: &str) {
        let note = self.log.0.text(note);
        if let Some(why) = self.events.emit(type_, reason, &note).await {
            self.log.say(&why);
        }
    }

    /// `version -json`: informational, so its failure only costs the
    /// result its runtimeVersion.
    async fn version(&mut self, inv: &Invocation<'_>) -> Result<(), RunError> {
        match exec::run(inv, self.signals, &self.log.0).await {
            Ok(Finished {
                interrupted: Some(stopped),
                exit_code,
                ..
            }) => Err(self.interrupted("version", stopped, exit_code)),
            Ok(done) if done.exit_code == 0 => {
                self.result.runtime_version = runtime_version(&done.stdout);
                Ok(())
            }
            Ok(done) => {
                self.log
                    .say(&format!("version -json exited {}", done.exit_code));
                Ok(())
            }
            Err(e) => {
                self.log
                    .say(&format!("starting {}: {e}", inv.bin.display()));
                Ok(())
            }
        }
    }

    async fn step(&mut self, step: &Step, inv: &Invocation<'_>) -> Result<(), RunError> {
        let name = step.name.as_str();
        let recorded = steps::recorded_args(&step.args);
        self.log
            .say(&format!("step {name}: {}", recorded.join(" ")));
        self.emit(Type::Normal, "StepStarted", &format!("step {name}"))
            .await;
        let done = exec::run(inv, self.signals, &self.log.0)
            .await
            .map_err(|e| {
                self.step_error(step.name, &format!("starting {}: {e}", inv.bin.display()))
            })?;
        self.result.steps.push(StepRecord {
            name: name.to_string(),
            exit_code: done.exit_code,
            duration_milliseconds: u64::try_from(done.duration.as_millis()).unwrap_or(u64::MAX),
            args: Some(recorded),
        });
        if let Some(stopped) = done.interrupted {
            return Err(self.interrupted(name, stopped, done.exit_code));
        }
        if let Some(read) = done.plan {
            self.shown = Some(read.map_err(|e| self.step_error(step.name, &e))?);
        }
        let verdict = steps::judge(
            step,
            done.exit_code,
            &done.stdout,
            &done.stderr,
            self.args.restore_resources,
        );
        let took = format!("{:.1}s", done.duration.as_secs_f64());
        let outcome = match verdict {
            Verdict::Succeeded => Ok(()),
            Verdict::SucceededBecause(why) => {
                self.log.say(&format!(
                    "step {name} exited {} and counts as succeeded: {why}",
                    done.exit_code
                ));
                Ok(())
            }
            Verdict::Failed => Err(RunError {
                kind: RunErrorKind::Step,
                step: Some(name.to_string()),
                summary: Some(summary::summarize(
                    &FailedStep {
                        name,
                        exit_code: done.exit_code,
                        validate_json: (step.name == StepName::Validate)
                            .then_some(done.stdout.as_slice()),
                        stderr: &done.stderr,
                    },
                    &self.log.0,
                )),
            }),
            Verdict::FailedBecause(why) => Err(self.step_error(step.name, &why)),
            Verdict::PlanStale => Err(RunError {
                kind: RunErrorKind::PlanChanged,
                step: Some(name.to_string()),
                summary: Some(
                    "the state changed after the plan was saved: not applied; \
                     the fresh plan is saved for approval"
                        .into(),
                ),
            }),
        };
        match &outcome {
            Ok(()) => {
                let note = format!("step {name} exited {} in {took}", done.exit_code);
                self.emit(Type::Normal, "StepSucceeded", &note).await;
                if matches!(step.name, StepName::Apply | StepName::Destroy)
                    && let Some(changed) = steps::changed(&done.stdout)
                {
                    self.result.changed = Some(changed);
                    // A guarded apply that changed nothing has nothing to say.
                    if !(changed.nothing() && self.args.guarded) {
                        let note = format!(
                            "{} imported, {} added, {} changed, {} destroyed",
                            changed.import, changed.add, changed.change, changed.destroy
                        );
                        self.emit(Type::Normal, "ResourcesChanged", &note).await;
                    }
                }
            }
            Err(e) => {
                let note = e
                    .summary
                    .clone()
                    .unwrap_or_else(|| format!("step {name} failed"));
                self.emit(Type::Warning, "StepFailed", &note).await;
            }
        }
        outcome
    }

    fn step_error(&self, step: StepName, summary: &str) -> RunError {
        RunError {
            kind: RunErrorKind::Step,
            step: Some(step.as_str().to_string()),
            summary: Some(self.log.redact(summary)),
        }
    }

    /// A stop request that arrived between steps ends the run before `next`.
    async fn interrupted_before(&mut self, next: &str) -> Result<(), RunError> {
        match self.signals.received().await {
            Some(signal) => Err(RunError {
                kind: RunErrorKind::Interrupted,
                step: None,
                summary: Some(format!(
                    "{} received before {next}, which did not run",
                    signal.name()
                )),
            }),
            None => Ok(()),
        }
    }

    fn interrupted(&self, step: &str, stopped: Stopped, exit_code: i32) -> RunError {
        let how = if stopped.killed {
            format!(
                "did not stop within {} and was killed",
                self.args.stop_timeout
            )
        } else {
            format!("exited {exit_code}")
        };
        RunError {
            kind: RunErrorKind::Interrupted,
            step: Some(step.to_string()),
            summary: Some(format!(
                "{} received during {step} and forwarded to the runtime, which {how}",
                stopped.signal.name()
            )),
        }
    }
}

/// The runtime's version from `version -json`.
fn runtime_version(stdout: &[u8]) -> Option<String> {
    let doc: serde_json::Value = serde_json::from_slice(stdout).ok()?;
    doc.get("terraform_version")?.as_str().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_versions() {
        for (stdout, want) in [
            (
                &br#"{"terraform_version":"1.12.6","platform":"linux_amd64","provider_selections":{}}"#[..],
                Some("1.12.6"),
            ),
            (br#"{"platform":"linux_amd64"}"#, None),
            (b"OpenTofu v1.12.6", None),
            (b"", None),
        ] {
            assert_eq!(runtime_version(stdout).as_deref(), want);
        }
    }
}
