//! What CAPTF makes of outputs that do not fit the contract (ref §9.4),
//! with the real Cluster API manager and real OpenTofu: a required output
//! the module does not declare, and a provider ID other than the one the
//! object already has.

mod capi_shared;
use capi_shared::*;

use captf::api::{TerraformCluster, TerraformClusterSpec, TerraformMachine, TerraformMachineSpec};
use captf::names::Kind;
use captf_testkit::capi::{self, CapiKind};
use captf_testkit::scenario::{JobsSeen, condition_message, labels, within};
use kube::api::PostParams;
use serde_json::json;

const UNDECLARED: &str = "captf.test/modules/capi-cluster-undeclared:dev";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undeclared_output_is_missing_and_a_known_provider_id_is_kept() {
    let (env, capi) = world("capi-outputs").await;
    let jobs = JobsSeen::watch(&env);

    // A module without failure_domains and exports applies, and is never
    // provisioned: the module has to change.
    let mut u = TerraformCluster::new(
        "u",
        TerraformClusterSpec {
            workspace: workspace(&env, UNDECLARED, None),
            ..Default::default()
        },
    );
    u.metadata.labels = labels("u");
    env.api::<TerraformCluster>()
        .create(&PostParams::default(), &u)
        .await
        .unwrap();
    capi::create(&env.client, &env.ns, capi::cluster("u", "u", false, None)).await;
    let s = within(&env, 240, "OutputsMissing on the cluster", || async {
        let s = env.cluster_status("u").await?;
        (reason(&s, "OutputsValid") == Some(("False", "OutputsMissing"))).then_some(s)
    })
    .await;
    assert_eq!(
        condition_message(&s, "OutputsValid"),
        Some("the module declares no output failure_domains, exports")
    );
    assert_eq!(
        reason(&s, "ApplyJobSucceeded"),
        Some(("True", "ApplySucceeded"))
    );
    assert!(!provisioned(&s));
    env.more_passes(Kind::Cluster, "u", 3).await;
    assert_eq!(jobs.named("captf-c-u-").len(), 1, "no second apply");
    let s = env.cluster_status("u").await.unwrap();
    assert_eq!(
        reason(&s, "OutputsValid"),
        Some(("False", "OutputsMissing"))
    );
    assert_eq!(
        field(
            &env,
            CapiKind::Cluster,
            "u",
            "/status/initialization/infrastructureProvisioned"
        )
        .await,
        None
    );

    // A machine whose spec already names another instance keeps it.
    cluster(&env, "c", None, false).await;
    capi.within(240, "the cluster's infrastructure provisioned", || async {
        let done = field(
            &env,
            CapiKind::Cluster,
            "c",
            "/status/initialization/infrastructureProvisioned",
        )
        .await?;
        (done == json!(true)).then_some(())
    })
    .await;
    let known = format!("captf-test://{}/adopted", env.ns);
    let mut m = TerraformMachine::new(
        "m",
        TerraformMachineSpec {
            workspace: workspace(&env, MACHINE, None),
            provider_id: Some(known.clone()),
            ..Default::default()
        },
    );
    m.metadata.labels = labels("c");
    env.api::<TerraformMachine>()
        .create(&PostParams::default(), &m)
        .await
        .unwrap();
    machine(&env, "m", "c", "m", None).await;
    let s = within(&env, 240, "ProviderIDChanged on the machine", || async {
        let s = env.machine_status("m").await?;
        (reason(&s, "OutputsValid") == Some(("False", "ProviderIDChanged"))).then_some(s)
    })
    .await;
    assert!(!provisioned(&s));
    let m = env.api::<TerraformMachine>().get("m").await.unwrap();
    assert_eq!(m.spec.provider_id.as_deref(), Some(known.as_str()));
    let message = condition_message(&s, "OutputsValid").unwrap_or_default();
    assert!(
        !message.contains(&format!("{}/m", env.ns)),
        "no output value in {message:?}"
    );
}
