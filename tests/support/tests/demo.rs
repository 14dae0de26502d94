//! `make demo` as a test: the demo with `--once` brings the samples of
//! config/samples up through Cluster API and CAPTF on its own control plane,
//! prints `clusterctl describe cluster`, stops everything and exits 0.

use std::path::PathBuf;
use std::process::Command;

/// The manager built beside this test (target/debug/captf-manager).
fn manager() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let debug = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/debug/deps");
    debug.join("captf-manager")
}

#[test]
fn the_demo_brings_the_samples_up() {
    let out = Command::new(env!("CARGO_BIN_EXE_captf-demo"))
        .arg("--once")
        .env("CAPTF_MANAGER_BIN", manager())
        .output()
        .expect("running captf-demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("the Cluster is provisioned and its 2 Machines run"),
        "{stdout}"
    );
    // clusterctl's tree shows the Cluster, its infrastructure and the
    // MachineDeployment.
    for line in [
        "Cluster default/demo",
        "TerraformCluster default/demo",
        "MachineDeployment default/demo-workers",
    ] {
        assert!(stdout.contains(line), "no {line} in:\n{stdout}");
    }
    assert!(stdout.contains("==> stopped"), "{stdout}");
}
