//! A MachineDeployment through the real Cluster API manager, watching every
//! namespace (see `CapiManager::start_for_all_namespaces`): scaled up, then
//! down.

mod capi_shared;
use capi_shared::*;

use captf::api::{
    TerraformMachine, TerraformMachineSpec, TerraformMachineTemplate,
    TerraformMachineTemplateResource, TerraformMachineTemplateSpec,
};
use captf::names::{self, Kind};
use captf_testkit::capi::{self, CapiKind, CapiManager};
use captf_testkit::controlplane;
use captf_testkit::scenario::{JobsSeen, setup, within};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_deployment_comes_up_and_scales_down() {
    let env = setup(MANAGER, "capi-md", &[], &["--sync-period=5s"]).await;
    let capi = CapiManager::start_for_all_namespaces(controlplane::shared()).await;
    cluster(&env, "c", None, false).await;
    workload_kubeconfig(&env, "c").await;
    let template = TerraformMachineTemplate::new(
        "workers",
        TerraformMachineTemplateSpec {
            template: TerraformMachineTemplateResource {
                metadata: None,
                spec: TerraformMachineSpec {
                    workspace: workspace(&env, MACHINE, None),
                    ..Default::default()
                },
            },
        },
    );
    Api::<TerraformMachineTemplate>::namespaced(env.client.clone(), &env.ns)
        .create(&PostParams::default(), &template)
        .await
        .unwrap();
    bootstrap(&env, "md-boot", "c").await;
    let md = capi::machine_deployment("md", "c", 3, "workers", "md-boot", Some("1.36.3"));
    capi::create(&env.client, &env.ns, md).await;
    let machines = capi
        .within(480, "three machines provisioned", || async {
            let list = env
                .api::<TerraformMachine>()
                .list(&Default::default())
                .await
                .ok()?;
            let done: Vec<TerraformMachine> = list
                .items
                .into_iter()
                .filter(|m| m.status.as_ref().is_some_and(|s| provisioned(&s.workspace)))
                .collect();
            (done.len() == 3).then_some(done)
        })
        .await;
    let mut ids: Vec<String> = machines
        .iter()
        .map(|m| m.spec.provider_id.clone().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "{ids:?}");
    // The bring-up count (ref §8.8): one cluster apply and one apply per
    // machine; without a control plane, control_plane_initialized never
    // flips, so the cluster is not applied again.
    for m in &machines {
        env.more_passes(Kind::Machine, &m.name_any(), 2).await;
    }
    let applies: Vec<String> = env
        .jobs()
        .await
        .iter()
        .map(|j| j.name_any())
        .filter(|n| n.contains("-apply-"))
        .collect();
    assert_eq!(applies.len(), 4, "{applies:?}");

    // The destroy Jobs as a watch sees them: a gone machine's Jobs are
    // collected with it, so a list at the end may miss them.
    let seen = JobsSeen::watch(&env);
    capi::api(&env.client, &env.ns, CapiKind::MachineDeployment)
        .patch(
            "md",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    let left = capi
        .within(300, "two machines destroyed and gone", || async {
            let list = env
                .api::<TerraformMachine>()
                .list(&Default::default())
                .await
                .ok()?;
            (list.items.len() == 1).then_some(list.items)
        })
        .await;
    for m in &machines {
        if m.name_any() == left[0].name_any() {
            continue;
        }
        let destroys = seen.destroys(Kind::Machine, &m.name_any());
        assert_eq!(destroys.len(), 1, "{}: {destroys:?}", m.name_any());
        let suffix = names::suffix(&env.ns, Kind::Machine, &m.name_any());
        within(
            &env,
            60,
            "the destroyed machine's state cleaned up",
            || async { env.state_secrets(&suffix).await.is_empty().then_some(()) },
        )
        .await;
    }
}
