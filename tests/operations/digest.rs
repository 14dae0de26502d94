//! Image digest pinning (ref §8.9): the digest a machine's apply ran is
//! recorded on its durable inputs, and its destroy runs exactly that image
//! after the tag moved to other content.

use captf::api::{Source, TerraformMachine, WorkspaceSpec};
use captf::names::{self, Kind};
use captf_testkit::scenario::*;
use kube::ResourceExt;
use serde_json::json;

use super::MANAGER;

#[tokio::test]
async fn a_machines_destroy_runs_the_digest_its_apply_ran() {
    let env = setup(MANAGER, "digest", &[], &[]).await;
    let marker = tempfile::tempdir().unwrap().keep().join("destroyed");
    let workspace = WorkspaceSpec {
        source: Source {
            image: MUTABLE.into(),
            image_pull_policy: None,
        },
        variables: vars(&[("destroy_marker", json!(marker.to_str().unwrap()))]),
        ..Default::default()
    };
    env.create_machine("m", "c", workspace).await;
    let s = within(&env, 240, "the apply", || async {
        env.machine_status("m").await.filter(applied)
    })
    .await;
    let image_id = s
        .source
        .as_ref()
        .and_then(|s| s.image_digest.clone())
        .unwrap();
    let digest = image_id.split_once('@').unwrap().1.to_owned();
    assert!(
        image_id.starts_with("captf.test/modules/mutable@sha256:"),
        "{image_id}"
    );
    let durable = env
        .secrets()
        .get(&names::inputs_secret(Kind::Machine, "m"))
        .await
        .unwrap();
    assert_eq!(durable.annotations()["captf.io/image-digest"], digest);
    assert_eq!(
        env.events_about("DigestPinned", Kind::Machine, "m")
            .await
            .len(),
        1
    );

    // The tag moves: the module's destroy would now write another mark.
    let module = env.mutable_module.join("main.tf");
    let text = std::fs::read_to_string(&module).unwrap();
    let moved = text.replace(
        "command = \"printf '%s' \\\"$API_TOKEN\\\" > ${self.input}\"",
        "command = \"echo moved > ${self.input}\"",
    );
    assert_ne!(
        moved, text,
        "the noop module's destroy marker changed shape"
    );
    std::fs::write(&module, moved).unwrap();

    env.delete::<TerraformMachine>("m").await;
    env.wait_gone::<TerraformMachine>(240, "m").await;
    // The mark says which content the destroy ran: the pinned one writes
    // the (here unset) API_TOKEN, so nothing, the moved tag "moved".
    let mark = std::fs::read_to_string(&marker).unwrap();
    assert_eq!(
        mark, "",
        "the destroy ran the moved tag's content: {mark:?}"
    );
    assert!(
        env.events_about("DigestUnknown", Kind::Machine, "m")
            .await
            .is_empty()
    );
}
