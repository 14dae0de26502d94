//! Upstream projects' own files, read from their Go modules in the module
//! cache at the versions pinned in versions.env: Cluster API's and
//! cert-manager's CRDs, installed as those projects ship them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// The directory of `module` (`path@version`) in the Go module cache, as
/// `go mod download -json` reports it, downloading it if it is missing.
pub fn go_module(module: &str) -> PathBuf {
    // Outside any go.mod, so that no main module's requirements apply.
    let out = Command::new("go")
        .args(["mod", "download", "-json", module])
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running go mod download {module}: {e}"));
    assert!(
        out.status.success(),
        "go mod download {module} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let info: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("go mod download -json {module}: {e}"));
    let dir = info["Dir"]
        .as_str()
        .unwrap_or_else(|| panic!("go mod download -json {module} names no Dir: {info}"));
    PathBuf::from(dir)
}

/// Every document of every `.yaml` file of `dir`, in file name order.
pub fn yaml_dir(dir: &Path) -> Vec<Value> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            documents(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
        })
        .collect()
}

/// The non-empty documents of a YAML stream.
pub fn documents(text: &str) -> Result<Vec<Value>, serde_saphyr::Error> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// cert-manager's CRDs (`deploy/crds`), so that the Issuer and Certificate
/// of CAPTF's manifests can be checked against cert-manager's own schema.
pub fn cert_manager_crds() -> Vec<Value> {
    let version = crate::controlplane::version("CERT_MANAGER_VERSION");
    let dir = go_module(&format!("github.com/cert-manager/cert-manager@v{version}"));
    yaml_dir(&dir.join("deploy/crds"))
}
