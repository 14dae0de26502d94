//! An AdmissionReview read from the request body in one pass.
//!
//! The API server sends a request's `kind` before its `object` and
//! `oldObject`. Once the kind is known, the handler may name a decoder for
//! it ([`AdmissionHandler::decoder`]), and each object is decoded straight
//! from the body during the same parse: its text is read once. Without one
//! (an unknown kind, a body too large to decode unchecked, or an object sent
//! before its kind), the object stays JSON text borrowed from the body
//! ([`Sent::Text`]) for the rules to decode.
//!
//! An object that fails to decode fails the whole parse, and the body is
//! parsed again keeping the objects' text: the rules then report the error
//! in their answer, as they would have without the decoder.

use std::fmt;

use k8s_openapi::api::authentication::v1::UserInfo;
use kube::core::admission::{AdmissionResponse, META_API_VERSION_V1, META_KIND, Operation};
use kube::core::{GroupVersionKind, Status};
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::AdmissionHandler;

/// An AdmissionReview's request as the rules read it; `O` is what the
/// handler decodes an object into.
#[derive(Debug)]
pub struct ReviewRequest<'a, O> {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub name: String,
    pub namespace: Option<String>,
    pub operation: Operation,
    pub user_info: UserInfo,
    /// Absent (or null) on DELETE.
    pub object: Option<Sent<'a, O>>,
    /// Present on UPDATE and DELETE.
    pub old_object: Option<Sent<'a, O>>,
    pub dry_run: bool,
}

/// Which object of the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Object,
    OldObject,
}

impl Field {
    /// The field's name in the AdmissionReview request.
    pub fn name(self) -> &'static str {
        match self {
            Field::Object => "object",
            Field::OldObject => "oldObject",
        }
    }
}

/// An object of the request.
#[derive(Debug)]
pub enum Sent<'a, O> {
    /// Decoded by the handler's decoder while the body was parsed.
    Decoded(O),
    /// Its JSON text, borrowed from the body.
    Text(&'a RawValue),
}

impl<O> ReviewRequest<'_, O> {
    /// A response that allows this request; `.deny(reason)` or
    /// `.with_patch(patch)` turn it into the others.
    pub fn allow(&self) -> AdmissionResponse {
        // kube builds a response from its own request type or as `invalid`;
        // with the failure cleared, the latter is the value the former gives.
        let mut response = AdmissionResponse::invalid("");
        response.uid = self.uid.clone();
        response.allowed = true;
        response.result = Status::default();
        response
    }
}

/// The review's request, its objects decoded by `handler` where it can,
/// borrowing the others' text from `body`. `Err` is why the body is not an
/// AdmissionReview.
pub(super) fn parse<'a, H: AdmissionHandler>(
    body: &'a [u8],
    handler: &H,
) -> Result<ReviewRequest<'a, H::Object>, String> {
    let body = std::str::from_utf8(body).map_err(|e| format!("the body is not UTF-8: {e}"))?;
    let decoding = Envelope {
        handler: Some(handler),
        body: body.len(),
    };
    let envelope = match decoding.parse(body) {
        Ok(envelope) => envelope,
        Err(_) => Envelope::<H> {
            handler: None,
            body: body.len(),
        }
        .parse(body)
        .map_err(|e| e.to_string())?,
    };
    let (api_version, kind, request) = envelope;
    if api_version != META_API_VERSION_V1 || kind != META_KIND {
        return Err(format!(
            "got kind {:?} of {:?}",
            clip(&kind),
            clip(&api_version)
        ));
    }
    request.ok_or_else(|| "it has no request".into())
}

/// A client's string, cut short for an error message.
fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

/// The envelope around the request; the response part of a review is
/// ignored, as the API server never sends one. `handler` is `None` when the
/// objects are kept as text.
struct Envelope<'h, H> {
    handler: Option<&'h H>,
    body: usize,
}

type Parsed<'a, O> = (String, String, Option<ReviewRequest<'a, O>>);

impl<'h, H: AdmissionHandler> Envelope<'h, H> {
    fn parse<'a>(self, body: &'a str) -> Result<Parsed<'a, H::Object>, serde_json::Error> {
        let mut deserializer = serde_json::Deserializer::from_str(body);
        let parsed = self.deserialize(&mut deserializer)?;
        deserializer.end()?;
        Ok(parsed)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum EnvelopeKey {
    ApiVersion,
    Kind,
    Request,
    #[serde(other)]
    Other,
}

impl<'de, H: AdmissionHandler> DeserializeSeed<'de> for Envelope<'_, H> {
    type Value = Parsed<'de, H::Object>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, H: AdmissionHandler> Visitor<'de> for Envelope<'_, H> {
    type Value = Parsed<'de, H::Object>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an AdmissionReview")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut api_version, mut kind, mut request) = (None, None, None);
        while let Some(key) = map.next_key()? {
            match key {
                EnvelopeKey::ApiVersion => once(&mut api_version, "apiVersion", map.next_value()?)?,
                EnvelopeKey::Kind => once(&mut kind, "kind", map.next_value()?)?,
                EnvelopeKey::Request => {
                    let seed = Nullable(Request {
                        handler: self.handler,
                        body: self.body,
                    });
                    once(&mut request, "request", map.next_value_seed(seed)?)?
                }
                EnvelopeKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((
            api_version.ok_or_else(|| de::Error::missing_field("apiVersion"))?,
            kind.ok_or_else(|| de::Error::missing_field("kind"))?,
            request.flatten(),
        ))
    }
}

/// Sets `slot` to the value of a key seen for the first time.
fn once<T, E: de::Error>(slot: &mut Option<T>, key: &'static str, value: T) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(key));
    }
    *slot = Some(value);
    Ok(())
}

/// `null` or the value of the seed.
struct Nullable<S>(S);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Nullable<S> {
    type Value = Option<S::Value>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, S: DeserializeSeed<'de>> Visitor<'de> for Nullable<S> {
    type Value = Option<S::Value>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("null or a value")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(d).map(Some)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum RequestKey {
    Uid,
    Kind,
    Name,
    Namespace,
    Operation,
    UserInfo,
    Object,
    OldObject,
    DryRun,
    #[serde(other)]
    Other,
}

/// The request, its objects decoded by `handler` once its kind is known.
struct Request<'h, H> {
    handler: Option<&'h H>,
    body: usize,
}

impl<'de, H: AdmissionHandler> DeserializeSeed<'de> for Request<'_, H> {
    type Value = ReviewRequest<'de, H::Object>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, H: AdmissionHandler> Visitor<'de> for Request<'_, H> {
    type Value = ReviewRequest<'de, H::Object>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an AdmissionReview's request")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut uid, mut kind, mut name, mut namespace) = (None, None, None, None);
        let (mut operation, mut user_info, mut dry_run) = (None, None, None);
        let (mut object, mut old_object) = (None, None);
        while let Some(key) = map.next_key()? {
            match key {
                RequestKey::Uid => once(&mut uid, "uid", map.next_value()?)?,
                RequestKey::Kind => once(&mut kind, "kind", map.next_value()?)?,
                RequestKey::Name => once(&mut name, "name", map.next_value()?)?,
                RequestKey::Namespace => once(&mut namespace, "namespace", map.next_value()?)?,
                RequestKey::Operation => once(&mut operation, "operation", map.next_value()?)?,
                RequestKey::UserInfo => once(&mut user_info, "userInfo", map.next_value()?)?,
                RequestKey::DryRun => once(&mut dry_run, "dryRun", map.next_value()?)?,
                RequestKey::Object => {
                    let seed = self.object(kind.as_ref(), Field::Object);
                    once(&mut object, "object", map.next_value_seed(seed)?)?
                }
                RequestKey::OldObject => {
                    let seed = self.object(kind.as_ref(), Field::OldObject);
                    once(&mut old_object, "oldObject", map.next_value_seed(seed)?)?
                }
                RequestKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(ReviewRequest {
            uid: uid.ok_or_else(|| de::Error::missing_field("uid"))?,
            kind: kind.ok_or_else(|| de::Error::missing_field("kind"))?,
            name: name.unwrap_or_default(),
            namespace: namespace.flatten(),
            operation: operation.ok_or_else(|| de::Error::missing_field("operation"))?,
            user_info: user_info.ok_or_else(|| de::Error::missing_field("userInfo"))?,
            object: object.flatten(),
            old_object: old_object.flatten(),
            dry_run: dry_run.unwrap_or_default(),
        })
    }
}

impl<H: AdmissionHandler> Request<'_, H> {
    /// How the `field` object of a request of `kind` is read.
    fn object(&self, kind: Option<&GroupVersionKind>, field: Field) -> Object<H::Decoder> {
        Object(
            self.handler
                .zip(kind)
                .and_then(|(handler, kind)| handler.decoder(&kind.kind, field, self.body)),
        )
    }
}

/// An object, `null` or absent: decoded by the decoder, or kept as text.
struct Object<S>(Option<S>);

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Object<S> {
    type Value = Option<Sent<'de, S::Value>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        match self.0 {
            Some(decoder) => Ok(Nullable(decoder).deserialize(d)?.map(Sent::Decoded)),
            None => Ok(Option::<&'de RawValue>::deserialize(d)?.map(Sent::Text)),
        }
    }
}
