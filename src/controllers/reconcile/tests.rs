use kube::runtime::events::EventType;

use super::*;

fn t(
    type_: &'static str,
    from: Option<(Status, &str)>,
    to: Status,
    reason: &'static str,
) -> Transition {
    Transition {
        type_,
        from: from.map(|(s, r)| (s, r.to_string())),
        to,
        reason,
    }
}

#[test]
fn each_condition_change_is_its_own_series() {
    // (transition, note, action, a warning)
    for (tr, note, action, warning) in [
        (
            t(
                "StateReadable",
                Some((Status::Unknown, "StateNotFound")),
                Status::True,
                "StateRead",
            ),
            "StateReadable: Unknown/StateNotFound -> True/StateRead",
            "StateReadable=True/StateRead",
            false,
        ),
        (
            t(
                "StateReadable",
                Some((Status::True, "StateRead")),
                Status::False,
                "StateCorrupt",
            ),
            "StateReadable: True/StateRead -> False/StateCorrupt",
            "StateReadable=False/StateCorrupt",
            true,
        ),
        // First set, but bad from the start.
        (
            t("IdentityAllowed", None, Status::False, "IdentityNotFound"),
            "IdentityAllowed: unset -> False/IdentityNotFound",
            "IdentityAllowed=False/IdentityNotFound",
            true,
        ),
        // Negative polarity: True is the bad state, False the good one.
        (
            t("DriftDetected", None, Status::True, "DriftReported"),
            "DriftDetected: unset -> True/DriftReported",
            "DriftDetected=True/DriftReported",
            true,
        ),
        (
            t(
                "DriftDetected",
                Some((Status::True, "DriftReported")),
                Status::False,
                "NoDrift",
            ),
            "DriftDetected: True/DriftReported -> False/NoDrift",
            "DriftDetected=False/NoDrift",
            false,
        ),
        (
            t(
                "AutoscalingActive",
                Some((Status::True, "ReplicasManagedByModule")),
                Status::False,
                "AutoscalingDisabled",
            ),
            "AutoscalingActive: True/ReplicasManagedByModule -> False/AutoscalingDisabled",
            "AutoscalingActive=False/AutoscalingDisabled",
            false,
        ),
    ] {
        let n = condition_note(&tr).unwrap();
        assert_eq!(n.reason, "ConditionChanged");
        assert_eq!(n.note, note);
        assert_eq!(n.action.as_deref(), Some(action));
        assert_eq!(n.type_ == EventType::Warning, warning, "{note}");
    }
}

#[test]
fn no_event_for_ready_or_a_first_setting_that_is_not_bad() {
    for tr in [
        t(conditions::READY, None, Status::True, "Ready"),
        t(
            conditions::READY,
            Some((Status::Unknown, "ReadyUnknown")),
            Status::False,
            "NotReady",
        ),
        t("IdentityAllowed", None, Status::True, "IdentityAllowed"),
        t("StateReadable", None, Status::Unknown, "StateNotFound"),
        t("DriftDetected", None, Status::False, "NoDrift"),
        t("Deleting", None, Status::False, "NotDeleting"),
        t(
            "AutoscalingActive",
            None,
            Status::False,
            "AutoscalingDisabled",
        ),
        t("Paused", None, Status::False, "NotPaused"),
    ] {
        assert!(condition_note(&tr).is_none(), "{tr:?}");
    }
}

#[test]
fn paused_and_resumed_instead_of_condition_changed() {
    let reason = |tr: Transition| condition_note(&tr).map(|n| n.reason);
    assert_eq!(
        reason(t("Paused", None, Status::True, "Paused")),
        Some("Paused")
    );
    assert_eq!(
        reason(t(
            "Paused",
            Some((Status::False, "NotPaused")),
            Status::True,
            "Paused"
        )),
        Some("Paused")
    );
    assert_eq!(
        reason(t(
            "Paused",
            Some((Status::True, "Paused")),
            Status::False,
            "NotPaused"
        )),
        Some("Resumed")
    );
    assert_eq!(
        reason(t(
            "Paused",
            Some((Status::True, "Paused")),
            Status::True,
            "Other"
        )),
        None
    );
}
