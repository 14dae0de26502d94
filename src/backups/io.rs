//! The Kubernetes I/O of backups: create a set whole or not at all, read
//! one set's Secrets, delete the pruned ones as they were listed.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams};

use super::{BACKUP_DIGEST, BACKUP_LABEL, BACKUP_SET, BACKUP_SUFFIX_LABEL, BackupSet, annotation};
use crate::error::{Categorized, Category, kube_category};
use crate::names;
use crate::protection::{self, AsRead};

/// A failure to take, list or delete backups.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("creating backup Secret {name}: {source}")]
    Create { name: String, source: kube::Error },
    #[error("reading backup Secret {name}: {source}")]
    Get { name: String, source: kube::Error },
    #[error("backup Secret {name} already exists and holds another state (digest differs)")]
    Conflict { name: String },
    #[error("listing backup Secrets: {0}")]
    List(#[source] kube::Error),
    #[error("deleting backup Secret {name}: {source}")]
    Delete { name: String, source: kube::Error },
    #[error("{cause}; removing the partial backup Secret {name} failed too: {source}")]
    Cleanup {
        cause: Box<BackupError>,
        name: String,
        source: kube::Error,
    },
}

impl Categorized for BackupError {
    fn category(&self) -> Category {
        match self {
            BackupError::Create { source, .. }
            | BackupError::Get { source, .. }
            | BackupError::List(source)
            | BackupError::Delete { source, .. } => kube_category(source),
            // Someone else's Secret under our name: retrying does not help.
            BackupError::Conflict { .. } => Category::Invalid,
            BackupError::Cleanup { .. } => Category::Transient,
        }
    }
}

fn selector(suffix: &str) -> String {
    format!("{BACKUP_LABEL}=true,{BACKUP_SUFFIX_LABEL}={suffix}")
}

fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == code)
}

/// What [`take`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum Taken {
    /// It created the set, or the rest of it: the Secrets it created, as
    /// the API server answered.
    New(Vec<Secret>),
    /// Every Secret of the set was there already, with its digest: an
    /// earlier pass took it (one that ran on an older status, or before a
    /// move), so it is not a new backup.
    Already,
}

/// Creates every Secret of `set`. On any failure it removes what this call
/// created and any leftover of the same set from an earlier attempt, so that
/// no partial set is left behind, and returns the failure. A Secret that
/// already exists with the set's digest counts as created: an earlier pass
/// may have taken this backup.
pub async fn take(api: &Api<Secret>, set: &BackupSet) -> Result<Taken, BackupError> {
    let mut created: Vec<String> = Vec::new();
    let mut written = Vec::new();
    let mut failure = None;
    for secret in &set.secrets {
        let name = secret.metadata.name.clone().unwrap_or_default();
        match crate::secret_io::create(api, secret).await {
            Ok(answer) => {
                created.push(name);
                written.push(answer);
            }
            Err(error) if is_status(&error, 409) => match api.get(&name).await {
                Ok(found)
                    if annotation(&found, BACKUP_DIGEST) == Some(set.digest.as_str())
                        && annotation(&found, BACKUP_SET) == Some(set.set_id.as_str()) => {}
                Ok(_) => {
                    failure = Some(BackupError::Conflict { name });
                    break;
                }
                Err(source) => {
                    failure = Some(BackupError::Get { name, source });
                    break;
                }
            },
            Err(source) => {
                failure = Some(BackupError::Create { name, source });
                break;
            }
        }
    }
    let Some(cause) = failure else {
        return Ok(if written.is_empty() {
            Taken::Already
        } else {
            Taken::New(written)
        });
    };
    Err(remove_partial(api, set, created, cause).await)
}

/// Deletes `created` and every listed Secret of the same set, and returns
/// `cause`, or a [`BackupError::Cleanup`] when a delete fails.
async fn remove_partial(
    api: &Api<Secret>,
    set: &BackupSet,
    mut doomed: Vec<String>,
    cause: BackupError,
) -> BackupError {
    let params = ListParams::default().labels(&selector(&set.suffix));
    match api.list_metadata(&params).await {
        Ok(list) => {
            for item in list.items {
                let Some(name) = item.metadata.name else {
                    continue;
                };
                let same_set = item
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(BACKUP_SET))
                    == Some(&set.set_id);
                if same_set
                    && names::backup_chunk_index(&set.suffix, set.serial, &name).is_some()
                    && !doomed.contains(&name)
                {
                    doomed.push(name);
                }
            }
        }
        Err(source) => {
            return BackupError::Cleanup {
                cause: Box::new(cause),
                name: names::backup_secret(&set.suffix, set.serial),
                source,
            };
        }
    }
    for name in doomed {
        match protection::unprotect_and_delete(api, &name, &DeleteParams::default()).await {
            Ok(()) => {}
            Err(source) => {
                return BackupError::Cleanup {
                    cause: Box::new(cause),
                    name,
                    source,
                };
            }
        }
    }
    cause
}

/// The Secrets `names` as they are now, with their data; ones gone are
/// left out. One set at a time: at most a state's chunk count of reads.
pub async fn read_set(api: &Api<Secret>, names: &[&str]) -> Result<Vec<Secret>, BackupError> {
    let mut read = Vec::with_capacity(names.len());
    for name in names {
        match api.get_opt(name).await {
            Ok(Some(secret)) => read.push(secret),
            Ok(None) => {}
            Err(source) => {
                return Err(BackupError::Get {
                    name: (*name).to_owned(),
                    source,
                });
            }
        }
    }
    Ok(read)
}

/// Deletes the backup Secrets `doomed` if each is still the one listed;
/// ones already gone are fine, one changed since fails (the next pass
/// lists it again).
pub async fn delete_sets(api: &Api<Secret>, doomed: &[AsRead]) -> Result<(), BackupError> {
    for read in doomed {
        if let Err(source) = protection::delete_as_read(api, read).await {
            return Err(BackupError::Delete {
                name: read.name.clone(),
                source,
            });
        }
    }
    Ok(())
}
