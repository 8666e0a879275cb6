//! Shifted partial outputs carried across kernels (flash-decoding), decided once per plan.
//!
//! A generated kernel whose safe-softmax group leaves outputs shifted by its running row max
//! (`scale_outputs`: shift degree 1, e.g. the partial numerators and denominators of split-KV
//! attention) stores them as they are, carrying `exp(−m)`, and stores `m` into an extra
//! intermediate buffer laid out like the outputs with one column per block of output columns
//! (`shift_store`). Un-shifting them by `exp(m)` before the store overflows fp32 once logits
//! pass ~88, although the graph's values are finite.
//!
//! Every kernel that reads such a buffer must undo the shift without overflow. A generated
//! kernel gets `shift_load` on those inputs (where the maxima of each loaded tile are) and a
//! `shift_carry` group: it keeps a running max `M` per row over the loaded maxima, multiplies
//! each loaded tile by `exp(m − M)` and rescales the listed accumulators by
//! `exp(M_old − M_new)`. That is exact when every output of the kernel is a ratio of such
//! values (shift degree 0, as the split-KV combine `Σ N_s / Σ D_s`) and the shifted values
//! never mix rows. Any other reader (a library kernel, a graph output, an output that keeps
//! the shift, rows that mix) fails the lowering with a MappingError, so the search never
//! offers such a candidate.

use super::{Buffer, GeneratedKernel, KernelPlan, Offset, PlanKernel, TileIo, TileOp};
use crate::cost::DeviceSpec;
use crate::error::{CoreError, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where a producer stores its running row max (on its safe-softmax group).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShiftStore {
    pub buffer: usize,
    pub tile: Vec<usize>,
    pub offsets: Vec<Vec<Offset>>,
}

/// Where a consumer finds the maxima of one shifted input tile (on the input): a tile of the
/// `m` buffer whose column `c` holds the max of the input tile's columns
/// `c·width .. (c+1)·width`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShiftLoad {
    pub buffer: usize,
    pub tile: Vec<usize>,
    pub offsets: Vec<Vec<Offset>>,
    pub width: usize,
}

/// A consumer's undoing of the shift: its shifted inputs (indices into `inputs`) and the
/// accumulators rescaled to the running max (empty when the shifted inputs are loaded once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShiftCarry {
    pub inputs: Vec<usize>,
    pub accums: Vec<usize>,
}

/// A shifted buffer: the `m` buffer holding its maxima, its columns per `m` column, and the
/// kernel that wrote it (for messages).
#[derive(Debug, Clone)]
struct Shifted {
    m_buffer: usize,
    width: usize,
    producer: String,
}

/// `plan` with every shifted output stored with its maxima and every reader of one undoing
/// the shift (see the module docs); a MappingError where a reader cannot.
pub(super) fn carried(mut plan: KernelPlan, spec: &DeviceSpec) -> Result<KernelPlan> {
    let mut shifted: BTreeMap<usize, Shifted> = BTreeMap::new();
    for kernel in &mut plan.kernels {
        match kernel {
            PlanKernel::Library(l) => {
                if let Some(b) = l.inputs.iter().find(|b| shifted.contains_key(b)) {
                    return Err(CoreError::Mapping(format!(
                        "kernel plan: library kernel {:?} reads buffer {b}, which {} stores \
                         shifted by its running max; only a generated kernel forming a ratio \
                         of the shifted partials can undo the shift",
                        l.op, shifted[b].producer
                    )));
                }
            }
            PlanKernel::Generated(k) => {
                carry_into(k, &shifted, spec)?;
                store_shifts(k, &mut plan.buffers, &mut shifted)?;
            }
        }
    }
    Ok(plan)
}

/// A tile of a max buffer: (tile, offsets).
type MaxWindow = (Vec<usize>, Vec<Vec<Offset>>);

/// The window of an `m` buffer that holds the maxima of a tile (`tile`, `offsets`) of a
/// buffer with `width` columns per max: (tile, offsets) of the `m` buffer, or None where the
/// tile or a step splits such a block of columns.
fn m_window(tile: &[usize], offsets: &[Vec<Offset>], width: usize) -> Option<MaxWindow> {
    let cols = *tile.last()?;
    if width == 0 || cols % width != 0 {
        return None;
    }
    let mut m_offsets = offsets.to_vec();
    for t in m_offsets.last_mut()?.iter_mut() {
        if t.stride % width != 0 {
            return None;
        }
        t.stride /= width;
    }
    let mut m_tile = tile.to_vec();
    *m_tile.last_mut()? = cols / width;
    Some((m_tile, m_offsets))
}

/// Dims of the `m` buffer of a shifted buffer of `dims` with `width` columns per max.
fn m_dims(dims: &[usize], width: usize) -> Option<Vec<usize>> {
    let (&cols, lead) = dims.split_last()?;
    (width > 0 && cols % width == 0).then(|| [lead, &[cols / width]].concat())
}

/// Producer side: every safe-softmax group with shifted outputs gets an `m` buffer and a
/// `shift_store`; its outputs' buffers become shifted.
fn store_shifts(
    k: &mut GeneratedKernel,
    buffers: &mut Vec<Buffer>,
    shifted: &mut BTreeMap<usize, Shifted>,
) -> Result<()> {
    let name = k.name.clone();
    let err = |msg: String| CoreError::Mapping(format!("kernel plan: {name}: {msg}"));
    let mut listed = vec![false; k.outputs.len()];
    for gi in 0..k.safe_softmax.len() {
        let g = &k.safe_softmax[gi];
        if g.scale_outputs.is_empty() {
            continue;
        }
        let exp = op(&k.ops, g.exp).ok_or_else(|| err(format!("no exp op {}", g.exp)))?;
        let rows = &exp.dims[..exp.dims.len() - 1];
        let mut layout: Option<(Vec<usize>, MaxWindow)> = None;
        for &oi in &g.scale_outputs {
            let out = k
                .outputs
                .get(oi)
                .ok_or_else(|| err(format!("scale_outputs names output #{oi}")))?;
            if std::mem::replace(&mut listed[oi], true) {
                return Err(err(format!(
                    "output #{oi} carries the shift of two running maxima; a reader can undo one"
                )));
            }
            let buf = &buffers[out.buffer];
            if buf.role != "intermediate" {
                return Err(err(format!(
                    "output #{oi} (graph {} #{}) would leave the plan shifted by the running \
                     max of exp op {}; only a later generated kernel can undo the shift",
                    buf.role,
                    buf.index.unwrap_or(0),
                    g.exp
                )));
            }
            if out.tile[..out.tile.len() - 1] != *rows {
                return Err(err(format!(
                    "shifted output #{oi} tile {:?} does not have the rows of exp op {} {:?}",
                    out.tile, g.exp, exp.dims
                )));
            }
            let width = out.tile[out.tile.len() - 1];
            let here = m_dims(&buf.dims, width)
                .zip(m_window(&out.tile, &out.offsets, width))
                .ok_or_else(|| {
                    err(format!(
                        "shifted output #{oi}: its column blocks do not tile buffer {}",
                        out.buffer
                    ))
                })?;
            if layout.as_ref().is_some_and(|first| *first != here) {
                return Err(err(format!(
                    "shifted outputs of exp op {} lay out their column blocks differently; \
                     one max buffer cannot serve both",
                    g.exp
                )));
            }
            shifted.insert(
                out.buffer,
                Shifted {
                    m_buffer: buffers.len(),
                    width,
                    producer: name.clone(),
                },
            );
            layout.get_or_insert(here);
        }
        let (dims, (tile, offsets)) = layout.ok_or_else(|| err("no shifted output".into()))?;
        let id = buffers.len();
        buffers.push(Buffer {
            id,
            dims,
            dtype: "float32".into(),
            role: "intermediate".into(),
            index: None,
        });
        k.safe_softmax[gi].shift_store = Some(ShiftStore {
            buffer: id,
            tile,
            offsets,
        });
    }
    Ok(())
}

fn op(ops: &[TileOp], id: usize) -> Option<&TileOp> {
    ops.iter().find(|o| o.id == id)
}

fn walks_loop(io: &TileIo) -> bool {
    io.offsets.iter().flatten().any(|t| t.var == "iter")
}

/// Consumer side: the `shift_load`s and the `shift_carry` group of a kernel reading shifted
/// buffers, after checking that its outputs do not keep the shift.
fn carry_into(
    k: &mut GeneratedKernel,
    shifted: &BTreeMap<usize, Shifted>,
    spec: &DeviceSpec,
) -> Result<()> {
    let name = k.name.clone();
    let err = |msg: String| CoreError::Mapping(format!("kernel plan: {name}: {msg}"));
    let reads: Vec<usize> = (0..k.inputs.len())
        .filter(|&i| shifted.contains_key(&k.inputs[i].buffer))
        .collect();
    let Some(&first) = reads.first() else {
        return Ok(());
    };
    let source = &shifted[&k.inputs[first].buffer];
    let mut loads = vec![];
    for &i in &reads {
        let io = &k.inputs[i];
        let s = &shifted[&io.buffer];
        if s.m_buffer != source.m_buffer {
            return Err(err(format!(
                "reads partials shifted by two running maxima ({} and {}); one kernel can \
                 undo one",
                source.producer, s.producer
            )));
        }
        if walks_loop(io) != walks_loop(&k.inputs[first]) {
            return Err(err(
                "loads some shifted partials once and walks others with its loop".into(),
            ));
        }
        let (tile, offsets) = m_window(&io.tile, &io.offsets, s.width).ok_or_else(|| {
            err(format!(
                "input #{i} reads buffer {} in tiles that split the {} columns of one \
                     running max",
                io.buffer, s.width
            ))
        })?;
        if io.tile[..io.tile.len() - 1] != k.inputs[first].tile[..io.tile.len() - 1] {
            return Err(err(format!(
                "shifted inputs #{first} and #{i} have different rows ({:?}, {:?})",
                k.inputs[first].tile, io.tile
            )));
        }
        loads.push((
            i,
            ShiftLoad {
                buffer: s.m_buffer,
                tile,
                offsets,
                width: s.width,
            },
        ));
    }
    let rows = k.inputs[first].tile[..k.inputs[first].tile.len() - 1].to_vec();
    let sources: Vec<usize> = k
        .ops
        .iter()
        .filter(|o| o.op == "input" && o.input.is_some_and(|i| reads.contains(&i)))
        .map(|o| o.id)
        .collect();
    let deg = carry_degrees(&k.ops, &sources, &rows);
    for (j, out) in k.outputs.iter().enumerate() {
        let d = deg.get(&out.src).copied().flatten();
        if d != Some(0) {
            return Err(err(format!(
                "output #{j} keeps the shift of {}'s partials (degree {d:?}; None: not a \
                 monomial in exp(-m), or rows mixed); only a ratio of the shifted partials \
                 that keeps their rows (degree 0) undoes it",
                source.producer
            )));
        }
    }
    let mut accums = vec![];
    for o in k.ops.iter().filter(|o| o.op == "accum") {
        match deg.get(&o.id).copied().flatten() {
            Some(0) => {}
            Some(1) => accums.push(o.id),
            d => {
                return Err(err(format!(
                    "accumulator {} holds the shifted partials with degree {d:?}; only \
                     degree 1 can be rescaled",
                    o.id
                )))
            }
        }
    }
    if !walks_loop(&k.inputs[first]) {
        accums.clear(); // loaded once: the running max is final before the loop starts
    }
    let extra: u64 = loads
        .iter()
        .map(|(_, l)| (l.tile.iter().product::<usize>() * super::INTERMEDIATE_BYTES) as u64)
        .sum();
    if k.smem_bytes + extra > spec.shared_mem_per_block {
        return Err(err(format!(
            "needs {} bytes of shared memory per block with its running maxima; the device \
             has {}",
            k.smem_bytes + extra,
            spec.shared_mem_per_block
        )));
    }
    k.smem_bytes += extra;
    for (i, load) in loads {
        k.inputs[i].shift_load = Some(load);
    }
    k.shift_carry = Some(ShiftCarry {
        inputs: reads,
        accums,
    });
    Ok(())
}

/// Shift degree of every op in the carried `exp(−M)` (the loads in `sources` have degree 1),
/// None where the value is not such a monomial or its rows mix: a shifted value must keep
/// the rows `rows` of the shifted loads, so it may only be reduced or concatenated along
/// its last dim and only be the A operand of a matmul.
fn carry_degrees(
    ops: &[TileOp],
    sources: &[usize],
    rows: &[usize],
) -> BTreeMap<usize, Option<i32>> {
    let mut deg: BTreeMap<usize, Option<i32>> = BTreeMap::new();
    for o in ops {
        let args: Vec<Option<i32>> = o
            .args
            .iter()
            .flatten()
            .map(|a| deg.get(a).copied().flatten())
            .collect();
        let last = o.dims.len() - 1;
        let along_last = !matches!(o.dim, Some(d) if d != last);
        let d = if o.op == "input" {
            Some(i32::from(sources.contains(&o.id)))
        } else if args.iter().any(Option::is_none) {
            None
        } else {
            let a: Vec<i32> = args.into_iter().flatten().collect();
            let all_zero = a.iter().all(|&x| x == 0);
            match o.op.as_str() {
                "matmul" if a[1] == 0 => Some(a[0]),
                "binary" => match o.binop.as_deref() {
                    Some("mul") => Some(a[0] + a[1]),
                    Some("div") => Some(a[0] - a[1]),
                    Some("add" | "sub") if a[0] == a[1] => Some(a[0]),
                    _ if all_zero => Some(0),
                    _ => None,
                },
                "unary" if matches!(o.unop.as_deref(), Some("neg" | "mul_scalar")) => Some(a[0]),
                "reduction" | "reduction_to_dimx" | "concat" if along_last || all_zero => {
                    a.first().copied().filter(|&x| a.iter().all(|&y| y == x))
                }
                "accum" if o.acc.as_deref() != Some("rms") || all_zero => Some(a[0]),
                _ if all_zero => Some(0),
                _ => None,
            }
        };
        let d = d.filter(|&x| x == 0 || o.dims[..last] == *rows);
        deg.insert(o.id, d);
    }
    deg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_graph::BlockGraph;
    use crate::dtype::DType;
    use crate::kernel_graph::{KernelGraph, TensorId};
    use crate::ops::{AccumKind, BinaryOp, UnaryOp};
    use crate::plan::lower;
    use crate::ErrorKind;

    const B: i64 = 2;
    const M: i64 = 4;
    const D: i64 = 16;
    const N: i64 = 256;
    const S: i64 = 4;

    /// Split-KV attention's first kernel: grid (B, 1, S), each block's loop walking its KV
    /// slice in 2 chunks; outputs the partial numerators [B, M, S·D] and sums [B, M, S].
    fn partials(g: &mut KernelGraph) -> (TensorId, TensorId) {
        let q = g.new_input(&[B, M, D], DType::F32).unwrap();
        let k = g.new_input(&[B, D, N], DType::F32).unwrap();
        let v = g.new_input(&[B, N, D], DType::F32).unwrap();
        let mut bg = BlockGraph::new([B, 1, S], [128, 1, 1], 2, 1).unwrap();
        let tq = bg
            .new_input(&[B, M, D], DType::F32, [0, -1, -1], -1)
            .unwrap();
        let tk = bg.new_input(&[B, D, N], DType::F32, [0, -1, 2], 2).unwrap();
        let tv = bg.new_input(&[B, N, D], DType::F32, [0, -1, 1], 1).unwrap();
        let s = bg.matmul(tq, tk).unwrap();
        let e = bg.unary(UnaryOp::Exp, s).unwrap();
        let o = bg.matmul(e, tv).unwrap();
        let num = bg.forloop_accum(o, AccumKind::Iter).unwrap();
        let den = bg.forloop_accum(e, AccumKind::Sum).unwrap();
        bg.new_output(num, [0, -1, 2]).unwrap();
        bg.new_output(den, [0, -1, 2]).unwrap();
        let outs = g.customized(&[q, k, v], &bg).unwrap();
        (outs[0], outs[1])
    }

    /// The combine: walks the S partials with its loop (`walk`) or loads them all once and
    /// sums them with `sum_todimx` / `sum`; `keep_shift` stores the numerator sum alone,
    /// `mix_rows` sums the partials over the query rows before the ratio.
    fn combine(walk: bool, keep_shift: bool, mix_rows: bool) -> KernelGraph {
        let mut g = KernelGraph::new();
        let (num, den) = partials(&mut g);
        let f = if walk { S } else { 1 };
        let fmap = if walk { 2 } else { -1 };
        let mut bg = BlockGraph::new([B, 1, 1], [128, 1, 1], f, D).unwrap();
        let mut tn = bg
            .new_input(&[B, M, S * D], DType::F32, [0, -1, -1], fmap)
            .unwrap();
        let mut td = bg
            .new_input(&[B, M, S], DType::F32, [0, -1, -1], fmap)
            .unwrap();
        if mix_rows {
            tn = bg.reduction(tn, 1).unwrap();
            td = bg.reduction(td, 1).unwrap();
        }
        let (an, ad) = if walk {
            let an = bg.forloop_accum(tn, AccumKind::Iter).unwrap();
            (an, bg.forloop_accum(td, AccumKind::Iter).unwrap())
        } else {
            let an = bg.forloop_accum(tn, AccumKind::SumToDimx).unwrap();
            (an, bg.forloop_accum(td, AccumKind::Sum).unwrap())
        };
        let out = if keep_shift {
            an
        } else {
            bg.binary(BinaryOp::Div, an, ad).unwrap()
        };
        bg.new_output(out, [0, -1, -1]).unwrap();
        let o = g.customized(&[num, den], &bg).unwrap();
        g.mark_output(o[0]).unwrap();
        g
    }

    fn generated(plan: &KernelPlan, i: usize) -> &GeneratedKernel {
        match &plan.kernels[i] {
            PlanKernel::Generated(k) => k,
            PlanKernel::Library(_) => panic!("kernel {i} is a library kernel"),
        }
    }

    fn terms(v: &[(&str, usize)]) -> Vec<Offset> {
        v.iter()
            .map(|&(var, stride)| Offset {
                var: var.into(),
                stride,
            })
            .collect()
    }

    fn mapping_error(g: &KernelGraph) -> String {
        let e = lower(g, &DeviceSpec::h100()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Mapping, "{e}");
        e.to_string()
    }

    #[test]
    fn split_kv_partials_are_stored_shifted_with_their_maxima() {
        let plan = lower(&combine(true, false, false), &DeviceSpec::h100()).unwrap();
        assert_eq!(plan.version, super::super::VERSION);
        let m = plan.buffers.last().unwrap();
        assert_eq!(
            (m.role.as_str(), m.dtype.as_str()),
            ("intermediate", "float32")
        );
        // one column per block of the split, like the partial sums
        assert_eq!(m.dims, vec![B as usize, M as usize, S as usize]);
        let k0 = generated(&plan, 0);
        assert_eq!(k0.safe_softmax[0].scale_outputs, vec![0, 1]);
        let store = k0.safe_softmax[0].shift_store.as_ref().unwrap();
        assert_eq!(store.buffer, m.id);
        assert_eq!(store.tile, vec![1, M as usize, 1]);
        let split = vec![terms(&[("bx", 1)]), vec![], terms(&[("bz", 1)])];
        assert_eq!(store.offsets, split);
        assert!(k0.shift_carry.is_none());
        // both sums carry exp(−m) once; P·V adds straight into the numerator
        let rescaled: Vec<(usize, i32)> = k0.safe_softmax[0]
            .rescale
            .iter()
            .map(|r| (r.accum, r.degree))
            .collect();
        assert_eq!(rescaled, vec![(6, 1), (7, 1)]);
        assert_eq!(k0.ops[5].accumulate_into, Some(6));
        // the combine reads split s's maxima beside its partials and rescales both sums
        let k1 = generated(&plan, 1);
        let walk = vec![terms(&[("bx", 1)]), vec![], terms(&[("iter", 1)])];
        for (i, width) in [(0, D as usize), (1, 1)] {
            let load = k1.inputs[i].shift_load.as_ref().unwrap();
            assert_eq!((load.buffer, load.width), (m.id, width));
            assert_eq!(load.tile, vec![1, M as usize, 1]);
            assert_eq!(load.offsets, walk);
        }
        let carry = k1.shift_carry.as_ref().unwrap();
        assert_eq!(carry.inputs, vec![0, 1]);
        let accums: Vec<usize> = k1
            .ops
            .iter()
            .filter(|o| o.op == "accum")
            .map(|o| o.id)
            .collect();
        assert_eq!(carry.accums, accums);
        let json = plan.to_json();
        assert!(json.contains("\"shift_store\"") && json.contains("\"width\":16"));
        assert_eq!(KernelPlan::from_json(&json).unwrap(), plan);
    }

    #[test]
    fn partials_loaded_at_once_need_no_rescale() {
        let plan = lower(&combine(false, false, false), &DeviceSpec::h100()).unwrap();
        let k1 = generated(&plan, 1);
        let load = k1.inputs[0].shift_load.as_ref().unwrap();
        // all S maxima of a row, each covering D columns of the loaded numerators
        assert_eq!(
            (load.tile.clone(), load.width),
            (vec![1, M as usize, S as usize], 16)
        );
        assert_eq!(k1.inputs[1].shift_load.as_ref().unwrap().width, 1);
        assert!(k1.shift_carry.as_ref().unwrap().accums.is_empty());
    }

    #[test]
    fn readers_that_cannot_undo_the_shift_are_rejected() {
        let msg = mapping_error(&combine(true, true, false));
        assert!(msg.contains("keeps the shift"), "{msg}");
        let msg = mapping_error(&combine(true, false, true));
        assert!(msg.contains("keeps the shift"), "{msg}");
        // a library kernel reading a partial
        let mut g = KernelGraph::new();
        let (num, den) = partials(&mut g);
        let r = g.reduction(den, -1).unwrap();
        let n = g.reduction(num, -1).unwrap();
        let y = g.binary(BinaryOp::Div, n, r).unwrap();
        g.mark_output(y).unwrap();
        let msg = mapping_error(&g);
        assert!(msg.contains("library kernel"), "{msg}");
        // a partial as a graph output
        let mut g = KernelGraph::new();
        let (num, den) = partials(&mut g);
        g.mark_output(num).unwrap();
        g.mark_output(den).unwrap();
        let msg = mapping_error(&g);
        assert!(msg.contains("graph output"), "{msg}");
    }
}
