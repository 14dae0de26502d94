//! Image digest pinning (ref §8.9): the digest the pod of a successful
//! apply ran is recorded on the durable inputs, and a machine's later
//! refresh, drift check and destroy run exactly that image,
//! `<repository>@sha256:<hex>`, however its tag moved. Pure.

use crate::image_ref::ImageRef;
use crate::names::{Kind, Op};

/// The digest in a container status `imageID`, as kubelets report it:
/// `<repository>@sha256:<hex>`, possibly after a scheme such as
/// `docker-pullable://`.
pub fn of_image_id(image_id: &str) -> Option<String> {
    let (_, digest) = image_id.rsplit_once('@')?;
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("sha256:{}", hex.to_ascii_lowercase()))
}

/// The image a Job runs, and whether it runs the spec's reference for lack
/// of a pinned digest (DigestUnknown). Only a machine's refresh, drift and
/// destroy run the pinned digest; `applied` is the image the apply ran.
pub fn image_for(kind: Kind, op: Op, applied: &str, pinned: Option<&str>) -> (String, bool) {
    if kind != Kind::Machine || !matches!(op, Op::Refresh | Op::Drift | Op::Destroy) {
        return (applied.to_owned(), false);
    }
    let reference = ImageRef::parse(applied).ok();
    match (reference, pinned) {
        (Some(r), Some(d)) => match r.pinned(d) {
            Ok(p) => (p.to_string(), false),
            Err(_) => (applied.to_owned(), true),
        },
        (Some(r), None) if r.digest.is_some() => (applied.to_owned(), false),
        _ => (applied.to_owned(), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn digests_from_image_ids() {
        for (id, want) in [
            (
                format!("registry.example/m@sha256:{HEX}"),
                Some(format!("sha256:{HEX}")),
            ),
            (
                format!(
                    "docker-pullable://registry.example/m@sha256:{}",
                    HEX.to_uppercase()
                ),
                Some(format!("sha256:{HEX}")),
            ),
            (format!("sha256:{HEX}"), None),
            ("registry.example/m@sha256:abc".to_string(), None),
            (String::new(), None),
        ] {
            assert_eq!(of_image_id(&id), want, "{id}");
        }
    }

    #[test]
    fn only_a_machines_later_runs_are_pinned() {
        let pinned = format!("sha256:{HEX}");
        let at = format!("registry.example/m@sha256:{HEX}");
        // (kind, op, pinned, image, unknown)
        for (kind, op, pin, want, unknown) in [
            (
                Kind::Machine,
                Op::Destroy,
                Some(pinned.as_str()),
                at.as_str(),
                false,
            ),
            (
                Kind::Machine,
                Op::Refresh,
                Some(pinned.as_str()),
                at.as_str(),
                false,
            ),
            (
                Kind::Machine,
                Op::Drift,
                Some(pinned.as_str()),
                at.as_str(),
                false,
            ),
            (
                Kind::Machine,
                Op::Destroy,
                None,
                "registry.example/m:1.0",
                true,
            ),
            (
                Kind::Machine,
                Op::Apply,
                Some(pinned.as_str()),
                "registry.example/m:1.0",
                false,
            ),
            (
                Kind::Cluster,
                Op::Destroy,
                Some(pinned.as_str()),
                "registry.example/m:1.0",
                false,
            ),
            (
                Kind::MachinePool,
                Op::Drift,
                None,
                "registry.example/m:1.0",
                false,
            ),
        ] {
            assert_eq!(
                image_for(kind, op, "registry.example/m:1.0", pin),
                (want.to_owned(), unknown),
                "{kind:?} {op:?}"
            );
        }
        // A spec already by digest needs no pin.
        let by_digest = format!("registry.example/m@sha256:{HEX}");
        assert_eq!(
            image_for(Kind::Machine, Op::Destroy, &by_digest, None),
            (by_digest.clone(), false)
        );
    }
}
