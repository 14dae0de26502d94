//! The runner's saved plans (book: "Steps by operation"): a plan Job saves
//! its plan sealed with the object's plan key; an approved apply applies
//! only the plan that was approved; a guarded apply stops before a delete
//! or a replace. What each shown plan decides is judged here.

use std::fs;
use std::path::Path;

use super::events::Type;
use super::saved::{self, Saved, SavedError};
use super::steps::StepName;
use super::{Runner, api};
use crate::api::{RunError, RunErrorKind};
use crate::names::Op;

/// The saved plan's Secret and what seals it.
pub(super) struct Store {
    client: kube::Client,
    namespace: String,
    secret: String,
    key: Vec<u8>,
    inputs_hash: String,
    /// The approved plan as found before the run, or why it cannot be
    /// applied.
    approved: Option<Result<Saved, SavedError>>,
}

impl Runner<'_> {
    /// Reaches the saved plan's Secret and reads the plan key; for an
    /// approved apply, also the approved plan, into `approved_file`.
    pub(super) async fn open_store(&mut self, approved_file: &Path) -> Result<(), RunError> {
        let args = self.args;
        let client = self
            .client()
            .await
            .map_err(|e| self.step_error(StepName::Init, &e))?;
        let fail = |why: String| self.step_error(StepName::Init, &why);
        let (Some(secret), Some(inputs_hash), Some(namespace)) = (
            args.plan_secret.clone(),
            args.inputs_hash.clone(),
            args.namespace(),
        ) else {
            return Err(fail(
                "a saved plan needs --plan-secret, --inputs-hash and the backend's namespace"
                    .into(),
            ));
        };
        let key = fs::read(&self.paths.plan_key).map_err(|e| {
            fail(format!(
                "reading the plan key {}: {e}",
                self.paths.plan_key.display()
            ))
        })?;
        let mut store = Store {
            client,
            namespace: namespace.to_owned(),
            secret,
            key,
            inputs_hash,
            approved: None,
        };
        if args.approved_plan.is_some() {
            let data = api::secret_data(&store.client, &store.namespace, &store.secret)
                .await
                .map_err(|e| fail(format!("reading the saved plan {}: {e}", store.secret)))?;
            let opened = saved::open(&store.key, data.as_ref());
            if let Ok(saved) = &opened {
                fs::write(approved_file, &saved.plan)
                    .map_err(|e| fail(format!("writing {}: {e}", approved_file.display())))?;
            }
            store.approved = Some(opened);
        }
        self.store = Some(store);
        Ok(())
    }

    /// What a shown plan decides: a plan is saved; an approved apply goes on
    /// only with the plan that was approved; a guarded apply stops before a
    /// delete or a replace that was not approved.
    pub(super) async fn judge_plan(&mut self, plan_file: &Path) -> Result<(), RunError> {
        let Some(plan) = self.shown.as_ref() else {
            return Err(self.step_error(StepName::Show, "show -json printed no plan"));
        };
        let report = plan.report();
        let destructive = plan.destructive_summary();
        self.result.plan = Some(report.clone());
        let summary = format!(
            "plan {}: add {}, change {}, destroy {}",
            report.plan_hash, report.add, report.change, report.destroy
        );
        self.emit(Type::Normal, "PlanSummary", &summary).await;
        let args = self.args;
        if args.op == Op::Plan {
            return self.save_shown(plan_file).await;
        }
        if let Some(approved) = args.approved_plan.as_deref() {
            let fresh = &report.plan_hash;
            let why = match self.store.as_ref().and_then(|s| s.approved.as_ref()) {
                None => Some("no approved plan was read".to_string()),
                Some(Err(e)) => Some(e.to_string()),
                Some(Ok(saved)) if saved.plan_hash != approved => Some(format!(
                    "the saved plan is {}, not the approved {approved}",
                    saved.plan_hash
                )),
                Some(Ok(saved))
                    if Some(&saved.inputs_hash) != self.store.as_ref().map(|s| &s.inputs_hash) =>
                {
                    Some("the saved plan was made from other inputs".to_string())
                }
                Some(Ok(_)) if fresh != approved => Some(format!(
                    "{approved} was approved, but the plan is now {fresh}"
                )),
                Some(Ok(_)) => None,
            };
            if let Some(why) = why {
                self.save_shown(plan_file).await?;
                return Err(RunError {
                    kind: RunErrorKind::PlanChanged,
                    step: Some(StepName::Plan.as_str().into()),
                    summary: Some(format!(
                        "{why}: not applied; plan {fresh} is saved for approval"
                    )),
                });
            }
            return Ok(());
        }
        if args.guarded && !args.allow_destructive && report.destructive {
            return Err(RunError {
                kind: RunErrorKind::Blocked,
                step: Some(StepName::Plan.as_str().into()),
                summary: Some(format!(
                    "the plan deletes or replaces {destructive}: not applied"
                )),
            });
        }
        Ok(())
    }

    /// Seals the shown plan and its saved file into the plan's Secret.
    pub(super) async fn save_shown(&mut self, plan_file: &Path) -> Result<(), RunError> {
        let fail = |why: String| self.step_error(StepName::Plan, &why);
        let (Some(store), Some(plan)) = (self.store.as_ref(), self.shown.as_ref()) else {
            return Err(fail("there is no plan to save".into()));
        };
        let bytes = fs::read(plan_file)
            .map_err(|e| fail(format!("reading {}: {e}", plan_file.display())))?;
        let data = saved::seal(
            &store.key,
            &Saved {
                plan: bytes,
                plan_hash: plan.hash(),
                inputs_hash: store.inputs_hash.clone(),
            },
        )
        .map_err(|e| fail(format!("saving the plan: {e}")))?;
        api::replace_secret_data(&store.client, &store.namespace, &store.secret, data)
            .await
            .map_err(|e| fail(format!("saving the plan in {}: {e}", store.secret)))?;
        self.log
            .say(&format!("saved plan {} in {}", plan.hash(), store.secret));
        Ok(())
    }
}
