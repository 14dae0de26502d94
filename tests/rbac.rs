//! Least privilege as the API server sees it: what the manager's account
//! and a namespace's runner account may do (`kubectl auth can-i --list`),
//! against the allow-lists in `tests/golden/rbac/`, so that a rule added to
//! `config/rbac` or to the runner's binding is a reviewed change.
//! `CAPTF_UPDATE_GOLDEN=1` rewrites them. Every other test runs the manager
//! as that account, so a rule it lacks fails them.

use std::collections::BTreeSet;

use captf::jobs::rbac;
use captf_testkit::controlplane;
use captf_testkit::identity::{self, check_allowed, rules};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, PostParams};

#[tokio::test]
async fn the_manager_account_may_do_what_its_allow_list_says() {
    let plane = controlplane::shared();
    let kubeconfig = plane.manager_kubeconfig();
    let ns = captf_testkit::namespace(&plane.client().await, "rbac-manager").await;
    let tenant = rules(kubeconfig, &ns);
    let own = rules(kubeconfig, identity::NAMESPACE);
    check_allowed(
        "manager.txt",
        &format!(
            "# in a tenant namespace\n{tenant}# in {}\n{own}",
            identity::NAMESPACE
        ),
    );
}

#[tokio::test]
async fn a_runner_account_may_do_what_its_allow_list_says() {
    let plane = controlplane::shared();
    let client = plane.client().await;
    captf_testkit::manager::install_runner_role(&client).await;
    let ns = captf_testkit::namespace(&client, "rbac-runner").await;
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &rbac::service_account(&ns))
        .await
        .unwrap();
    let account = rbac::service_account(&ns).metadata.name.unwrap();
    Api::<RoleBinding>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &rbac::role_binding(&ns, &BTreeSet::from([account.clone()])),
        )
        .await
        .unwrap();
    let kubeconfig = identity::account_kubeconfig(plane, &ns, &account).unwrap();
    // What it may do in its namespace, and in another.
    let own = rules(&kubeconfig, &ns);
    let other = rules(&kubeconfig, "default");
    check_allowed(
        "runner.txt",
        &format!("# in its namespace\n{own}# in another namespace\n{other}"),
    );
}
