//! Images: the local layouts that image references stand for.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

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
    /// What each pulled digest held when it was pulled, as a registry keeps
    /// a manifest after its tag moves on (shared by clones).
    pulled: Arc<Mutex<HashMap<String, Image>>>,
}

/// `sha256:<hex>` of a module image's content: its module files, runtime
/// and environment; of a runner image, its binary's path, size and time.
fn digest_of(image: &Image) -> std::io::Result<String> {
    let mut h = Sha256::new();
    match image {
        Image::Runner(binary) => {
            let meta = fs::metadata(binary)?;
            h.update(binary.to_string_lossy().as_bytes());
            h.update(meta.len().to_be_bytes());
            h.update(format!("{:?}", meta.modified()?).as_bytes());
        }
        Image::Module(m) => {
            let mut files: Vec<PathBuf> = fs::read_dir(&m.module)?
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect();
            files.sort();
            for file in files {
                h.update(file.file_name().unwrap_or_default().as_encoded_bytes());
                h.update([0]);
                h.update(fs::read(&file)?);
                h.update([0]);
            }
            h.update(m.runtime.to_string_lossy().as_bytes());
            for (k, v) in &m.env {
                h.update(format!("{k}={v}\n").as_bytes());
            }
        }
    }
    Ok(format!("sha256:{:x}", h.finalize()))
}

/// The repository of a reference: without its digest and its tag.
fn repository(reference: &str) -> &str {
    let name = reference.split('@').next().unwrap_or(reference);
    match name.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => name,
    }
}

/// A copy of a module image's files under its digest, which later pulls of
/// that digest find however the tag moved.
fn snapshot(image: &Image, digest: &str) -> std::io::Result<Image> {
    let Image::Module(m) = image else {
        return Ok(image.clone());
    };
    let dir = std::env::temp_dir().join(format!("captf-image-{}", digest.replace(':', "-")));
    if !dir.exists() {
        let partial = dir.with_extension(format!("partial-{}", std::process::id()));
        fs::create_dir_all(&partial)?;
        for entry in fs::read_dir(&m.module)?.flatten() {
            if entry.path().is_file() {
                fs::copy(entry.path(), partial.join(entry.file_name()))?;
            }
        }
        if let Err(e) = fs::rename(&partial, &dir) {
            // Another pull of the same digest came first.
            let _ = fs::remove_dir_all(&partial);
            if !dir.exists() {
                return Err(e);
            }
        }
    }
    Ok(Image::Module(ModuleImage {
        module: dir,
        ..m.clone()
    }))
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

    /// The image a reference names: exactly; by digest, what that digest
    /// held when it was pulled; or a tag with a digest, by its tag.
    pub fn get(&self, reference: &str) -> Option<Image> {
        if let Some(image) = self.by_reference.get(reference) {
            return Some(image.clone());
        }
        let (name, digest) = reference.split_once('@')?;
        if let Some(image) = self.pulled.lock().ok()?.get(digest) {
            return Some(image.clone());
        }
        self.by_reference.get(name).cloned()
    }

    /// Pulls `reference` as a container runtime does: the image it names
    /// now, kept under its digest, and the image ID a kubelet reports,
    /// `<repository>@sha256:<hex>`. A reference by a digest that was never
    /// pulled pulls what its repository's tag holds, if that has the digest.
    pub fn pull(&self, reference: &str) -> Option<(Image, String)> {
        let repo = repository(reference);
        let image = match self.get(reference) {
            Some(image) => image,
            None => {
                let (_, wanted) = reference.split_once('@')?;
                self.by_reference
                    .iter()
                    .filter(|(r, _)| repository(r) == repo)
                    .map(|(_, i)| i.clone())
                    .find(|i| digest_of(i).ok().as_deref() == Some(wanted))?
            }
        };
        let digest = match reference.split_once('@') {
            Some((_, d)) if self.pulled.lock().ok()?.contains_key(d) => d.to_owned(),
            _ => digest_of(&image).ok()?,
        };
        let kept = snapshot(&image, &digest).ok()?;
        self.pulled
            .lock()
            .ok()?
            .insert(digest.clone(), kept.clone());
        Some((kept, format!("{repo}@{digest}")))
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
            ("m@sha256:0123", None),
        ];
        for (reference, want) in cases {
            let got = images.get(reference).map(|i| match &i {
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
