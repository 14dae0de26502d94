//! The operations of the book's step table as the manager runs them (ref
//! §8.2–§8.4) end to end: the manager, the local pod executor, real
//! OpenTofu and the real API server.

mod approval;
mod digest;
mod drift;
mod events;
mod remediation;
mod settings;
mod stuck;

const MANAGER: &str = env!("CARGO_BIN_EXE_captf-manager");
