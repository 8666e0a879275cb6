//! A small dense row-major tensor, generic over the value type, with the tensor kernels
//! every executor needs. Kernels take a [`Domain`] for the arithmetic; summation order per
//! output element is fixed (index order), so results do not depend on thread count.

use crate::domain::Domain;
use crate::error::{eval_err, Result};
use crate::ops::{BinaryOp, UnaryOp};
use crate::shape::{fmt_dims, numel, strides, Dims};
use rayon::prelude::*;

/// Work (multiply-adds) above which a matmul is split across rayon threads.
const PAR_MATMUL_WORK: usize = 1 << 15;

/// Dense row-major tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense<V> {
    pub dims: Dims,
    pub data: Vec<V>,
}

/// A float64 tensor (the reference evaluator's inputs/outputs).
pub type Tensor = Dense<f64>;

impl<V: Copy> Dense<V> {
    /// Build, checking `data.len()` against the dims.
    pub fn new(dims: Dims, data: Vec<V>) -> Result<Self> {
        if numel(&dims) != data.len() {
            return eval_err(format!(
                "tensor of dims {} needs {} values, got {}",
                fmt_dims(&dims),
                numel(&dims),
                data.len()
            ));
        }
        Ok(Dense { dims, data })
    }

    /// A tensor filled with `v`.
    pub fn full(dims: &[usize], v: V) -> Self {
        Dense {
            dims: dims.to_vec(),
            data: vec![v; numel(dims)],
        }
    }

    /// Copy the box `[offset, offset + sizes)` out of `self`.
    pub fn slice(&self, offset: &[usize], sizes: &[usize]) -> Self {
        let st = strides(&self.dims);
        let n = numel(sizes);
        let mut data = Vec::with_capacity(n);
        let r = sizes.len();
        let mut idx = vec![0usize; r];
        let inner = sizes[r - 1];
        let rows = n / inner;
        for _ in 0..rows {
            let base: usize = (0..r).map(|k| (offset[k] + idx[k]) * st[k]).sum();
            data.extend_from_slice(&self.data[base..base + inner]);
            // advance the multi-index over all but the last dim
            for k in (0..r.saturating_sub(1)).rev() {
                idx[k] += 1;
                if idx[k] < sizes[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        Dense {
            dims: sizes.to_vec(),
            data,
        }
    }

    /// Write `src` into the box of `self` starting at `offset`.
    /// Dims reordered: output dim `i` is dim `perm[i]` (a permutation of `0..rank`).
    pub fn permute(&self, perm: &[usize]) -> Self {
        let dims: Dims = perm.iter().map(|&d| self.dims[d]).collect();
        let mut in_strides = vec![1usize; self.dims.len()];
        for i in (0..self.dims.len().saturating_sub(1)).rev() {
            in_strides[i] = in_strides[i + 1] * self.dims[i + 1];
        }
        let strides: Vec<usize> = perm.iter().map(|&d| in_strides[d]).collect();
        let mut data = Vec::with_capacity(self.data.len());
        let mut idx = vec![0usize; dims.len()];
        for _ in 0..self.data.len() {
            let src: usize = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
            data.push(self.data[src]);
            for k in (0..dims.len()).rev() {
                idx[k] += 1;
                if idx[k] < dims[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        Dense { dims, data }
    }

    pub fn place(&mut self, src: &Self, offset: &[usize]) {
        let st = strides(&self.dims);
        let sizes = &src.dims;
        let r = sizes.len();
        let inner = sizes[r - 1];
        let mut idx = vec![0usize; r];
        for row in src.data.chunks(inner) {
            let base: usize = (0..r).map(|k| (offset[k] + idx[k]) * st[k]).sum();
            self.data[base..base + inner].copy_from_slice(row);
            for k in (0..r.saturating_sub(1)).rev() {
                idx[k] += 1;
                if idx[k] < sizes[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
    }
}

/// Split dims around `dim` into (outer, len, inner) extents.
fn around(dims: &[usize], dim: usize) -> (usize, usize, usize) {
    (
        dims[..dim].iter().product(),
        dims[dim],
        dims[dim + 1..].iter().product(),
    )
}

/// Pad dims/strides to rank 4 (leading 1s / 0s).
fn pad4(d: &[usize], s: &[usize]) -> ([usize; 4], [usize; 4]) {
    let mut dd = [1; 4];
    let mut ss = [0; 4];
    let off = 4 - d.len();
    dd[off..].copy_from_slice(d);
    ss[off..].copy_from_slice(s);
    (dd, ss)
}

/// Elements of an elementwise op from which it runs on the rayon pool (each element is
/// independent, so the result does not depend on the threads).
const PAR_ELEMENTWISE: usize = 1 << 16;

/// Elementwise unary op.
pub fn unary<D: Domain>(d: &D, op: UnaryOp, x: &Dense<D::V>) -> Dense<D::V> {
    unary_map(x, d.unary_fn(op))
}

/// Elementwise map with a closure.
pub fn map<D: Domain>(x: &Dense<D::V>, f: impl Fn(D::V) -> D::V) -> Dense<D::V> {
    Dense {
        dims: x.dims.clone(),
        data: x.data.iter().map(|&v| f(v)).collect(),
    }
}

/// Elementwise binary op with numpy broadcasting (right-aligned, missing leading dims are
/// 1, sizes equal or 1; dims validated upstream).
pub fn binary_with<D: Domain>(
    a: &Dense<D::V>,
    b: &Dense<D::V>,
    f: impl Fn(D::V, D::V) -> D::V + Sync + Send,
) -> Dense<D::V> {
    let r = a.dims.len().max(b.dims.len());
    let (pa, pb) = (
        crate::shape::promote_dims(&a.dims, r),
        crate::shape::promote_dims(&b.dims, r),
    );
    let out: Dims = pa.iter().zip(&pb).map(|(&x, &y)| x.max(y)).collect();
    if pa == pb {
        let data = if a.data.len() >= PAR_ELEMENTWISE {
            a.data
                .par_iter()
                .zip(&b.data)
                .map(|(&x, &y)| f(x, y))
                .collect()
        } else {
            a.data.iter().zip(&b.data).map(|(&x, &y)| f(x, y)).collect()
        };
        return Dense { dims: out, data };
    }
    // strides of an operand (promoted to rank r), 0 along its broadcast dims
    let bstr = |d: &[usize]| -> Vec<usize> {
        strides(d)
            .iter()
            .zip(d)
            .map(|(&s, &n)| if n == 1 { 0 } else { s })
            .collect()
    };
    let (od, _) = pad4(&out, &strides(&out));
    let (_, sa) = pad4(&pa, &bstr(&pa));
    let (_, sb) = pad4(&pb, &bstr(&pb));
    // one innermost row (the last dim) per task, in order
    let row = |ri: usize| {
        let (i0, i1, i2) = (ri / (od[1] * od[2]), ri / od[2] % od[1], ri % od[2]);
        let ba = i0 * sa[0] + i1 * sa[1] + i2 * sa[2];
        let bb = i0 * sb[0] + i1 * sb[1] + i2 * sb[2];
        (0..od[3]).map(move |i3| (a.data[ba + i3 * sa[3]], b.data[bb + i3 * sb[3]]))
    };
    let rows = od[0] * od[1] * od[2];
    let data = if numel(&out) >= PAR_ELEMENTWISE {
        (0..rows)
            .into_par_iter()
            .flat_map_iter(|ri| row(ri).map(|(x, y)| f(x, y)))
            .collect()
    } else {
        (0..rows)
            .flat_map(|ri| row(ri).map(|(x, y)| f(x, y)))
            .collect()
    };
    Dense { dims: out, data }
}

/// Elementwise binary op from the vocabulary. A divisor with fewer elements than the result
/// (broadcast) is inverted once per element where the domain divides by reciprocals (the
/// field: one exponentiation per inverse), not once per output element.
pub fn binary<D: Domain>(d: &D, op: BinaryOp, a: &Dense<D::V>, b: &Dense<D::V>) -> Dense<D::V> {
    if op == BinaryOp::Div && d.divides_by_reciprocal() && b.data.len() < a.data.len() {
        let inv = unary_map(b, |y| d.recip(y));
        return binary_with::<D>(a, &inv, |x, y| d.mul(x, y));
    }
    binary_with::<D>(a, b, |x, y| d.binary(op, x, y))
}

/// `f` over every element (on the rayon pool when large).
pub(crate) fn unary_map<V: Copy + Send + Sync>(
    x: &Dense<V>,
    f: impl Fn(V) -> V + Sync + Send,
) -> Dense<V> {
    let data = if x.data.len() >= PAR_ELEMENTWISE {
        x.data.par_iter().map(|&v| f(v)).collect()
    } else {
        x.data.iter().map(|&v| f(v)).collect()
    };
    Dense {
        dims: x.dims.clone(),
        data,
    }
}

/// `batch` row-major [k, n] matrices transposed to [n, k], so every dot product of a matmul
/// reads contiguous memory. Columns are copied in blocks of up to 16 (each row of B is read
/// 16 values at a time, not one value per cache line), blocks in parallel on big matrices
/// (the fingerprint of a 4096 x 4096 weight transposes it once per candidate and trial).
fn transposed<D: Domain>(d: &D, b: &[D::V], k: usize, n: usize) -> Vec<D::V> {
    let jb = [16, 8, 4, 2, 1]
        .into_iter()
        .find(|w| n % w == 0)
        .unwrap_or(1);
    let mut bt = vec![d.zero(); b.len()];
    let block = |(i, out): (usize, &mut [D::V])| {
        let (bi, j0) = (i * jb / n, i * jb % n);
        let src = &b[bi * k * n..(bi + 1) * k * n];
        for kk in 0..k {
            let row = &src[kk * n + j0..kk * n + j0 + jb];
            for (jj, &v) in row.iter().enumerate() {
                out[jj * k + kk] = v;
            }
        }
    };
    if b.len() >= PAR_ELEMENTWISE {
        bt.par_chunks_mut(jb * k).enumerate().for_each(block);
    } else {
        bt.chunks_mut(jb * k).enumerate().for_each(block);
    }
    bt
}

/// Batched matmul over equal leading dims (dims validated upstream).
pub fn matmul<D: Domain>(d: &D, a: &Dense<D::V>, b: &Dense<D::V>) -> Dense<D::V> {
    let r = a.dims.len();
    let (m, k, n) = (a.dims[r - 2], a.dims[r - 1], b.dims[r - 1]);
    let batch: usize = a.dims[..r - 2].iter().product();
    let bt = transposed(d, &b.data, k, n);
    let mut dims = a.dims.clone();
    dims[r - 1] = n;
    let mut data = vec![d.zero(); batch * m * n];
    let row = |ri: usize, out: &mut [D::V]| {
        let bi = ri / m;
        let arow = &a.data[ri * k..(ri + 1) * k];
        for (j, o) in out.iter_mut().enumerate() {
            let bcol = &bt[(bi * n + j) * k..(bi * n + j + 1) * k];
            *o = d.dot(k, |kk| (arow[kk], bcol[kk]));
        }
    };
    if batch * m * n * k >= PAR_MATMUL_WORK && batch * m > 1 {
        data.par_chunks_mut(n)
            .enumerate()
            .for_each(|(ri, out)| row(ri, out));
    } else {
        data.chunks_mut(n)
            .enumerate()
            .for_each(|(ri, out)| row(ri, out));
    }
    Dense { dims, data }
}

/// Sum over `dim`, keepdim.
pub fn reduce_sum<D: Domain>(d: &D, x: &Dense<D::V>, dim: usize) -> Dense<D::V> {
    reduce_groups(d, x, dim, 1)
}

/// Reduce `dim` to size `k` by summing strided groups: `out[j] = Σ_g x[g·k + j]`
/// (`x.dims[dim] % k == 0`, validated upstream). Strided, so `k`-wide partial results laid
/// side by side along `dim` (e.g. split-KV partials placed by an omap) add up elementwise.
pub fn reduce_groups<D: Domain>(d: &D, x: &Dense<D::V>, dim: usize, k: usize) -> Dense<D::V> {
    let (outer, len, inner) = around(&x.dims, dim);
    let g = len / k;
    let mut dims = x.dims.clone();
    dims[dim] = k;
    let mut data = Vec::with_capacity(outer * k * inner);
    for o in 0..outer {
        for j in 0..k {
            for i in 0..inner {
                let base = o * len * inner + j * inner + i;
                data.push(d.sum(g, |l| x.data[base + l * k * inner]));
            }
        }
    }
    Dense { dims, data }
}

/// Max over `dim`, keepdim ([`Domain::max_of`] of each row).
pub fn reduce_max<D: Domain>(d: &D, x: &Dense<D::V>, dim: usize) -> Dense<D::V> {
    let (outer, len, inner) = around(&x.dims, dim);
    let mut dims = x.dims.clone();
    dims[dim] = 1;
    let mut data = Vec::with_capacity(outer * inner);
    let mut row = Vec::with_capacity(len);
    for o in 0..outer {
        for i in 0..inner {
            row.clear();
            row.extend((0..len).map(|l| x.data[o * len * inner + l * inner + i]));
            data.push(d.max_of(&row));
        }
    }
    Dense { dims, data }
}

/// `Σ x²` over the last dim, keepdim (used by rms norm and the rms accumulator).
pub fn sum_squares_last<D: Domain>(d: &D, x: &Dense<D::V>) -> Dense<D::V> {
    let r = x.dims.len();
    let sq = map::<D>(x, |v| d.mul(v, v));
    reduce_sum(d, &sq, r - 1)
}

/// `x / sqrt(mean(x²) over the trailing `ntrail` dims + eps) * weight`.
pub fn rms_norm<D: Domain>(
    d: &D,
    x: &Dense<D::V>,
    ntrail: usize,
    weight: Option<&Dense<D::V>>,
    eps: f64,
) -> Dense<D::V> {
    let r = x.dims.len();
    let inner: usize = x.dims[r - ntrail..].iter().product();
    let e = d.constant(eps);
    let mut data = Vec::with_capacity(x.data.len());
    for row in x.data.chunks(inner) {
        let ss = d.sum(inner, |i| d.mul(row[i], row[i]));
        let denom = d.sqrt(d.add(d.div_count(ss, inner), e));
        for (i, &v) in row.iter().enumerate() {
            let y = d.div(v, denom);
            data.push(match weight {
                Some(w) => d.mul(y, w.data[i]),
                None => y,
            });
        }
    }
    Dense {
        dims: x.dims.clone(),
        data,
    }
}

/// `exp(x) / Σ_dim exp(x)`, computed as `exp(x − m) / Σ_dim exp(x − m)` with each row's
/// [`Domain::softmax_shift`] `m` where the domain has one.
pub fn softmax<D: Domain>(d: &D, x: &Dense<D::V>, dim: usize) -> Dense<D::V> {
    let (outer, len, inner) = around(&x.dims, dim);
    let mut shifted = x.clone();
    for o in 0..outer {
        for i in 0..inner {
            let at = |l: usize| o * len * inner + l * inner + i;
            let Some(m) = d.softmax_shift(&mut (0..len).map(|l| x.data[at(l)])) else {
                continue;
            };
            for l in 0..len {
                shifted.data[at(l)] = d.binary(BinaryOp::Sub, x.data[at(l)], m);
            }
        }
    }
    let e = unary(d, UnaryOp::Exp, &shifted);
    let s = reduce_sum(d, &e, dim);
    binary_with::<D>(&e, &s, |a, b| d.div(a, b))
}

/// Concatenate along `dim` (dims validated upstream).
pub fn concat<V: Copy>(xs: &[&Dense<V>], dim: usize) -> Dense<V> {
    let mut dims = xs[0].dims.clone();
    dims[dim] = xs.iter().map(|x| x.dims[dim]).sum();
    let (outer, _, inner) = around(&dims, dim);
    let mut data = Vec::with_capacity(numel(&dims));
    for o in 0..outer {
        for x in xs {
            let span = x.dims[dim] * inner;
            data.extend_from_slice(&x.data[o * span..(o + 1) * span]);
        }
    }
    Dense { dims, data }
}

/// `acc += x` elementwise (same dims).
pub fn add_assign<D: Domain>(d: &D, acc: &mut Dense<D::V>, x: &Dense<D::V>) {
    for (a, &b) in acc.data.iter_mut().zip(&x.data) {
        *a = d.add(*a, b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::F64;

    fn t(dims: &[usize], v: &[f64]) -> Tensor {
        Dense::new(dims.to_vec(), v.to_vec()).unwrap()
    }

    #[test]
    fn large_and_broadcast_elementwise_ops_match_the_scalar_ops() {
        // [8, 64, 300] ÷ [8, 1, 300] and × [300]: over PAR_ELEMENTWISE elements, so the
        // parallel paths and the field's reciprocal-once division run
        use crate::field::{fv_from_key, Fv};
        use crate::fingerprint::FieldDomain;
        let d = FieldDomain::new(1, 0);
        let fill = |dims: &[usize], k: u64| Dense {
            dims: dims.to_vec(),
            data: (0..numel(dims) as u64)
                .map(|j| fv_from_key(k * 1_000_003 + j))
                .collect::<Vec<Fv>>(),
        };
        let a = fill(&[8, 64, 300], 1);
        let b = fill(&[8, 1, 300], 2);
        let c = fill(&[300], 3);
        assert!(a.data.len() >= PAR_ELEMENTWISE);
        let q = binary(&d, BinaryOp::Div, &a, &b);
        let p = binary(&d, BinaryOp::Mul, &a, &c);
        for (i, (&x, (&qv, &pv))) in a.data.iter().zip(q.data.iter().zip(&p.data)).enumerate() {
            let (r, col) = (i / (64 * 300), i % 300);
            assert_eq!(qv, x / b.data[r * 300 + col]);
            assert_eq!(pv, x * c.data[col]);
        }
        let e = unary(&d, UnaryOp::Exp, &a);
        assert!(e
            .data
            .iter()
            .zip(&a.data)
            .all(|(&y, &x)| Some(y) == x.exp(d.exp_base())));
        // the f64 domain divides (no reciprocals): 1/3 ÷ 3 is not (1/3)·(1/3) in general
        let x = t(&[1, 2], &[1.0 / 3.0, 0.1]);
        let y = t(&[1, 1], &[3.0]);
        assert_eq!(
            binary(&F64, BinaryOp::Div, &x, &y).data,
            [1.0 / 3.0 / 3.0, 0.1 / 3.0]
        );
    }

    #[test]
    fn blocked_transpose_matches_the_definition() {
        // column blocks of 16, 2 and 1; one matrix and a batch of three; serial and parallel
        for (batch, k, n) in [(1, 5, 48), (3, 7, 6), (2, 4, 7), (2, 300, 160)] {
            let b: Vec<f64> = (0..batch * k * n).map(|i| i as f64).collect();
            let bt = transposed(&F64, &b, k, n);
            for bi in 0..batch {
                for kk in 0..k {
                    for j in 0..n {
                        let want = b[bi * k * n + kk * n + j];
                        assert_eq!(bt[(bi * n + j) * k + kk], want, "{batch}x{k}x{n}");
                    }
                }
            }
        }
        const { assert!(2 * 300 * 160 >= PAR_ELEMENTWISE) }; // the last one runs in parallel
    }

    #[test]
    fn slice_place_concat() {
        let x = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
        let s = x.slice(&[0, 1], &[2, 2]);
        assert_eq!(s.data, vec![2., 3., 5., 6.]);
        let mut z = Dense::full(&[2, 3], 0.0);
        z.place(&s, &[0, 1]);
        assert_eq!(z.data, vec![0., 2., 3., 0., 5., 6.]);
        let c = concat(&[&x, &s], 1);
        assert_eq!(c.dims, vec![2, 5]);
        assert_eq!(c.data, vec![1., 2., 3., 2., 3., 4., 5., 6., 5., 6.]);
        assert!(Dense::new(vec![2, 2], vec![1.0]).is_err());
    }

    #[test]
    fn kernels_by_hand() {
        let d = F64;
        let a = t(&[2, 2], &[1., 2., 3., 4.]);
        let b = t(&[2, 2], &[5., 6., 7., 8.]);
        assert_eq!(matmul(&d, &a, &b).data, vec![19., 22., 43., 50.]);
        let col = t(&[2, 1], &[10., 20.]);
        assert_eq!(
            binary(&d, BinaryOp::Add, &a, &col).data,
            vec![11., 12., 23., 24.]
        );
        let row = t(&[1, 2], &[1., 2.]);
        assert_eq!(
            binary(&d, BinaryOp::Mul, &col, &row).data,
            vec![10., 20., 20., 40.]
        );
        // rank promotion: [2] broadcasts like [1, 2]
        let v = t(&[2], &[1., 2.]);
        let r = binary(&d, BinaryOp::Add, &a, &v);
        assert_eq!(r.dims, vec![2, 2]);
        assert_eq!(r.data, vec![2., 4., 4., 6.]);
        let r = binary(&d, BinaryOp::Sub, &v, &col);
        assert_eq!(r.data, vec![-9., -8., -19., -18.]);
        assert_eq!(reduce_sum(&d, &a, 0).data, vec![4., 6.]);
        assert_eq!(reduce_sum(&d, &a, 1).data, vec![3., 7.]);
        let x = t(&[1, 4], &[1., 2., 3., 4.]);
        assert_eq!(reduce_groups(&d, &x, 1, 2).data, vec![4., 6.]);
        let r = rms_norm(&d, &t(&[1, 2], &[3., 4.]), 1, None, 0.0);
        let s = (12.5f64).sqrt();
        assert_eq!(r.data, vec![3. / s, 4. / s]);
        let sm = softmax(&d, &t(&[1, 2], &[0., 0.]), 1);
        assert_eq!(sm.data, vec![0.5, 0.5]);
        // past exp's range the row max is subtracted first; a row without finite values
        // keeps the plain formula (NaN, as exp(inf)/inf)
        let sm = softmax(
            &d,
            &t(&[2, 2], &[1000., 1000. + 2f64.ln(), f64::INFINITY, 0.]),
            1,
        );
        assert!((sm.data[0] - 1. / 3.).abs() < 1e-12 && (sm.data[1] - 2. / 3.).abs() < 1e-12);
        assert_eq!(sm.data[3], 0.0);
        assert!(sm.data[2].is_nan());
        // batched matmul
        let a3 = t(&[2, 1, 2], &[1., 2., 3., 4.]);
        let b3 = t(&[2, 2, 1], &[1., 1., 2., 0.5]);
        assert_eq!(matmul(&d, &a3, &b3).data, vec![3., 8.]);
    }
}
