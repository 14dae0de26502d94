//! The pod's layout: the preflight checks of the image (ref §9.1), the
//! working directory the steps run in (book: inside-the-job.md "Preparing
//! the working directory"), and the restore's state file.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::error::{Categorized, Category};
use crate::state::MAX_DECOMPRESSED;

/// The files a module directory must have one of, at its top level.
const MODULE_SUFFIXES: [&str; 4] = [".tf", ".tf.json", ".tofu", ".tofu.json"];

/// Why the image cannot run (error kind image-layout).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error(
        "the module directory {0} has no .tf, .tf.json, .tofu or .tofu.json file at its top level"
    )]
    NoModule(PathBuf),
    #[error("the runtime {0} is not an executable file")]
    NoRuntime(PathBuf),
}

impl Categorized for LayoutError {
    fn category(&self) -> Category {
        Category::Invalid
    }
}

/// The working directory could not be prepared.
#[derive(Debug, thiserror::Error)]
#[error("preparing the working directory: {what}: {source}")]
pub struct PrepareError {
    what: String,
    source: io::Error,
}

impl Categorized for PrepareError {
    fn category(&self) -> Category {
        Category::Internal
    }
}

/// The restore's backup could not be turned into a state file.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("reading backup chunk {path}: {source}")]
    Chunk { path: PathBuf, source: io::Error },
    #[error("the backup is not a valid gzip stream: {0}")]
    Gzip(io::Error),
    #[error("the backup decompresses to more than {0} bytes")]
    TooLarge(u64),
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
    #[error("the backup is not a state document: {0}")]
    NotAState(String),
}

impl Categorized for RestoreError {
    fn category(&self) -> Category {
        match self {
            RestoreError::Gzip(_) | RestoreError::TooLarge(_) | RestoreError::NotAState(_) => {
                Category::Invalid
            }
            RestoreError::Chunk { .. } | RestoreError::Write { .. } => Category::Internal,
        }
    }
}

/// Whether a module directory listing has a configuration file. `files`
/// are the names of the regular files at its top level.
pub fn has_module_file<'a>(files: impl IntoIterator<Item = &'a OsStr>) -> bool {
    files.into_iter().any(|name| {
        let name = name.as_encoded_bytes();
        MODULE_SUFFIXES
            .iter()
            .any(|suffix| name.len() > suffix.len() && name.ends_with(suffix.as_bytes()))
    })
}

/// Checks the image: a module and an executable runtime.
pub fn preflight(module: &Path, bin: &Path) -> Result<(), LayoutError> {
    let files = regular_files(module).map_err(|_| LayoutError::NoModule(module.into()))?;
    if !has_module_file(files.iter().map(|(name, _)| name.as_os_str())) {
        return Err(LayoutError::NoModule(module.into()));
    }
    // Executable by this user, not merely carrying an x bit for someone.
    let executable = fs::metadata(bin).is_ok_and(|m| m.is_file())
        && rustix::fs::access(bin, rustix::fs::Access::EXEC_OK).is_ok();
    if !executable {
        return Err(LayoutError::NoRuntime(bin.into()));
    }
    Ok(())
}

/// The regular files at the top of `dir`, symlinks followed (a Secret
/// volume's keys are symlinks into `..data`), as (name, path).
fn regular_files(dir: &Path) -> io::Result<Vec<(std::ffi::OsString, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        // The `..data` and `..<timestamp>` entries of a Secret volume.
        if name.as_encoded_bytes().starts_with(b"..") {
            continue;
        }
        let path = entry.path();
        if fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            out.push((name, path));
        }
    }
    out.sort();
    Ok(out)
}

/// The contents of the top-level files of `dir`, by name; an absent
/// directory has none (a Job without an identity mounts no credentials).
pub fn read_files(dir: &Path) -> io::Result<Vec<(String, Vec<u8>)>> {
    let files = match regular_files(dir) {
        Ok(files) => files,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    files
        .into_iter()
        .map(|(name, path)| Ok((name.to_string_lossy().into_owned(), fs::read(path)?)))
        .collect()
}

/// The CLI configuration that installs providers only from the image's
/// mirror, so that a Job never downloads one.
pub fn cli_config(providers: &Path) -> String {
    // A JSON string is a valid HCL string literal for any path.
    let path = serde_json::Value::String(providers.display().to_string());
    format!(
        "provider_installation {{\n  filesystem_mirror {{\n    path    = {path}\n    include = [\"*/*/*\"]\n  }}\n  direct {{\n    exclude = [\"*/*/*\"]\n  }}\n}}\n"
    )
}

/// The working directory as the steps expect it.
#[derive(Clone, Debug)]
pub struct Workdir {
    /// Where the steps run: the rendered root and its tfvars.
    pub root: PathBuf,
    /// The CLI configuration, when the image ships providers.
    pub cli_config: Option<PathBuf>,
}

/// Copies the top-level files of `config` into `<workdir>/root` (mode 0600)
/// and, when `providers` exists, writes `<workdir>/cli.tfrc`.
pub fn prepare(workdir: &Path, config: &Path, providers: &Path) -> Result<Workdir, PrepareError> {
    let err = |what: String| move |source| PrepareError { what, source };
    let root = workdir.join("root");
    fs::create_dir_all(&root).map_err(err(format!("creating {}", root.display())))?;
    let files = regular_files(config).map_err(err(format!("reading {}", config.display())))?;
    for (name, path) in files {
        let to = root.join(&name);
        let content = fs::read(&path).map_err(err(format!("reading {}", path.display())))?;
        write_private(&to, &content).map_err(err(format!("writing {}", to.display())))?;
    }
    let cli_config = if providers.is_dir() {
        let path = workdir.join("cli.tfrc");
        write_private(&path, cli_config(providers).as_bytes())
            .map_err(err(format!("writing {}", path.display())))?;
        Some(path)
    } else {
        None
    };
    Ok(Workdir { root, cli_config })
}

/// Creates the scratch directory the step environment points TMPDIR at.
pub fn create_tmpdir(path: &Path) -> Result<(), PrepareError> {
    fs::create_dir_all(path).map_err(|source| PrepareError {
        what: format!("creating {}", path.display()),
        source,
    })
}

/// Writes the state file of a restore: chunks `0..count` of
/// `<config>/restore`, concatenated and gunzipped (at most
/// [`MAX_DECOMPRESSED`] bytes), with its serial set to `serial` when given,
/// to `to` with mode 0600.
pub fn write_restore_file(
    config: &Path,
    count: u32,
    serial: Option<u64>,
    to: &Path,
) -> Result<(), RestoreError> {
    let mut compressed = Vec::new();
    for i in 0..count {
        let path = config.join("restore").join(i.to_string());
        let mut chunk = fs::read(&path).map_err(|source| RestoreError::Chunk { path, source })?;
        compressed.append(&mut chunk);
    }
    let mut state = gunzip_bounded(&compressed, MAX_DECOMPRESSED)?;
    if let Some(serial) = serial {
        state = with_serial(&state, serial)?;
    }
    write_private(to, &state).map_err(|source| RestoreError::Write {
        path: to.into(),
        source,
    })
}

/// The state document `doc` with its top-level `serial` set to `serial`;
/// every other member (the lineage too) kept as written, in order.
fn with_serial(doc: &[u8], serial: u64) -> Result<Vec<u8>, RestoreError> {
    let members: Members<'_> =
        serde_json::from_slice(doc).map_err(|e| RestoreError::NotAState(e.to_string()))?;
    let mut out = Vec::with_capacity(doc.len() + 8);
    out.push(b'{');
    let mut set = false;
    for (i, (key, value)) in members.0.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let key_json =
            serde_json::to_string(key).map_err(|e| RestoreError::NotAState(e.to_string()))?;
        out.extend_from_slice(key_json.as_bytes());
        out.push(b':');
        if key == "serial" {
            out.extend_from_slice(serial.to_string().as_bytes());
            set = true;
        } else {
            out.extend_from_slice(value.get().as_bytes());
        }
    }
    if !set {
        return Err(RestoreError::NotAState("it has no serial".into()));
    }
    out.push(b'}');
    Ok(out)
}

/// A JSON object's members in order, their values as written.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

/// Decompresses a gzip stream of at most `max` bytes.
fn gunzip_bounded(compressed: &[u8], max: u64) -> Result<Vec<u8>, RestoreError> {
    let mut out = Vec::new();
    GzDecoder::new(compressed)
        .take(max + 1)
        .read_to_end(&mut out)
        .map_err(RestoreError::Gzip)?;
    if out.len() as u64 > max {
        return Err(RestoreError::TooLarge(max));
    }
    Ok(out)
}

/// Writes `content` to `path`, readable by this user only.
fn write_private(path: &Path, content: &[u8]) -> io::Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // The mode above applies only to a new file.
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    file.write_all(content)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn module_files() {
        for (names, want) in [
            (&["main.tf"][..], true),
            (&["main.tf.json"], true),
            (&["main.tofu"], true),
            (&["x.tofu.json"], true),
            (&["README.md", "variables.tf"], true),
            (&["README.md"], false),
            (&[".tf"], false),
            (&["main.tfvars", "main.tf.bak", "terraform.tfstate"], false),
            (&[], false),
        ] {
            assert_eq!(
                has_module_file(names.iter().map(OsStr::new)),
                want,
                "{names:?}"
            );
        }
    }

    fn write(path: &Path, content: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }

    #[test]
    fn preflight_checks_module_and_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let module = dir.path().join("module");
        let bin = dir.path().join("runtime");
        write(&bin, "#!/bin/sh\n");
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();

        assert_eq!(
            preflight(&module, &bin),
            Err(LayoutError::NoModule(module.clone()))
        );
        fs::create_dir_all(module.join("sub.tf")).unwrap();
        write(&module.join("nested/main.tf"), "");
        assert_eq!(
            preflight(&module, &bin),
            Err(LayoutError::NoModule(module.clone())),
            "a directory named *.tf and a nested file do not count"
        );
        write(&module.join("main.tf"), "");
        assert_eq!(preflight(&module, &bin), Ok(()));

        let link = dir.path().join("runtime-link");
        symlink(&bin, &link).unwrap();
        assert_eq!(
            preflight(&module, &link),
            Ok(()),
            "a symlink to the runtime"
        );

        fs::set_permissions(&bin, fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            preflight(&module, &bin),
            Err(LayoutError::NoRuntime(bin.clone()))
        );
        let missing = dir.path().join("missing");
        assert_eq!(
            preflight(&module, &missing),
            Err(LayoutError::NoRuntime(missing.clone()))
        );
        assert_eq!(
            preflight(&module, dir.path()),
            Err(LayoutError::NoRuntime(dir.path().into())),
            "a directory is not a runtime"
        );
    }

    #[test]
    fn prepare_copies_the_config_privately() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config");
        // Laid out like a Secret volume: keys are symlinks into ..data.
        write(&config.join("..2026_01_01/main.tf.json"), "{}");
        write(
            &config.join("..2026_01_01/terraform.tfvars.json"),
            "{\"a\":1}",
        );
        symlink("..2026_01_01", config.join("..data")).unwrap();
        symlink("..data/main.tf.json", config.join("main.tf.json")).unwrap();
        symlink(
            "..data/terraform.tfvars.json",
            config.join("terraform.tfvars.json"),
        )
        .unwrap();
        write(&config.join("restore/0"), "chunk");
        let work = dir.path().join("work");
        fs::create_dir(&work).unwrap();

        let got = prepare(&work, &config, &dir.path().join("no-providers")).unwrap();
        assert_eq!(got.root, work.join("root"));
        assert_eq!(got.cli_config, None);
        let mut names: Vec<_> = fs::read_dir(&got.root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["main.tf.json", "terraform.tfvars.json"]);
        for name in &names {
            let meta = fs::symlink_metadata(got.root.join(name)).unwrap();
            assert!(meta.is_file(), "{name} is a copy, not a link");
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{name}");
        }
        assert_eq!(
            fs::read_to_string(got.root.join("terraform.tfvars.json")).unwrap(),
            "{\"a\":1}"
        );
        assert!(!work.join("cli.tfrc").exists());
    }

    #[test]
    fn prepare_writes_the_cli_config_with_providers() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config");
        write(&config.join("main.tf.json"), "{}");
        let providers = dir.path().join("providers");
        fs::create_dir(&providers).unwrap();
        let work = dir.path().join("work");

        let got = prepare(&work, &config, &providers).unwrap();
        let path = work.join("cli.tfrc");
        assert_eq!(got.cli_config.as_deref(), Some(path.as_path()));
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), cli_config(&providers));
    }

    #[test]
    fn cli_config_text() {
        assert_eq!(
            cli_config(Path::new("/captf/providers")),
            "provider_installation {\n  filesystem_mirror {\n    path    = \"/captf/providers\"\n    \
             include = [\"*/*/*\"]\n  }\n  direct {\n    exclude = [\"*/*/*\"]\n  }\n}\n"
        );
        assert!(cli_config(Path::new("/odd \"dir\"")).contains(r#"path    = "/odd \"dir\"""#));
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn restore_file_from_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config");
        let state = br#"{"version":4,"serial":7,"lineage":"l","resources":[]}"#;
        let gz = gzip(state);
        let (a, b) = gz.split_at(gz.len() / 2);
        write(&config.join("restore/0"), "");
        fs::write(config.join("restore/0"), a).unwrap();
        fs::write(config.join("restore/1"), b).unwrap();
        let to = dir.path().join("restore.tfstate");

        write_restore_file(&config, 2, None, &to).unwrap();
        assert_eq!(fs::read(&to).unwrap(), state);
        assert_eq!(
            fs::metadata(&to).unwrap().permissions().mode() & 0o777,
            0o600
        );

        assert!(matches!(
            write_restore_file(&config, 3, None, &to),
            Err(RestoreError::Chunk { .. })
        ));
        assert!(matches!(
            write_restore_file(&config, 1, None, &to),
            Err(RestoreError::Gzip(_))
        ));
    }

    #[test]
    fn gunzip_is_bounded() {
        let data = vec![b' '; 1000];
        assert_eq!(gunzip_bounded(&gzip(&data), 1000).unwrap(), data);
        assert!(matches!(
            gunzip_bounded(&gzip(&data), 999),
            Err(RestoreError::TooLarge(999))
        ));
        assert!(matches!(
            gunzip_bounded(b"plain", 1000),
            Err(RestoreError::Gzip(_))
        ));
    }

    #[test]
    fn a_restored_state_takes_the_serial_it_is_given_and_keeps_the_rest() {
        let doc = br#"{"version":4,"terraform_version":"1.9.0","serial":7,"lineage":"3f6e-\"x\"","outputs":{"serial":{"value":1}},"resources":[{"a":[1, 2]}]}"#;
        let got = with_serial(doc, 12).unwrap();
        assert_eq!(
            String::from_utf8(got).unwrap(),
            r#"{"version":4,"terraform_version":"1.9.0","serial":12,"lineage":"3f6e-\"x\"","outputs":{"serial":{"value":1}},"resources":[{"a":[1, 2]}]}"#
        );
        for bad in [&b"[1]"[..], b"{\"version\":4}", b"{\"serial\":"] {
            assert!(
                matches!(with_serial(bad, 3), Err(RestoreError::NotAState(_))),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
