use super::*;

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_000_000 + secs).unwrap()
}

fn job(op: Op, succeeded: bool, secs: i64) -> Finished {
    Finished {
        op,
        outcome: match succeeded {
            true => crate::controllers::ledger::Outcome::Succeeded,
            false => crate::controllers::ledger::Outcome::Failed,
        },
        succeeded,
        counts_for_backoff: !succeeded,
        finished_at: at(secs),
        inputs_hash: None,
        remediation: false,
    }
}

fn base() -> Situation {
    Situation {
        kind: Kind::Machine,
        dependents: 0,
        abandoned: false,
        state: StateFact::Read {
            inputs_hash: Some("h2:a".into()),
        },
        ever_applied: true,
        namespace_terminating: false,
        away_possible: true,
        durable_inputs: true,
        renders: true,
        finished: vec![job(Op::Apply, true, 0)],
        failed_jobs_history_limit: 3,
        now: at(1000),
        foreign_lock: false,
    }
}

#[test]
fn a_held_deletion_names_its_cause_and_both_ways_out() {
    let lost = held(Hold::Lost, "ns", "abc-m", "u-1", "");
    let corrupt = held(Hold::Unreadable, "ns", "abc-m", "u-1", "StateCorrupt");
    for c in [&lost, &corrupt] {
        assert_eq!(
            (c.type_, c.status, c.reason),
            (conditions::DELETING, Status::True, "DeletionHeld")
        );
        assert!(
            c.message.contains("captf-state-backup-abc-m-<serial>"),
            "{}",
            c.message
        );
        assert!(
            c.message.contains("into tfstate-default-abc-m"),
            "{}",
            c.message
        );
        assert!(
            c.message.contains("captf.io/abandon-infrastructure=u-1"),
            "{}",
            c.message
        );
    }
    assert!(lost.message.contains("tfstate-default-abc-m is missing"));
    assert!(corrupt.message.contains("cannot be read (StateCorrupt)"));
    let gone = held(
        Hold::NamespaceTerminating,
        "team-a",
        "abc-m",
        "u-1",
        "serial 4, 2 managed resources",
    );
    assert_eq!((gone.status, gone.reason), (Status::True, "DeletionHeld"));
    for part in [
        "namespace team-a is being deleted",
        "(serial 4, 2 managed resources)",
        "captf.io/abandon-infrastructure=u-1",
        "captf-state-backup-abc-m-<serial>",
        "another namespace",
    ] {
        assert!(gone.message.contains(part), "{part}: {}", gone.message);
    }
    let locked = held(
        Hold::Locked,
        "ns",
        "abc-m",
        "u-1",
        "the state lock is held by me@laptop",
    );
    assert_eq!(
        (locked.status, locked.reason),
        (Status::True, "DeletionHeld")
    );
    for part in [
        "held: the state lock is held by me@laptop. The state Secret",
        "tfstate-default-abc-m",
        "lock-tfstate-default-abc-m",
        "until the lock is released",
    ] {
        assert!(locked.message.contains(part), "{part}: {}", locked.message);
    }
    let m = missing_inputs(Kind::Machine, "w-0", "u-2");
    assert_eq!((m.status, m.reason), (Status::False, "DestroyFailed"));
    assert!(m.message.contains("captf-inputs-m-w-0") && m.message.contains("=u-2"));
}

#[test]
fn the_finalizer_is_the_top_level_step() {
    let ours = vec![finalizer(Kind::Machine).to_string()];
    let other = vec!["example.com/other".to_string()];
    let table = [
        (false, vec![], Lifecycle::AddFinalizer),
        (false, other.clone(), Lifecycle::AddFinalizer),
        (false, ours.clone(), Lifecycle::Live),
        (true, ours.clone(), Lifecycle::Deleting),
        (true, other, Lifecycle::Released),
        (true, vec![], Lifecycle::Released),
    ];
    for (deleting, finalizers, want) in table {
        assert_eq!(
            lifecycle(Kind::Machine, deleting, &finalizers),
            want,
            "{deleting} {finalizers:?}"
        );
    }
    // Another kind's finalizer is not ours.
    assert_eq!(lifecycle(Kind::Cluster, true, &ours), Lifecycle::Released);
}

#[test]
fn steps() {
    let with = |edit: &dyn Fn(&mut Situation)| {
        let mut f = base();
        edit(&mut f);
        f
    };
    let table: Vec<(&str, Situation, Next)> = vec![
        (
            "applied, readable: destroy from the durable inputs",
            base(),
            Next::Destroy(DestroyInputs::Durable),
        ),
        (
            "applied, namespace terminating: destroyed from the manager's namespace",
            with(&|f| f.namespace_terminating = true),
            Next::Destroy(DestroyInputs::Durable),
        ),
        (
            "applied, namespace terminating, no destroy possible from elsewhere: held",
            with(&|f| {
                f.namespace_terminating = true;
                f.away_possible = false;
            }),
            Next::Hold(Hold::NamespaceTerminating),
        ),
        (
            "namespace terminating, state unreadable: held, even if possible from elsewhere",
            with(&|f| {
                f.namespace_terminating = true;
                f.state = StateFact::Unreadable;
            }),
            Next::Hold(Hold::NamespaceTerminating),
        ),
        (
            "namespace terminating, a destroy from elsewhere failed: backing off",
            with(&|f| {
                f.namespace_terminating = true;
                f.finished.insert(0, job(Op::Destroy, false, 970));
            }),
            Next::Backoff {
                wait: Duration::from_secs(30),
                failures: 1,
            },
        ),
        (
            "applied, state gone with the namespace: held on the namespace",
            with(&|f| {
                f.namespace_terminating = true;
                f.state = StateFact::NotFound;
                f.durable_inputs = false;
            }),
            Next::Hold(Hold::NamespaceTerminating),
        ),
        (
            "an apply started, namespace terminating, no state left: held",
            with(&|f| {
                f.namespace_terminating = true;
                f.state = StateFact::NotFound;
                f.ever_applied = false;
            }),
            Next::Hold(Hold::NamespaceTerminating),
        ),
        (
            "never applied, namespace terminating: clean up at once",
            with(&|f| {
                f.namespace_terminating = true;
                f.state = StateFact::NotFound;
                f.ever_applied = false;
                f.durable_inputs = false;
            }),
            Next::Cleanup(Why::NeverApplied),
        ),
        (
            "namespace terminating, abandoned: clean up",
            with(&|f| {
                f.namespace_terminating = true;
                f.abandoned = true;
            }),
            Next::Cleanup(Why::Abandoned),
        ),
        (
            "namespace terminating, destroyed already: clean up",
            with(&|f| {
                f.namespace_terminating = true;
                f.finished.insert(0, job(Op::Destroy, true, 10));
            }),
            Next::Cleanup(Why::Destroyed),
        ),
        (
            "destroyed, a foreign holder has the lock: held, nothing deleted",
            with(&|f| {
                f.finished.insert(0, job(Op::Destroy, true, 10));
                f.foreign_lock = true;
            }),
            Next::Hold(Hold::Locked),
        ),
        (
            "abandoned, a foreign holder has the lock: held",
            with(&|f| {
                f.abandoned = true;
                f.foreign_lock = true;
            }),
            Next::Hold(Hold::Locked),
        ),
        (
            "never applied, a foreign holder has the lock: held",
            with(&|f| {
                f.state = StateFact::NotFound;
                f.ever_applied = false;
                f.durable_inputs = false;
                f.foreign_lock = true;
            }),
            Next::Hold(Hold::Locked),
        ),
        (
            "a foreign lock, a destroy due: the destroy's Job waits for the lock",
            with(&|f| f.foreign_lock = true),
            Next::Destroy(DestroyInputs::Durable),
        ),
        (
            "namespace terminating, destroyed, a foreign lock: clean up (the namespace takes it all)",
            with(&|f| {
                f.namespace_terminating = true;
                f.finished.insert(0, job(Op::Destroy, true, 10));
                f.foreign_lock = true;
            }),
            Next::Cleanup(Why::Destroyed),
        ),
        (
            "never applied: clean up at once",
            with(&|f| {
                f.state = StateFact::NotFound;
                f.ever_applied = false;
                f.durable_inputs = false;
                f.finished = vec![job(Op::Apply, false, 0)];
            }),
            Next::Cleanup(Why::NeverApplied),
        ),
        (
            "applied, state gone: held",
            with(&|f| f.state = StateFact::NotFound),
            Next::Hold(Hold::Lost),
        ),
        (
            "corrupt: held",
            with(&|f| f.state = StateFact::Unreadable),
            Next::Hold(Hold::Unreadable),
        ),
        (
            "abandoned releases a hold",
            with(&|f| {
                f.state = StateFact::Unreadable;
                f.abandoned = true;
            }),
            Next::Cleanup(Why::Abandoned),
        ),
        (
            "abandoned releases a failing destroy",
            with(&|f| {
                f.abandoned = true;
                f.finished = vec![job(Op::Destroy, false, 990)];
            }),
            Next::Cleanup(Why::Abandoned),
        ),
        (
            "destroyed: clean up, even once the state is gone",
            with(&|f| {
                f.state = StateFact::NotFound;
                f.finished = vec![job(Op::Destroy, true, 900), job(Op::Destroy, false, 500)];
            }),
            Next::Cleanup(Why::Destroyed),
        ),
        (
            "a failed destroy backs off 1m",
            with(&|f| f.finished = vec![job(Op::Destroy, false, 970)]),
            Next::Backoff {
                wait: Duration::from_secs(30),
                failures: 1,
            },
        ),
        (
            "then retries",
            with(&|f| f.finished = vec![job(Op::Destroy, false, 940)]),
            Next::Destroy(DestroyInputs::Durable),
        ),
        (
            "two failures wait 2m",
            with(&|f| {
                f.finished = vec![job(Op::Destroy, false, 900), job(Op::Destroy, false, 700)]
            }),
            Next::Backoff {
                wait: Duration::from_secs(20),
                failures: 2,
            },
        ),
        (
            "apply failures do not delay a destroy",
            with(&|f| f.finished = vec![job(Op::Apply, false, 999)]),
            Next::Destroy(DestroyInputs::Durable),
        ),
        (
            "a machine never falls back to its spec",
            with(&|f| f.durable_inputs = false),
            Next::MissingInputs,
        ),
        (
            "a pool falls back to its spec",
            with(&|f| {
                f.kind = Kind::MachinePool;
                f.durable_inputs = false;
            }),
            Next::Destroy(DestroyInputs::Current),
        ),
        (
            "unless the spec does not render",
            with(&|f| {
                f.kind = Kind::MachinePool;
                f.durable_inputs = false;
                f.renders = false;
            }),
            Next::MissingInputs,
        ),
        (
            "a cluster waits for its machines, abandoned or not",
            with(&|f| {
                f.kind = Kind::Cluster;
                f.dependents = 2;
                f.abandoned = true;
            }),
            Next::WaitForDependents(2),
        ),
        (
            "dependents do not hold a machine",
            with(&|f| f.dependents = 2),
            Next::Destroy(DestroyInputs::Durable),
        ),
    ];
    for (what, facts, want) in table {
        assert_eq!(next(&facts), want, "{what}");
    }
}
