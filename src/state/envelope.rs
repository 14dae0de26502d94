//! What the document is: OpenTofu's encryption envelope, a state of another
//! version, a version 4 state of the wrong shape, or a state CAPTF reads.
//!
//! OpenTofu wraps an encrypted state in a JSON object with `meta`,
//! `encrypted_data` and `encryption_version`, and no `version` of its own; it
//! takes any object with a non-empty string `encryption_version` for one,
//! before looking at anything else. So does this decision.

use std::collections::BTreeMap;

use super::parse::Parsed;
use super::{Corruption, Output, Unreadable};

/// The fields of a version 4 state.
#[derive(Debug)]
pub(super) struct Fields {
    pub serial: u64,
    pub lineage: String,
    pub terraform_version: String,
    pub outputs: BTreeMap<String, Output>,
    pub managed_resources: u64,
}

/// The state version CAPTF reads.
const STATE_VERSION: u64 = 4;

pub(super) fn decide(parsed: Parsed) -> Result<Fields, Unreadable> {
    if parsed.envelope {
        return Err(Unreadable::Encrypted);
    }
    match parsed.version {
        Some(STATE_VERSION) => {}
        Some(other) => return Err(Unreadable::Corrupt(Corruption::UnsupportedVersion(other))),
        None => {
            return Err(Unreadable::Corrupt(
                parsed.shape.unwrap_or(Corruption::NoVersion),
            ));
        }
    }
    if let Some(shape) = parsed.shape {
        return Err(Unreadable::Corrupt(shape));
    }
    Ok(Fields {
        serial: parsed.serial,
        lineage: parsed.lineage,
        terraform_version: parsed.terraform_version,
        outputs: parsed.outputs,
        managed_resources: parsed.managed_resources,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Option<Corruption> {
        Some(Corruption::Shape {
            offset: 1,
            detail: "x".into(),
        })
    }

    #[test]
    fn decisions() {
        let table: Vec<(Parsed, Result<(), Unreadable>)> = vec![
            (
                Parsed {
                    version: Some(4),
                    ..Default::default()
                },
                Ok(()),
            ),
            (
                Parsed {
                    envelope: true,
                    ..Default::default()
                },
                Err(Unreadable::Encrypted),
            ),
            (
                // The envelope wins over anything else in the object.
                Parsed {
                    version: Some(3),
                    envelope: true,
                    shape: shape(),
                    ..Default::default()
                },
                Err(Unreadable::Encrypted),
            ),
            (
                Parsed {
                    ..Default::default()
                },
                Err(Unreadable::Corrupt(Corruption::NoVersion)),
            ),
            (
                Parsed {
                    version: Some(3),
                    shape: shape(),
                    ..Default::default()
                },
                Err(Unreadable::Corrupt(Corruption::UnsupportedVersion(3))),
            ),
            (
                Parsed {
                    version: Some(5),
                    ..Default::default()
                },
                Err(Unreadable::Corrupt(Corruption::UnsupportedVersion(5))),
            ),
            (
                Parsed {
                    version: None,
                    shape: shape(),
                    ..Default::default()
                },
                Err(Unreadable::Corrupt(shape().unwrap())),
            ),
            (
                Parsed {
                    version: Some(4),
                    shape: shape(),
                    ..Default::default()
                },
                Err(Unreadable::Corrupt(shape().unwrap())),
            ),
        ];
        for (parsed, want) in table {
            let what = format!("{parsed:?}");
            assert_eq!(decide(parsed).map(|_| ()), want, "{what}");
        }
    }
}
