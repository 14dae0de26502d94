//! The manager's own identity on a test control plane: the ServiceAccount
//! and RBAC of `config/rbac`, applied with kubectl as a user installs them,
//! and a kubeconfig with a token of that ServiceAccount.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::controlplane::{ControlPlane, binary};

/// The manager's namespace and ServiceAccount (config/rbac).
pub const NAMESPACE: &str = "captf-system";
pub const SERVICE_ACCOUNT: &str = "captf-controller-manager";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs kubectl with `kubeconfig`; its stdout, or why it failed.
pub fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(binary("kubectl"))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .output()
        .map_err(|e| format!("running kubectl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Applies config/rbac and writes a kubeconfig for the manager's
/// ServiceAccount; its path.
pub fn install(plane: &ControlPlane) -> Result<PathBuf, String> {
    let admin = plane.kubeconfig();
    let namespace = plane.dir().join("captf-system.yaml");
    std::fs::write(
        &namespace,
        format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n"),
    )
    .map_err(|e| e.to_string())?;
    kubectl(admin, &["apply", "-f", &namespace.display().to_string()])?;
    let rbac = repo().join("config/rbac");
    kubectl(admin, &["apply", "-k", &rbac.display().to_string()])?;
    account_kubeconfig(plane, NAMESPACE, SERVICE_ACCOUNT)
}

/// A kubeconfig with a token of the ServiceAccount `namespace/account`
/// (which must exist), whose namespace is `namespace`; its path.
pub fn account_kubeconfig(
    plane: &ControlPlane,
    namespace: &str,
    account: &str,
) -> Result<PathBuf, String> {
    let token = kubectl(
        plane.kubeconfig(),
        &[
            "create",
            "token",
            account,
            "-n",
            namespace,
            "--duration=24h",
        ],
    )?;
    let ca = std::fs::read_to_string(plane.dir().join("ca.crt")).map_err(|e| e.to_string())?;
    let path = plane
        .dir()
        .join(format!("{namespace}-{account}.kubeconfig"));
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    let text = token_kubeconfig(plane.server(), &ca, token.trim(), account, Some(namespace));
    std::fs::write(&path, text).map_err(|e| e.to_string())?;
    Ok(path)
}

/// A kubeconfig whose user is `user` with `token`; the context's namespace
/// is `namespace` when given. `ca_data` is the CA's PEM in base64.
pub fn token_kubeconfig(
    server: &str,
    ca_data: &str,
    token: &str,
    user: &str,
    namespace: Option<&str>,
) -> String {
    let namespace = namespace
        .map(|ns| format!("\n    namespace: {ns}"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: captf-test
  cluster:
    server: {server}
    certificate-authority-data: {ca_data}
users:
- name: {user}
  user:
    token: {token}
contexts:
- name: {user}
  context:
    cluster: captf-test
    user: {user}{namespace}
current-context: {user}
"
    )
}

/// `kubectl auth can-i --list` for `kubeconfig` in `namespace`, one rule
/// per line, columns separated by " | " (the table pads them with runs of
/// spaces; a verb list has single spaces inside its brackets).
pub fn rules(kubeconfig: &Path, namespace: &str) -> String {
    let table = kubectl(kubeconfig, &["auth", "can-i", "--list", "-n", namespace])
        .unwrap_or_else(|e| panic!("{e}"));
    let mut lines: Vec<String> = table
        .lines()
        .skip(1)
        .map(|line| {
            line.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .filter(|l| !l.is_empty())
        .collect();
    lines.sort();
    lines.join("\n") + "\n"
}

/// Holds `got` to the allow-list `tests/golden/rbac/<name>`
/// (`CAPTF_UPDATE_GOLDEN=1` rewrites it).
pub fn check_allowed(name: &str, got: &str) {
    let path = repo().join("tests/golden/rbac").join(name);
    if std::env::var_os("CAPTF_UPDATE_GOLDEN").is_some() {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("creating tests/golden/rbac");
        }
        std::fs::write(&path, got).expect("writing an allow-list");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        want == got,
        "{} differs from what the account may do (CAPTF_UPDATE_GOLDEN=1 rewrites it once reviewed):\n--- allowed\n{want}\n--- now\n{got}",
        path.display()
    );
}
