//! Element types of tensors.
//!
//! The IR only records the dtype so code generators know what to load and store and so
//! mixed-dtype graphs are rejected early; the reference evaluator and the fingerprints
//! compute in f64 / the finite field regardless of dtype.

use crate::error::{dtype_err, Result};

/// Supported element types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F16,
    BF16,
    F32,
}

impl DType {
    /// The canonical (numpy/torch-style) name used in the API and JSON.
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
        }
    }

    /// Parse a canonical name.
    pub fn parse(s: &str) -> Result<DType> {
        match s {
            "float16" => Ok(DType::F16),
            "bfloat16" => Ok(DType::BF16),
            "float32" => Ok(DType::F32),
            other => dtype_err(format!(
                "unsupported dtype {other:?}: expected one of \"float16\", \"bfloat16\", \"float32\""
            )),
        }
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Check that every dtype equals the first; `what` names the op for the message.
pub(crate) fn same_dtype(what: &str, dtypes: &[DType]) -> Result<DType> {
    let Some(&first) = dtypes.first() else {
        return dtype_err(format!("{what}: no operands"));
    };
    if let Some(&other) = dtypes.iter().find(|&&d| d != first) {
        return dtype_err(format!(
            "{what}: mixed dtypes {first} and {other}; all operands must have the same dtype (cast first)"
        ));
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in [DType::F16, DType::BF16, DType::F32] {
            assert_eq!(DType::parse(d.name()).unwrap(), d);
        }
        assert!(DType::parse("int8").is_err());
        assert_eq!(
            same_dtype("add", &[DType::F16, DType::F32])
                .unwrap_err()
                .kind(),
            crate::ErrorKind::DType
        );
    }
}
