//! The manager's runtime, shaped like kubert's: [`Runtime::build`] turns
//! the flags into a serving process (signal handlers, API client,
//! readiness, listeners), and [`Runtime::run`] runs the reconcilers until a
//! signal or a lost leadership, then drains the listeners.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use futures::FutureExt;
use tokio::sync::watch;
use tracing::{error, info};

use super::ServerError;
use super::diagnostics::METRICS_CERT_DIR;
use super::flags::Flags;
use super::health::{GATE_WATCHES, GATE_WEBHOOK, Readiness};
use super::leader::{self, Lost, Timing};
use super::listeners::Listeners;
use crate::controllers::{self, Concurrency, Settings};
use crate::metrics::Metrics;
use crate::webhooks::handler::Webhooks;

/// A manager whose listeners serve and whose reconcilers have not started.
pub struct Runtime {
    flags: Flags,
    client: kube::Client,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    listeners: Listeners,
    shutdown: Pin<Box<dyn Future<Output = ()> + Send>>,
}

/// The image of the manager's own container, read from its pod
/// (`$POD_NAMESPACE`/`$POD_NAME`, the downward API): its only container, or
/// the one named `manager`. None outside a pod or when the read fails.
async fn own_image(client: &kube::Client) -> Option<String> {
    let (namespace, name) = (
        std::env::var("POD_NAMESPACE").ok()?,
        std::env::var("POD_NAME").ok()?,
    );
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), &namespace);
    let pod = match pods.get(&name).await {
        Ok(pod) => pod,
        Err(e) => {
            tracing::warn!("reading this manager's pod {namespace}/{name} for its image: {e}");
            return None;
        }
    };
    let containers = pod.spec?.containers;
    let own = match containers.as_slice() {
        [only] => only,
        many => many.iter().find(|c| c.name == "manager")?,
    };
    own.image.clone()
}

impl Runtime {
    /// Builds the client, resolves the flags (the default runner image is
    /// `$CAPTF_MANAGER_IMAGE`, else the manager's own image) and starts the
    /// listeners. The signal handlers come first, so that a signal during
    /// start-up is not lost.
    pub async fn build(flags: Flags) -> Result<Self, ServerError> {
        let shutdown = Box::pin(super::shutdown_signal()?);
        // A bad combination is told before anything connects.
        flags.check()?;
        let metrics = Arc::new(Metrics::new());
        let client = super::kube_client(flags.kubeconfig.as_deref(), metrics.clone()).await?;
        let manager_image = match std::env::var("CAPTF_MANAGER_IMAGE") {
            Ok(image) => Some(image),
            Err(_) if flags.runner_image.is_empty() => own_image(&client).await,
            Err(_) => None,
        };
        let flags = flags.resolve(manager_image)?;
        // A standby (leader election on, not leading) runs no watches: it is
        // ready once its webhooks serve, and the watches gate is added when it
        // starts to lead.
        let readiness = if flags.leader_elect {
            Readiness::new(&[GATE_WEBHOOK])
        } else {
            Readiness::new(&[GATE_WEBHOOK, GATE_WATCHES])
        };
        let listeners = Listeners::start(
            &flags,
            client.clone(),
            Arc::new(Webhooks::new(client.clone())),
            metrics.clone(),
            readiness.clone(),
            Path::new(METRICS_CERT_DIR),
        )
        .await?;
        Ok(Self {
            flags,
            client,
            metrics,
            readiness,
            listeners,
            shutdown,
        })
    }

    /// Runs the reconcilers, behind leader election with `--leader-elect`,
    /// until SIGTERM or SIGINT or until leading is lost; then drains the
    /// listeners. Losing the lead is an error.
    pub async fn run(self) -> Result<(), ServerError> {
        let Self {
            flags,
            client,
            metrics,
            readiness,
            listeners,
            shutdown,
        } = self;
        let settings = Settings::from(&flags);
        let timing = flags.leader_elect.then(|| Timing::from(&flags));
        let (stop, mut stop_rx) = watch::channel(false);
        // An error means the sender is gone, which is a stop too.
        let stopped = Box::pin(async move {
            let _ = stop_rx.wait_for(|stop| *stop).await;
        })
        .shared();
        let mut reconcilers = tokio::spawn(reconcile(
            client,
            metrics,
            settings,
            readiness.clone(),
            timing,
            stopped,
        ));
        // Leading lost ends the process at once, as client-go's elector does:
        // another replica may lead already. The Deployment restarts it.
        let lost = tokio::select! {
            () = shutdown => None,
            ended = &mut reconcilers => Some(ended),
        };
        // The reconcilers finish the passes they are in while the listeners
        // drain.
        let _ = stop.send(true);
        listeners.shutdown(&readiness, flags.shutdown_delay.0).await;
        let ended = match lost {
            Some(ended) => ended,
            None => reconcilers.await,
        };
        match ended {
            Ok(Ok(())) => {}
            Ok(Err(lost)) => return Err(ServerError::LeaderElectionLost(lost)),
            Err(e) => error!("the reconcilers stopped abnormally: {e}"),
        }
        info!("stopped");
        Ok(())
    }
}

/// Waits for the API server, then runs the reconcilers until `stopped`,
/// only while leading when `timing` is set.
async fn reconcile(
    client: kube::Client,
    metrics: Arc<Metrics>,
    settings: Settings,
    readiness: Readiness,
    timing: Option<Timing>,
    stopped: impl Future<Output = ()> + Send + Sync + Clone + 'static,
) -> Result<(), Lost> {
    let version = super::wait_for_api_server(&client).await;
    info!(%version, "connected to the API server");
    // The manager's namespace: the pod's (downward API), else the client's
    // (in a pod, the service account's namespace).
    let namespace =
        std::env::var("POD_NAMESPACE").unwrap_or_else(|_| client.default_namespace().to_string());
    let mut settings = settings;
    settings.away = Some(namespace.clone());
    let run = {
        let (client, stopped) = (client.clone(), stopped.clone());
        move || {
            readiness.require(GATE_WATCHES);
            controllers::run(client, metrics, settings, readiness, stopped)
        }
    };
    let Some(timing) = timing else {
        run().await;
        return Ok(());
    };
    leader::Elector::new(client, &namespace, leader::identity(), timing)
        .while_leading(stopped, run)
        .await
}

/// The reconcilers' flags; empty `--namespace` and `--watch-filter` mean
/// none.
impl From<&Flags> for Settings {
    fn from(flags: &Flags) -> Self {
        Settings {
            runner_image: flags.runner_image.clone(),
            cluster_operation_gate: flags.cluster_operation_gate,
            state_backups: flags.state_backups,
            namespace: Some(flags.namespace.clone()).filter(|n| !n.is_empty()),
            // Known once connected.
            away: None,
            watch_filter: Some(flags.watch_filter.clone()).filter(|f| !f.is_empty()),
            sync_period: flags.sync_period.0,
            drift_default_interval: flags.drift_default_interval.0,
            runner_events: flags.runner_events,
            concurrency: Concurrency {
                cluster: flags.terraformcluster_concurrency,
                machine: flags.terraformmachine_concurrency,
                machine_pool: flags.terraformmachinepool_concurrency,
            },
        }
    }
}

impl From<&Flags> for Timing {
    fn from(flags: &Flags) -> Self {
        Timing {
            lease_duration: flags.leader_elect_lease_duration.0,
            renew_deadline: flags.leader_elect_renew_deadline.0,
            retry_period: flags.leader_elect_retry_period.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;
    use crate::server::flags::normalize_args;

    fn flags(args: &[&str]) -> Flags {
        let argv = ["captf-manager", "--runner-image=registry.example/captf:v1"]
            .into_iter()
            .chain(args.iter().copied())
            .map(Into::into);
        Flags::try_parse_from(normalize_args(argv)).expect("flags parse")
    }

    #[test]
    fn settings_and_timing_from_flags() {
        let all = Settings::from(&flags(&[]));
        assert_eq!((all.namespace, all.watch_filter), (None, None));
        let some = Settings::from(&flags(&[
            "--namespace=infra",
            "--watch-filter=team-a",
            "--terraformmachinepool-concurrency=3",
        ]));
        assert_eq!(some.namespace.as_deref(), Some("infra"));
        assert_eq!(some.watch_filter.as_deref(), Some("team-a"));
        assert_eq!(some.concurrency.machine_pool, 3);
        assert_eq!(some.runner_image, "registry.example/captf:v1");
        let timing = Timing::from(&flags(&[
            "--leader-elect-lease-duration=20s",
            "--leader-elect-renew-deadline=9s",
            "--leader-elect-retry-period=3s",
        ]));
        let s = Duration::from_secs;
        assert_eq!(
            timing,
            Timing {
                lease_duration: s(20),
                renew_deadline: s(9),
                retry_period: s(3),
            }
        );
    }
}
