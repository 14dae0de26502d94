//! CAPTF's images (issue 21): built by `hack/images.sh` without a Docker
//! daemon, pushed to a registry with crane, read back from it, and run:
//! a cluster applied by Jobs whose pods pull the runner and the module from
//! the registry.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use captf_testkit::registry::{self, MANAGER as MANAGER_IMAGE, NOOP_MODULE, Pushed, RUNNER, crane};
use captf_testkit::scenario::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::Value;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

/// The OCI labels every image carries (reference §9.1).
const OCI_LABELS: [&str; 3] = [
    "org.opencontainers.image.source",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.version",
];

/// The image's config, as the registry serves it.
fn config(image: &Pushed) -> Value {
    serde_json::from_str(&crane(&["config", &image.by_digest()]).unwrap()).unwrap()
}

/// The image's filesystem, unpacked into `dir`.
fn export(image: &Pushed, dir: &Path) {
    let tarball = dir.join("image.tar");
    crane(&["export", &image.by_digest(), &tarball.to_string_lossy()]).unwrap();
    let status = Command::new("tar")
        .arg("-xf")
        .arg(&tarball)
        .arg("-C")
        .arg(dir)
        .status()
        .unwrap();
    assert!(status.success());
    std::fs::remove_file(&tarball).unwrap();
}

/// Whether the ELF executable at `path` asks for no program interpreter
/// (no PT_INTERP program header): linked statically.
fn is_static(path: &Path) -> bool {
    let elf = std::fs::read(path).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF", "{} is not ELF", path.display());
    let u16_at = |at: usize| u16::from_le_bytes([elf[at], elf[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (size, count) = (u16_at(0x36), u16_at(0x38));
    const PT_INTERP: u32 = 3;
    (0..count).all(|i| {
        let at = phoff + i * size;
        u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) != PT_INTERP
    })
}

/// The lines `program args` prints.
fn run(program: &Path, args: &[&str]) -> Vec<String> {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(out.status.success(), "{}: {out:?}", program.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

/// The files of the tree `dir`, relative, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                out.push(
                    path.strip_prefix(dir)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    out.sort();
    out
}

/// What the `Dockerfile`'s stage `stage` puts in its image: the files it
/// copies in, its USER and its ENTRYPOINT, with what it takes from the
/// stage it starts from.
fn dockerfile_stage(stage: &str) -> (Vec<String>, String, Value) {
    let text = std::fs::read_to_string("Dockerfile").unwrap();
    let mut from = None;
    let mut current = None;
    let (mut files, mut user, mut entrypoint) = (Vec::new(), String::new(), Value::Null);
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["FROM", base, "AS", name] => {
                current = Some(*name);
                if *name == stage {
                    from = Some(base.to_string());
                }
            }
            _ if current != Some(stage) => {}
            ["COPY", .., to] => files.push(to.trim_start_matches('/').to_string()),
            ["USER", u] => user = u.to_string(),
            ["ENTRYPOINT", ..] => {
                entrypoint = serde_json::from_str(line.trim_start_matches("ENTRYPOINT")).unwrap()
            }
            _ => {}
        }
    }
    files.sort();
    if let Some(base) = from.filter(|b| text.contains(&format!(" AS {b}\n"))) {
        let (base_files, base_user, base_entrypoint) = dockerfile_stage(&base);
        files.extend(base_files);
        files.sort();
        if user.is_empty() {
            user = base_user;
        }
        if entrypoint.is_null() {
            entrypoint = base_entrypoint;
        }
    }
    (files, user, entrypoint)
}

#[test]
fn each_image_holds_its_static_binaries_runs_as_65532_and_carries_its_labels() {
    // The probe tells: this test binary is linked dynamically.
    assert!(!is_static(&std::env::current_exe().unwrap()));
    let version = format!("ARG VERSION={}\n", env!("CARGO_PKG_VERSION"));
    assert!(
        std::fs::read_to_string("Dockerfile")
            .unwrap()
            .contains(&version)
    );
    let registry = registry::shared();
    let module_files: Vec<String> = files(Path::new("tests/modules/noop"))
        .into_iter()
        .map(|f| format!("captf/module/{f}"))
        .collect();
    let cases: [(&str, &str, Vec<String>); 3] = [
        (
            MANAGER_IMAGE,
            "/manager",
            vec!["manager".into(), "runner".into()],
        ),
        (RUNNER, "/runner", vec!["runner".into()]),
        (
            NOOP_MODULE,
            "/captf/runtime",
            // The shell of the module's provisioner, beside its libraries.
            [
                vec!["bin/sh".into(), "bin/sleep".into()],
                module_files,
                vec!["captf/runtime".into(), "usr/bin/env".into()],
            ]
            .concat(),
        ),
    ];
    for (name, entrypoint, want_files) in cases {
        let image = registry.push(name);
        let config = config(&image);
        assert_eq!(config["os"], "linux", "{name}");
        assert_eq!(config["architecture"], "amd64", "{name}");
        let run_config = &config["config"];
        assert_eq!(run_config["User"], "65532:65532", "{name}");
        assert_eq!(
            run_config["Entrypoint"],
            serde_json::json!([entrypoint]),
            "{name}"
        );
        let labels: BTreeMap<String, String> =
            serde_json::from_value(run_config["Labels"].clone()).unwrap();
        for label in OCI_LABELS {
            assert!(
                labels.get(label).is_some_and(|v| !v.is_empty()),
                "{name}: {label} in {labels:?}"
            );
        }
        assert_eq!(
            labels["org.opencontainers.image.version"],
            registry::TAG,
            "{name}"
        );

        let dir = tempfile::tempdir().unwrap();
        export(&image, dir.path());
        let held: Vec<String> = files(dir.path())
            .into_iter()
            .filter(|f| !f.starts_with("lib"))
            .collect();
        assert_eq!(held, want_files, "{name}");
        match name {
            NOOP_MODULE => {
                for (label, value) in [
                    ("io.captf.contract", "v1alpha1"),
                    ("io.captf.runtime", "tofu"),
                    ("io.captf.role", "machine"),
                ] {
                    assert_eq!(
                        labels.get(label).map(String::as_str),
                        Some(value),
                        "{label}"
                    );
                }
                let tofu = run(&dir.path().join("captf/runtime"), &["version"]);
                let version = &labels["io.captf.runtime.version"];
                assert!(tofu.contains(&format!("OpenTofu v{version}")), "{tofu:?}");
                let module =
                    std::fs::read_to_string(dir.path().join("captf/module/main.tf")).unwrap();
                assert_eq!(
                    module,
                    std::fs::read_to_string("tests/modules/noop/main.tf").unwrap()
                );
            }
            _ => {
                let stage = name.trim_start_matches("captf-");
                let built = (
                    want_files.clone(),
                    run_config["User"].as_str().unwrap_or_default().to_string(),
                    run_config["Entrypoint"].clone(),
                );
                assert_eq!(dockerfile_stage(stage), built, "the Dockerfile's {stage}");
                for binary in &want_files {
                    let path = dir.path().join(binary);
                    assert!(is_static(&path), "{name}: {binary} is linked dynamically");
                    let version = run(&path, &["--version"]);
                    let want = format!("captf-{binary} {}", env!("CARGO_PKG_VERSION"));
                    assert_eq!(version, [want], "{name}");
                }
            }
        }
    }
}

#[tokio::test]
async fn a_cluster_is_applied_by_pods_that_pull_the_runner_and_the_module_from_the_registry() {
    let registry = registry::shared();
    let runner = registry.push(RUNNER);
    let module = registry.push(NOOP_MODULE);
    let runner_flag = format!("--runner-image={}", runner.reference);
    let env = setup(MANAGER, "images", &[], &[&runner_flag]).await;
    env.cluster("c", &module.reference, None).await;
    let status = within(
        &env,
        180,
        "the cluster applied from the registry",
        || async { env.cluster_status("c").await.filter(applied) },
    )
    .await;
    let source = status.source.expect("status.source");
    assert_eq!(source.image.as_deref(), Some(module.reference.as_str()));
    assert_eq!(
        source.image_digest.as_deref(),
        Some(module.by_digest().as_str())
    );
    let labels = &config(&module)["config"]["Labels"];
    assert_eq!(
        source.runtime_version.as_deref(),
        labels["io.captf.runtime.version"].as_str()
    );

    // The pod's statuses name what was pulled, by digest, as a kubelet's.
    let pods = Api::<Pod>::namespaced(env.client.clone(), &env.ns);
    let pod = pods
        .list(&ListParams::default().labels("captf.io/managed=true"))
        .await
        .unwrap()
        .items
        .into_iter()
        .next()
        .expect("the apply Job's pod");
    let status = pod.status.unwrap();
    let ids = |statuses: Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| {
        statuses
            .into_iter()
            .flatten()
            .map(|s| s.image_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(status.init_container_statuses), [runner.by_digest()]);
    assert_eq!(ids(status.container_statuses), [module.by_digest()]);
}
