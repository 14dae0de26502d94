//! The saved plan between a plan Job and the approved apply (ref Appendix B
//! "Plan key Secret"): the plan file, sealed with the object's plan key so
//! that an approved apply applies only a plan a runner of this object
//! saved, for the inputs and the hash that were approved.
//!
//! The plan is kept in the Secret `captf-plan-<ks>-<name>` beside the plan
//! key; the manager creates both, owned by the object, and the runner only
//! writes the plan's data. Sealing and opening are pure.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use ring::hmac;
use sha2::{Digest, Sha256};

/// The most plan bytes a Secret holds here: a Secret is at most 1 MiB.
pub const PLAN_MAX: usize = 900 * 1024;

const PLAN: &str = "plan";
const PLAN_HASH: &str = "planHash";
const INPUTS_HASH: &str = "inputsHash";
const MAC: &str = "mac";

/// A saved plan, opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Saved {
    pub plan: Vec<u8>,
    pub plan_hash: String,
    pub inputs_hash: String,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SavedError {
    #[error("no plan is saved")]
    Missing,
    #[error("the saved plan lacks its {0}")]
    Incomplete(&'static str),
    #[error("the saved plan fails its authentication: it was not saved by this object's runner")]
    Forged,
    #[error("the plan is {0} bytes; a saved plan holds at most {PLAN_MAX}")]
    TooLarge(usize),
    #[error("the plan key must be at least 32 bytes, it has {0}")]
    WeakKey(usize),
}

fn message(saved: &Saved) -> Vec<u8> {
    let mut m = format!("captf-plan/1\n{}\n{}\n", saved.inputs_hash, saved.plan_hash).into_bytes();
    m.extend_from_slice(&Sha256::digest(&saved.plan));
    m
}

fn key(raw: &[u8]) -> Result<hmac::Key, SavedError> {
    if raw.len() < 32 {
        return Err(SavedError::WeakKey(raw.len()));
    }
    Ok(hmac::Key::new(hmac::HMAC_SHA256, raw))
}

/// The Secret data of `saved`, authenticated with the plan key.
pub fn seal(plan_key: &[u8], saved: &Saved) -> Result<BTreeMap<String, ByteString>, SavedError> {
    if saved.plan.len() > PLAN_MAX {
        return Err(SavedError::TooLarge(saved.plan.len()));
    }
    let tag = hmac::sign(&key(plan_key)?, &message(saved));
    Ok(BTreeMap::from([
        (PLAN.into(), ByteString(saved.plan.clone())),
        (
            PLAN_HASH.into(),
            ByteString(saved.plan_hash.clone().into_bytes()),
        ),
        (
            INPUTS_HASH.into(),
            ByteString(saved.inputs_hash.clone().into_bytes()),
        ),
        (MAC.into(), ByteString(tag.as_ref().to_vec())),
    ]))
}

/// The saved plan in Secret data, once its seal is verified.
pub fn open(
    plan_key: &[u8],
    data: Option<&BTreeMap<String, ByteString>>,
) -> Result<Saved, SavedError> {
    let data = data.filter(|d| !d.is_empty()).ok_or(SavedError::Missing)?;
    let get = |name: &'static str| {
        data.get(name)
            .map(|v| v.0.clone())
            .ok_or(SavedError::Incomplete(name))
    };
    let text = |name: &'static str| {
        String::from_utf8(get(name)?).map_err(|_| SavedError::Incomplete(name))
    };
    let saved = Saved {
        plan: get(PLAN)?,
        plan_hash: text(PLAN_HASH)?,
        inputs_hash: text(INPUTS_HASH)?,
    };
    hmac::verify(&key(plan_key)?, &message(&saved), &get(MAC)?).map_err(|_| SavedError::Forged)?;
    Ok(saved)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];

    fn saved() -> Saved {
        Saved {
            plan: b"PK\x03\x04 a zip".to_vec(),
            plan_hash: "p1:abc".into(),
            inputs_hash: "h2:def".into(),
        }
    }

    #[test]
    fn a_sealed_plan_opens_with_its_key_only() {
        let data = seal(&KEY, &saved()).unwrap();
        assert_eq!(open(&KEY, Some(&data)), Ok(saved()));
        assert_eq!(open(&[8; 32], Some(&data)), Err(SavedError::Forged));
    }

    #[test]
    fn any_change_breaks_the_seal() {
        let data = seal(&KEY, &saved()).unwrap();
        for (field, value) in [
            (PLAN, &b"PK\x03\x04 another zip"[..]),
            (PLAN_HASH, b"p1:abd"),
            (INPUTS_HASH, b"h2:deg"),
            (MAC, b"\0\0\0\0"),
        ] {
            let mut swapped = data.clone();
            swapped.insert(field.into(), ByteString(value.to_vec()));
            assert_eq!(
                open(&KEY, Some(&swapped)),
                Err(SavedError::Forged),
                "{field}"
            );
        }
    }

    #[test]
    fn missing_short_and_large() {
        assert_eq!(open(&KEY, None), Err(SavedError::Missing));
        assert_eq!(open(&KEY, Some(&BTreeMap::new())), Err(SavedError::Missing));
        let mut data = seal(&KEY, &saved()).unwrap();
        data.remove(MAC);
        assert_eq!(open(&KEY, Some(&data)), Err(SavedError::Incomplete("mac")));
        assert_eq!(seal(&[1; 16], &saved()), Err(SavedError::WeakKey(16)));
        let large = Saved {
            plan: vec![0; PLAN_MAX + 1],
            ..saved()
        };
        assert_eq!(seal(&KEY, &large), Err(SavedError::TooLarge(PLAN_MAX + 1)));
    }
}
