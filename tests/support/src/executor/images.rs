//! Images: the local layouts that image references stand for.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The runner image of the tests (the manager's `--runner-image`).
pub const TEST_RUNNER_IMAGE: &str = "captf.test/runner:dev";

/// The image reference of a test module under `tests/modules/<dir>`.
pub fn test_module_image(dir: &str) -> String {
    format!("captf.test/modules/{dir}:dev")
}

/// What a module image holds (reference §9.1), as local paths.
#[derive(Clone, Debug)]
pub struct ModuleImage {
    /// `/captf/module`.
    pub module: PathBuf,
    /// `/captf/runtime`: the built tofu.
    pub runtime: PathBuf,
    /// `/captf/providers`, when the image ships a provider mirror.
    pub providers: Option<PathBuf>,
    /// The image's ENV.
    pub env: Vec<(String, String)>,
}

/// A local stand-in for an image.
#[derive(Clone, Debug)]
pub enum Image {
    /// The runner image: the binary that is its `/runner`.
    Runner(PathBuf),
    Module(ModuleImage),
}

/// Image references and the local layouts they stand for.
#[derive(Clone, Debug, Default)]
pub struct Images {
    by_reference: HashMap<String, Image>,
}

impl Images {
    pub fn new() -> Images {
        Images::default()
    }

    pub fn with_runner(mut self, reference: &str, binary: PathBuf) -> Images {
        self.by_reference
            .insert(reference.to_string(), Image::Runner(binary));
        self
    }

    pub fn with_module(mut self, reference: &str, image: ModuleImage) -> Images {
        self.by_reference
            .insert(reference.to_string(), Image::Module(image));
        self
    }

    /// [`TEST_RUNNER_IMAGE`] as the runner built by cargo, and
    /// `captf.test/modules/<dir>:dev` for every directory of `tests/modules`,
    /// with the built tofu as its runtime.
    pub fn for_tests() -> Images {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target"));
        let mut images = Images::new().with_runner(TEST_RUNNER_IMAGE, test_runner(&target));
        let modules = workspace.join("tests/modules");
        let tofu = crate::controlplane::binary("tofu");
        let entries =
            fs::read_dir(&modules).unwrap_or_else(|e| panic!("reading {}: {e}", modules.display()));
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(dir) = path
                .file_name()
                .and_then(|n| n.to_str())
                .map(str::to_string)
            else {
                continue;
            };
            if path.is_dir() {
                let image = ModuleImage {
                    module: path,
                    runtime: tofu.clone(),
                    providers: None,
                    env: Vec::new(),
                };
                images = images.with_module(&test_module_image(&dir), image);
            }
        }
        images
    }

    /// The image a reference names: exactly, or without its digest, since the
    /// manager may pin one.
    pub fn get(&self, reference: &str) -> Option<&Image> {
        self.by_reference.get(reference).or_else(|| {
            let (name, _digest) = reference.split_once('@')?;
            self.by_reference.get(name)
        })
    }
}

/// The statically linked runner, unless it is missing or older than the one
/// of the plain debug build (which a test binary has just had cargo build).
fn test_runner(target: &Path) -> PathBuf {
    let static_runner = target.join("x86_64-unknown-linux-gnu/debug/captf-runner");
    let plain = target.join("debug/captf-runner");
    let modified = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
    match (modified(&static_runner), modified(&plain)) {
        (Some(s), Some(p)) if s >= p => static_runner,
        (Some(_), None) => static_runner,
        _ => plain,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn images_are_found_by_reference_with_or_without_a_digest() {
        let images = Images::new()
            .with_runner("r:dev", PathBuf::from("/bin/runner"))
            .with_module(
                "m:dev",
                ModuleImage {
                    module: PathBuf::from("/m"),
                    runtime: PathBuf::from("/tofu"),
                    providers: None,
                    env: Vec::new(),
                },
            );
        let cases: &[(&str, Option<&str>)] = &[
            ("r:dev", Some("runner")),
            ("m:dev", Some("module")),
            ("m:dev@sha256:0123", Some("module")),
            ("m:other", None),
            ("x@sha256:0123", None),
        ];
        for (reference, want) in cases {
            let got = images.get(reference).map(|i| match i {
                Image::Runner(_) => "runner",
                Image::Module(_) => "module",
            });
            assert_eq!(got, *want, "{reference}");
        }
    }

    #[test]
    fn the_test_runner_is_the_static_one_unless_it_is_missing_or_older() {
        let dir = tempfile::tempdir().unwrap();
        let static_runner = dir
            .path()
            .join("x86_64-unknown-linux-gnu/debug/captf-runner");
        let plain = dir.path().join("debug/captf-runner");
        let make = |path: &Path, seconds: u64| {
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            let file = fs::File::create(path).unwrap();
            file.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(seconds))
                .unwrap();
        };
        assert_eq!(test_runner(dir.path()), plain, "neither exists");
        make(&plain, 100);
        assert_eq!(test_runner(dir.path()), plain, "only the plain one");
        make(&static_runner, 50);
        assert_eq!(test_runner(dir.path()), plain, "the static one is older");
        make(&static_runner, 200);
        assert_eq!(
            test_runner(dir.path()),
            static_runner,
            "the static one is newer"
        );
        fs::remove_file(&plain).unwrap();
        assert_eq!(
            test_runner(dir.path()),
            static_runner,
            "only the static one"
        );
    }
}
