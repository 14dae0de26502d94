use super::*;
use crate::api::{ClusterDefaults, IdentityReference, TerraformClusterSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use kube::core::PartialObjectMetaExt;

fn ident(n: &str) -> Option<IdentityReference> {
    Some(IdentityReference { name: n.into() })
}

#[test]
fn identity_resolution_order() {
    let own = WorkspaceSpec {
        identity_ref: ident("own"),
        ..Default::default()
    };
    let none = WorkspaceSpec::default();
    let mut cluster = TerraformCluster::new(
        "c",
        TerraformClusterSpec {
            workspace: WorkspaceSpec {
                identity_ref: ident("cluster"),
                ..Default::default()
            },
            ..Default::default()
        },
    );
    assert_eq!(identity_name(&own, Some(&cluster)), Some("own"));
    assert_eq!(identity_name(&none, Some(&cluster)), Some("cluster"));
    cluster.spec.defaults = Some(ClusterDefaults {
        identity_ref: ident("defaults"),
        ..Default::default()
    });
    assert_eq!(identity_name(&none, Some(&cluster)), Some("defaults"));
    assert_eq!(identity_name(&none, None), None);
}

#[test]
fn allowed_namespaces() {
    let labels = BTreeMap::from([("team".to_string(), "a".to_string())]);
    let list = AllowedNamespaces {
        list: Some(vec!["ns1".into()]),
        selector: None,
    };
    let every = AllowedNamespaces {
        list: None,
        selector: Some(LabelSelector::default()),
    };
    let team_b = AllowedNamespaces {
        list: Some(vec!["ns9".into()]),
        selector: Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "team".into(),
                operator: "In".into(),
                values: Some(vec!["b".into()]),
            }]),
            match_labels: None,
        }),
    };
    let bad = AllowedNamespaces {
        list: None,
        selector: Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "team".into(),
                operator: "Near".into(),
                values: None,
            }]),
            match_labels: None,
        }),
    };
    let table = [
        (None, "ns1", false),
        (Some(&list), "ns1", true),
        (Some(&list), "ns2", false),
        (Some(&every), "anything", true),
        (Some(&team_b), "ns1", false),
        (Some(&team_b), "ns9", true),
        (Some(&bad), "ns1", false),
    ];
    for (allowed, ns, want) in table {
        assert_eq!(
            namespace_allowed(allowed, ns, &labels),
            want,
            "{allowed:?} {ns}"
        );
    }
}

#[test]
fn source_hash_sees_every_key_and_byte() {
    let a = BTreeMap::from([("k".to_string(), ByteString(b"v".to_vec()))]);
    let b = BTreeMap::from([("k".to_string(), ByteString(b"w".to_vec()))]);
    let c = BTreeMap::from([("kv".to_string(), ByteString(Vec::new()))]);
    assert_ne!(source_hash(&a), source_hash(&b));
    assert_ne!(source_hash(&a), source_hash(&c));
    assert_eq!(source_hash(&a), source_hash(&a.clone()));
}

#[test]
fn the_mirror_is_written_only_when_it_differs() {
    use crate::api::{SecretReference, TerraformClusterIdentitySpec};
    let owner = user_reference(
        "v".into(),
        "TerraformMachine".into(),
        "m".into(),
        "u-1".into(),
    );
    let source = Secret {
        data: Some(BTreeMap::from([(
            "k".to_string(),
            ByteString(b"v".to_vec()),
        )])),
        ..Default::default()
    };
    let identity = TerraformClusterIdentity::new(
        "id",
        TerraformClusterIdentitySpec {
            secret_ref: SecretReference {
                name: "creds".into(),
                namespace: "sys".into(),
            },
            allowed_namespaces: Some(AllowedNamespaces {
                list: Some(vec!["ns".into()]),
                selector: None,
            }),
        },
    );
    // The mirror as the watch shows it: its metadata.
    let observed = |mirror: Option<Secret>| Observed {
        name: Some("id".into()),
        identity: Some(Arc::new(identity.clone())),
        namespace_labels: BTreeMap::new(),
        source: Some(Arc::new(source.clone())),
        mirror: mirror.map(|m| {
            let mut seen = m.metadata.into_response_partial::<Secret>();
            seen.metadata.uid = Some("mirror-uid".into());
            Arc::new(seen)
        }),
    };
    let first = decide(&observed(None), "ns", &owner);
    assert_eq!(first.identity.as_deref(), Some("id"));
    let Some(MirrorWrite::Create(created)) = first.write else {
        panic!("a missing mirror is created: {:?}", first.write)
    };
    assert_eq!(created.metadata.name.as_deref(), Some("captf-creds-id"));
    // The same data and this owner: nothing to write.
    assert_eq!(
        decide(&observed(Some(created.clone())), "ns", &owner).write,
        None
    );
    // Another user: added as an owner.
    let other = user_reference(
        "v".into(),
        "TerraformMachine".into(),
        "n".into(),
        "u-2".into(),
    );
    assert_eq!(
        decide(&observed(Some(created.clone())), "ns", &other).write,
        Some(MirrorWrite::AddUser {
            name: "captf-creds-id".into(),
            user: other.clone(),
        }),
        "a new user of an up to date mirror is added by itself"
    );
    // New data: the mirror is rewritten, with the new user in it.
    let mut stale = created.clone();
    stale
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(crate::keys::SOURCE_HASH.into(), "old".into());
    let Some(MirrorWrite::Replace(shared)) = decide(&observed(Some(stale)), "ns", &other).write
    else {
        panic!("new data rewrites the mirror")
    };
    assert_eq!(shared.metadata.owner_references.unwrap().len(), 2);
    assert_eq!(
        shared.data, source.data,
        "the source's data, not the mirror's"
    );
    assert_eq!(shared.type_.as_deref(), Some("Opaque"));
    assert_eq!(shared.metadata.uid.as_deref(), Some("mirror-uid"));
    // A Secret of that name that is not a mirror is left alone.
    let mut foreign = created;
    foreign.metadata.labels = None;
    let refused = decide(&observed(Some(foreign)), "ns", &owner);
    assert_eq!((refused.identity, refused.write), (None, None));
    assert_eq!(refused.mirrored.reason, "MirrorFailed");
    // Other namespaces, missing identities and Secrets are refused.
    assert_eq!(
        decide(&observed(None), "other", &owner).allowed.reason,
        "NamespaceNotAllowed"
    );
    let mut no_source = observed(None);
    no_source.source = None;
    assert_eq!(
        decide(&no_source, "ns", &owner).allowed.reason,
        "SecretNotFound"
    );
    assert_eq!(
        decide(&Observed::default(), "ns", &owner).allowed.reason,
        "IdentityNotFound"
    );
}
