//! The manager's command line: refused flag combinations, `crds`, and the
//! allocator it runs with.

use super::*;

#[test]
fn invalid_flag_combinations_stop_the_manager_with_the_reason() {
    let certs = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_captf-manager"))
        .arg("--kubeconfig=/nonexistent")
        .arg(format!("--webhook-cert-dir={}", certs.path().display()))
        .arg("--runner-image=registry.example/captf:test")
        .arg("--leader-elect-renew-deadline=20s")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("--leader-elect-lease-duration: 15s must be greater than --leader-elect-renew-deadline 20s"),
        "{log}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_captf-manager"))
        .arg("--webhook-port=http")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--webhook-port"));
}

#[test]
fn crds_subcommand_prints_the_crds() {
    let out = Command::new(env!("CARGO_BIN_EXE_captf-manager"))
        .arg("crds")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let yaml = String::from_utf8(out.stdout).unwrap();
    assert_eq!(yaml, captf::api::crds_yaml());
    assert!(yaml.contains("kind: CustomResourceDefinition"));
}

/// The manager's allocator runs with the options `src/bin/captf-manager.rs`
/// compiles in: a misspelt options symbol would leave jemalloc on its
/// defaults without a word (an arena per thread, ten seconds of decay).
#[test]
fn the_allocator_runs_with_the_compiled_in_options() {
    let out = Command::new(env!("CARGO_BIN_EXE_captf-manager"))
        .arg("crds")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stats = String::from_utf8_lossy(&out.stderr);
    for option in [
        "opt.narenas: 1\n",
        "opt.dirty_decay_ms: 1000 ",
        "opt.muzzy_decay_ms: 0 ",
        "opt.background_thread: true ",
    ] {
        assert!(stats.contains(option), "{option:?} not in {stats}");
    }
}
