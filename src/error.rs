//! Error categories: every error type of the library says what its caller
//! should do about it, so that reconcilers can turn any failure into the right
//! condition, event and requeue without matching on every variant.

/// What to do about an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    /// Bad input from a user or from the cluster (an invalid spec, a corrupt
    /// state): report it; retrying the same input gives the same answer.
    Invalid,
    /// A passing failure (an API error, a timeout, a conflict): retry with
    /// backoff.
    Transient,
    /// The program or its environment is broken: report loudly.
    Internal,
}

/// Implemented by every error type of the library.
pub trait Categorized {
    fn category(&self) -> Category;
}

/// The category of an error from the Kubernetes API.
pub fn kube_category(error: &kube::Error) -> Category {
    match error {
        // 4xx answers other than conflicts and throttling mean the request
        // itself was refused: sending it again gives the same answer.
        kube::Error::Api(status) => match status.code {
            409 | 429 => Category::Transient,
            400..=499 => Category::Invalid,
            _ => Category::Transient,
        },
        kube::Error::SerdeError(_) => Category::Invalid,
        _ => Category::Transient,
    }
}

impl Categorized for crate::server::dev_certs::DevCertError {
    fn category(&self) -> Category {
        Category::Internal
    }
}
