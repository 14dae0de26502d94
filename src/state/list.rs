//! One page of a label-selected list of Secrets, decoded straight from the
//! response's bytes. kube's `Api::list` copies the body into a `String`
//! before decoding it, so a state's listing was held twice over (each copy
//! about 4/3 of the compressed state) on top of the decoded data, and on a
//! decoding failure it logs that text, Secret data, at warn.

use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, ObjectList};
use kube::core::{Request, Status};

/// The most of a non-JSON error body kept in the error's message: a proxy's
/// page can be long, and the message goes into conditions.
const ERROR_TEXT_LIMIT: usize = 256;

/// One page of `api`'s list under `params`, as `Api::list` returns it, with
/// the same errors: an API error as [`kube::Error::Api`], a body that is not
/// a list as [`kube::Error::SerdeError`].
pub async fn page(
    api: &Api<Secret>,
    params: &ListParams,
) -> Result<ObjectList<Secret>, kube::Error> {
    let mut request = Request::new(api.resource_url())
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    // kube names its requests' spans by this; `Api::list` sets the same.
    request.extensions_mut().insert("list");
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

#[cfg(test)]
mod tests {
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
}
