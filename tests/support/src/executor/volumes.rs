//! Volumes: a pod's root laid out, each volume at its mount path, filled
//! from Secrets, ConfigMaps, the downward API and tokens as a kubelet would.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, Volume,
};
use kube::api::Api;

use super::images::Image;
use super::{NODE, PodError, PodRun, TOKEN_SECONDS, io_error};

/// Kubelet's default mode for Secret, ConfigMap and projected files.
const DEFAULT_FILE_MODE: i32 = 0o644;

/// A container path inside `root`; it must be absolute and plain.
pub(super) fn in_root(root: &Path, container_path: &str) -> Result<PathBuf, PodError> {
    let path = Path::new(container_path);
    let mut out = root.to_path_buf();
    let mut components = path.components();
    if components.next() != Some(Component::RootDir) {
        return Err(PodError::Unsupported(format!(
            "path {container_path:?} is not absolute"
        )));
    }
    for component in components {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            _ => {
                return Err(PodError::Unsupported(format!(
                    "path {container_path:?} leaves its root"
                )));
            }
        }
    }
    Ok(out)
}

/// A relative path of a volume item; it must stay inside the volume.
fn item_path(path: &str) -> Result<PathBuf, PodError> {
    let p = Path::new(path);
    if p.as_os_str().is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(PodError::Unsupported(format!(
            "volume item path {path:?} leaves its volume"
        )));
    }
    Ok(p.to_path_buf())
}

/// The data of a Secret or a ConfigMap, by key.
pub(super) type Data = BTreeMap<String, Vec<u8>>;

/// One file of a Secret, ConfigMap or projected volume.
#[derive(Clone, Debug, PartialEq)]
struct VolumeFile {
    path: PathBuf,
    contents: Vec<u8>,
    mode: u32,
}

/// The files of an object's keys: every key, or the listed items. A listed
/// key that is missing is an error unless the source is optional.
fn key_files(
    kind: &'static str,
    name: &str,
    data: &Data,
    items: Option<&[KeyToPath]>,
    default_mode: i32,
    optional: bool,
) -> Result<Vec<VolumeFile>, PodError> {
    let file = |path: &str, contents: &[u8], mode: Option<i32>| -> Result<VolumeFile, PodError> {
        Ok(VolumeFile {
            path: item_path(path)?,
            contents: contents.to_vec(),
            mode: (mode.unwrap_or(default_mode) & 0o7777) as u32,
        })
    };
    match items {
        None => data
            .iter()
            .map(|(key, value)| file(key, value, None))
            .collect(),
        Some(items) => {
            let mut files = Vec::new();
            for item in items {
                match data.get(&item.key) {
                    Some(value) => files.push(file(&item.path, value, item.mode)?),
                    None if optional => {}
                    None => {
                        return Err(PodError::MissingKey {
                            kind,
                            name: name.to_string(),
                            key: item.key.clone(),
                        });
                    }
                }
            }
            Ok(files)
        }
    }
}

/// The value of a downward API field a kubelet would resolve.
pub(super) fn field_value(pod: &Pod, field_path: &str) -> Result<String, PodError> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let map = |m: &Option<BTreeMap<String, String>>| {
        m.iter()
            .flatten()
            .map(|(k, v)| format!("{k}={v:?}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let value = match field_path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "metadata.labels" => Some(map(&meta.labels)),
        "metadata.annotations" => Some(map(&meta.annotations)),
        "spec.nodeName" => Some(NODE.to_string()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        _ => {
            if let Some(key) = field_path
                .strip_prefix("metadata.labels['")
                .and_then(|k| k.strip_suffix("']"))
            {
                meta.labels.as_ref().and_then(|l| l.get(key).cloned())
            } else if let Some(key) = field_path
                .strip_prefix("metadata.annotations['")
                .and_then(|k| k.strip_suffix("']"))
            {
                meta.annotations.as_ref().and_then(|a| a.get(key).cloned())
            } else {
                return Err(PodError::Unsupported(format!(
                    "the field {field_path:?} is not supported by the local executor"
                )));
            }
        }
    };
    Ok(value.unwrap_or_default())
}

impl PodRun {
    /// A fresh root: every volume at its mount path (or under `.volumes`
    /// when no container mounts it), the image's paths, and `dev/`.
    pub(super) async fn lay_out(&self, pod: &Pod) -> Result<(), PodError> {
        let root = &self.root;
        match fs::remove_dir_all(root) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_error(root)(e)),
            _ => {}
        }
        let dev = root.join("dev");
        fs::create_dir_all(&dev).map_err(io_error(&dev))?;
        if self.shared.contained {
            // Where the host's /proc and devices are bound in.
            let proc = root.join("proc");
            fs::create_dir_all(&proc).map_err(io_error(&proc))?;
            for device in super::contained::DEVICES {
                write_file(&dev.join(device), b"", 0o666)?;
            }
        }
        let spec = pod.spec.clone().unwrap_or_default();
        let containers: Vec<&Container> = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .collect();
        let mut objects = Objects::new(&self.shared.client, &self.key.namespace);
        for volume in spec.volumes.iter().flatten() {
            let mut paths = Vec::new();
            for mount in containers
                .iter()
                .flat_map(|c| c.volume_mounts.iter().flatten())
            {
                if mount.name != volume.name {
                    continue;
                }
                if mount.sub_path.as_deref().is_some_and(|s| !s.is_empty())
                    || mount
                        .sub_path_expr
                        .as_deref()
                        .is_some_and(|s| !s.is_empty())
                {
                    return Err(PodError::Unsupported(format!(
                        "volume {:?}: subPath mounts are not supported by the local executor",
                        volume.name
                    )));
                }
                let path = in_root(root, &mount.mount_path)?;
                if !paths.contains(&path) {
                    paths.push(path);
                }
            }
            // A volume no container mounts still has to be set up: a kubelet
            // waits for its Secret all the same.
            let dir = paths
                .first()
                .cloned()
                .unwrap_or_else(|| root.join(".volumes").join(&volume.name));
            self.fill_volume(pod, volume, &dir, &mut objects)
                .await
                .map_err(|e| PodError::Volume {
                    volume: volume.name.clone(),
                    source: Box::new(e),
                })?;
            if self.shared.contained
                && let Some(group) = spec.security_context.as_ref().and_then(|c| c.fs_group)
            {
                let writable = volume.empty_dir.is_some();
                super::contained::own_volume(&dir, group as u32, writable)
                    .map_err(io_error(&dir))?;
            }
            for other in paths.iter().skip(1) {
                // Relative, so that it holds in a chroot too.
                let target = relative_to(other, &dir, root);
                link(&target, other)?;
            }
        }
        let mounted: Vec<PathBuf> = containers
            .iter()
            .flat_map(|c| c.volume_mounts.iter().flatten())
            .filter_map(|m| in_root(root, &m.mount_path).ok())
            .collect();
        for container in &containers {
            let reference = container.image.clone().unwrap_or_default();
            match self.shared.images.get(&reference) {
                Some(Image::Module(image)) => {
                    link(&image.module, &root.join("captf/module"))?;
                    link(&image.runtime, &root.join("captf/runtime"))?;
                    if let Some(providers) = &image.providers {
                        link(providers, &root.join("captf/providers"))?;
                    }
                }
                Some(Image::Unpacked(image)) => link_tree(&image.root, root, &mounted)?,
                _ => {}
            }
        }
        Ok(())
    }

    async fn fill_volume(
        &self,
        pod: &Pod,
        volume: &Volume,
        dir: &Path,
        objects: &mut Objects,
    ) -> Result<(), PodError> {
        fs::create_dir_all(dir).map_err(io_error(dir))?;
        let mut files = Vec::new();
        if volume.empty_dir.is_some() {
            // An empty directory, writable by any user, as a kubelet's.
            fs::set_permissions(dir, fs::Permissions::from_mode(0o777)).map_err(io_error(dir))?;
        } else if let Some(source) = &volume.secret {
            let name = source.secret_name.clone().unwrap_or_default();
            let optional = source.optional.unwrap_or(false);
            let mode = source.default_mode.unwrap_or(DEFAULT_FILE_MODE);
            if let Some(data) = objects.secret(&name, optional).await? {
                files = key_files(
                    "secret",
                    &name,
                    &data,
                    source.items.as_deref(),
                    mode,
                    optional,
                )?;
            }
        } else if let Some(source) = &volume.config_map {
            let optional = source.optional.unwrap_or(false);
            let mode = source.default_mode.unwrap_or(DEFAULT_FILE_MODE);
            if let Some(data) = objects.config_map(&source.name, optional).await? {
                files = key_files(
                    "configmap",
                    &source.name,
                    &data,
                    source.items.as_deref(),
                    mode,
                    optional,
                )?;
            }
        } else if let Some(source) = &volume.downward_api {
            let mode = source.default_mode.unwrap_or(DEFAULT_FILE_MODE);
            files = downward_files(pod, source.items.as_deref().unwrap_or_default(), mode)?;
        } else if let Some(projected) = &volume.projected {
            let mode = projected.default_mode.unwrap_or(DEFAULT_FILE_MODE);
            for source in projected.sources.iter().flatten() {
                if let Some(secret) = &source.secret {
                    let optional = secret.optional.unwrap_or(false);
                    if let Some(data) = objects.secret(&secret.name, optional).await? {
                        files.extend(key_files(
                            "secret",
                            &secret.name,
                            &data,
                            secret.items.as_deref(),
                            mode,
                            optional,
                        )?);
                    }
                } else if let Some(map) = &source.config_map {
                    let optional = map.optional.unwrap_or(false);
                    if let Some(data) = objects.config_map(&map.name, optional).await? {
                        files.extend(key_files(
                            "configmap",
                            &map.name,
                            &data,
                            map.items.as_deref(),
                            mode,
                            optional,
                        )?);
                    }
                } else if let Some(downward) = &source.downward_api {
                    files.extend(downward_files(
                        pod,
                        downward.items.as_deref().unwrap_or_default(),
                        mode,
                    )?);
                } else if let Some(token) = &source.service_account_token {
                    let seconds = token.expiration_seconds.unwrap_or(TOKEN_SECONDS);
                    let value = self.token(pod, token.audience.clone(), seconds).await?;
                    files.push(VolumeFile {
                        path: item_path(&token.path)?,
                        contents: value.into_bytes(),
                        mode: (mode & 0o7777) as u32,
                    });
                } else {
                    return Err(PodError::Unsupported(format!(
                        "volume {:?}: a projected source the local executor does not support",
                        volume.name
                    )));
                }
            }
        } else {
            return Err(PodError::Unsupported(format!(
                "volume {:?}: the local executor supports emptyDir, secret, configMap, downwardAPI and projected volumes",
                volume.name
            )));
        }
        for file in files {
            write_file(&dir.join(&file.path), &file.contents, file.mode)?;
        }
        Ok(())
    }
}

fn downward_files(
    pod: &Pod,
    items: &[DownwardAPIVolumeFile],
    default_mode: i32,
) -> Result<Vec<VolumeFile>, PodError> {
    items
        .iter()
        .map(|item| {
            let Some(field) = &item.field_ref else {
                return Err(PodError::Unsupported(format!(
                    "downward API item {:?}: only fieldRef is supported",
                    item.path
                )));
            };
            Ok(VolumeFile {
                path: item_path(&item.path)?,
                contents: field_value(pod, &field.field_path)?.into_bytes(),
                mode: (item.mode.unwrap_or(default_mode) & 0o7777) as u32,
            })
        })
        .collect()
}

pub(super) fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), PodError> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).map_err(io_error(parent))?;
    }
    fs::write(path, contents).map_err(io_error(path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_error(path))
}

/// Hard-links every file of the image's tree `from` into the root at its
/// path (a chrooted process can follow no link out of its root), but none
/// under a mount: a volume shadows what the image holds there. Every
/// container of the pod sees the files of all its images.
fn link_tree(from: &Path, root: &Path, mounted: &[PathBuf]) -> Result<(), PodError> {
    let mut dirs = vec![from.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).map_err(io_error(&dir))? {
            let entry = entry.map_err(io_error(&dir))?;
            let path = entry.path();
            let Ok(relative) = path.strip_prefix(from) else {
                continue;
            };
            let inside = root.join(relative);
            if mounted.iter().any(|m| inside.starts_with(m)) {
                continue;
            }
            let file_type = entry.file_type().map_err(io_error(&path))?;
            if file_type.is_dir() {
                dirs.push(path);
                continue;
            }
            if let Some(parent) = inside.parent() {
                fs::create_dir_all(parent).map_err(io_error(parent))?;
            }
            let _ = fs::remove_file(&inside);
            if fs::hard_link(&path, &inside).is_err() {
                fs::copy(&path, &inside).map_err(io_error(&inside))?;
            }
        }
    }
    Ok(())
}

/// `target` as seen from the folder of `link`, both inside `root`.
fn relative_to(link: &Path, target: &Path, root: &Path) -> PathBuf {
    let (Ok(link), Ok(target)) = (link.strip_prefix(root), target.strip_prefix(root)) else {
        return target.to_path_buf();
    };
    let up = link.components().count().saturating_sub(1);
    let mut relative: PathBuf = std::iter::repeat_n(Component::ParentDir, up).collect();
    relative.push(target);
    relative
}

/// `link` names `target` (replacing what was there).
fn link(target: &Path, link: &Path) -> Result<(), PodError> {
    if let Some(parent) = link.parent() {
        fs::create_dir_all(parent).map_err(io_error(parent))?;
    }
    match fs::remove_file(link) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_error(link)(e)),
        _ => {}
    }
    symlink(target, link).map_err(io_error(link))
}

/// The Secrets and ConfigMaps one preparation reads, each read once.
pub(super) struct Objects {
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
    cache: HashMap<(&'static str, String), Option<Data>>,
}

impl Objects {
    pub(super) fn new(client: &kube::Client, namespace: &str) -> Objects {
        Objects {
            secrets: Api::namespaced(client.clone(), namespace),
            config_maps: Api::namespaced(client.clone(), namespace),
            cache: HashMap::new(),
        }
    }

    /// A Secret's data; None when it is missing and optional.
    pub(super) async fn secret(
        &mut self,
        name: &str,
        optional: bool,
    ) -> Result<Option<Data>, PodError> {
        let key = ("secret", name.to_string());
        if !self.cache.contains_key(&key) {
            let data = self.secrets.get_opt(name).await?.map(|s| {
                s.data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect()
            });
            self.cache.insert(key.clone(), data);
        }
        Self::found(
            self.cache.get(&key).cloned().flatten(),
            "secret",
            name,
            optional,
        )
    }

    /// A ConfigMap's data and binaryData; None when it is missing and
    /// optional.
    pub(super) async fn config_map(
        &mut self,
        name: &str,
        optional: bool,
    ) -> Result<Option<Data>, PodError> {
        let key = ("configmap", name.to_string());
        if !self.cache.contains_key(&key) {
            let data = self.config_maps.get_opt(name).await?.map(|m| {
                let text = m
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes()));
                let binary = m
                    .binary_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0));
                text.chain(binary).collect()
            });
            self.cache.insert(key.clone(), data);
        }
        Self::found(
            self.cache.get(&key).cloned().flatten(),
            "configmap",
            name,
            optional,
        )
    }

    fn found(
        data: Option<Data>,
        kind: &'static str,
        name: &str,
        optional: bool,
    ) -> Result<Option<Data>, PodError> {
        match data {
            Some(data) => Ok(Some(data)),
            None if optional => Ok(None),
            None => Err(PodError::NotFound {
                kind,
                name: name.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests;
