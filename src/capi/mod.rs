//! Cluster API, as CAPTF sees it: the objects it reads ([`objects`]), who
//! owns a workload object ([`owners`]) and the inputs each role renders
//! from them ([`inputs`]), and a pool's autoscaling ([`autoscaling`]).

pub mod autoscaling;
pub mod inputs;
pub mod objects;
pub mod owners;
