//! The runner as the images carry it: linked statically.

use super::*;

const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

/// The runner as `make runner` builds it, built here the same way when
/// missing.
fn static_runner() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("target"));
    let path = target_dir.join(STATIC_TARGET).join("debug/captf-runner");
    if !path.exists() {
        let status =
            std::process::Command::new(std::env::var_os("CARGO").unwrap_or("cargo".into()))
                .args(["build", "--bin", "captf-runner", "--target", STATIC_TARGET])
                .env(
                    "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
                    "-C target-feature=+crt-static",
                )
                .current_dir(manifest)
                .status()
                .unwrap();
        assert!(status.success(), "building the static runner");
    }
    path
}

/// Whether an ELF executable asks for a program interpreter (the dynamic
/// loader).
fn has_interpreter(path: &Path) -> bool {
    use object::read::elf::{ElfFile64, ProgramHeader};
    let data = std::fs::read(path).unwrap();
    let elf = ElfFile64::<object::Endianness>::parse(&*data).unwrap();
    let endian = elf.endian();
    elf.elf_program_headers()
        .iter()
        .any(|ph| ph.p_type(endian) == object::elf::PT_INTERP)
}

#[tokio::test]
async fn the_built_runner_is_static() {
    let runner = static_runner();
    assert!(
        !has_interpreter(&runner),
        "{} is dynamically linked",
        runner.display()
    );
    // The check tells the difference: the ordinary build is dynamic.
    assert!(has_interpreter(Path::new(RUNNER)));

    // And it runs: in an otherwise empty pod it reports the image's layout.
    let pod = tempfile::tempdir().unwrap();
    std::fs::create_dir(pod.path().join("dev")).unwrap();
    let out = std::process::Command::new(&runner)
        .args(["run", "--op=apply", "--job-name=static"])
        .arg(format!("--root={}", pod.path().display()))
        .env_clear()
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: RunResult =
        serde_json::from_slice(&std::fs::read(pod.path().join("dev/termination-log")).unwrap())
            .unwrap();
    assert_eq!(result.error.unwrap().kind, RunErrorKind::ImageLayout);
}
