//! The flags of `captf-runner run` (ref §6.2, as agreed with the Job builder
//! and the local pod executor).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use crate::names::Op;
use crate::server::flags::GoDuration;

/// `captf-runner run`.
#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    /// The operation: apply, destroy, refresh, drift, restore or plan.
    #[arg(long, value_parser = parse_operation)]
    pub op: Op,

    /// The Terraform or OpenTofu binary.
    #[arg(long, default_value = "/captf/runtime")]
    pub bin: PathBuf,

    /// The role module (the image's child module).
    #[arg(long, default_value = "/captf/module")]
    pub module: PathBuf,

    /// The image's provider mirror, if it has one.
    #[arg(long, default_value = "/captf/providers")]
    pub providers: PathBuf,

    /// The writable working directory.
    #[arg(long, default_value = "/captf/work")]
    pub workdir: PathBuf,

    /// The per-run Secret's mount.
    #[arg(long, default_value = "/captf/config")]
    pub config: PathBuf,

    /// The credentials mirror's mount, one file per key.
    #[arg(long, default_value = "/var/run/captf/credentials")]
    pub credentials: PathBuf,

    /// Where the result document goes.
    #[arg(long, default_value = "/dev/termination-log")]
    pub result: PathBuf,

    /// How long a state-touching step waits for the state lock.
    #[arg(long, default_value = "5m0s")]
    pub lock_timeout: GoDuration,

    /// How long an interrupted step may take to stop before it is killed.
    #[arg(long, default_value = "1m0s")]
    pub stop_timeout: GoDuration,

    /// A `key=value` for init's `-backend-config` (repeatable).
    #[arg(long = "backend-config")]
    pub backend_config: Vec<String>,

    /// The ID of a stale state lock to clear after init.
    #[arg(long)]
    pub force_unlock: Option<String>,

    /// The source image, echoed in the result.
    #[arg(long)]
    pub image: Option<String>,

    /// The Job's name, echoed in the result.
    #[arg(long)]
    pub job_name: Option<String>,

    /// How many backup chunks `<config>/restore/` holds (restore).
    #[arg(long, default_value_t = 0)]
    pub restore_chunks: u32,

    /// How many resources the backup had: when non-zero, `state list` must
    /// show at least one (restore).
    #[arg(long, default_value_t = 0)]
    pub restore_resources: u64,

    /// The serial the restored state is pushed with, above every serial
    /// the object has had; 0 keeps the backup's own (restore).
    #[arg(long, default_value_t = 0)]
    pub restore_serial: u64,

    /// An apply that plans, shows and applies its saved plan (a
    /// TerraformCluster's guarded apply): a delete or replace stops it.
    #[arg(long)]
    pub guarded: bool,

    /// With --guarded: the plan may delete or replace (an approved
    /// destructive plan).
    #[arg(long, requires = "guarded")]
    pub allow_destructive: bool,

    /// An approved apply: applies the saved plan when it and a fresh plan
    /// both have this hash.
    #[arg(long)]
    pub approved_plan: Option<String>,

    /// The Secret, in the backend's namespace, that keeps the saved plan
    /// (plan, approved apply).
    #[arg(long)]
    pub plan_secret: Option<String>,

    /// The key the saved plan is sealed with.
    #[arg(long, default_value = "/captf/plan-key/key")]
    pub plan_key_file: PathBuf,

    /// The inputs hash of the Job, which a saved plan is bound to.
    #[arg(long)]
    pub inputs_hash: Option<String>,

    /// Emit progress events on this object, `<kind>/<name>/<uid>`, with the
    /// Job as the related object (the manager's --runner-events).
    #[arg(long)]
    pub events_for: Option<super::events::Regarding>,

    /// An environment variable whose value is a secret to redact
    /// (repeatable): the Job's `spec.jobs.env[]` entries that come from a
    /// `secretKeyRef`. Only the name travels; the runner reads the value
    /// from its own environment.
    #[arg(long = "secret-env", value_name = "NAME")]
    pub secret_env: Vec<String>,

    /// The directory the fixed paths above are taken relative to.
    #[arg(long, default_value = "/")]
    pub root: PathBuf,
}

/// The runner's paths, every one taken relative to `--root`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    pub bin: PathBuf,
    pub module: PathBuf,
    pub providers: PathBuf,
    pub workdir: PathBuf,
    pub config: PathBuf,
    pub credentials: PathBuf,
    pub result: PathBuf,
    pub plan_key: PathBuf,
}

impl RunArgs {
    /// The paths, resolved against `--root`.
    pub fn paths(&self) -> Paths {
        let at = |path: &Path| under(&self.root, path);
        Paths {
            bin: at(&self.bin),
            module: at(&self.module),
            providers: at(&self.providers),
            workdir: at(&self.workdir),
            config: at(&self.config),
            credentials: at(&self.credentials),
            result: at(&self.result),
            plan_key: at(&self.plan_key_file),
        }
    }

    /// Combinations clap cannot check: a restore needs its backup; a plan
    /// and an approved apply need where the plan is saved and the inputs it
    /// is bound to.
    pub fn check(&self) -> Result<(), String> {
        if self.op == Op::Restore && self.restore_chunks == 0 {
            return Err("--op=restore needs --restore-chunks of at least 1".into());
        }
        let saves = self.op == Op::Plan || self.approved_plan.is_some();
        if saves && (self.plan_secret.is_none() || self.inputs_hash.is_none()) {
            return Err(
                "--op=plan and --approved-plan need --plan-secret and --inputs-hash".into(),
            );
        }
        if self.approved_plan.is_some() && (self.op != Op::Apply || self.guarded) {
            return Err("--approved-plan goes with --op=apply alone, not --guarded".into());
        }
        if self.guarded && self.op != Op::Apply {
            return Err("--guarded goes with --op=apply".into());
        }
        Ok(())
    }

    /// The namespace of the backend, where the saved plan's Secret is.
    pub fn namespace(&self) -> Option<&str> {
        self.backend_config
            .iter()
            .find_map(|kv| kv.strip_prefix("namespace="))
    }

    /// The backend's `secret_suffix`, which names the state and its lock.
    pub fn secret_suffix(&self) -> Option<&str> {
        self.backend_config
            .iter()
            .find_map(|kv| kv.strip_prefix("secret_suffix="))
    }
}

/// `path` inside `root`: an absolute path loses its leading `/`.
fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

fn parse_operation(s: &str) -> Result<Op, String> {
    Op::parse(s).ok_or_else(|| {
        format!("{s:?} is not an operation (apply, destroy, refresh, drift, restore or plan)")
    })
}

/// The whole seconds of a lock timeout, rounded up so that a sub-second
/// timeout still waits.
pub fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("run").chain(args.iter().copied())).map(|c| c.run)
    }

    #[test]
    fn the_job_builders_arguments_parse() {
        let args = parse(&[
            "--op=apply",
            "--image=registry.example/role:1",
            "--job-name=captf-m-a-apply-a1-abcdef",
            "--lock-timeout=300s",
            "--stop-timeout=570s",
            "--backend-config=secret_suffix=0123456789abcdef-m",
            "--backend-config=namespace=ns",
            "--backend-config=in_cluster_config=true",
            "--backend-config=labels={\"captf.io/managed\"=\"true\"}",
            "--force-unlock=1234",
            "--secret-env=DB_PASSWORD",
            "--secret-env=API_TOKEN",
        ])
        .unwrap();
        assert_eq!(args.secret_env, ["DB_PASSWORD", "API_TOKEN"]);
        assert_eq!(args.op, Op::Apply);
        assert_eq!(args.lock_timeout.0, Duration::from_secs(300));
        assert_eq!(args.stop_timeout.0, Duration::from_secs(570));
        assert_eq!(args.backend_config.len(), 4);
        assert_eq!(
            args.backend_config[3],
            "labels={\"captf.io/managed\"=\"true\"}"
        );
        assert_eq!(args.force_unlock.as_deref(), Some("1234"));
        assert_eq!(args.image.as_deref(), Some("registry.example/role:1"));
        assert_eq!(args.restore_chunks, 0);
    }

    #[test]
    fn defaults_are_the_pods_fixed_paths() {
        let args = parse(&["--op", "destroy"]).unwrap();
        assert!(args.secret_env.is_empty());
        assert_eq!(args.lock_timeout.0, Duration::from_secs(300));
        assert_eq!(args.stop_timeout.0, Duration::from_secs(60));
        let paths = args.paths();
        assert_eq!(paths.bin, Path::new("/captf/runtime"));
        assert_eq!(paths.module, Path::new("/captf/module"));
        assert_eq!(paths.providers, Path::new("/captf/providers"));
        assert_eq!(paths.workdir, Path::new("/captf/work"));
        assert_eq!(paths.config, Path::new("/captf/config"));
        assert_eq!(paths.credentials, Path::new("/var/run/captf/credentials"));
        assert_eq!(paths.result, Path::new("/dev/termination-log"));
    }

    #[test]
    fn root_moves_every_fixed_path() {
        let args = parse(&["--op=plan", "--root=/tmp/pod", "--bin=/opt/tofu"]).unwrap();
        let paths = args.paths();
        assert_eq!(paths.bin, Path::new("/tmp/pod/opt/tofu"));
        assert_eq!(paths.module, Path::new("/tmp/pod/captf/module"));
        assert_eq!(paths.workdir, Path::new("/tmp/pod/captf/work"));
        assert_eq!(
            paths.credentials,
            Path::new("/tmp/pod/var/run/captf/credentials")
        );
        assert_eq!(paths.result, Path::new("/tmp/pod/dev/termination-log"));
    }

    #[test]
    fn usage_errors() {
        for bad in [
            &["--op=upgrade"][..],
            &[][..],
            &["--op=apply", "--lock-timeout=5"],
            &["--op=apply", "--stop-timeout=-1s"],
            &["--op=apply", "--restore-chunks=-1"],
            &["--op=apply", "--unknown"],
            &["--op=apply", "extra"],
        ] {
            let err = parse(bad).err().unwrap_or_else(|| panic!("{bad:?} parsed"));
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn go_durations() {
        for (text, seconds) in [
            ("300s", 300),
            ("5m0s", 300),
            ("1m", 60),
            ("1h30m", 5400),
            ("0", 0),
        ] {
            let args = parse(&["--op=apply", &format!("--lock-timeout={text}")]).unwrap();
            assert_eq!(args.lock_timeout.0, Duration::from_secs(seconds), "{text}");
        }
    }

    #[test]
    fn a_restore_needs_its_chunks() {
        assert!(parse(&["--op=restore"]).unwrap().check().is_err());
        assert!(
            parse(&["--op=restore", "--restore-chunks=2"])
                .unwrap()
                .check()
                .is_ok()
        );
        assert!(parse(&["--op=apply"]).unwrap().check().is_ok());
    }

    #[test]
    fn plans_need_their_secret_and_inputs() {
        let saving = ["--plan-secret=captf-plan-c-a", "--inputs-hash=h2:x"];
        for (args, ok) in [
            (vec!["--op=plan"], false),
            (vec!["--op=plan", saving[0]], false),
            (vec!["--op=plan", saving[0], saving[1]], true),
            (vec!["--op=apply", "--approved-plan=p1:x"], false),
            (
                vec!["--op=apply", "--approved-plan=p1:x", saving[0], saving[1]],
                true,
            ),
            (
                vec!["--op=drift", "--approved-plan=p1:x", saving[0], saving[1]],
                false,
            ),
            (
                vec![
                    "--op=apply",
                    "--guarded",
                    "--approved-plan=p1:x",
                    saving[0],
                    saving[1],
                ],
                false,
            ),
            (vec!["--op=apply", "--guarded"], true),
            (vec!["--op=apply", "--guarded", "--allow-destructive"], true),
            (vec!["--op=destroy", "--guarded"], false),
        ] {
            assert_eq!(parse(&args).unwrap().check().is_ok(), ok, "{args:?}");
        }
        // Allowing destruction means nothing without the guard.
        assert!(parse(&["--op=apply", "--allow-destructive"]).is_err());
        let args = parse(&["--op=plan", "--backend-config=namespace=team-a"]).unwrap();
        assert_eq!(args.namespace(), Some("team-a"));
        assert_eq!(args.paths().plan_key, Path::new("/captf/plan-key/key"));
    }

    #[test]
    fn whole_seconds_round_up() {
        for (duration, seconds) in [
            (Duration::ZERO, 0),
            (Duration::from_secs(300), 300),
            (Duration::from_millis(1500), 2),
            (Duration::from_nanos(1), 1),
        ] {
            assert_eq!(whole_seconds(duration), seconds, "{duration:?}");
        }
    }

    #[test]
    fn operation_names_round_trip() {
        for name in ["apply", "destroy", "refresh", "drift", "restore", "plan"] {
            assert_eq!(parse_operation(name).unwrap().as_str(), name);
        }
        assert!(parse_operation("Apply").is_err());
    }
}
