//! The single error type of the core.
//!
//! Every fallible entry point returns [`CoreError`]. Messages are written for the
//! person who built the graph: they name the offending tensor/op, the shape that was
//! expected and, where there is one, the fix. [`CoreError::kind`] gives the coarse
//! category that the Python binding maps onto its exception classes.

use thiserror::Error;

/// Coarse error category; the binding maps each onto one Python exception class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Dims that do not fit the operator.
    Shape,
    /// Unsupported dtype or mixed dtypes.
    DType,
    /// Malformed graph: unknown tensor id, bad op name/params, no outputs.
    Graph,
    /// Thread-block mapping problem (imap/fmap/omap, phases, grid/block/forloop ranges).
    Mapping,
    /// Invalid or unsupported JSON.
    Serialization,
    /// Inputs given to an evaluator do not match the graph.
    Evaluation,
}

/// The core's error: a category plus a human-readable message.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CoreError {
    #[error("{0}")]
    Shape(String),
    #[error("{0}")]
    DType(String),
    #[error("{0}")]
    Graph(String),
    #[error("{0}")]
    Mapping(String),
    #[error("{0}")]
    Serialization(String),
    #[error("{0}")]
    Evaluation(String),
}

impl CoreError {
    /// The category of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CoreError::Shape(_) => ErrorKind::Shape,
            CoreError::DType(_) => ErrorKind::DType,
            CoreError::Graph(_) => ErrorKind::Graph,
            CoreError::Mapping(_) => ErrorKind::Mapping,
            CoreError::Serialization(_) => ErrorKind::Serialization,
            CoreError::Evaluation(_) => ErrorKind::Evaluation,
        }
    }

    /// The message without the category.
    pub fn message(&self) -> &str {
        match self {
            CoreError::Shape(m)
            | CoreError::DType(m)
            | CoreError::Graph(m)
            | CoreError::Mapping(m)
            | CoreError::Serialization(m)
            | CoreError::Evaluation(m) => m,
        }
    }

    /// Same category, message prefixed with `prefix: ` (used to say where an error arose,
    /// e.g. which op of a JSON document failed to replay).
    pub fn context(self, prefix: impl std::fmt::Display) -> CoreError {
        let wrap = |m: String| format!("{prefix}: {m}");
        match self {
            CoreError::Shape(m) => CoreError::Shape(wrap(m)),
            CoreError::DType(m) => CoreError::DType(wrap(m)),
            CoreError::Graph(m) => CoreError::Graph(wrap(m)),
            CoreError::Mapping(m) => CoreError::Mapping(wrap(m)),
            CoreError::Serialization(m) => CoreError::Serialization(wrap(m)),
            CoreError::Evaluation(m) => CoreError::Evaluation(wrap(m)),
        }
    }
}

/// Result alias used throughout the core.
pub type Result<T> = std::result::Result<T, CoreError>;

/// Shorthand constructors, so call sites read `shape_err(format!(..))`.
pub(crate) fn shape_err<T>(m: impl Into<String>) -> Result<T> {
    Err(CoreError::Shape(m.into()))
}
pub(crate) fn graph_err<T>(m: impl Into<String>) -> Result<T> {
    Err(CoreError::Graph(m.into()))
}
pub(crate) fn mapping_err<T>(m: impl Into<String>) -> Result<T> {
    Err(CoreError::Mapping(m.into()))
}
pub(crate) fn dtype_err<T>(m: impl Into<String>) -> Result<T> {
    Err(CoreError::DType(m.into()))
}
pub(crate) fn eval_err<T>(m: impl Into<String>) -> Result<T> {
    Err(CoreError::Evaluation(m.into()))
}
