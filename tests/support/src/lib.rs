//! captf-testkit: what the integration tests and the demo share: a real control
//! plane and a namespace per test.

pub mod capi;
pub mod clusterctl;
pub mod controlplane;
pub mod executor;
pub mod faults;
pub mod heap;
pub mod identity;
pub mod install;
pub mod manager;
pub mod owners;
pub mod providers;
pub mod refusal;
pub mod registry;
pub mod scenario;
pub mod upstream;

pub use executor::{Executor, Images, ModuleImage};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};

/// Creates a fresh namespace for one test, named `<prefix>-<n>`.
pub async fn namespace(client: &kube::Client, prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
    name
}

/// Polls `probe` until it yields a value; panics naming `what` after a minute.
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The first pod that `selector` matches, if the list succeeds and finds one:
/// a probe for [`eventually`] or a scenario's `within`.
pub async fn first_pod(
    pods: &Api<k8s_openapi::api::core::v1::Pod>,
    selector: &str,
) -> Option<k8s_openapi::api::core::v1::Pod> {
    let listed = pods
        .list(&kube::api::ListParams::default().labels(selector))
        .await;
    listed.ok()?.items.into_iter().next()
}

/// The built tofu, run in `dir` with an environment of its own: nothing of
/// the test's environment but PATH, so no TF_* variable steers it.
pub fn tofu(
    dir: &std::path::Path,
    home: &std::path::Path,
    args: &[&str],
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(controlplane::binary("tofu"));
    cmd.args(args)
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("TF_IN_AUTOMATION", "1")
        .env("TF_INPUT", "0")
        .env("CHECKPOINT_DISABLE", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Runs `cmd` to the end; panics with its output unless it succeeded.
pub async fn run_ok(mut cmd: tokio::process::Command, what: &str) -> std::process::Output {
    let out = cmd.output().await.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed with {}:\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A gzip stream of `prefix` and then `mebibytes` MiB of `fill`, made
/// without compressing them: one deflate block that expands to 1 MiB of
/// `fill` from the window, repeated. A decompression bomb of any size in
/// about a thousandth of it.
pub fn gzip_bomb(prefix: &[u8], fill: u8, mebibytes: u64) -> Vec<u8> {
    use flate2::{Compress, Compression, FlushCompress};
    let mib = vec![fill; 1 << 20];
    let mut compress = Compress::new(Compression::best(), false);
    let mut deflate = |input: &[u8], flush: FlushCompress| {
        let mut out = Vec::with_capacity(1 << 20);
        let before = compress.total_in();
        compress
            .compress_vec(input, &mut out, flush)
            .expect("deflate");
        assert_eq!(
            compress.total_in() - before,
            input.len() as u64,
            "deflate took all its input"
        );
        out
    };
    let head = [prefix, &mib].concat();
    let first = deflate(&head, FlushCompress::Sync);
    let repeat = deflate(&mib, FlushCompress::Sync);
    let end = deflate(&[], FlushCompress::Finish);
    let mut crc = flate2::Crc::new();
    crc.update(&head);
    let mut one = flate2::Crc::new();
    one.update(&mib);
    for _ in 1..mebibytes {
        crc.combine(&one);
    }
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255];
    out.extend_from_slice(&first);
    for _ in 1..mebibytes {
        out.extend_from_slice(&repeat);
    }
    out.extend_from_slice(&end);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    // ISIZE is the length modulo 2^32.
    out.extend_from_slice(&((prefix.len() as u64 + (mebibytes << 20)) as u32).to_le_bytes());
    out
}
