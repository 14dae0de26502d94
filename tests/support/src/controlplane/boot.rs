//! Booting a control plane: etcd, kube-apiserver and kube-controller-manager
//! on free ports, its kubeconfig, and waiting until it serves.

use super::*;

/// Starts a control plane. It boots on a thread of its own, because it
/// waits on a runtime of its own and may be called from inside a test's.
pub fn start() -> Result<ControlPlane, String> {
    std::thread::spawn(start_here)
        .join()
        .map_err(|_| "the control plane's boot thread panicked".to_string())?
}

fn start_here() -> Result<ControlPlane, String> {
    let started = Instant::now();
    remove_stale_dirs(DIR_PREFIX, "CAPTF_KEEP_CONTROLPLANE");
    let dir = std::env::temp_dir().join(format!(
        "{DIR_PREFIX}{}-{:x}",
        std::process::id(),
        started.elapsed().as_nanos() ^ rand_seed()
    ));
    fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;

    let etcd = binary("etcd");
    let apiserver = binary("kube-apiserver");
    let kcm = binary("kube-controller-manager");

    let plane = ControlPlane {
        kubeconfig: dir.join("kubeconfig"),
        manager_kubeconfig: OnceLock::new(),
        server: String::new(),
        dir: dir.clone(),
        children: Mutex::new(Vec::new()),
    };
    let result = boot(plane, &etcd, &apiserver, &kcm);
    if let Ok(plane) = &result {
        eprintln!(
            "control plane up at {} in {:.1}s ({})",
            plane.server,
            started.elapsed().as_secs_f64(),
            dir.display()
        );
    }
    result
}

fn boot(
    mut plane: ControlPlane,
    etcd: &Path,
    apiserver: &Path,
    kcm: &Path,
) -> Result<ControlPlane, String> {
    let dir = plane.dir.clone();
    let write = |name: &str, contents: &str| -> Result<PathBuf, String> {
        let path = dir.join(name);
        fs::write(&path, contents).map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(path)
    };

    let ca = DevCa::generate("captf-test-ca").map_err(|e| e.to_string())?;
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    // 10.0.0.1 is the kubernetes Service's address in --service-cluster-ip-range.
    let serving = ca
        .issue_server(
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ],
            &[loopback, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))],
        )
        .map_err(|e| e.to_string())?;
    let admin = ca
        .issue_client("captf-admin", &["system:masters"])
        .map_err(|e| e.to_string())?;
    let sa_key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;

    let ca_file = write("ca.crt", ca.cert_pem())?;
    let serving_cert = write("apiserver.crt", &serving.cert_pem)?;
    let serving_key = write("apiserver.key", &serving.key_pem)?;
    let sa_key_file = write("service-account.key", &sa_key.serialize_pem())?;
    let sa_pub_file = write("service-account.pub", &sa_key.public_key_pem())?;

    let [etcd_client, etcd_peer, api_port, kcm_port] = free_ports()?;
    plane.server = format!("https://127.0.0.1:{api_port}");

    let kubeconfig = kubeconfig_yaml(
        &plane.server,
        ca.cert_pem(),
        &admin.cert_pem,
        &admin.key_pem,
    );
    plane.kubeconfig = write("kubeconfig", &kubeconfig)?;

    let etcd_url = format!("http://127.0.0.1:{etcd_client}");
    let peer_url = format!("http://127.0.0.1:{etcd_peer}");
    plane.spawn(
        "etcd",
        etcd,
        &[
            "--name=default".into(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=default={peer_url}"),
            // A test cluster's data is thrown away: durability buys nothing.
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ],
    )?;
    let mut audit = Vec::new();
    if let Ok(to) = std::env::var("CAPTF_AUDIT_DIR") {
        audit = audit_flags(&dir, Path::new(&to))?;
    }
    plane.spawn(
        "kube-apiserver",
        apiserver,
        &[
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={api_port}"),
            "--bind-address=127.0.0.1".into(),
            // These machines may have no default route to take an address from.
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", serving_cert.display()),
            format!("--tls-private-key-file={}", serving_key.display()),
            format!("--client-ca-file={}", ca_file.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", sa_pub_file.display()),
            format!(
                "--service-account-signing-key-file={}",
                sa_key_file.display()
            ),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            // A webhook's Service is dialled at its endpoints (the pod IPs
            // of the pod stand-in): there is no Service network.
            "--enable-aggregator-routing=true".into(),
            "--authorization-mode=RBAC".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ]
        .into_iter()
        .chain(audit)
        .collect::<Vec<_>>(),
    )?;
    let deadline = Instant::now() + START_TIMEOUT;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("building a runtime: {e}"))?;
    runtime.block_on(wait_apiserver_ready(&plane, deadline))?;

    let kcm_kubeconfig = plane.kubeconfig.display().to_string();
    plane.spawn(
        "kube-controller-manager",
        kcm,
        &[
            format!("--kubeconfig={kcm_kubeconfig}"),
            format!("--authentication-kubeconfig={kcm_kubeconfig}"),
            format!("--authorization-kubeconfig={kcm_kubeconfig}"),
            // Deployments and Services for the managers installed in pods;
            // the aggregated ClusterRoles Cluster API's providers install.
            "--controllers=job-controller,garbage-collector-controller,namespace-controller,serviceaccount-controller,serviceaccount-token-controller,root-ca-certificate-publisher-controller,deployment-controller,replicaset-controller,endpointslice-controller,clusterrole-aggregation-controller".into(),
            format!("--service-account-private-key-file={}", sa_key_file.display()),
            format!("--root-ca-file={}", ca_file.display()),
            "--use-service-account-credentials=false".into(),
            "--leader-elect=false".into(),
            format!("--secure-port={kcm_port}"),
            "--bind-address=127.0.0.1".into(),
            format!("--cert-dir={}", dir.join("kcm-certs").display()),
            "--v=1".into(),
        ],
    )?;
    runtime.block_on(wait_controllers_ready(&plane, deadline))?;
    Ok(plane)
}

impl ControlPlane {
    fn spawn(&mut self, name: &'static str, bin: &Path, args: &[String]) -> Result<(), String> {
        let log = fs::File::create(self.dir.join(format!("{name}.log")))
            .map_err(|e| format!("creating {name}.log: {e}"))?;
        let child = self.launch(bin, args, log)?;
        self.children
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .push(Process {
                name,
                bin: bin.to_owned(),
                args: args.to_vec(),
                child,
            });
        Ok(())
    }

    /// Starts `bin` with `args` in this control plane's directory, its
    /// output to `log`.
    pub(crate) fn launch(
        &self,
        bin: &Path,
        args: &[String],
        log: fs::File,
    ) -> Result<Child, String> {
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        spawn_owned(cmd).map_err(|e| format!("starting {}: {e}", bin.display()))
    }

    /// Fails with the log tail of a process that exited.
    fn check_alive(&self) -> Result<(), String> {
        let mut children = self.children.lock().unwrap_or_else(|e| e.into_inner());
        for Process { name, child, .. } in children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!(
                    "{name} exited with {status}; the end of its log:\n{}",
                    log_tail(&self.dir.join(format!("{name}.log")))
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn timed_out(&self, what: &str) -> String {
        let logs: Vec<String> = ["etcd", "kube-apiserver", "kube-controller-manager"]
            .iter()
            .map(|n| {
                format!(
                    "--- {n}.log\n{}",
                    log_tail(&self.dir.join(format!("{n}.log")))
                )
            })
            .collect();
        format!("timed out waiting for {what}\n{}", logs.join("\n"))
    }
}

pub(crate) async fn wait_apiserver_ready(
    plane: &ControlPlane,
    deadline: Instant,
) -> Result<(), String> {
    let client = plane.client().await;
    loop {
        plane.check_alive()?;
        let req = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        if let Ok(body) = client.request_text(req).await
            && body.trim() == "ok"
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(plane.timed_out("the API server's /readyz"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The controller-manager is up once its serviceaccount controller has made
/// the default namespace's ServiceAccount.
async fn wait_controllers_ready(plane: &ControlPlane, deadline: Instant) -> Result<(), String> {
    let client = plane.client().await;
    let accounts: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
        kube::Api::namespaced(client, "default");
    loop {
        plane.check_alive()?;
        if let Ok(Some(_)) = accounts.get_opt("default").await {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(plane.timed_out("the controller-manager's default ServiceAccount"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// With `CAPTF_AUDIT_DIR` set, the API server logs every request of the
/// manager's ServiceAccount (verb, resource, response code) to a file of
/// its own there: what `hack/rbac-audit.sh` sums up to review the
/// manager's ClusterRole against what the tests made it do.
fn audit_flags(dir: &Path, to: &Path) -> Result<Vec<String>, String> {
    let policy = dir.join("audit-policy.yaml");
    fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  users: [\"system:serviceaccount:captf-system:captf-controller-manager\"]\n- level: None\n",
    )
    .map_err(|e| format!("writing {}: {e}", policy.display()))?;
    fs::create_dir_all(to).map_err(|e| format!("creating {}: {e}", to.display()))?;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(vec![
        format!("--audit-policy-file={}", policy.display()),
        format!(
            "--audit-log-path={}",
            to.join(format!("{name}.log")).display()
        ),
        "--audit-log-format=json".into(),
    ])
}

fn kubeconfig_yaml(server: &str, ca_pem: &str, cert_pem: &str, key_pem: &str) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: captf-test
  cluster:
    server: {server}
    certificate-authority-data: {}
users:
- name: captf-admin
  user:
    client-certificate-data: {}
    client-key-data: {}
contexts:
- name: captf-test
  context:
    cluster: captf-test
    user: captf-admin
current-context: captf-test
",
        b64(ca_pem),
        b64(cert_pem),
        b64(key_pem)
    )
}
