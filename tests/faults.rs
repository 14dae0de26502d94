//! Faults of the control plane under a running manager (issue 19, item
//! 15): the API server restarted and etcd stalled while objects apply. The
//! manager must recover by itself (re-list, re-watch, retry) and finish,
//! without a restart of its own. This binary has its own control plane, so
//! the faults touch no other test.

use std::time::Duration;

use captf::api::TerraformMachine;
use captf::names::Kind;
use captf_testkit::scenario::*;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");

const MACHINES: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_outlives_an_api_server_restart_and_an_etcd_stall() {
    let mut env = setup(MANAGER, "faults", &[("API_TOKEN", "t0ken-faults")], &[]).await;
    let jobs = JobsSeen::watch(&env);
    let pid = env.manager.pid();
    env.cluster("c1", NOOP, None).await;
    for i in 0..MACHINES {
        env.machine(&format!("m{i}"), "c1", None).await;
    }

    // Mid-run: the cluster's Job has started.
    within(&env, 120, "the cluster's apply Job", || async {
        (!jobs.named("captf-c-c1-apply-").is_empty()).then_some(())
    })
    .await;
    let away = env
        .plane
        .restart_apiserver()
        .await
        .unwrap_or_else(|e| panic!("restarting the API server: {e}"));
    eprintln!("the API server was away for {:.1}s", away.as_secs_f64());

    // etcd stalls while the machines' Jobs run or are about to.
    {
        let _paused = env
            .plane
            .pause_etcd()
            .unwrap_or_else(|e| panic!("pausing etcd: {e}"));
        tokio::time::sleep(Duration::from_secs(10)).await;
    }

    within(
        &env,
        300,
        "the cluster and every machine applied",
        || async {
            if !env.cluster_status("c1").await.is_some_and(|s| applied(&s)) {
                return None;
            }
            for i in 0..MACHINES {
                if !env
                    .machine_status(&format!("m{i}"))
                    .await
                    .is_some_and(|s| applied(&s))
                {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;

    // The watches are live again: an object made after the faults is
    // applied, and a deletion is carried out.
    env.machine("late", "c1", None).await;
    within(&env, 180, "the late machine applied", || async {
        env.machine_status("late").await.filter(applied)
    })
    .await;
    env.delete::<TerraformMachine>("m0").await;
    env.wait_gone::<TerraformMachine>(180, "m0").await;

    assert_eq!(
        env.manager.exited(),
        None,
        "the manager exited{}",
        env.context()
    );
    assert_eq!(env.manager.pid(), pid, "the manager was restarted");
    assert!(env.manager.ready(), "the manager is not ready again");
    // One Job per decision: an apply the faults made fail is retried as
    // the next attempt, never started twice as the same one.
    for (kind, name) in std::iter::once((Kind::Cluster, "c1".to_string()))
        .chain((0..MACHINES).map(|i| (Kind::Machine, format!("m{i}"))))
        .chain(std::iter::once((Kind::Machine, "late".to_string())))
    {
        let prefix = format!("captf-{}-{name}-apply-", kind.short());
        let applies = jobs.named(&prefix);
        let mut attempts: Vec<&str> = applies
            .iter()
            .filter_map(|(job, _)| job.strip_prefix(&prefix)?.split('-').next())
            .collect();
        attempts.sort_unstable();
        let all = attempts.len();
        attempts.dedup();
        assert!(
            !applies.is_empty() && attempts.len() == all,
            "{kind:?} {name}: apply Jobs {applies:?}{}",
            env.context()
        );
    }
    env.manager.stop();
}
