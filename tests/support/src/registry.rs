//! A local OCI registry and CAPTF's images in it.
//!
//! `hack/images.sh` builds the images (the manager, the runner and the noop
//! module) as OCI layouts under `target/images`; [`Registry::start`] serves
//! crane's in-memory registry on a loopback port and [`Registry::push`]
//! pushes a built image to it with crane, as a user publishes one.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::controlplane::{binary, spawn_owned, terminate};

/// The images `hack/images.sh` builds, by folder name.
pub const MANAGER: &str = "captf-manager";
pub const RUNNER: &str = "captf-runner";
pub const NOOP_MODULE: &str = "captf-module-noop";

/// The tag the pushed images carry.
pub const TAG: &str = "dev";

/// The folder of the built images: `hack/images.sh` run once per test
/// process (a dev build; cargo and crane make a second run cheap), so the
/// images hold the binaries of this checkout.
pub fn built_images() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target"));
        let out = target.join("images");
        let script = workspace.join("hack/images.sh");
        let started = Instant::now();
        let output = Command::new(&script)
            .arg(&out)
            .env("PROFILE", "dev")
            .env("TAG", TAG)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            output.status.success(),
            "{} failed:\n{}{}",
            script.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        eprintln!(
            "images built in {:.1}s:\n{}",
            started.elapsed().as_secs_f64(),
            String::from_utf8_lossy(&output.stdout)
        );
        out
    })
}

/// An image in the registry.
#[derive(Clone, Debug)]
pub struct Pushed {
    /// `<host>/<name>:dev`.
    pub reference: String,
    /// `sha256:<hex>` of its manifest.
    pub digest: String,
}

impl Pushed {
    /// `<host>/<name>@sha256:<hex>`: the image ID a kubelet reports.
    pub fn by_digest(&self) -> String {
        let repository = self
            .reference
            .rsplit_once(':')
            .map_or(self.reference.as_str(), |(r, _)| r);
        format!("{repository}@{}", self.digest)
    }
}

static SHARED: OnceLock<Registry> = OnceLock::new();

/// The registry of this test process, started on first use. The executors
/// of scenarios set up after it pull the images it names from it.
pub fn shared() -> &'static Registry {
    SHARED.get_or_init(|| Registry::start().unwrap_or_else(|e| panic!("{e}")))
}

/// The registry of this test process, if one was started.
pub fn started() -> Option<&'static Registry> {
    SHARED.get()
}

/// crane's in-memory registry on `127.0.0.1:<port>`, stopped when dropped
/// (the shared one: when the process exits).
pub struct Registry {
    host: String,
    child: Mutex<Child>,
}

impl Registry {
    pub fn start() -> Result<Registry, String> {
        let log = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(binary("crane"));
        cmd.args(["registry", "serve", "--address", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.reopen().map_err(|e| e.to_string())?);
        let mut child = spawn_owned(cmd).map_err(|e| format!("starting the registry: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let port = loop {
            let text = std::fs::read_to_string(log.path()).unwrap_or_default();
            if let Some(port) = text
                .split("serving on port ")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
            {
                break port.to_string();
            }
            if Instant::now() > deadline || matches!(child.try_wait(), Ok(Some(_))) {
                terminate(&mut child);
                return Err(format!("the registry did not start:\n{text}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        Ok(Registry {
            host: format!("127.0.0.1:{port}"),
            child: Mutex::new(child),
        })
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Pushes the built image `name` as `<host>/<name>:dev`.
    pub fn push(&self, name: &str) -> Pushed {
        let layout = built_images().join(name);
        let reference = format!("{}/{name}:{TAG}", self.host);
        crane(&["push", &layout.to_string_lossy(), &reference])
            .unwrap_or_else(|e| panic!("pushing {name}: {e}"));
        let digest =
            crane(&["digest", &reference]).unwrap_or_else(|e| panic!("digest of {name}: {e}"));
        Pushed {
            reference,
            digest: digest.trim().to_string(),
        }
    }
}

impl Registry {
    /// `image` under `tag` with one more label, so a new digest: a new
    /// release of the same binaries.
    pub fn variant(&self, image: &Pushed, tag: &str) -> Pushed {
        let repository = image
            .reference
            .rsplit_once(':')
            .map_or(image.reference.as_str(), |(r, _)| r);
        let reference = format!("{repository}:{tag}");
        let label = format!("io.captf.test.variant={tag}");
        crane(&[
            "mutate",
            &image.reference,
            "--label",
            &label,
            "-t",
            &reference,
        ])
        .unwrap_or_else(|e| panic!("making {reference}: {e}"));
        let digest =
            crane(&["digest", &reference]).unwrap_or_else(|e| panic!("digest of {reference}: {e}"));
        Pushed {
            reference,
            digest: digest.trim().to_string(),
        }
    }
}

impl Registry {
    /// The platform's `program` (`controlplane::binary`) as an image
    /// `<host>/<name>:<tag>`: one layer holding it at `path`, its
    /// entrypoint, user 65532, as its project's own image holds it.
    pub fn program(&self, program: &str, path: &str, name: &str, tag: &str) -> Pushed {
        let work = tempfile::tempdir().expect("a temporary directory");
        let root = work.path().join("root");
        let target = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(target.parent().expect("a path in a folder")).unwrap();
        std::fs::copy(binary(program), &target)
            .unwrap_or_else(|e| panic!("copying {program}: {e}"));
        let layer = work.path().join("layer.tar");
        let top = path
            .trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or(path);
        let status = Command::new("tar")
            .args([
                "--sort=name",
                "--mtime=@0",
                "--owner=0",
                "--group=0",
                "--numeric-owner",
            ])
            .arg("-C")
            .arg(&root)
            .arg("-cf")
            .arg(&layer)
            .arg(top)
            .status()
            .expect("running tar");
        assert!(status.success(), "tar of {program} failed");
        let host = &self.host;
        let staged = format!("{host}/{name}:layer");
        let reference = format!("{host}/{name}:{tag}");
        let layer = layer.to_string_lossy();
        crane(&["append", "--oci-empty-base", "-f", &layer, "-t", &staged])
            .unwrap_or_else(|e| panic!("{e}"));
        crane(&[
            "mutate",
            &staged,
            "--set-platform",
            "linux/amd64",
            "--user",
            "65532:65532",
            "--entrypoint",
            path,
            "-t",
            &reference,
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        let digest =
            crane(&["digest", &reference]).unwrap_or_else(|e| panic!("digest of {reference}: {e}"));
        Pushed {
            reference,
            digest: digest.trim().to_string(),
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        terminate(&mut self.child.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// Runs crane (plain HTTP, as the registry serves) and returns its output.
pub fn crane(args: &[&str]) -> Result<String, String> {
    let output = Command::new(binary("crane"))
        .args(args)
        .arg("--insecure")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running crane: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "crane {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    String::from_utf8(output.stdout).map_err(|e| format!("crane's output: {e}"))
}
