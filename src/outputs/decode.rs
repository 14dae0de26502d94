//! Each output decoded by the contract's shape (ref §9.4), not by the type
//! the state records. A problem names the output and the rule, never the
//! value: every output is sensitive in the rendered root.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::api::{
    ApiEndpoint, FailureDomain, InstanceState, MachineAddress, MachineAddressType,
    MachinePoolInstance,
};
use crate::names::Kind;
use crate::role::DECLARED_OUTPUTS;
use crate::state::Output;

/// Why an output cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// Declared, and null (tofu keeps no null output in the state: an
    /// absent output of the rendered root is a null one).
    #[error("output {0} is null")]
    Pending(&'static str),
    #[error("output {output} {rule}")]
    Invalid { output: &'static str, rule: String },
    /// Required outputs the module does not declare.
    #[error("the module declares no output {}", .0.join(", "))]
    Missing(Vec<&'static str>),
}

fn invalid(output: &'static str, rule: impl Into<String>) -> Problem {
    Problem::Invalid {
        output,
        rule: rule.into(),
    }
}

/// The outputs of a state, as JSON values.
pub struct Outputs(BTreeMap<String, Value>);

impl Outputs {
    /// Decodes every output's JSON text; one that is not JSON is invalid.
    pub fn of(outputs: &BTreeMap<String, Output>) -> Result<Outputs, Problem> {
        let mut values = BTreeMap::new();
        for (name, output) in outputs {
            match output.value.expose().to_value() {
                Ok(v) => values.insert(name.clone(), v),
                Err(_) => return Err(invalid("value", "is not JSON")),
            };
        }
        Ok(Outputs(values))
    }

    /// The value of `name`, None when null.
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    /// The required outputs of `kind` the module does not declare, from
    /// the rendered root's list; a state without the list (written before
    /// it was rendered) counts as declaring them all.
    pub fn undeclared(&self, kind: Kind) -> Result<Vec<&'static str>, Problem> {
        let Some(declared) = self.get(DECLARED_OUTPUTS) else {
            return Ok(Vec::new());
        };
        let declared: Vec<&str> = declared
            .as_array()
            .and_then(|names| names.iter().map(Value::as_str).collect())
            .ok_or_else(|| invalid(DECLARED_OUTPUTS, "must be a list of names"))?;
        Ok(kind
            .required_outputs()
            .iter()
            .copied()
            .filter(|name| !declared.contains(name))
            .collect())
    }

    fn required(&self, name: &'static str) -> Result<&Value, Problem> {
        self.get(name).ok_or(Problem::Pending(name))
    }
}

fn text(v: &Value, output: &'static str, what: &str, max: usize) -> Result<String, Problem> {
    match v.as_str() {
        Some(s) if !s.is_empty() && s.chars().count() <= max => Ok(s.to_owned()),
        Some(_) => Err(invalid(
            output,
            format!("{what} must be 1 to {max} characters"),
        )),
        None => Err(invalid(output, format!("{what} must be a string"))),
    }
}

fn list<'a>(v: &'a Value, output: &'static str, max: usize) -> Result<&'a Vec<Value>, Problem> {
    let items = v
        .as_array()
        .ok_or_else(|| invalid(output, "must be a list"))?;
    if items.len() > max {
        return Err(invalid(output, format!("has more than {max} items")));
    }
    Ok(items)
}

/// The module's `health`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub state: InstanceState,
    pub healthy: bool,
    pub message: Option<String>,
    pub reasons: Vec<String>,
}

pub fn health(o: &Outputs) -> Result<Option<Health>, Problem> {
    let Some(v) = o.get("health") else {
        return Ok(None);
    };
    let state: InstanceState = v
        .get("state")
        .cloned()
        .and_then(|s| serde_json::from_value(s).ok())
        .ok_or_else(|| {
            invalid(
                "health",
                "state must be one of pending, running, degraded, stopped, terminated, unknown",
            )
        })?;
    let healthy = v
        .get("healthy")
        .and_then(Value::as_bool)
        .ok_or_else(|| invalid("health", "healthy must be a boolean"))?;
    let message = v.get("message").and_then(Value::as_str).map(str::to_owned);
    let reasons = match v.get("reasons") {
        None | Some(Value::Null) => Vec::new(),
        Some(r) => list(r, "health", 100)?
            .iter()
            .map(|r| r.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| invalid("health", "reasons must be strings"))?,
    };
    Ok(Some(Health {
        state,
        healthy,
        message,
        reasons,
    }))
}

/// A cluster's `control_plane_endpoint`: nullable, both halves or none.
pub fn endpoint(o: &Outputs) -> Result<Option<ApiEndpoint>, Problem> {
    let Some(v) = o.get("control_plane_endpoint") else {
        return Ok(None);
    };
    let host = v
        .get("host")
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty());
    let port = v.get("port").and_then(Value::as_i64);
    match (host, port) {
        (Some(host), Some(port)) if (1..=65535).contains(&port) && host.len() <= 512 => {
            Ok(Some(ApiEndpoint {
                host: Some(host.to_owned()),
                port: i32::try_from(port).ok(),
            }))
        }
        _ => Err(invalid(
            "control_plane_endpoint",
            "must hold both a host (1 to 512 characters) and a port (1 to 65535)",
        )),
    }
}

/// A cluster's `failure_domains`: nullable; names unique.
pub fn failure_domains(o: &Outputs) -> Result<Vec<FailureDomain>, Problem> {
    const OUT: &str = "failure_domains";
    let Some(v) = o.get(OUT) else {
        return Ok(Vec::new());
    };
    let mut domains: Vec<FailureDomain> = Vec::new();
    for item in list(v, OUT, 100)? {
        let name = text(item.get("name").unwrap_or(&Value::Null), OUT, "a name", 256)?;
        if domains.iter().any(|d| d.name == name) {
            return Err(invalid(OUT, "has a name twice"));
        }
        let control_plane = match item.get("control_plane") {
            None | Some(Value::Null) => true,
            Some(b) => b
                .as_bool()
                .ok_or_else(|| invalid(OUT, "control_plane must be a boolean"))?,
        };
        let attributes = match item.get("attributes") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(a) => serde_json::from_value(a.clone())
                .map_err(|_| invalid(OUT, "attributes must be a map of strings"))?,
        };
        domains.push(FailureDomain {
            name,
            control_plane: Some(control_plane),
            attributes: (!attributes.is_empty()).then_some(attributes),
        });
    }
    Ok(domains)
}

/// A cluster's `exports`: null is `{}`; integer numbers only.
pub fn exports(o: &Outputs) -> Result<Value, Problem> {
    let v = o
        .get("exports")
        .cloned()
        .unwrap_or_else(|| Value::Object(Default::default()));
    crate::jobs::inputs::integers_only(&v, "exports")
        .map_err(|_| invalid("exports", "holds a number that is not an integer"))?;
    Ok(v)
}

/// A machine's `provider_id` (`""` is null) or a pool's.
pub fn provider_id(o: &Outputs) -> Result<Option<String>, Problem> {
    match o.get("provider_id") {
        None => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(v) => text(v, "provider_id", "it", 512).map(Some),
    }
}

/// Addresses in the contract's order: InternalIP, InternalDNS, ExternalIP,
/// ExternalDNS, Hostname, then by address.
pub fn addresses(v: Option<&Value>, output: &'static str) -> Result<Vec<MachineAddress>, Problem> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let mut addresses = Vec::new();
    for item in list(v, output, 256)? {
        let address_type: MachineAddressType = item
            .get("type")
            .cloned()
            .and_then(|t| serde_json::from_value(t).ok())
            .ok_or_else(|| {
                invalid(
                    output,
                    "has an address type that is not Hostname, ExternalIP, InternalIP, ExternalDNS or InternalDNS",
                )
            })?;
        let address = text(
            item.get("address").unwrap_or(&Value::Null),
            output,
            "an address",
            256,
        )?;
        addresses.push(MachineAddress {
            address_type,
            address,
        });
    }
    let rank = |t: MachineAddressType| match t {
        MachineAddressType::InternalIp => 0,
        MachineAddressType::InternalDns => 1,
        MachineAddressType::ExternalIp => 2,
        MachineAddressType::ExternalDns => 3,
        MachineAddressType::Hostname => 4,
    };
    addresses.sort_by(|a, b| {
        (rank(a.address_type), &a.address).cmp(&(rank(b.address_type), &b.address))
    });
    Ok(addresses)
}

pub fn machine_addresses(o: &Outputs) -> Result<Vec<MachineAddress>, Problem> {
    addresses(o.get("addresses"), "addresses")
}

/// A machine's `failure_domain`, nullable.
pub fn failure_domain(o: &Outputs) -> Result<Option<String>, Problem> {
    o.get("failure_domain")
        .map(|v| text(v, "failure_domain", "it", 256))
        .transpose()
}

/// A machine's `interruptible`: null is false.
pub fn interruptible(o: &Outputs) -> Result<bool, Problem> {
    match o.get("interruptible") {
        None => Ok(false),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| invalid("interruptible", "must be a boolean")),
    }
}

/// A pool's `provider_id_list`, sorted and deduplicated.
pub fn provider_id_list(o: &Outputs) -> Result<Vec<String>, Problem> {
    const OUT: &str = "provider_id_list";
    let v = o.required(OUT)?;
    let mut ids = list(v, OUT, 10_000)?
        .iter()
        .map(|id| text(id, OUT, "each provider ID", 512))
        .collect::<Result<Vec<_>, _>>()?;
    ids.sort();
    ids.dedup();
    Ok(ids)
}

/// A pool's `replicas`.
pub fn replicas(o: &Outputs) -> Result<i32, Problem> {
    let v = o.required("replicas")?;
    v.as_i64()
        .filter(|n| *n >= 0)
        .and_then(|n| i32::try_from(n).ok())
        .ok_or_else(|| invalid("replicas", "must be a whole number, 0 or more"))
}

/// The most instances status keeps.
pub const MAX_INSTANCES: usize = 1000;

/// A pool's `instances`, and whether there were more than status keeps.
pub fn instances(o: &Outputs) -> Result<(Vec<MachinePoolInstance>, bool), Problem> {
    const OUT: &str = "instances";
    let Some(v) = o.get(OUT) else {
        return Ok((Vec::new(), false));
    };
    let items = list(v, OUT, 10_000)?;
    let mut instances = Vec::new();
    for item in items.iter().take(MAX_INSTANCES) {
        let provider_id = text(
            item.get("provider_id").unwrap_or(&Value::Null),
            OUT,
            "a provider_id",
            512,
        )?;
        let optional = |key: &str, max| {
            item.get(key)
                .filter(|v| !v.is_null())
                .map(|v| text(v, OUT, key, max))
                .transpose()
        };
        let state = match item.get("state").filter(|v| !v.is_null()) {
            None => None,
            Some(s) => Some(
                serde_json::from_value(s.clone())
                    .map_err(|_| invalid(OUT, "has a state that is not an instance state"))?,
            ),
        };
        let addresses = addresses(item.get("addresses"), OUT)?;
        instances.push(MachinePoolInstance {
            provider_id,
            instance_id: optional("instance_id", 256)?,
            addresses: (!addresses.is_empty()).then_some(addresses),
            failure_domain: optional("failure_domain", 256)?,
            state,
        });
    }
    Ok((instances, items.len() > MAX_INSTANCES))
}
