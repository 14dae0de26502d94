use super::*;

const BACKEND: [&str; 3] = [
    "secret_suffix=0123456789abcdef-m",
    "namespace=team-a",
    "in_cluster_config=true",
];

fn plan(op: Op, force_unlock: Option<&str>) -> Vec<Step> {
    steps_of(op, force_unlock, false)
}

fn steps_of(op: Op, force_unlock: Option<&str>, guarded: bool) -> Vec<Step> {
    let backend: Vec<String> = BACKEND.iter().map(|s| s.to_string()).collect();
    steps(&StepInputs {
        op,
        lock_timeout_seconds: 300,
        backend_config: &backend,
        force_unlock,
        plan_file: Path::new("/captf/work/plan.out"),
        restore_file: Path::new("/captf/work/restore.tfstate"),
        guarded,
        apply_file: Path::new("/captf/work/approved.out"),
    })
}

#[test]
fn a_guarded_apply_applies_the_saved_plan() {
    let got = steps_of(Op::Apply, None, true);
    assert_eq!(
        lines(&got),
        vec![
            INIT,
            VALIDATE,
            "plan: plan -input=false -no-color -lock-timeout=300s -detailed-exitcode \
                 -var-file=terraform.tfvars.json -out=/captf/work/plan.out",
            SHOW,
            "apply: apply -input=false -no-color -lock-timeout=300s /captf/work/approved.out",
        ]
    );
    assert!(got[2].changes_exit_code);
    assert_eq!(got[3].stdout, Stdout::Plan);
    // Every other operation ignores the guard.
    for op in [Op::Plan, Op::Destroy, Op::Refresh, Op::Drift, Op::Restore] {
        assert_eq!(steps_of(op, None, true), plan(op, None), "{op:?}");
    }
}

fn lines(steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .map(|s| format!("{}: {}", s.name.as_str(), s.args.join(" ")))
        .collect()
}

const INIT: &str = "init: init -input=false -no-color -lock-timeout=300s \
        -backend-config=secret_suffix=0123456789abcdef-m -backend-config=namespace=team-a \
        -backend-config=in_cluster_config=true";
const VALIDATE: &str = "validate: validate -json -no-color";
const SHOW: &str = "show: show -json -no-color /captf/work/plan.out";
const REFRESH: &str = "apply-refresh-only: apply -input=false -no-color -lock-timeout=300s \
        -refresh-only -auto-approve -var-file=terraform.tfvars.json";

#[test]
fn steps_by_operation() {
    for (op, want) in [
        (
            Op::Apply,
            vec![
                INIT,
                VALIDATE,
                "apply: apply -input=false -no-color -lock-timeout=300s -auto-approve \
                     -var-file=terraform.tfvars.json",
            ],
        ),
        (
            Op::Plan,
            vec![
                INIT,
                VALIDATE,
                "plan: plan -input=false -no-color -lock-timeout=300s \
                     -var-file=terraform.tfvars.json -out=/captf/work/plan.out",
                SHOW,
            ],
        ),
        (
            Op::Destroy,
            vec![
                INIT,
                "destroy: destroy -input=false -no-color -lock-timeout=300s -auto-approve \
                     -var-file=terraform.tfvars.json",
            ],
        ),
        (Op::Refresh, vec![INIT, REFRESH]),
        (
            Op::Drift,
            vec![
                INIT,
                REFRESH,
                "plan: plan -input=false -no-color -lock-timeout=300s -refresh=false \
                     -detailed-exitcode -var-file=terraform.tfvars.json -out=/captf/work/plan.out",
                SHOW,
            ],
        ),
        (
            Op::Restore,
            vec![
                INIT,
                "state-push: state push -force -lock-timeout=300s /captf/work/restore.tfstate",
                "state-list: state list",
            ],
        ),
    ] {
        assert_eq!(lines(&plan(op, None)), want, "{op:?}");
    }
}

#[test]
fn force_unlock_follows_init() {
    let got = lines(&plan(Op::Destroy, Some("6b1d4cde-lock")));
    assert_eq!(got[0], INIT);
    assert_eq!(got[1], "force-unlock: force-unlock -force 6b1d4cde-lock");
    assert!(got[2].starts_with("destroy: "));
}

#[test]
fn lock_timeout_on_exactly_the_state_touching_steps() {
    for op in [
        Op::Apply,
        Op::Plan,
        Op::Destroy,
        Op::Refresh,
        Op::Drift,
        Op::Restore,
    ] {
        for step in plan(op, Some("id")) {
            let has = step.args.iter().any(|a| a.starts_with("-lock-timeout="));
            let wants = matches!(
                step.name,
                StepName::Init
                    | StepName::Plan
                    | StepName::Apply
                    | StepName::Destroy
                    | StepName::ApplyRefreshOnly
                    | StepName::StatePush
            );
            assert_eq!(has, wants, "{op:?} {:?}", step.name);
        }
    }
}

#[test]
fn show_output_is_never_logged() {
    for op in [Op::Plan, Op::Drift] {
        let show = plan(op, None)
            .into_iter()
            .find(|s| s.name == StepName::Show)
            .unwrap();
        assert_eq!(show.stdout, Stdout::Plan);
    }
}

#[test]
fn recorded_args_elide_backend_values() {
    let args: Vec<String> = [
        "init",
        "-lock-timeout=300s",
        "-backend-config=config_path=/home/me/.kube/config",
        "-backend-config=labels={\"a\"=\"b=c\"}",
        "-backend-config=backend.hcl",
        "-var-file=terraform.tfvars.json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(
        recorded_args(&args),
        [
            "init",
            "-lock-timeout=300s",
            "-backend-config=config_path",
            "-backend-config=labels",
            "-backend-config=backend.hcl",
            "-var-file=terraform.tfvars.json",
        ]
    );
}

#[test]
fn summary_lines() {
    let c = |import, add, change, destroy| Changed {
        import,
        add,
        change,
        destroy,
    };
    for (out, want) in [
        (
            "module.role.terraform_data.x: Creating...\n\nApply complete! Resources: 1 added, 0 changed, 0 destroyed.\n\nOutputs:\n",
            Some(c(0, 1, 0, 0)),
        ),
        (
            "\x1b[0m\x1b[1m\x1b[32mApply complete! Resources: 2 imported, 1 added, 3 changed, 4 destroyed.\x1b[0m\n",
            Some(c(2, 1, 3, 4)),
        ),
        (
            "Destroy complete! Resources: 5 destroyed.\n",
            Some(c(0, 0, 0, 5)),
        ),
        (
            "No changes. Your infrastructure matches the configuration.\n",
            None,
        ),
        ("Apply complete! Resources: many added.\n", None),
    ] {
        assert_eq!(changed(out.as_bytes()), want, "{out:?}");
    }
}

#[test]
fn verdicts() {
    use Op::*;
    use StepName as S;
    // As OpenTofu 1.12 prints them with the kubernetes backend (colored:
    // force-unlock takes no -no-color).
    let unlocked = "\x1b[31m\u{2502}\x1b[0m \x1b[0m\x1b[1m\x1b[31mError: \x1b[0m\x1b[0m\x1b[1m\
                        Failed to unlock state: state is already unlocked\x1b[0m\n";
    let mismatch = "Error: Failed to unlock state: lock id \"6c4a\" does not match existing \
                        lock\nLock Info:\n  ID: other\n";
    let other = "Error: Failed to unlock state: connection refused\n";
    // OpenTofu 1.12, applying a plan saved before another apply.
    let stale = "\nError: Saved plan is stale\n\nThe given plan file can no longer be \
                     applied because the state was changed by\nanother operation after the plan \
                     was created.\n";
    let quoted = "Error: Failed to load state: the state is already unlocked, says a module\n";
    let gone = Verdict::SucceededBecause("the state is already unlocked");
    let relocked = Verdict::SucceededBecause("the lock is now held under another ID");
    let no_resource =
        Verdict::FailedBecause("the restored state lists no resource, but the backup had 3".into());
    // (op, step, exit code, stdout, stderr, --restore-resources, verdict)
    for (op, name, code, stdout, stderr, resources, want) in [
        (Apply, S::Apply, 0, "", "", 0, Verdict::Succeeded),
        (Apply, S::Apply, 1, "", "Error: x", 0, Verdict::Failed),
        (Apply, S::Validate, 2, "", "", 0, Verdict::Failed),
        (Plan, S::Plan, 2, "", "", 0, Verdict::Failed),
        (Drift, S::Plan, 2, "", "", 0, Verdict::Succeeded),
        (Drift, S::Plan, 1, "", "", 0, Verdict::Failed),
        (Apply, S::ForceUnlock, 1, "", unlocked, 0, gone),
        (Apply, S::ForceUnlock, 1, "", mismatch, 0, relocked),
        (Apply, S::ForceUnlock, 1, "", other, 0, Verdict::Failed),
        (Apply, S::ForceUnlock, 1, "", quoted, 0, Verdict::Failed),
        (Apply, S::Apply, 1, "", unlocked, 0, Verdict::Failed),
        (Apply, S::Apply, 1, "", stale, 0, Verdict::PlanStale),
        (Apply, S::Validate, 1, "", stale, 0, Verdict::Failed),
        (
            Restore,
            S::StateList,
            0,
            "module.role.x.y\n",
            "",
            3,
            Verdict::Succeeded,
        ),
        (Restore, S::StateList, 0, "", "", 0, Verdict::Succeeded),
        (Restore, S::StateList, 0, "\n", "", 3, no_resource),
        (Restore, S::StateList, 1, "", "", 0, Verdict::Failed),
    ] {
        let step = plan(op, Some("id"))
            .into_iter()
            .find(|s| s.name == name)
            .unwrap();
        let got = judge(&step, code, stdout.as_bytes(), stderr.as_bytes(), resources);
        assert_eq!(got, want, "{op:?} {name:?} {code} {stderr:?}");
    }
}
