//! What a state's outputs give Cluster API (ref §9.4): the OutputsValid and
//! InfrastructureHealthy conditions, the provisioned latch, the spec fields
//! written once and the kind's status fields. Pure; the outputs come from
//! the state the reader already parsed, and no value reaches a message.

pub mod decode;

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::api::{ApiEndpoint, InstanceState};
use crate::controllers::conditions::{self, Cond, Status};
use crate::names::Kind;
use crate::state::Output;
use decode::{Health, Outputs, Problem};

/// What the mapping looks at.
#[derive(Clone, Copy, Debug)]
pub struct Facts<'a> {
    pub kind: Kind,
    /// The state's outputs; None when no state was read.
    pub outputs: Option<&'a BTreeMap<String, Output>>,
    /// The state carries the inputs hash of a successful apply.
    pub applied: bool,
    /// An apply started once (Provisioning until provisioned).
    pub apply_started: bool,
    /// The latch in status.
    pub provisioned: bool,
    /// A cluster's `spec.controlPlaneEndpoint`.
    pub endpoint: Option<&'a ApiEndpoint>,
    /// The applied inputs rendered `control_plane_endpoint = null`.
    pub endpoint_input_null: bool,
    /// A machine's `spec.providerID`.
    pub provider_id: Option<&'a str>,
    /// A machine's rendered `failure_domain` input.
    pub failure_domain_input: Option<&'a str>,
}

/// What the outputs come to.
#[derive(Clone, Debug, PartialEq)]
pub struct Mapped {
    /// None: no state was read, the condition stays as it is.
    pub outputs_valid: Option<Cond>,
    pub healthy: Cond,
    pub provisioned: bool,
    /// Spec fields to write (a merge patch); empty when nothing is due.
    pub spec: Map<String, Value>,
    /// The endpoint written now came from the module.
    pub endpoint_from_module: bool,
    /// The kind's status fields; None keeps what the object has.
    pub status: Option<Map<String, Value>>,
}

const MESSAGE_MAX: usize = 1024;

fn valid_cond(status: Status, reason: &'static str, message: impl Into<String>) -> Cond {
    Cond::new(conditions::OUTPUTS_VALID, status, reason, message)
}

fn health_cond(status: Status, reason: &'static str, message: impl Into<String>) -> Cond {
    let mut message: String = message.into();
    if message.len() > MESSAGE_MAX {
        let mut end = MESSAGE_MAX;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    Cond::new(conditions::INFRASTRUCTURE_HEALTHY, status, reason, message)
}

fn problem_cond(p: &Problem) -> Cond {
    match p {
        Problem::Pending(_) => valid_cond(Status::Unknown, "OutputsPending", p.to_string()),
        Problem::Invalid { .. } => valid_cond(Status::False, "OutputsInvalid", p.to_string()),
        Problem::Missing(_) => valid_cond(Status::False, "OutputsMissing", p.to_string()),
    }
}

/// The health the module reports, as InfrastructureHealthy.
fn from_health(h: Option<&Health>) -> Cond {
    let Some(h) = h else {
        return health_cond(
            Status::Unknown,
            "HealthUnknown",
            "the module reports no health",
        );
    };
    let detail = match (&h.message, h.reasons.is_empty()) {
        (Some(m), true) => m.clone(),
        (Some(m), false) => format!("{m} ({})", h.reasons.join(", ")),
        (None, false) => h.reasons.join(", "),
        (None, true) => String::new(),
    };
    let (status, reason) = match (h.state, h.healthy) {
        (InstanceState::Running, true) => (Status::True, "Healthy"),
        (InstanceState::Running, false) => (Status::False, "InstanceUnhealthy"),
        (InstanceState::Degraded, _) => (Status::False, "InstanceDegraded"),
        (InstanceState::Pending, _) => (Status::False, "InstancePending"),
        (InstanceState::Stopped, _) => (Status::False, "InstanceStopped"),
        (InstanceState::Terminated, _) => (Status::False, "InstanceTerminated"),
        (InstanceState::Unknown, _) => (Status::Unknown, "HealthUnknown"),
    };
    health_cond(status, reason, detail)
}

/// The role's outputs decoded: the status fields, the spec writes, and the
/// first problem.
struct Decoded {
    health: Option<Health>,
    problem: Option<Cond>,
    status: Map<String, Value>,
    spec: Map<String, Value>,
    endpoint_from_module: bool,
    /// A machine's provider ID is null.
    no_provider_id: bool,
}

fn first<T>(r: Result<T, Problem>, problem: &mut Option<Cond>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(p) => {
            problem.get_or_insert_with(|| problem_cond(&p));
            None
        }
    }
}

fn decode(f: &Facts, o: &Outputs) -> Decoded {
    let mut problem = None;
    // Missing outputs come first: the module itself has to change.
    if let Some(missing) = first(o.undeclared(f.kind), &mut problem)
        && !missing.is_empty()
    {
        problem = Some(problem_cond(&Problem::Missing(missing)));
    }
    let health = first(decode::health(o), &mut problem).flatten();
    let mut d = Decoded {
        health,
        problem: None,
        status: Map::new(),
        spec: Map::new(),
        endpoint_from_module: false,
        no_provider_id: false,
    };
    match f.kind {
        Kind::Cluster => {
            let endpoint = first(decode::endpoint(o), &mut problem).flatten();
            let unset = crate::capi::inputs::valid_endpoint(f.endpoint).is_none();
            if let (Some(e), true, true) = (endpoint, unset, f.endpoint_input_null) {
                d.spec.insert("controlPlaneEndpoint".into(), json!(e));
                d.endpoint_from_module = true;
            }
            if let Some(domains) = first(decode::failure_domains(o), &mut problem)
                && !domains.is_empty()
            {
                d.status.insert("failureDomains".into(), json!(domains));
            }
            first(decode::exports(o), &mut problem);
        }
        Kind::Machine => {
            if let Some(id) = first(decode::provider_id(o), &mut problem) {
                match (id, f.provider_id) {
                    (None, _) => d.no_provider_id = true,
                    (Some(id), None) => {
                        d.spec.insert("providerID".into(), id.into());
                    }
                    (Some(id), Some(known)) if id != known => {
                        problem.get_or_insert_with(|| {
                            valid_cond(
                                Status::False,
                                "ProviderIDChanged",
                                "output provider_id differs from spec.providerID, which is kept",
                            )
                        });
                    }
                    (Some(_), Some(_)) => {}
                }
            }
            if let Some(a) = first(decode::machine_addresses(o), &mut problem)
                && !a.is_empty()
            {
                d.status.insert("addresses".into(), json!(a));
            }
            if let Some(domain) = first(decode::failure_domain(o), &mut problem) {
                if let (Some(input), out) = (f.failure_domain_input, domain.as_deref())
                    && out != Some(input)
                {
                    problem.get_or_insert_with(|| {
                        valid_cond(
                            Status::False,
                            "FailureDomainMismatch",
                            "output failure_domain differs from the failure_domain input",
                        )
                    });
                }
                if let Some(domain) = domain {
                    d.status.insert("failureDomain".into(), domain.into());
                }
            }
            if let Some(i) = first(decode::interruptible(o), &mut problem) {
                d.status.insert("interruptible".into(), i.into());
            }
        }
        Kind::MachinePool => {
            if let Some(id) = first(decode::provider_id(o), &mut problem) {
                d.spec
                    .insert("providerID".into(), id.map_or(Value::Null, Value::from));
            }
            if let Some(ids) = first(decode::provider_id_list(o), &mut problem) {
                d.spec.insert("providerIDList".into(), json!(ids));
            }
            if let Some(n) = first(decode::replicas(o), &mut problem) {
                d.status.insert("replicas".into(), n.into());
            }
            if let Some((instances, truncated)) = first(decode::instances(o), &mut problem) {
                if !instances.is_empty() {
                    d.status.insert("instances".into(), json!(instances));
                }
                if truncated {
                    problem.get_or_insert_with(|| {
                        valid_cond(
                            Status::True,
                            "InstancesTruncated",
                            format!("status keeps the first {} instances", decode::MAX_INSTANCES),
                        )
                    });
                }
            }
        }
    }
    d.problem = problem;
    d
}

fn provisioning() -> Cond {
    health_cond(
        Status::False,
        "Provisioning",
        "the infrastructure is being provisioned",
    )
}

/// InfrastructureHealthy once an apply Job has started, when it still
/// waits for the first (ref §3: False/Provisioning from the first apply
/// start until provisioned). The pass that starts the Job says so; the
/// passes while it runs do not look at the outputs.
pub fn apply_started(current: Option<(Status, &str)>) -> Option<Cond> {
    match current {
        None | Some((Status::Unknown, "WaitingForProvisioning")) => Some(provisioning()),
        Some(_) => None,
    }
}

/// Maps the outputs of `f` (ref §9.4).
pub fn map(f: &Facts) -> Mapped {
    let waiting = || match f.apply_started {
        true => provisioning(),
        false => health_cond(
            Status::Unknown,
            "WaitingForProvisioning",
            "no apply has started yet",
        ),
    };
    let decoded = f.outputs.filter(|_| f.applied).map(Outputs::of);
    let d = match decoded {
        None => {
            return Mapped {
                outputs_valid: None,
                healthy: match f.provisioned {
                    true => health_cond(
                        Status::Unknown,
                        "HealthUnknown",
                        "the state is not readable",
                    ),
                    false => waiting(),
                },
                provisioned: f.provisioned,
                spec: Map::new(),
                endpoint_from_module: false,
                status: None,
            };
        }
        Some(Err(p)) => Decoded {
            health: None,
            problem: Some(problem_cond(&p)),
            status: Map::new(),
            spec: Map::new(),
            endpoint_from_module: false,
            no_provider_id: false,
        },
        Some(Ok(o)) => decode(f, &o),
    };
    let pending = d
        .health
        .as_ref()
        .is_some_and(|h| h.state == InstanceState::Pending);
    // Informational only: a truncated instance list still counts as valid.
    let valid = d.problem.as_ref().is_none_or(|c| c.status == Status::True);
    let provisioned = f.provisioned
        || match f.kind {
            Kind::MachinePool => !pending,
            Kind::Cluster => valid && !pending,
            Kind::Machine => valid && !pending && !d.no_provider_id,
        };
    let healthy = match (provisioned, f.kind == Kind::Machine && d.no_provider_id) {
        (false, _) => waiting(),
        (true, true) => health_cond(
            Status::False,
            "InstanceTerminated",
            "output provider_id is null: the instance is gone",
        ),
        (true, false) => from_health(d.health.as_ref()),
    };
    let outputs_valid = Some(match (&d.problem, f.kind, d.no_provider_id, provisioned) {
        (Some(c), _, _, _) => c.clone(),
        (None, Kind::Machine, true, false) => valid_cond(
            Status::Unknown,
            "OutputsPending",
            "output provider_id is null",
        ),
        _ => valid_cond(Status::True, "OutputsValid", ""),
    });
    let mut status = d.status;
    if f.kind == Kind::MachinePool && provisioned {
        status.insert("ready".into(), true.into());
    }
    Mapped {
        outputs_valid,
        healthy,
        provisioned,
        spec: d.spec,
        endpoint_from_module: d.endpoint_from_module,
        status: Some(status),
    }
}

#[cfg(test)]
mod tests;
