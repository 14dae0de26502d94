//! The requests that carry a state's bytes: listing a state's Secrets and
//! creating a backup's. kube's `Api::list` and `Api::create` copy each
//! response into a `String` before decoding it, and log that text, Secret
//! data, at warn when decoding fails; `Api::create` also serializes the data
//! through k8s-openapi's `ByteString`, which builds each value's base64 as a
//! `String` before writing it into a body grown by doubling. Here a body is
//! written once, into a buffer of about its size, and a response is decoded
//! from its bytes. After a start every state is read and backed up at once,
//! and the bodies, their base64 and the responses being read were a fifth
//! of the heap at its peak (`heaptrack` over `cargo bench --bench scale`).

use std::collections::BTreeMap;

use base64::display::Base64Display;
use base64::engine::general_purpose::STANDARD;
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, ObjectList, PostParams};
use kube::core::{Request, Status};
use serde::de::DeserializeOwned;
use serde::{Serialize, Serializer};

/// The most of a non-JSON error body kept in the error's message: a proxy's
/// page can be long, and the message goes into conditions.
const ERROR_TEXT_LIMIT: usize = 256;

/// Room in a body for everything but the data: the metadata, the field names.
const BODY_OVERHEAD: usize = 4096;

/// One page of `api`'s list under `params`, as `Api::list` returns it, with
/// the same errors: an API error as [`kube::Error::Api`], a body that is not
/// a list as [`kube::Error::SerdeError`].
pub async fn page(
    api: &Api<Secret>,
    params: &ListParams,
) -> Result<ObjectList<Secret>, kube::Error> {
    let request = Request::new(api.resource_url())
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    send(api, request, "list").await
}

/// Creates `secret` and returns it as the API server answered, as
/// `Api::create` does, with the same errors.
pub async fn create(api: &Api<Secret>, secret: &Secret) -> Result<Secret, kube::Error> {
    let request = Request::new(api.resource_url())
        .create(&PostParams::default(), body(secret)?)
        .map_err(kube::Error::BuildRequest)?;
    send(api, request, "create").await
}

/// Sends `request` and decodes the answer from its bytes. `verb` names the
/// request's span, as kube's own methods do.
async fn send<T: DeserializeOwned>(
    api: &Api<Secret>,
    mut request: http::Request<Vec<u8>>,
    verb: &'static str,
) -> Result<T, kube::Error> {
    request.extensions_mut().insert(verb);
    let response = api
        .clone()
        .into_client()
        .send(request.map(Into::into))
        .await?;
    let code = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    if code.is_client_error() || code.is_server_error() {
        return Err(kube::Error::Api(refusal(code.as_u16(), &body).boxed()));
    }
    serde_json::from_slice(&body).map_err(kube::Error::SerdeError)
}

/// The API server's `Status` for a refused request, or one made of the
/// body's first bytes when something else (a proxy) answered, as kube does.
fn refusal(code: u16, body: &[u8]) -> Status {
    serde_json::from_slice::<Status>(body).unwrap_or_else(|_| {
        let text = String::from_utf8_lossy(&body[..body.len().min(ERROR_TEXT_LIMIT)]);
        Status::failure(text.trim(), "Failed to parse error data").with_code(code)
    })
}

/// `secret` as JSON, the same document as k8s-openapi writes, each data
/// value's base64 written straight into the body.
fn body(secret: &Secret) -> Result<Vec<u8>, kube::Error> {
    let data = secret.data.as_ref().map(|data| {
        data.iter()
            .map(|(key, value)| (key.as_str(), Base64(&value.0)))
            .collect::<BTreeMap<_, _>>()
    });
    let size = data
        .iter()
        .flatten()
        .map(|(key, value)| key.len() + 4 * value.0.len().div_ceil(3) + 6)
        .sum::<usize>();
    let mut out = Vec::with_capacity(BODY_OVERHEAD + size);
    serde_json::to_writer(
        &mut out,
        &Body {
            api_version: "v1",
            kind: "Secret",
            metadata: &secret.metadata,
            data,
            immutable: secret.immutable,
            string_data: secret.string_data.as_ref(),
            type_: secret.type_.as_deref(),
        },
    )
    .map_err(kube::Error::SerdeError)?;
    Ok(out)
}

/// A Secret as the API server reads it (k8s-openapi's field names).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: &'a ObjectMeta,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<BTreeMap<&'a str, Base64<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    immutable: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    string_data: Option<&'a BTreeMap<String, String>>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    type_: Option<&'a str>,
}

/// Bytes written as a base64 string without building that string:
/// serde_json writes `collect_str`'s pieces straight into its output.
struct Base64<'a>(&'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&Base64Display::new(self.0, &STANDARD))
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;

    use super::*;

    #[test]
    fn a_refusal_is_the_servers_status_or_the_start_of_the_body() {
        let status = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"secrets is forbidden","reason":"Forbidden","code":403}"#;
        let got = refusal(403, status);
        assert_eq!(
            (got.code, got.reason.as_str(), got.message.as_str()),
            (403, "Forbidden", "secrets is forbidden")
        );

        let page = format!("  <html>{}</html>", "x".repeat(1000));
        let got = refusal(502, page.as_bytes());
        assert_eq!(got.code, 502);
        assert_eq!(got.reason, "Failed to parse error data");
        assert_eq!(got.message.len(), ERROR_TEXT_LIMIT - 2, "cut, then trimmed");
        assert!(got.message.starts_with("<html>xxx"), "{}", got.message);
    }

    #[test]
    fn a_body_is_the_document_k8s_openapi_writes() {
        let bytes = |n: usize| ByteString((0..n).map(|i| (i * 7 % 256) as u8).collect());
        let full = Secret {
            metadata: ObjectMeta {
                name: Some("tfstate-default-x-backup-1".into()),
                labels: Some(BTreeMap::from([("captf.io/backup".into(), "true".into())])),
                annotations: Some(BTreeMap::from([("a\"b".into(), "é\n".into())])),
                ..Default::default()
            },
            // Lengths 0, 1, 2 and 3 mod 3 exercise base64's padding.
            data: Some(BTreeMap::from([
                ("empty".into(), bytes(0)),
                ("one".into(), bytes(1)),
                ("two".into(), bytes(2)),
                ("tfstate".into(), bytes(200_001)),
            ])),
            immutable: Some(true),
            string_data: Some(BTreeMap::from([("k".into(), "v".into())])),
            type_: Some("Opaque".into()),
        };
        for secret in [full, Secret::default()] {
            let ours = body(&secret).unwrap();
            let theirs = serde_json::to_vec(&secret).unwrap();
            assert_eq!(
                serde_json::from_slice::<serde_json::Value>(&ours).unwrap(),
                serde_json::from_slice::<serde_json::Value>(&theirs).unwrap()
            );
            assert!(
                ours.capacity() < BODY_OVERHEAD + theirs.len(),
                "written into a buffer of about its size: {} for {} bytes",
                ours.capacity(),
                ours.len()
            );
        }
    }
}
