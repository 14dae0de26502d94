//! The environment each step sees (book: inside-the-job.md "Environment";
//! ref §6.3 "Runner rewrite of the step environment").
//!
//! A module must not be steerable by a TF_WORKSPACE, TF_VAR_*, TF_CLI_ARGS
//! or KUBE_* that arrived with a credential or the image's ENV, so every such
//! name goes, whatever its source; only the values the Job sets on purpose
//! survive, and those are forced rather than trusted.
//!
//! The CLI configuration (credentials, hosts, provider installation) is the
//! runner's too: HOME is forced, and every other variable either runtime
//! reads to find a CLI configuration goes as well ([`CLI_CONFIG_VARS`]).

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// The step environment, and what building it dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepEnv {
    pub vars: BTreeMap<OsString, OsString>,
    /// Names removed from the inherited environment, for the log (never
    /// their values).
    pub dropped: Vec<String>,
    /// The scratch directory to create, when TMPDIR was not inherited.
    pub create_tmpdir: Option<PathBuf>,
}

/// Builds the step environment from the inherited one. `cli_config` is the
/// CLI configuration file, written only when the image ships providers.
pub fn step_env(
    inherited: impl IntoIterator<Item = (OsString, OsString)>,
    workdir: &Path,
    cli_config: Option<&Path>,
) -> StepEnv {
    let mut vars = BTreeMap::new();
    let mut dropped = Vec::new();
    for (name, value) in inherited {
        if is_reserved(&name) && name != "KUBE_NAMESPACE" {
            // TF_IN_AUTOMATION and TF_INPUT are forced below: a replaced value
            // is not a dropped name.
            if name != "TF_IN_AUTOMATION" && name != "TF_INPUT" {
                dropped.push(name.to_string_lossy().into_owned());
            }
            continue;
        }
        vars.insert(name, value);
    }
    let mut set = |name: &str, value: &OsStr| {
        vars.insert(OsString::from(name), value.to_owned());
    };
    set("TF_IN_AUTOMATION", OsStr::new("1"));
    set("TF_INPUT", OsStr::new("0"));
    set("TF_DATA_DIR", workdir.join(".terraform").as_os_str());
    set("HOME", workdir.as_os_str());
    if let Some(cli_config) = cli_config {
        set("TF_CLI_CONFIG_FILE", cli_config.as_os_str());
    }
    let create_tmpdir = match vars.get(OsStr::new("TMPDIR")) {
        Some(tmpdir) if !tmpdir.is_empty() => None,
        _ => {
            let tmpdir = workdir.join("tmp");
            vars.insert(OsString::from("TMPDIR"), tmpdir.clone().into_os_string());
            Some(tmpdir)
        }
    };
    dropped.sort();
    StepEnv {
        vars,
        dropped,
        create_tmpdir,
    }
}

/// The variables outside TF_* that Terraform or OpenTofu read to find a CLI
/// configuration, HOME aside (forced):
/// - TERRAFORM_CONFIG: the legacy name of TF_CLI_CONFIG_FILE, read by both
///   runtimes when TF_CLI_CONFIG_FILE is unset, as it is when the image ships
///   no providers. A credential key is a file of the credentials mount, so a
///   credential could otherwise name a CLI configuration it brings itself.
/// - TOFU_CLI_CONFIG_FILE: not read by OpenTofu 1.x, but a name it may take
///   up for TF_CLI_CONFIG_FILE, and tools set it beside that one.
/// - XDG_CONFIG_HOME: OpenTofu reads `$XDG_CONFIG_HOME/opentofu/tofurc` and
///   the `*.tfrc` files of `$XDG_CONFIG_HOME/opentofu` when HOME holds no CLI
///   configuration, which the forced HOME never does.
pub const CLI_CONFIG_VARS: &[&str] = &[
    "TERRAFORM_CONFIG",
    "TOFU_CLI_CONFIG_FILE",
    "XDG_CONFIG_HOME",
];

fn is_reserved(name: &OsStr) -> bool {
    let bytes = name.as_encoded_bytes();
    bytes.starts_with(b"TF_")
        || bytes.starts_with(b"KUBE_")
        || CLI_CONFIG_VARS.iter().any(|var| bytes == var.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<OsString, OsString> {
        env(pairs).into_iter().collect()
    }

    const WORK: &str = "/captf/work";

    #[test]
    fn the_job_environment() {
        let got = step_env(
            env(&[
                ("PATH", "/usr/bin:/bin"),
                ("TF_IN_AUTOMATION", "1"),
                ("TF_INPUT", "0"),
                ("HOME", "/captf/work"),
                ("TMPDIR", "/tmp"),
                ("KUBE_NAMESPACE", "team-a"),
                ("CHECKPOINT_DISABLE", "1"),
                ("AWS_ACCESS_KEY_ID", "AKIA"),
            ]),
            Path::new(WORK),
            None,
        );
        assert_eq!(
            got.vars,
            map(&[
                ("AWS_ACCESS_KEY_ID", "AKIA"),
                ("CHECKPOINT_DISABLE", "1"),
                ("HOME", "/captf/work"),
                ("KUBE_NAMESPACE", "team-a"),
                ("PATH", "/usr/bin:/bin"),
                ("TF_DATA_DIR", "/captf/work/.terraform"),
                ("TF_INPUT", "0"),
                ("TF_IN_AUTOMATION", "1"),
                ("TMPDIR", "/tmp"),
            ])
        );
        assert!(got.dropped.is_empty());
        assert_eq!(got.create_tmpdir, None);
    }

    #[test]
    fn steering_variables_are_dropped_by_name() {
        let got = step_env(
            env(&[
                ("TF_WORKSPACE", "evil"),
                ("TF_VAR_region", "moon"),
                ("TF_CLI_ARGS", "-destroy"),
                ("TF_CLI_ARGS_apply", "-target=x"),
                ("TF_LOG", "TRACE"),
                ("TF_PLUGIN_CACHE_DIR", "/cache"),
                ("TF_CLI_CONFIG_FILE", "/evil.tfrc"),
                ("TERRAFORM_CONFIG", "/var/run/captf/credentials/tfrc"),
                ("TOFU_CLI_CONFIG_FILE", "/evil.tofurc"),
                ("XDG_CONFIG_HOME", "/evil"),
                (
                    "terraform_config",
                    "kept: the runtimes read only upper case",
                ),
                ("KUBE_CONFIG_PATH", "/other/kubeconfig"),
                ("KUBE_TOKEN", "t0ken"),
                ("KUBECONFIG", "/kept/kubeconfig"),
                ("tf_var_lower", "kept: the runtime reads only upper case"),
            ]),
            Path::new(WORK),
            None,
        );
        assert_eq!(
            got.dropped,
            [
                "KUBE_CONFIG_PATH",
                "KUBE_TOKEN",
                "TERRAFORM_CONFIG",
                "TF_CLI_ARGS",
                "TF_CLI_ARGS_apply",
                "TF_CLI_CONFIG_FILE",
                "TF_LOG",
                "TF_PLUGIN_CACHE_DIR",
                "TF_VAR_region",
                "TF_WORKSPACE",
                "TOFU_CLI_CONFIG_FILE",
                "XDG_CONFIG_HOME",
            ]
        );
        let names: Vec<_> = got.vars.keys().map(|k| k.to_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "HOME",
                "KUBECONFIG",
                "TF_DATA_DIR",
                "TF_INPUT",
                "TF_IN_AUTOMATION",
                "TMPDIR",
                "terraform_config",
                "tf_var_lower"
            ]
        );
    }

    #[test]
    fn forced_values_win_over_what_arrived() {
        let got = step_env(
            env(&[
                ("TF_IN_AUTOMATION", ""),
                ("TF_INPUT", "1"),
                ("TF_DATA_DIR", "/elsewhere"),
                ("HOME", "/root"),
            ]),
            Path::new(WORK),
            None,
        );
        assert_eq!(got.vars[OsStr::new("TF_IN_AUTOMATION")], "1");
        assert_eq!(got.vars[OsStr::new("TF_INPUT")], "0");
        assert_eq!(
            got.vars[OsStr::new("TF_DATA_DIR")],
            "/captf/work/.terraform"
        );
        assert_eq!(got.vars[OsStr::new("HOME")], "/captf/work");
        assert_eq!(got.dropped, ["TF_DATA_DIR"]);
    }

    #[test]
    fn forced_values_are_set_when_absent() {
        let got = step_env(env(&[]), Path::new(WORK), None);
        assert_eq!(
            got.vars,
            map(&[
                ("HOME", "/captf/work"),
                ("TF_DATA_DIR", "/captf/work/.terraform"),
                ("TF_INPUT", "0"),
                ("TF_IN_AUTOMATION", "1"),
                ("TMPDIR", "/captf/work/tmp"),
            ])
        );
        assert_eq!(
            got.create_tmpdir.as_deref(),
            Some(Path::new("/captf/work/tmp"))
        );
    }

    #[test]
    fn tmpdir() {
        let scratch = Some("/captf/work/tmp");
        for (inherited, want, create) in [
            (Some("/tmp"), "/tmp", None),
            (Some(""), "/captf/work/tmp", scratch),
            (None, "/captf/work/tmp", scratch),
        ] {
            let pairs: Vec<(&str, &str)> = inherited.map(|v| ("TMPDIR", v)).into_iter().collect();
            let got = step_env(env(&pairs), Path::new(WORK), None);
            assert_eq!(got.vars[OsStr::new("TMPDIR")], want, "{inherited:?}");
            assert_eq!(
                got.create_tmpdir.as_deref(),
                create.map(Path::new),
                "{inherited:?}"
            );
        }
    }

    #[test]
    fn cli_config_only_with_providers() {
        let with = step_env(
            env(&[]),
            Path::new(WORK),
            Some(Path::new("/captf/work/cli.tfrc")),
        );
        assert_eq!(
            with.vars[OsStr::new("TF_CLI_CONFIG_FILE")],
            "/captf/work/cli.tfrc"
        );
        // Without the runner's file no variable names another one: the
        // runtime falls back to HOME, the working directory.
        let without = step_env(
            env(&[
                ("TF_CLI_CONFIG_FILE", "/x"),
                ("TERRAFORM_CONFIG", "/y"),
                ("XDG_CONFIG_HOME", "/z"),
            ]),
            Path::new(WORK),
            None,
        );
        for name in ["TF_CLI_CONFIG_FILE", "TERRAFORM_CONFIG", "XDG_CONFIG_HOME"] {
            assert!(!without.vars.contains_key(OsStr::new(name)), "{name}");
        }
    }
}
