//! clusterctl as a user runs it: the binary `tests/controlplane/build.sh`
//! builds, a private HOME, no version check and no network, and CAPTF's
//! release artifacts (`hack/release-manifests.sh`) as a local provider
//! repository, `infrastructure-terraform/v<version>/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::controlplane;

/// CAPTF's provider name in clusterctl (`--infrastructure terraform`).
pub const PROVIDER: &str = "terraform";

/// The release clusterctl installs: `v<captf::VERSION>`.
pub fn release() -> String {
    format!("v{}", captf::VERSION)
}

/// The built clusterctl of the pinned Cluster API release.
pub fn binary() -> PathBuf {
    let path = controlplane::bin_dir().join(format!("clusterctl-v{}", crate::capi::version()));
    assert!(
        path.exists(),
        "{} is missing: run tests/controlplane/build.sh",
        path.display()
    );
    path
}

/// A clusterctl with its own HOME and a configuration naming CAPTF's
/// local repository.
pub struct Clusterctl {
    home: tempfile::TempDir,
    /// The release folder: infrastructure-components.yaml, metadata.yaml,
    /// cluster-template.yaml.
    pub release: PathBuf,
}

impl Clusterctl {
    /// Renders the release artifacts into a local repository.
    pub fn with_release() -> Clusterctl {
        let home = tempfile::tempdir().expect("a temporary directory");
        let release = home
            .path()
            .join("repository/infrastructure-terraform")
            .join(release());
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/release-manifests.sh");
        let out = Command::new(&script)
            .arg(&release)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "{} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let config = format!(
            "providers:\n  - name: {PROVIDER}\n    type: InfrastructureProvider\n    url: {}\n",
            release.join("infrastructure-components.yaml").display()
        );
        std::fs::write(home.path().join("clusterctl.yaml"), config).unwrap();
        Clusterctl { home, release }
    }

    /// Runs clusterctl with `args` and the variables `vars`; its stdout, or
    /// a panic with its stderr.
    pub fn run(&self, args: &[&str], vars: &[(&str, &str)]) -> String {
        let out = self
            .command(args, vars)
            .output()
            .expect("running clusterctl");
        assert!(
            out.status.success(),
            "clusterctl {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("clusterctl writes UTF-8")
    }

    /// The command, for a caller that reads its output as it comes.
    pub fn command(&self, args: &[&str], vars: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(binary());
        cmd.arg(format!(
            "--config={}",
            self.home.path().join("clusterctl.yaml").display()
        ))
        .args(args)
        // Nothing of the test's environment steers it: no KUBECONFIG, no
        // variable a developer happens to have set.
        .env_clear()
        .env("HOME", self.home.path())
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("CLUSTERCTL_DISABLE_VERSIONCHECK", "true")
        .env("GOPROXY", "off")
        .envs(vars.iter().copied())
        .stdin(Stdio::null());
        cmd
    }
}
