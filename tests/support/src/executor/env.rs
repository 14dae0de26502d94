//! Environment and token: a container's command line and environment as
//! the host runs them, and the kubeconfig with its ServiceAccount's token.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Container, Pod, ServiceAccount};
use kube::api::{Api, PostParams};

use super::images::Image;
use super::volumes::{Data, Objects, field_value, in_root};
use super::{PodError, PodRun};

/// A container's process environment as a container runtime builds it: the
/// image's ENV (over a PATH so that local-exec provisioners find their
/// programs), overridden by envFrom, overridden by env. A value naming a path
/// under one of the container's mounts is taken inside the root, as the
/// process sees the pod's files there.
pub(super) fn merge_env(
    path: &str,
    image_env: &[(String, String)],
    env_from: &[(String, String)],
    env: &[(String, String)],
    root: &Path,
    mount_paths: &[String],
) -> BTreeMap<String, String> {
    let mut merged = BTreeMap::from([("PATH".to_string(), path.to_string())]);
    for (name, value) in image_env.iter().chain(env_from).chain(env) {
        merged.insert(name.clone(), value.clone());
    }
    for value in merged.values_mut() {
        let under_mount = mount_paths.iter().any(|m| {
            value == m
                || value
                    .strip_prefix(m.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        });
        if under_mount && let Ok(local) = in_root(root, value) {
            *value = local.to_string_lossy().into_owned();
        }
    }
    merged
}

/// The envFrom entries of one object: its keys, prefixed, except those that
/// cannot be a variable's name.
fn prefixed(data: &Data, prefix: &str) -> Vec<(String, String)> {
    data.iter()
        .filter(|(key, _)| !key.is_empty() && !key.contains('='))
        .map(|(key, value)| {
            (
                format!("{prefix}{key}"),
                String::from_utf8_lossy(value).into_owned(),
            )
        })
        .collect()
}

/// A container's command or argument with its `$(NAME)` references
/// expanded as a kubelet does: a variable of the container's own env;
/// `$$` is a `$`; an unknown or unterminated reference stays as written.
pub(super) fn expand(text: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(name_end) = after.strip_prefix('(').and_then(|a| a.find(')')) {
            let name = &after[1..=name_end];
            match lookup(name) {
                Some(value) => out.push_str(&value),
                None => out.push_str(&rest[at..at + name_end + 3]),
            }
            rest = &after[name_end + 2..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

const IN_CLUSTER: &str = "--backend-config=in_cluster_config=true";

/// A container's command line as a kubelet makes it: its command replaces
/// the image's entrypoint and Cmd; its args replace the Cmd.
pub(super) fn container_argv<'a>(
    image: &'a Image,
    command: &'a [String],
    args: &'a [String],
) -> Vec<&'a String> {
    let (command, args) = match image {
        Image::Unpacked(u) if command.is_empty() => {
            let args = if args.is_empty() { &u.cmd[..] } else { args };
            (&u.entrypoint[..], args)
        }
        _ => (command, args),
    };
    command.iter().chain(args).collect()
}

/// The host command line of a container: its command and args, or what its
/// image's entrypoint and Cmd give in their place. The runner image's
/// `/runner` is its binary; a program found in the root runs from there, any other from the
/// host. The runner's `run` gets `--root=<root>` and the kubeconfig in place
/// of the in-cluster configuration; for any other program, an absolute
/// argument whose path (or its parent) is in the root is taken inside it.
pub(super) fn host_argv(
    image: &Image,
    command: &[String],
    args: &[String],
    root: &Path,
    kubeconfig: &Path,
    root_has: &dyn Fn(&Path) -> bool,
) -> Result<Vec<String>, PodError> {
    let argv = container_argv(image, command, args);
    let Some((program, rest)) = argv.split_first() else {
        return Err(PodError::Unsupported(
            "the container has no command, and its image no entrypoint".into(),
        ));
    };
    let local = |arg: &str| -> Option<PathBuf> {
        let path = in_root(root, arg).ok()?;
        (root_has(&path) || path.parent().is_some_and(|p| p != root && root_has(p))).then_some(path)
    };
    let host_program = match image {
        Image::Runner(binary) if program.as_str() == "/runner" => binary.clone(),
        _ => local(program).unwrap_or_else(|| PathBuf::from(program.as_str())),
    };
    let mut out = vec![host_program.to_string_lossy().into_owned()];
    let runner_run = Path::new(program.as_str())
        .file_name()
        .is_some_and(|n| n == "runner")
        && rest.first().is_some_and(|a| a.as_str() == "run");
    if runner_run {
        out.push("run".into());
        out.push(format!("--root={}", root.display()));
        out.extend(rest[1..].iter().map(|arg| {
            if arg.as_str() == IN_CLUSTER {
                format!("--backend-config=config_path={}", kubeconfig.display())
            } else {
                arg.to_string()
            }
        }));
    } else {
        out.extend(rest.iter().map(|arg| match local(arg) {
            Some(path) => path.to_string_lossy().into_owned(),
            None => arg.to_string(),
        }));
    }
    Ok(out)
}

impl PodRun {
    /// A token of the pod's ServiceAccount, bound to the pod as a kubelet's.
    pub(super) async fn token(
        &self,
        pod: &Pod,
        audience: Option<String>,
        seconds: i64,
    ) -> Result<String, PodError> {
        let account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: audience.map(|a| vec![a]),
                expiration_seconds: Some(seconds),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(self.key.name.clone()),
                    uid: Some(self.uid.clone()),
                }),
            }),
            ..Default::default()
        };
        let accounts: Api<ServiceAccount> =
            Api::namespaced(self.shared.client.clone(), &self.key.namespace);
        let answer = accounts
            .create_token_request(&account, &PostParams::default(), &request)
            .await
            .map_err(|e| match e {
                kube::Error::Api(status) if status.code == 404 => PodError::NotFound {
                    kind: "serviceaccount",
                    name: account.clone(),
                },
                other => PodError::Api(other),
            })?;
        answer.status.and_then(|s| s.token).ok_or_else(|| {
            PodError::Unsupported("the TokenRequest came back without a token".into())
        })
    }

    /// The entries of envFrom and of env, resolved.
    pub(super) async fn container_env(
        &self,
        pod: &Pod,
        container: &Container,
        objects: &mut Objects,
    ) -> Result<(Vec<(String, String)>, Vec<(String, String)>), PodError> {
        let mut env_from = Vec::new();
        for source in container.env_from.iter().flatten() {
            let prefix = source.prefix.clone().unwrap_or_default();
            let data = if let Some(secret) = &source.secret_ref {
                objects
                    .secret(&secret.name, secret.optional.unwrap_or(false))
                    .await?
            } else if let Some(map) = &source.config_map_ref {
                objects
                    .config_map(&map.name, map.optional.unwrap_or(false))
                    .await?
            } else {
                None
            };
            if let Some(data) = data {
                env_from.extend(prefixed(&data, &prefix));
            }
        }
        let mut env = Vec::new();
        for var in container.env.iter().flatten() {
            let Some(from) = &var.value_from else {
                env.push((var.name.clone(), var.value.clone().unwrap_or_default()));
                continue;
            };
            let (kind, name, key, optional, data) = if let Some(r) = &from.secret_key_ref {
                let optional = r.optional.unwrap_or(false);
                (
                    "secret",
                    &r.name,
                    &r.key,
                    optional,
                    objects.secret(&r.name, optional).await?,
                )
            } else if let Some(r) = &from.config_map_key_ref {
                let optional = r.optional.unwrap_or(false);
                (
                    "configmap",
                    &r.name,
                    &r.key,
                    optional,
                    objects.config_map(&r.name, optional).await?,
                )
            } else if let Some(field) = &from.field_ref {
                env.push((var.name.clone(), field_value(pod, &field.field_path)?));
                continue;
            } else {
                return Err(PodError::Unsupported(format!(
                    "env {:?}: only value, secretKeyRef, configMapKeyRef and fieldRef are supported",
                    var.name
                )));
            };
            match data.as_ref().and_then(|d| d.get(key.as_str())) {
                Some(value) => env.push((
                    var.name.clone(),
                    String::from_utf8_lossy(value).into_owned(),
                )),
                None if optional => {}
                None => {
                    return Err(PodError::MissingKey {
                        kind,
                        name: name.clone(),
                        key: key.clone(),
                    });
                }
            }
        }
        Ok((env_from, env))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executor::ModuleImage;
    use captf::error::{Categorized, Category};

    #[test]
    fn the_environment_layers_image_env_from_and_env() {
        let pairs = |p: &[(&str, &str)]| -> Vec<(String, String)> {
            p.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let image = pairs(&[
            ("A", "image"),
            ("B", "image"),
            ("C", "image"),
            ("LANG", "C.UTF-8"),
        ]);
        let from = pairs(&[("B", "from"), ("C", "from")]);
        let env = pairs(&[
            ("C", "env"),
            ("HOME", "/captf/work"),
            ("TMPDIR", "/tmp"),
            ("OTHER", "/tmpfoo"),
            ("SUB", "/tmp/x"),
        ]);
        let mounts = ["/captf/work".to_string(), "/tmp".to_string()];
        let merged = merge_env(
            "/usr/bin:/bin",
            &image,
            &from,
            &env,
            Path::new("/r"),
            &mounts,
        );
        let want = BTreeMap::from(
            [
                ("PATH", "/usr/bin:/bin"),
                ("A", "image"),
                ("B", "from"),
                ("C", "env"),
                ("LANG", "C.UTF-8"),
                ("HOME", "/r/captf/work"),
                ("TMPDIR", "/r/tmp"),
                ("OTHER", "/tmpfoo"),
                ("SUB", "/r/tmp/x"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        assert_eq!(merged, want);

        let overridden = merge_env(
            "/bin",
            &pairs(&[("PATH", "/image/bin")]),
            &[],
            &[],
            Path::new("/r"),
            &[],
        );
        assert_eq!(
            overridden["PATH"], "/image/bin",
            "an image's PATH wins over the host's"
        );

        let data = BTreeMap::from([
            ("KEY".to_string(), b"v".to_vec()),
            ("a=b".to_string(), b"x".to_vec()),
            (String::new(), b"x".to_vec()),
        ]);
        assert_eq!(prefixed(&data, "P_"), pairs(&[("P_KEY", "v")]));
    }

    #[test]
    fn references_expand_as_a_kubelet_expands_them() {
        let env = |name: &str| (name == "NS").then(|| "cert-manager".to_string());
        for (text, want) in [
            ("--namespace=$(NS)", "--namespace=cert-manager"),
            ("$(NS).svc,$(NS)", "cert-manager.svc,cert-manager"),
            ("$(UNKNOWN)", "$(UNKNOWN)"),
            ("$$(NS)", "$(NS)"),
            ("$$$(NS)", "$cert-manager"),
            ("cost: $5", "cost: $5"),
            ("$(NS", "$(NS"),
            ("trailing $", "trailing $"),
            ("", ""),
        ] {
            assert_eq!(expand(text, env), want, "{text}");
        }
    }

    #[test]
    fn commands_run_from_the_root_or_the_host() {
        let root = Path::new("/r");
        let kubeconfig = Path::new("/r/kubeconfig");
        let runner = Image::Runner(PathBuf::from("/target/captf-runner"));
        let module = Image::Module(ModuleImage {
            module: PathBuf::from("/m"),
            runtime: PathBuf::from("/tofu"),
            providers: None,
            env: Vec::new(),
        });
        // What the laid-out root holds: the runner volume, not yet the runner.
        let root_has = |p: &Path| p == Path::new("/r/captf/bin") || p == Path::new("/r/captf/work");
        let s = |v: &[&str]| -> Vec<String> { v.iter().map(|a| a.to_string()).collect() };
        struct Case<'a> {
            what: &'a str,
            image: &'a Image,
            command: Vec<String>,
            args: Vec<String>,
            want: Vec<String>,
        }
        let case = |what, image, command, args, want| Case {
            what,
            image,
            command,
            args,
            want,
        };
        let cases = [
            case(
                "the init container copies the runner",
                &runner,
                s(&["/runner", "copy", "/captf/bin/runner"]),
                vec![],
                s(&["/target/captf-runner", "copy", "/r/captf/bin/runner"]),
            ),
            case(
                "the runner runs with the root and the kubeconfig",
                &module,
                s(&["/captf/bin/runner", "run"]),
                s(&[
                    "--op=apply",
                    "--backend-config=namespace=ns",
                    IN_CLUSTER,
                    "--backend-config=labels={}",
                ]),
                s(&[
                    "/r/captf/bin/runner",
                    "run",
                    "--root=/r",
                    "--op=apply",
                    "--backend-config=namespace=ns",
                    "--backend-config=config_path=/r/kubeconfig",
                    "--backend-config=labels={}",
                ]),
            ),
            case(
                "a host program keeps its script",
                &module,
                s(&["/bin/sh", "-c"]),
                s(&["/bin/echo hi > /captf/work/x"]),
                s(&["/bin/sh", "-c", "/bin/echo hi > /captf/work/x"]),
            ),
            case(
                "a path argument in the root is taken there",
                &module,
                s(&["/bin/cat", "/captf/work/x", "/etc/hostname", IN_CLUSTER]),
                vec![],
                s(&["/bin/cat", "/r/captf/work/x", "/etc/hostname", IN_CLUSTER]),
            ),
            case(
                "a runner image runs other programs from the host",
                &runner,
                s(&["/bin/true"]),
                vec![],
                s(&["/bin/true"]),
            ),
        ];
        for c in cases {
            let got = host_argv(c.image, &c.command, &c.args, root, kubeconfig, &root_has).unwrap();
            assert_eq!(got, c.want, "{}", c.what);
        }
        let error = host_argv(&module, &[], &[], root, kubeconfig, &root_has).unwrap_err();
        assert_eq!(error.category(), Category::Invalid);
    }

    #[test]
    fn the_kubeconfig_holds_the_server_ca_and_token() {
        let yaml =
            crate::identity::token_kubeconfig("https://127.0.0.1:6443", "Q0E=", "tok", "pod", None);
        let config = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
        let cluster = config.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        assert_eq!(cluster.certificate_authority_data.as_deref(), Some("Q0E="));
        assert_eq!(config.current_context.as_deref(), Some("pod"));
        // The token as written (kube keeps its own copy out of reach).
        let raw: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        assert_eq!(raw["users"][0]["user"]["token"], "tok");
    }
}
