//! A TerraformMachinePool's autoscaling (ref §8.8, §9.3): the MachinePool's
//! autoscaler annotations, the pool's `replicas` and `autoscaling` inputs,
//! the AutoscalingActive condition, and what is written back to the
//! MachinePool. Pure.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::controllers::conditions::{self, Cond, Status};
use crate::keys::{AUTOSCALER_MAX_SIZE, AUTOSCALER_MIN_SIZE, REPLICAS_MANAGED_BY};

/// The value of `replicas-managed-by` that is CAPTF's claim.
pub const CLAIM: &str = "captf";

/// What the MachinePool's autoscaler annotations ask for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Autoscaling {
    /// Neither annotation.
    Off,
    /// One is there, but the pair does not hold bounds: why.
    Invalid(String),
    On {
        min: i32,
        max: i32,
    },
}

fn bound(key: &str, value: Option<&String>) -> Result<i32, String> {
    let value = value.ok_or_else(|| format!("{key} is missing"))?;
    match value.trim().parse::<i64>() {
        Ok(n) if n < 0 => Err(format!("{key} is negative")),
        Ok(n) => i32::try_from(n).map_err(|_| format!("{key} is too large")),
        Err(_) => Err(format!("{key} is not a whole number")),
    }
}

/// Reads the annotations: on only when both parse with 0 ≤ min ≤ max.
pub fn read(annotations: Option<&BTreeMap<String, String>>) -> Autoscaling {
    let get = |key: &str| annotations.and_then(|a| a.get(key));
    let (min, max) = (get(AUTOSCALER_MIN_SIZE), get(AUTOSCALER_MAX_SIZE));
    if min.is_none() && max.is_none() {
        return Autoscaling::Off;
    }
    match (
        bound(AUTOSCALER_MIN_SIZE, min),
        bound(AUTOSCALER_MAX_SIZE, max),
    ) {
        (Ok(min), Ok(max)) if min <= max => Autoscaling::On { min, max },
        (Ok(min), Ok(max)) => Autoscaling::Invalid(format!(
            "the minimum size {min} is above the maximum size {max}"
        )),
        (Err(why), _) | (_, Err(why)) => Autoscaling::Invalid(why),
    }
}

impl Autoscaling {
    /// The `autoscaling` input: `{false,0,0}` unless on.
    pub fn input(&self) -> Value {
        match self {
            Autoscaling::On { min, max } => json!({ "enabled": true, "min": min, "max": max }),
            _ => json!({ "enabled": false, "min": 0, "max": 0 }),
        }
    }

    /// The `replicas` input: off, the MachinePool's (unset is 1); on, the
    /// count the module last reported if known, else the MachinePool's,
    /// within the bounds.
    pub fn replicas(&self, spec: Option<i32>, observed: Option<i32>) -> i32 {
        let spec = spec.unwrap_or(1).max(0);
        match self {
            Autoscaling::On { min, max } => observed.unwrap_or(spec).clamp(*min, *max),
            _ => spec,
        }
    }

    pub fn on(&self) -> bool {
        matches!(self, Autoscaling::On { .. })
    }
}

/// What a pass writes to the MachinePool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteBack {
    /// Set `replicas-managed-by: captf`.
    pub claim: bool,
    /// Remove CAPTF's claim.
    pub release: bool,
    /// `spec.replicas` from → to, the module's count unclamped.
    pub replicas: Option<(Option<i32>, i32)>,
}

impl WriteBack {
    pub fn is_empty(&self) -> bool {
        *self == WriteBack::default()
    }
}

/// Whose `replicas-managed-by` value `value` is.
fn claimed_by_another(value: Option<&str>) -> bool {
    !matches!(value, None | Some("false") | Some(CLAIM))
}

/// The write-back (ref §8.8): while on, claim the replicas unless another
/// manager did, and write the module's count to `spec.replicas` when it
/// differs; while off, withdraw only CAPTF's own claim.
pub fn write_back(
    a: &Autoscaling,
    managed_by: Option<&str>,
    spec: Option<i32>,
    observed: Option<i32>,
) -> WriteBack {
    if !a.on() {
        return WriteBack {
            release: managed_by == Some(CLAIM),
            ..WriteBack::default()
        };
    }
    if claimed_by_another(managed_by) {
        return WriteBack::default();
    }
    WriteBack {
        claim: managed_by != Some(CLAIM),
        release: false,
        replicas: observed.filter(|n| Some(*n) != spec).map(|n| (spec, n)),
    }
}

/// AutoscalingActive (ref §3; never in Ready).
pub fn condition(a: &Autoscaling, managed_by: Option<&str>) -> Cond {
    let cond = |status, reason, message: String| {
        Cond::new(conditions::AUTOSCALING_ACTIVE, status, reason, message)
    };
    match a {
        Autoscaling::Off => cond(Status::False, "AutoscalingDisabled", String::new()),
        Autoscaling::Invalid(why) => cond(
            Status::False,
            "AutoscalingAnnotationsInvalid",
            format!("{why}: the pool applies without autoscaling"),
        ),
        Autoscaling::On { min, max } => {
            let message = match managed_by.filter(|v| claimed_by_another(Some(v))) {
                Some(other) => format!(
                    "between {min} and {max} replicas; {REPLICAS_MANAGED_BY} is {other:?}, \
                     so CAPTF writes no replicas back"
                ),
                None => format!("between {min} and {max} replicas, as the module reports them"),
            };
            cond(Status::True, "ReplicasManagedByModule", message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(min: Option<&str>, max: Option<&str>) -> BTreeMap<String, String> {
        let mut a = BTreeMap::new();
        if let Some(v) = min {
            a.insert(AUTOSCALER_MIN_SIZE.to_string(), v.to_string());
        }
        if let Some(v) = max {
            a.insert(AUTOSCALER_MAX_SIZE.to_string(), v.to_string());
        }
        a
    }

    #[test]
    fn the_annotations_give_bounds_only_as_a_valid_pair() {
        let invalid = |why: &str| Autoscaling::Invalid(why.to_string());
        for (min, max, want) in [
            (None, None, Autoscaling::Off),
            (Some("1"), Some("5"), Autoscaling::On { min: 1, max: 5 }),
            (Some("0"), Some("0"), Autoscaling::On { min: 0, max: 0 }),
            (Some(" 2 "), Some("2"), Autoscaling::On { min: 2, max: 2 }),
            (
                Some("1"),
                None,
                invalid(&format!("{AUTOSCALER_MAX_SIZE} is missing")),
            ),
            (
                None,
                Some("3"),
                invalid(&format!("{AUTOSCALER_MIN_SIZE} is missing")),
            ),
            (
                Some("-1"),
                Some("3"),
                invalid(&format!("{AUTOSCALER_MIN_SIZE} is negative")),
            ),
            (
                Some("1"),
                Some("three"),
                invalid(&format!("{AUTOSCALER_MAX_SIZE} is not a whole number")),
            ),
            (
                Some("1"),
                Some("99999999999"),
                invalid(&format!("{AUTOSCALER_MAX_SIZE} is too large")),
            ),
            (
                Some("4"),
                Some("2"),
                invalid("the minimum size 4 is above the maximum size 2"),
            ),
        ] {
            assert_eq!(read(Some(&annotations(min, max))), want, "{min:?} {max:?}");
        }
        assert_eq!(read(None), Autoscaling::Off);
    }

    #[test]
    fn replicas_follow_the_machine_pool_or_the_module_within_the_bounds() {
        let on = Autoscaling::On { min: 2, max: 5 };
        let bad = Autoscaling::Invalid("x".into());
        // (autoscaling, spec.replicas, status.replicas, input)
        for (a, spec, observed, want) in [
            (&Autoscaling::Off, Some(3), Some(7), 3),
            (&Autoscaling::Off, None, None, 1),
            (&bad, Some(3), Some(7), 3),
            (&on, Some(3), None, 3),
            (&on, Some(3), Some(4), 4),
            (&on, Some(3), Some(9), 5),
            (&on, Some(3), Some(0), 2),
            (&on, None, None, 2),
        ] {
            assert_eq!(
                a.replicas(spec, observed),
                want,
                "{a:?} {spec:?} {observed:?}"
            );
        }
        assert_eq!(on.input(), json!({"enabled": true, "min": 2, "max": 5}));
        assert_eq!(bad.input(), json!({"enabled": false, "min": 0, "max": 0}));
    }

    #[test]
    fn the_write_back_claims_writes_and_withdraws_only_its_own() {
        let on = Autoscaling::On { min: 1, max: 5 };
        let claim = |replicas| WriteBack {
            claim: true,
            release: false,
            replicas,
        };
        // (autoscaling, replicas-managed-by, spec, status, want)
        for (a, by, spec, observed, want) in [
            (&on, None, Some(2), None, claim(None)),
            (&on, Some("false"), Some(2), Some(2), claim(None)),
            // The raw count, outside the bounds too.
            (&on, None, Some(2), Some(7), claim(Some((Some(2), 7)))),
            (
                &on,
                Some(CLAIM),
                Some(2),
                Some(3),
                WriteBack {
                    replicas: Some((Some(2), 3)),
                    ..WriteBack::default()
                },
            ),
            (&on, Some(CLAIM), Some(3), Some(3), WriteBack::default()),
            // Another manager's claim is left alone, and so are replicas.
            (&on, Some("true"), Some(2), Some(3), WriteBack::default()),
            (&on, Some(""), Some(2), Some(3), WriteBack::default()),
            (
                &Autoscaling::Off,
                Some(CLAIM),
                Some(2),
                Some(3),
                WriteBack {
                    release: true,
                    ..WriteBack::default()
                },
            ),
            (
                &Autoscaling::Off,
                Some("true"),
                Some(2),
                Some(3),
                WriteBack::default(),
            ),
            (
                &Autoscaling::Invalid("x".into()),
                Some(CLAIM),
                Some(2),
                Some(3),
                WriteBack {
                    release: true,
                    ..WriteBack::default()
                },
            ),
        ] {
            assert_eq!(
                write_back(a, by, spec, observed),
                want,
                "{a:?} {by:?} {spec:?} {observed:?}"
            );
        }
    }

    #[test]
    fn autoscaling_active_says_which() {
        let on = Autoscaling::On { min: 1, max: 5 };
        for (a, by, want) in [
            (
                &Autoscaling::Off,
                None,
                (Status::False, "AutoscalingDisabled"),
            ),
            (
                &Autoscaling::Invalid("x".into()),
                None,
                (Status::False, "AutoscalingAnnotationsInvalid"),
            ),
            (&on, None, (Status::True, "ReplicasManagedByModule")),
            (
                &on,
                Some("other"),
                (Status::True, "ReplicasManagedByModule"),
            ),
        ] {
            let c = condition(a, by);
            assert_eq!((c.status, c.reason), want, "{a:?}");
        }
        assert!(
            condition(&on, Some("other"))
                .message
                .contains("writes no replicas back")
        );
        assert!(!condition(&on, Some(CLAIM)).message.contains("writes no"));
    }
}
