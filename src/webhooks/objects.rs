//! The objects of an AdmissionReview, typed by its kind, each as defaulting
//! leaves it and with the patch that defaulting made.
//!
//! The server decodes them with [`Decoder`] during the parse of the body,
//! so their text is read once; an object it kept as text ([`Sent::Text`]) is
//! decoded here when a rule asks for it, with the same result.

use std::borrow::Cow;

use json_patch::PatchOperation;
use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer};

use super::decode::{self, DecodeError, Field};
use super::defaults::Defaults;
use super::rules::Violation;
use crate::api::{
    TerraformCluster, TerraformClusterIdentity, TerraformClusterTemplate, TerraformMachine,
    TerraformMachinePool, TerraformMachinePoolTemplate, TerraformMachineTemplate,
};
use crate::server::webhook::Sent;

/// An object decoded during the parse of the body.
#[derive(Debug)]
pub struct Decoded {
    object: Typed,
    defaults: Vec<PatchOperation>,
}

/// An object of the request, sent decoded or as text.
pub type Object<'a> = Sent<'a, Decoded>;

macro_rules! kinds {
    ($($variant:ident => $type:ty),+ $(,)?) => {
        /// An object of a kind the webhooks serve.
        #[derive(Debug)]
        pub(crate) enum Typed {
            $($variant(Box<$type>)),+
        }

        /// The kinds the decoder reads.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        enum Served {
            $($variant),+
        }

        impl Served {
            fn of(kind: &str) -> Option<Self> {
                match kind {
                    $(stringify!($type) => Some(Served::$variant),)+
                    _ => None,
                }
            }
        }

        impl<'de> DeserializeSeed<'de> for Decoder {
            type Value = Decoded;

            fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Decoded, D::Error> {
                match self.kind {
                    $(Served::$variant => defaulted(self.field, d, Typed::$variant),)+
                }
            }
        }

        $(
            impl Reviewed for $type {
                fn of(typed: &Typed) -> Option<&Self> {
                    match typed {
                        Typed::$variant(object) => Some(object),
                        _ => None,
                    }
                }
            }
        )+
    };
}

kinds! {
    Cluster => TerraformCluster,
    Machine => TerraformMachine,
    MachinePool => TerraformMachinePool,
    ClusterTemplate => TerraformClusterTemplate,
    MachineTemplate => TerraformMachineTemplate,
    MachinePoolTemplate => TerraformMachinePoolTemplate,
    Identity => TerraformClusterIdentity,
}

/// Decodes one object of a kind, as [`decode::decode`] does, during the
/// parse of the body.
#[derive(Clone, Copy, Debug)]
pub struct Decoder {
    kind: Served,
    field: Field,
}

impl Decoder {
    /// The decoder for the `field` object of `kind` in a body of `body`
    /// bytes. A body long enough to pass the cap on JSON values gets none:
    /// its objects are kept as text, counted, then decoded.
    pub fn of(kind: &str, field: Field, body: usize) -> Option<Self> {
        if !decode::below_the_cap(body) {
            return None;
        }
        Served::of(kind).map(|kind| Decoder { kind, field })
    }
}

fn defaulted<'de, T, D>(field: Field, d: D, wrap: fn(Box<T>) -> Typed) -> Result<Decoded, D::Error>
where
    T: DeserializeOwned + Defaults,
    D: Deserializer<'de>,
{
    let mut object: T = decode::decode_from(field, d)?;
    let defaults = object.apply_defaults();
    Ok(Decoded {
        object: wrap(Box::new(object)),
        defaults,
    })
}

/// A kind the webhooks serve.
pub(crate) trait Reviewed: DeserializeOwned + Defaults + Clone {
    fn of(typed: &Typed) -> Option<&Self>;
}

/// An object as defaulting leaves it, and the patch defaulting made.
pub(crate) struct Read<'a, T: Clone> {
    pub object: Cow<'a, T>,
    pub defaults: Cow<'a, [PatchOperation]>,
}

/// The `field` object as a `T`: the one decoded with the body, or decoded
/// from its text now.
pub(crate) fn read<'a, T: Reviewed>(
    field: Field,
    sent: &'a Object<'_>,
) -> Result<Read<'a, T>, DecodeError> {
    match sent {
        Sent::Decoded(decoded) => {
            let object = T::of(&decoded.object).ok_or(DecodeError::OtherKind(field))?;
            Ok(Read {
                object: Cow::Borrowed(object),
                defaults: Cow::Borrowed(&decoded.defaults),
            })
        }
        Sent::Text(raw) => {
            let mut object: T = decode::decode(field, raw)?;
            let defaults = object.apply_defaults();
            Ok(Read {
                object: Cow::Owned(object),
                defaults: Cow::Owned(defaults),
            })
        }
    }
}

/// The mutating webhook's patch for an object of `kind`; none for the kinds
/// that are not defaulted. An object that does not match its schema gets
/// none (validation refuses it); one past the values cap is refused here too.
pub fn defaults_patch(kind: &str, sent: &Object<'_>) -> Result<Vec<PatchOperation>, Violation> {
    match kind {
        "TerraformCluster" => patch_of::<TerraformCluster>(sent),
        "TerraformMachine" => patch_of::<TerraformMachine>(sent),
        "TerraformMachinePool" => patch_of::<TerraformMachinePool>(sent),
        _ => Ok(Vec::new()),
    }
}

fn patch_of<T: Reviewed>(sent: &Object<'_>) -> Result<Vec<PatchOperation>, Violation> {
    match read::<T>(Field::Object, sent) {
        Ok(read) => Ok(read.defaults.into_owned()),
        Err(DecodeError::Json(_)) => Ok(Vec::new()),
        Err(e) => Err(e.into_violation(|e| e.to_string())),
    }
}
