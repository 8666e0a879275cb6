//! yirage-core: the pure-Rust heart of yirage.
//!
//! * [`kernel_graph`] / [`block_graph`]: the validated µGraph IR (kernel and thread-block
//!   levels), with shape rules in [`shape`] and the phase rule in [`phase`];
//! * [`json`]: canonical serialisation and content hash;
//! * [`exec`] over a [`domain::Domain`]: the single executor, used by the float64
//!   [`reference`] evaluator and the finite-field [`fingerprint`]s ([`field`]).

pub mod block_graph;
pub mod canon;
pub mod cost;
pub mod dense;
pub mod domain;
pub mod dtype;
pub mod error;
pub mod exec;
pub mod field;
pub mod fingerprint;
pub mod json;
pub mod kernel_graph;
pub mod masked_loop;
pub mod ops;
pub mod phase;
pub mod plan;
pub mod reference;
pub mod search;
pub mod shape;
#[cfg(test)]
mod tests;

pub use block_graph::BlockGraph;
pub use dense::{Dense, Tensor};
pub use dtype::DType;
pub use error::{CoreError, ErrorKind, Result};
pub use fingerprint::{equivalent, fingerprint, FINGERPRINT_SCHEME};
pub use kernel_graph::KernelGraph;
pub use ops::{AccumKind, BinaryOp, UnaryOp};
pub use reference::evaluate;

/// Crate version (the Python module's `__version__`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
