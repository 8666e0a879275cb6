//! Shape rules shared by the kernel and the thread-block level.
//!
//! Conventions (documented once, used everywhere):
//! * a tensor has 1 to [`MAX_RANK`] dims, every dim ≥ 1 (no empty tensors), and at most
//!   [`MAX_ELEMS`] elements (so index arithmetic never overflows);
//! * dim arguments may be negative, Python style (-1 = last), and are normalised to
//!   non-negative indices before they are stored;
//! * kernel-level elementwise binary ops follow **numpy broadcasting**
//!   ([`numpy_broadcast_dims`]): dims are aligned from the right, a missing leading dim counts
//!   as 1, and per dim the sizes must be equal or one of them 1. Thread-block tiles (and the
//!   graphs the search builds, see [`crate::canon`]) use the equal-rank special case
//!   ([`broadcast_dims`]), so code generators never see rank promotion;
//! * matmul: both operands rank ≥ 2 and equal rank; leading (batch) dims equal; A's last
//!   dim equals B's dim -2.

use crate::error::{shape_err, Result};

/// Maximum tensor rank.
pub const MAX_RANK: usize = 4;
/// Maximum number of elements of one tensor (2^40).
pub const MAX_ELEMS: u64 = 1 << 40;

/// Dims of a tensor, outermost first.
pub type Dims = Vec<usize>;

/// Render dims as `[8,4096]` for messages.
pub fn fmt_dims(d: &[usize]) -> String {
    let inner: Vec<String> = d.iter().map(|x| x.to_string()).collect();
    format!("[{}]", inner.join(","))
}

/// Number of elements (dims are validated, so no overflow).
pub fn numel(d: &[usize]) -> usize {
    d.iter().product()
}

/// Element count computed without overflow (saturating at u64::MAX).
pub fn numel_saturating(d: &[usize]) -> u64 {
    d.iter().fold(1u64, |acc, &x| acc.saturating_mul(x as u64))
}

/// Check a derived result shape against [`MAX_ELEMS`].
pub fn check_elems(what: &str, d: &[usize]) -> Result<()> {
    if numel_saturating(d) > MAX_ELEMS {
        return shape_err(format!(
            "{what}: result {} would have more than 2^40 elements",
            fmt_dims(d)
        ));
    }
    Ok(())
}

/// Validate user-given dims: rank 1..=4, every dim ≥ 1, element count ≤ 2^40.
pub fn validate_dims(what: &str, dims: &[i64]) -> Result<Dims> {
    if dims.is_empty() || dims.len() > MAX_RANK {
        return shape_err(format!(
            "{what}: dims {dims:?} have rank {}; expected 1 to {MAX_RANK} dims",
            dims.len()
        ));
    }
    let mut total: u64 = 1;
    let mut out = Vec::with_capacity(dims.len());
    for &d in dims {
        if d < 1 {
            return shape_err(format!(
                "{what}: dims {dims:?} contain {d}; every dim must be ≥ 1"
            ));
        }
        total = total.saturating_mul(d as u64);
        if total > MAX_ELEMS {
            return shape_err(format!(
                "{what}: dims {dims:?} have more than 2^40 elements"
            ));
        }
        out.push(d as usize);
    }
    Ok(out)
}

/// Validate already-unsigned dims (used when replaying JSON and for derived tiles).
pub fn validate_udims(what: &str, dims: &[u64]) -> Result<Dims> {
    let as_i: Vec<i64> = dims
        .iter()
        .map(|&d| d.min(i64::MAX as u64) as i64)
        .collect();
    validate_dims(what, &as_i)
}

/// Normalise a possibly negative dim index against `rank`.
pub fn norm_dim(what: &str, dim: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    if dim < -r || dim >= r {
        return shape_err(format!(
            "{what}: dim {dim} is out of range for a tensor of rank {rank} (valid: {} to {})",
            -r,
            r - 1
        ));
    }
    Ok(if dim < 0 {
        (dim + r) as usize
    } else {
        dim as usize
    })
}

/// Could `matmul_dims` accept these operands? (Checked before calling it: it formats its
/// error messages, and the search asks millions of times.)
pub fn matmul_fits(a: &[usize], b: &[usize]) -> bool {
    let r = a.len();
    r >= 2 && b.len() == r && a[..r - 2] == b[..r - 2] && a[r - 1] == b[r - 2]
}

/// Could `broadcast_dims` accept these operands? (Equal-rank size-1 broadcasting.)
pub fn broadcast_fits(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| x == y || x == 1 || y == 1)
}

/// Output dims of `A · B` (see module doc for the rule).
pub fn matmul_dims(what: &str, a: &[usize], b: &[usize]) -> Result<Dims> {
    // formatted only on error: the search calls this for every candidate matmul
    let ab = || format!("{what}: A{} · B{}", fmt_dims(a), fmt_dims(b));
    if a.len() < 2 || b.len() < 2 {
        return shape_err(format!("{}: both operands need at least 2 dims", ab()));
    }
    if a.len() != b.len() {
        return shape_err(format!(
            "{}: operands must have the same rank (batch dims are not broadcast)",
            ab()
        ));
    }
    let r = a.len();
    if a[..r - 2] != b[..r - 2] {
        return shape_err(format!(
            "{}: batch dims {} and {} must be equal",
            ab(),
            fmt_dims(&a[..r - 2]),
            fmt_dims(&b[..r - 2])
        ));
    }
    if a[r - 1] != b[r - 2] {
        return shape_err(format!(
            "{}: A's last dim ({}) must equal B's dim -2 ({})",
            ab(),
            a[r - 1],
            b[r - 2]
        ));
    }
    let mut out = a.to_vec();
    out[r - 1] = b[r - 1];
    check_elems(what, &out)?;
    Ok(out)
}

/// The broadcasting rule, quoted in error messages.
pub const NUMPY_RULE: &str = "numpy broadcasting: dims are aligned from the right, a missing leading dim counts as 1, and each pair of sizes must be equal or one of them 1";

/// `d` with leading size-1 dims up to `rank` (unchanged when already that long).
pub fn promote_dims(d: &[usize], rank: usize) -> Dims {
    let mut out = vec![1; rank.saturating_sub(d.len())];
    out.extend_from_slice(d);
    out
}

/// Output dims of a kernel-level elementwise binary op under numpy broadcasting
/// (right-aligned, missing leading dims = 1, sizes equal or 1).
pub fn numpy_broadcast_dims(what: &str, a: &[usize], b: &[usize]) -> Result<Dims> {
    let r = a.len().max(b.len());
    let (pa, pb) = (promote_dims(a, r), promote_dims(b, r));
    let mut out = Vec::with_capacity(r);
    for (i, (&x, &y)) in pa.iter().zip(&pb).enumerate() {
        if x == y || y == 1 {
            out.push(x);
        } else if x == 1 {
            out.push(y);
        } else {
            return shape_err(format!(
                "{what}: {} and {} do not broadcast at dim {} ({x} vs {y}); {NUMPY_RULE}",
                fmt_dims(a),
                fmt_dims(b),
                i as i64 - r as i64
            ));
        }
    }
    check_elems(what, &out)?;
    Ok(out)
}

/// Output dims of an elementwise binary op (size-1 broadcasting, equal rank): the rule of
/// thread-block tiles and of the (rank-canonical) graphs the search builds.
pub fn broadcast_dims(what: &str, a: &[usize], b: &[usize]) -> Result<Dims> {
    if a.len() != b.len() {
        return shape_err(format!(
            "{what}: {} and {} have different ranks; broadcasting needs equal rank (reshape to add size-1 dims)",
            fmt_dims(a),
            fmt_dims(b)
        ));
    }
    let out: Dims = a
        .iter()
        .zip(b)
        .enumerate()
        .map(|(i, (&x, &y))| {
            if x == y || y == 1 {
                Ok(x)
            } else if x == 1 {
                Ok(y)
            } else {
                shape_err(format!(
                    "{what}: {} and {} do not broadcast at dim {i} ({x} vs {y}); sizes must be equal or 1",
                    fmt_dims(a),
                    fmt_dims(b)
                ))
            }
        })
        .collect::<Result<_>>()?;
    check_elems(what, &out)?;
    Ok(out)
}

/// Dims after a keepdim reduction of `dim` (already normalised).
pub fn keepdim_dims(d: &[usize], dim: usize) -> Dims {
    let mut out = d.to_vec();
    out[dim] = 1;
    out
}

/// Dims after concatenating `parts` along `dim` (already normalised).
pub fn concat_dims(what: &str, parts: &[&[usize]], dim: usize) -> Result<Dims> {
    let Some(first) = parts.first() else {
        return shape_err(format!("{what}: needs at least one tensor"));
    };
    let mut out = first.to_vec();
    for p in &parts[1..] {
        let same_rest = p.len() == first.len()
            && p.iter()
                .zip(first.iter())
                .enumerate()
                .all(|(i, (x, y))| i == dim || x == y);
        if !same_rest {
            return shape_err(format!(
                "{what}: {} and {} must agree in every dim except dim {dim}",
                fmt_dims(first),
                fmt_dims(p)
            ));
        }
        out[dim] = out[dim].saturating_add(p[dim]);
    }
    check_elems(what, &out)?;
    Ok(out)
}

/// Row-major strides of `d`.
pub fn strides(d: &[usize]) -> Vec<usize> {
    let mut s = vec![1; d.len()];
    for i in (0..d.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * d[i + 1];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_message_names_both_shapes() {
        let e = matmul_dims("matmul", &[8, 4096], &[512, 768]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "matmul: A[8,4096] · B[512,768]: A's last dim (4096) must equal B's dim -2 (512)"
        );
        assert_eq!(
            matmul_dims("m", &[2, 3, 4], &[2, 4, 5]).unwrap(),
            vec![2, 3, 5]
        );
        assert!(matmul_dims("m", &[2, 3, 4], &[3, 4, 5]).is_err());
    }

    #[test]
    fn broadcast_rules() {
        assert_eq!(broadcast_dims("add", &[4, 1], &[1, 5]).unwrap(), vec![4, 5]);
        assert!(broadcast_dims("add", &[4, 2], &[4, 3]).is_err());
        assert!(broadcast_dims("add", &[4], &[1, 4]).is_err());
        assert!(broadcast_dims("add", &[1 << 39, 1], &[1, 1 << 39]).is_err());
        assert!(matmul_dims("m", &[1 << 39, 1], &[1, 1 << 39]).is_err());
        // numpy rule: right-aligned, missing leading dims are 1
        assert_eq!(
            numpy_broadcast_dims("add", &[8, 64], &[64]).unwrap(),
            vec![8, 64]
        );
        assert_eq!(
            numpy_broadcast_dims("add", &[3, 1, 5], &[4, 1]).unwrap(),
            vec![3, 4, 5]
        );
        assert_eq!(
            numpy_broadcast_dims("add", &[1], &[2, 3]).unwrap(),
            vec![2, 3]
        );
        let e = numpy_broadcast_dims("add(t0, t1)", &[8, 64], &[32]).unwrap_err();
        let m = e.to_string();
        assert!(m.contains("[8,64]") && m.contains("[32]") && m.contains("dim -1"));
        assert!(m.contains("aligned from the right"), "{m}");
        assert_eq!(promote_dims(&[4], 3), vec![1, 1, 4]);
        assert_eq!(promote_dims(&[2, 4], 2), vec![2, 4]);
    }

    #[test]
    fn dims_validation() {
        assert!(validate_dims("x", &[]).is_err());
        assert!(validate_dims("x", &[1, 2, 3, 4, 5]).is_err());
        assert!(validate_dims("x", &[0]).is_err());
        assert!(validate_dims("x", &[-3]).is_err());
        assert!(validate_dims("x", &[1 << 21, 1 << 21]).is_err());
        assert_eq!(norm_dim("r", -1, 3).unwrap(), 2);
        assert!(norm_dim("r", 3, 3).is_err());
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(
            concat_dims("c", &[&[2, 3], &[2, 5]], 1).unwrap(),
            vec![2, 8]
        );
        assert!(concat_dims("c", &[&[2, 3], &[3, 5]], 1).is_err());
    }
}
