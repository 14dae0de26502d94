//! The admission webhooks: defaulting and validating rules over the objects
//! (pure), and the handlers that apply them to AdmissionReviews.

pub mod decode;
pub mod defaults;
pub mod handler;
pub mod objects;
pub mod rules;
pub mod validate;
