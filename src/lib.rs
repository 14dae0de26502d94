//! CAPTF: a Cluster API infrastructure provider that provisions infrastructure
//! by running Terraform or OpenTofu modules in Kubernetes Jobs.
//!
//! One module per concept of the book; decisions are pure functions over plain
//! data, and the Kubernetes I/O stays at the edges.

pub mod api;
pub mod backups;
pub mod capi;
pub mod controllers;
pub mod error;
pub mod image_ref;
pub mod jobs;
pub mod json_key;
pub mod keys;
pub mod locks;
pub mod metrics;
pub mod names;
pub mod outputs;
pub mod protection;
pub mod role;
pub mod runner;
pub mod secret_io;
pub mod server;
pub mod state;
pub mod webhooks;

/// The release of CAPTF: the crate version, also its clusterctl release
/// (`v<VERSION>`) and the manager image tag of its release manifests.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
