//! Images: the local layouts that image references stand for, and images
//! pulled from a registry ([`Images::with_registry`]) and unpacked.

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

/// An image pulled from a registry: its files, unpacked, and what its
/// config sets of how a container runs.
#[derive(Clone, Debug, Default)]
pub struct Unpacked {
    /// The image's filesystem, its layers applied in order.
    pub root: PathBuf,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// The image's ENV.
    pub env: Vec<(String, String)>,
    /// The image's USER, `uid[:gid]`, if set.
    pub user: Option<String>,
    /// The image's WORKDIR, if set.
    pub working_dir: Option<String>,
}

/// A local stand-in for an image.
#[derive(Clone, Debug)]
pub enum Image {
    /// The runner image: the binary that is its `/runner`.
    Runner(PathBuf),
    Module(ModuleImage),
    Unpacked(Unpacked),
}

impl Image {
    /// The ENV of the image's config.
    pub fn env(&self) -> &[(String, String)] {
        match self {
            Image::Runner(_) => &[],
            Image::Module(m) => &m.env,
            Image::Unpacked(u) => &u.env,
        }
    }
}

/// Image references and the local layouts they stand for.
#[derive(Clone, Debug, Default)]
pub struct Images {
    by_reference: HashMap<String, Image>,
    /// What each pulled digest held when it was pulled, as a registry keeps
    /// a manifest after its tag moves on (shared by clones).
    pulled: Arc<Mutex<HashMap<String, Image>>>,
    /// The registry (`host:port`) whose references are pulled from it.
    registry: Option<String>,
    /// The digest each reference of the registry named when last pulled.
    resolved: Arc<Mutex<HashMap<String, String>>>,
}

/// `sha256:<hex>` of a module image's content: its module files, runtime
/// and environment; of a runner image, its binary's path, size and time;
/// of an unpacked one, its folder (named by its registry digest).
fn digest_of(image: &Image) -> std::io::Result<String> {
    let mut h = Sha256::new();
    match image {
        Image::Unpacked(u) => h.update(u.root.to_string_lossy().as_bytes()),
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

/// `sha256:` and 64 hex digits: what a digest must be before it names a
/// folder.
fn is_digest(digest: &str) -> bool {
    digest
        .strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Pulls `<repository>@<digest>` with crane, which checks the manifest,
/// the config and each layer against their digests, into a folder named by
/// the digest: the layers applied in order (`crane export`), and the config.
fn unpack(repository: &str, digest: &str) -> Result<Unpacked, String> {
    use crate::registry::crane;
    let by_digest = format!("{repository}@{digest}");
    let config: serde_json::Value = serde_json::from_str(&crane(&["config", &by_digest])?)
        .map_err(|e| format!("the config of {by_digest}: {e}"))?;
    let config = &config["config"];
    let strings = |key: &str| -> Vec<String> {
        config[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    let env = strings("Env")
        .into_iter()
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect();
    let root = std::env::temp_dir().join(format!("captf-image-{}", digest.replace(':', "-")));
    if !root.exists() {
        let partial = root.with_extension(format!("partial-{}", std::process::id()));
        fs::create_dir_all(&partial).map_err(|e| e.to_string())?;
        let tarball = partial.with_extension("tar");
        crane(&["export", &by_digest, &tarball.to_string_lossy()])?;
        let untar = std::process::Command::new("tar")
            .arg("-xf")
            .arg(&tarball)
            .arg("-C")
            .arg(&partial)
            .status();
        let _ = fs::remove_file(&tarball);
        match untar {
            Ok(status) if status.success() => {}
            other => return Err(format!("unpacking {by_digest}: {other:?}")),
        }
        if let Err(e) = fs::rename(&partial, &root) {
            // Another pull of the same digest came first.
            let _ = fs::remove_dir_all(&partial);
            if !root.exists() {
                return Err(e.to_string());
            }
        }
    }
    let text = |key: &str| {
        config[key]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    Ok(Unpacked {
        root,
        entrypoint: strings("Entrypoint"),
        cmd: strings("Cmd"),
        env,
        user: text("User"),
        working_dir: text("WorkingDir"),
    })
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

    /// Images whose reference names `host` (`127.0.0.1:<port>`) are pulled
    /// from that registry.
    pub fn with_registry(mut self, host: &str) -> Images {
        self.registry = Some(host.to_string());
        self
    }

    /// Whether `reference` names an image of the registry.
    fn in_registry(&self, reference: &str) -> bool {
        self.registry
            .as_deref()
            .is_some_and(|host| reference.split_once('/').is_some_and(|(h, _)| h == host))
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
    /// An image of the registry is found once pulled.
    pub fn get(&self, reference: &str) -> Option<Image> {
        if self.in_registry(reference) {
            let digest = self.resolved.lock().ok()?.get(reference)?.clone();
            return self.pulled.lock().ok()?.get(&digest).cloned();
        }
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
    /// An image of the registry is pulled from it; the error is what
    /// ErrImagePull shows.
    pub fn pull(&self, reference: &str) -> Result<(Image, String), String> {
        if self.in_registry(reference) {
            return self.pull_from_registry(reference);
        }
        self.pull_local(reference)
            .ok_or_else(|| format!("image {reference:?} is not known to the local executor"))
    }

    fn pull_local(&self, reference: &str) -> Option<(Image, String)> {
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

    /// Pulls `reference` from the registry: the digest its tag names now
    /// (or the one it names), unpacked once per digest.
    fn pull_from_registry(&self, reference: &str) -> Result<(Image, String), String> {
        let repo = repository(reference);
        let digest = match reference.split_once('@') {
            Some((_, digest)) => digest.to_string(),
            None => crate::registry::crane(&["digest", reference])?
                .trim()
                .to_string(),
        };
        if !is_digest(&digest) {
            return Err(format!("{reference}: {digest:?} is not a sha256 digest"));
        }
        let known = self
            .pulled
            .lock()
            .ok()
            .and_then(|p| p.get(&digest).cloned());
        let image = match known {
            Some(image) => image,
            None => {
                let image = Image::Unpacked(unpack(repo, &digest)?);
                if let Ok(mut pulled) = self.pulled.lock() {
                    pulled.insert(digest.clone(), image.clone());
                }
                image
            }
        };
        if let Ok(mut resolved) = self.resolved.lock() {
            resolved.insert(reference.to_string(), digest.clone());
        }
        Ok((image, format!("{repo}@{digest}")))
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
                Image::Unpacked(_) => "unpacked",
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
