//! JSON form, canonical form and content hash of kernel graphs.
//!
//! The document is a versioned envelope
//! `{"format":"yirage.kernel_graph","version":1,"ops":[…],"outputs":[…]}`; each op is an
//! object tagged by `"op"` with its fields in a fixed order; tensor ids are implicit (each
//! op appends its results in order) and all dims are stored normalised. Floats are printed
//! by serde_json (shortest round-trip form), so `to_json(from_json(to_json(g)))` is
//! byte-identical. `from_json` replays the ops through the validating builders, so a
//! hand-edited document can only yield a well-formed graph or an error.
//!
//! [`to_json`] lists the ops as they were built; [`canonical_json`] lists the same graph in
//! one order whatever the construction order, without the ops no output depends on. The
//! hash is the blake3 hex digest of the canonical form: platform independent (no Rust struct
//! layout, no HashMap order involved).

use crate::block_graph::{BlockGraph, BlockOpKind};
use crate::dtype::DType;
use crate::error::{CoreError, Result};
use crate::kernel_graph::{KernelGraph, KernelOpKind};
use crate::ops::{AccumKind, BinaryOp, UnaryOp};
use serde::{Deserialize, Serialize};

/// Envelope format name.
pub const FORMAT: &str = "yirage.kernel_graph";
/// Envelope version.
pub const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KernelGraphDoc {
    format: String,
    version: u32,
    /// Ranks of a multi-device graph; omitted when 1 (so single-device documents and their
    /// hashes are unchanged).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    world_size: u64,
    ops: Vec<KernelOpDoc>,
    outputs: Vec<u64>,
}

fn one() -> u64 {
    1
}

fn is_one(v: &u64) -> bool {
    *v == 1
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum KernelOpDoc {
    Input {
        dims: Vec<i64>,
        dtype: String,
    },
    Matmul {
        a: u64,
        b: u64,
    },
    Unary {
        kind: String,
        x: u64,
        params: Vec<f64>,
    },
    Binary {
        kind: String,
        a: u64,
        b: u64,
    },
    Reduction {
        x: u64,
        dim: i64,
    },
    RmsNorm {
        x: u64,
        normalized_shape: Vec<i64>,
        weight: Option<u64>,
        eps: f64,
    },
    Softmax {
        x: u64,
        dim: i64,
    },
    Concat {
        xs: Vec<u64>,
        dim: i64,
    },
    Chunk {
        x: u64,
        chunks: i64,
        dim: i64,
        index: i64,
    },
    Customized {
        inputs: Vec<u64>,
        block_graph: BlockGraphDoc,
    },
    AllReduce {
        x: u64,
    },
    Permute {
        x: u64,
        perm: Vec<i64>,
    },
    ReduceMax {
        x: u64,
        dim: i64,
    },
    Reshape {
        x: u64,
        dims: Vec<i64>,
    },
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockGraphDoc {
    grid_dim: [i64; 3],
    block_dim: [i64; 3],
    forloop_range: i64,
    /// The loop's explicit tile ([`BlockGraph::set_loop_tile`]); absent for the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    forloop_tile: Option<i64>,
    reduction_dimx: i64,
    ops: Vec<BlockOpDoc>,
    outputs: Vec<BlockOutputDoc>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockOutputDoc {
    x: u64,
    omap: [i64; 3],
}

#[derive(Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum BlockOpDoc {
    Input {
        dims: Vec<i64>,
        dtype: String,
        imap: [i64; 3],
        fmap: i64,
    },
    Matmul {
        a: u64,
        b: u64,
    },
    Unary {
        kind: String,
        x: u64,
        params: Vec<f64>,
    },
    Binary {
        kind: String,
        a: u64,
        b: u64,
    },
    Reduction {
        x: u64,
        dim: i64,
    },
    ReductionToDimx {
        x: u64,
        dim: i64,
    },
    RmsNorm {
        x: u64,
        eps: f64,
    },
    Concat {
        xs: Vec<u64>,
        dim: i64,
    },
    ForloopAccum {
        x: u64,
        acc: Option<String>,
        eps: f64,
    },
}

fn ids(v: &[usize]) -> Vec<u64> {
    v.iter().map(|&x| x as u64).collect()
}

fn dims_i(v: &[usize]) -> Vec<i64> {
    v.iter().map(|&x| x as i64).collect()
}

fn block_doc(g: &BlockGraph) -> BlockGraphDoc {
    let ops = g
        .ops()
        .iter()
        .map(|op| match op {
            BlockOpKind::Input {
                kernel_dims,
                dtype,
                imap,
                fmap,
            } => BlockOpDoc::Input {
                dims: dims_i(kernel_dims),
                dtype: dtype.name().into(),
                imap: imap.map(|v| v as i64),
                fmap: *fmap as i64,
            },
            BlockOpKind::Matmul { a, b } => BlockOpDoc::Matmul {
                a: *a as u64,
                b: *b as u64,
            },
            BlockOpKind::Unary { op, x } => BlockOpDoc::Unary {
                kind: op.name().into(),
                x: *x as u64,
                params: op.params(),
            },
            BlockOpKind::Binary { op, a, b } => BlockOpDoc::Binary {
                kind: op.name().into(),
                a: *a as u64,
                b: *b as u64,
            },
            BlockOpKind::Reduction { x, dim } => BlockOpDoc::Reduction {
                x: *x as u64,
                dim: *dim as i64,
            },
            BlockOpKind::ReductionToDimx { x, dim } => BlockOpDoc::ReductionToDimx {
                x: *x as u64,
                dim: *dim as i64,
            },
            BlockOpKind::RmsNorm { x, eps } => BlockOpDoc::RmsNorm {
                x: *x as u64,
                eps: *eps,
            },
            BlockOpKind::Concat { xs, dim } => BlockOpDoc::Concat {
                xs: ids(xs),
                dim: *dim as i64,
            },
            BlockOpKind::ForloopAccum { x, kind } => BlockOpDoc::ForloopAccum {
                x: *x as u64,
                acc: kind.name().map(String::from),
                eps: kind.eps(),
            },
        })
        .collect();
    BlockGraphDoc {
        grid_dim: g.grid_dim().map(|v| v as i64),
        block_dim: g.block_dim().map(|v| v as i64),
        forloop_range: g.forloop_range() as i64,
        forloop_tile: g.loop_tile().map(i64::from),
        reduction_dimx: g.reduction_dimx() as i64,
        ops,
        outputs: g
            .outputs()
            .iter()
            .map(|o| BlockOutputDoc {
                x: o.tile as u64,
                omap: o.omap.map(|v| v as i64),
            })
            .collect(),
    }
}

/// The document of one op, its operands written as `t(operand)`.
fn op_doc(kind: &KernelOpKind, t: impl Fn(usize) -> u64) -> KernelOpDoc {
    match kind {
        KernelOpKind::Input { dims, dtype } => KernelOpDoc::Input {
            dims: dims_i(dims),
            dtype: dtype.name().into(),
        },
        KernelOpKind::Matmul { a, b } => KernelOpDoc::Matmul { a: t(*a), b: t(*b) },
        KernelOpKind::Unary { op, x } => KernelOpDoc::Unary {
            kind: op.name().into(),
            x: t(*x),
            params: op.params(),
        },
        KernelOpKind::Binary { op, a, b } => KernelOpDoc::Binary {
            kind: op.name().into(),
            a: t(*a),
            b: t(*b),
        },
        KernelOpKind::Reduction { x, dim } => KernelOpDoc::Reduction {
            x: t(*x),
            dim: *dim as i64,
        },
        KernelOpKind::RmsNorm {
            x,
            normalized_shape,
            weight,
            eps,
        } => KernelOpDoc::RmsNorm {
            x: t(*x),
            normalized_shape: dims_i(normalized_shape),
            weight: weight.map(t),
            eps: *eps,
        },
        KernelOpKind::Softmax { x, dim } => KernelOpDoc::Softmax {
            x: t(*x),
            dim: *dim as i64,
        },
        KernelOpKind::Concat { xs, dim } => KernelOpDoc::Concat {
            xs: xs.iter().map(|&x| t(x)).collect(),
            dim: *dim as i64,
        },
        KernelOpKind::Chunk {
            x,
            chunks,
            dim,
            index,
        } => KernelOpDoc::Chunk {
            x: t(*x),
            chunks: *chunks as i64,
            dim: *dim as i64,
            index: *index as i64,
        },
        KernelOpKind::Customized { inputs, graph } => KernelOpDoc::Customized {
            inputs: inputs.iter().map(|&x| t(x)).collect(),
            block_graph: block_doc(graph),
        },
        KernelOpKind::AllReduce { x } => KernelOpDoc::AllReduce { x: t(*x) },
        KernelOpKind::ReduceMax { x, dim } => KernelOpDoc::ReduceMax {
            x: t(*x),
            dim: *dim as i64,
        },
        KernelOpKind::Permute { x, perm } => KernelOpDoc::Permute {
            x: t(*x),
            perm: dims_i(perm),
        },
        KernelOpKind::Reshape { x, dims } => KernelOpDoc::Reshape {
            x: t(*x),
            dims: dims_i(dims),
        },
    }
}

/// JSON of a kernel graph as built: its ops in construction order (a byte-identical round
/// trip through [`from_json`]).
pub fn to_json(g: &KernelGraph) -> String {
    let ops = g
        .ops()
        .iter()
        .map(|op| op_doc(&op.kind, |x| x as u64))
        .collect();
    doc_json(g, ops, ids(g.outputs()))
}

fn doc_json(g: &KernelGraph, ops: Vec<KernelOpDoc>, outputs: Vec<u64>) -> String {
    let doc = KernelGraphDoc {
        format: FORMAT.into(),
        version: VERSION,
        world_size: g.world_size() as u64,
        ops,
        outputs,
    };
    // Serialising plain structs of strings/ints/finite floats cannot fail.
    serde_json::to_string(&doc).unwrap_or_default()
}

/// The canonical JSON of a kernel graph: one document for every construction of the same
/// graph. The inputs come first in their order (they are the signature), then the ops that
/// an output depends on, in a topological order fixed by their content (each op keyed by
/// its own fields and its operands' keys); ops no output depends on are left out.
pub fn canonical_json(g: &KernelGraph) -> String {
    let ops = g.ops();
    let producer = {
        let mut p = vec![0usize; g.num_tensors()];
        for (i, op) in ops.iter().enumerate() {
            for &o in &op.outs {
                p[o] = i;
            }
        }
        p
    };
    let mut live: Vec<bool> = ops
        .iter()
        .map(|op| matches!(op.kind, KernelOpKind::Input { .. }))
        .collect();
    let mut stack: Vec<usize> = g.outputs().iter().map(|&o| producer[o]).collect();
    while let Some(i) = stack.pop() {
        if !live[i] {
            live[i] = true;
            stack.extend(ops[i].kind.operands().iter().map(|&x| producer[x]));
        }
    }
    // content keys: an input by its position, any other op by its document with operands
    // replaced by their keys (ops are stored in a topological order)
    let mut tensor_key = vec![0u64; g.num_tensors()];
    let mut op_key = vec![0u64; ops.len()];
    let mut inputs_seen = 0u64;
    for (i, op) in ops.iter().enumerate() {
        let key = if matches!(op.kind, KernelOpKind::Input { .. }) {
            inputs_seen += 1;
            inputs_seen - 1
        } else {
            let doc = serde_json::to_string(&op_doc(&op.kind, |x| tensor_key[x]));
            let digest = blake3::hash(doc.unwrap_or_default().as_bytes());
            u64::from_le_bytes(digest.as_bytes()[..8].try_into().unwrap_or_default())
        };
        op_key[i] = key;
        for (j, &o) in op.outs.iter().enumerate() {
            tensor_key[o] = crate::field::mix_words(&[key, j as u64]);
        }
    }
    // Kahn's algorithm: inputs in order, then the ready live op of the smallest key
    let mut order: Vec<usize> = (0..ops.len())
        .filter(|&i| matches!(ops[i].kind, KernelOpKind::Input { .. }))
        .collect();
    let mut done = vec![false; ops.len()];
    for &i in &order {
        done[i] = true;
    }
    loop {
        let ready = (0..ops.len())
            .filter(|&i| live[i] && !done[i])
            .filter(|&i| ops[i].kind.operands().iter().all(|&x| done[producer[x]]))
            .min_by_key(|&i| (op_key[i], i));
        let Some(i) = ready else { break };
        done[i] = true;
        order.push(i);
    }
    let mut new_id = vec![0u64; g.num_tensors()];
    let mut next = 0u64;
    let mut docs = Vec::with_capacity(order.len());
    for &i in &order {
        docs.push(op_doc(&ops[i].kind, |x| new_id[x]));
        for &o in &ops[i].outs {
            new_id[o] = next;
            next += 1;
        }
    }
    let outputs = g.outputs().iter().map(|&o| new_id[o]).collect();
    doc_json(g, docs, outputs)
}

/// Content hash: blake3 hex digest of the [`canonical_json`].
pub fn hash(g: &KernelGraph) -> String {
    blake3::hash(canonical_json(g).as_bytes())
        .to_hex()
        .to_string()
}

fn id(v: u64) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

fn id_vec(v: &[u64]) -> Vec<usize> {
    v.iter().map(|&x| id(x)).collect()
}

fn replay_block(doc: &BlockGraphDoc) -> Result<BlockGraph> {
    let mut g = BlockGraph::new(
        doc.grid_dim,
        doc.block_dim,
        doc.forloop_range,
        doc.reduction_dimx,
    )?;
    if let Some(t) = doc.forloop_tile {
        g.set_loop_tile(t)?;
    }
    for (k, op) in doc.ops.iter().enumerate() {
        let r = match op {
            BlockOpDoc::Input {
                dims,
                dtype,
                imap,
                fmap,
            } => DType::parse(dtype).and_then(|dt| g.new_input(dims, dt, *imap, *fmap)),
            BlockOpDoc::Matmul { a, b } => g.matmul(id(*a), id(*b)),
            BlockOpDoc::Unary { kind, x, params } => {
                UnaryOp::parse(kind, params).and_then(|op| g.unary(op, id(*x)))
            }
            BlockOpDoc::Binary { kind, a, b } => {
                BinaryOp::parse(kind).and_then(|op| g.binary(op, id(*a), id(*b)))
            }
            BlockOpDoc::Reduction { x, dim } => g.reduction(id(*x), *dim),
            BlockOpDoc::ReductionToDimx { x, dim } => g.reduction_to_dimx(id(*x), *dim),
            BlockOpDoc::RmsNorm { x, eps } => g.rms_norm(id(*x), *eps),
            BlockOpDoc::Concat { xs, dim } => g.concat(&id_vec(xs), *dim),
            BlockOpDoc::ForloopAccum { x, acc, eps } => AccumKind::parse(acc.as_deref(), *eps)
                .and_then(|kind| g.forloop_accum(id(*x), kind)),
        };
        r.map_err(|e| e.context(format!("from_json: block op #{k}")))?;
    }
    for (k, o) in doc.outputs.iter().enumerate() {
        g.new_output(id(o.x), o.omap)
            .map_err(|e| e.context(format!("from_json: block output #{k}")))?;
    }
    Ok(g)
}

/// Parse and validate a canonical (or hand-written) JSON document.
pub fn from_json(s: &str) -> Result<KernelGraph> {
    let doc: KernelGraphDoc = serde_json::from_str(s).map_err(|e| {
        CoreError::Serialization(format!("from_json: invalid kernel-graph JSON: {e}"))
    })?;
    if doc.format != FORMAT {
        return Err(CoreError::Serialization(format!(
            "from_json: format {:?} is not {FORMAT:?}",
            doc.format
        )));
    }
    if doc.version != VERSION {
        return Err(CoreError::Serialization(format!(
            "from_json: version {} is not supported (this build reads version {VERSION})",
            doc.version
        )));
    }
    let ws = i64::try_from(doc.world_size).unwrap_or(i64::MAX);
    let mut g = KernelGraph::with_world_size(ws).map_err(|e| e.context("from_json"))?;
    for (k, op) in doc.ops.iter().enumerate() {
        let r = match op {
            KernelOpDoc::Input { dims, dtype } => DType::parse(dtype)
                .and_then(|dt| g.new_input(dims, dt))
                .map(|_| ()),
            KernelOpDoc::Matmul { a, b } => g.matmul(id(*a), id(*b)).map(|_| ()),
            KernelOpDoc::Unary { kind, x, params } => UnaryOp::parse(kind, params)
                .and_then(|op| g.unary(op, id(*x)))
                .map(|_| ()),
            KernelOpDoc::Binary { kind, a, b } => BinaryOp::parse(kind)
                .and_then(|op| g.binary(op, id(*a), id(*b)))
                .map(|_| ()),
            KernelOpDoc::Reduction { x, dim } => g.reduction(id(*x), *dim).map(|_| ()),
            KernelOpDoc::RmsNorm {
                x,
                normalized_shape,
                weight,
                eps,
            } => g
                .rms_norm(id(*x), normalized_shape, weight.map(id), *eps)
                .map(|_| ()),
            KernelOpDoc::Softmax { x, dim } => g.softmax(id(*x), *dim).map(|_| ()),
            KernelOpDoc::Concat { xs, dim } => g.concat(&id_vec(xs), *dim).map(|_| ()),
            KernelOpDoc::Chunk {
                x,
                chunks,
                dim,
                index,
            } => g.chunk_piece(id(*x), *chunks, *dim, *index).map(|_| ()),
            KernelOpDoc::Customized {
                inputs,
                block_graph,
            } => replay_block(block_graph)
                .and_then(|bg| g.customized(&id_vec(inputs), &bg))
                .map(|_| ()),
            KernelOpDoc::AllReduce { x } => g.all_reduce(id(*x)).map(|_| ()),
            KernelOpDoc::Permute { x, perm } => g.permute(id(*x), perm).map(|_| ()),
            KernelOpDoc::ReduceMax { x, dim } => g.reduce_max(id(*x), *dim).map(|_| ()),
            KernelOpDoc::Reshape { x, dims } => g.reshape(id(*x), dims).map(|_| ()),
        };
        r.map_err(|e| e.context(format!("from_json: op #{k}")))?;
    }
    for &o in &doc.outputs {
        g.mark_output(id(o))
            .map_err(|e| e.context("from_json: outputs"))?;
    }
    Ok(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn round_trip_and_errors() {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[8, 64], DType::F32).unwrap();
        let y = g.unary(UnaryOp::MulScalar(0.1), x).unwrap();
        let z = g.rms_norm(y, &[64], None, 1e-6).unwrap();
        let parts = g.chunk(z, 2, -1).unwrap();
        g.mark_output(parts[1]).unwrap();
        let s = to_json(&g);
        assert!(s.starts_with("{\"format\":\"yirage.kernel_graph\",\"version\":1,"));
        let g2 = from_json(&s).unwrap();
        assert_eq!(g2, g);
        assert_eq!(to_json(&g2), s);
        assert_eq!(hash(&g2), hash(&g));
        assert_eq!(hash(&g).len(), 64);
        assert_eq!(from_json("{").unwrap_err().kind(), ErrorKind::Serialization);
        assert_eq!(
            from_json("[]").unwrap_err().kind(),
            ErrorKind::Serialization
        );
        let bad = s.replace("\"version\":1", "\"version\":2");
        assert_eq!(
            from_json(&bad).unwrap_err().kind(),
            ErrorKind::Serialization
        );
        let bad = s.replace("\"x\":0", "\"x\":7");
        assert_eq!(from_json(&bad).unwrap_err().kind(), ErrorKind::Graph);
        let bad = s.replace("[8,64]", "[8,0]");
        assert_eq!(from_json(&bad).unwrap_err().kind(), ErrorKind::Shape);
        // floats parse correctly rounded (serde_json "float_roundtrip")
        for v in [
            -1.5e-300,
            9.313225746154785e-10,
            9.576836816141717e+234,
            5e-324,
            0.1,
        ] {
            let mut h = KernelGraph::new();
            let x = h.new_input(&[2], DType::F32).unwrap();
            let y = h.unary(UnaryOp::MulScalar(v), x).unwrap();
            h.mark_output(y).unwrap();
            let j = to_json(&h);
            assert_eq!(to_json(&from_json(&j).unwrap()), j);
            assert_eq!(from_json(&j).unwrap(), h);
        }
        let bad = s.replace("\"op\":\"unary\"", "\"op\":\"bogus\"");
        assert_eq!(
            from_json(&bad).unwrap_err().kind(),
            ErrorKind::Serialization
        );
        // world_size: only written when > 1
        assert!(!s.contains("world_size"));
        let mut m = KernelGraph::with_world_size(4).unwrap();
        let x = m.new_input(&[8, 64], DType::F32).unwrap();
        let y = m.all_reduce(x).unwrap();
        m.mark_output(y).unwrap();
        let j = to_json(&m);
        assert!(j.starts_with(
            "{\"format\":\"yirage.kernel_graph\",\"version\":1,\"world_size\":4,\"ops\":"
        ));
        assert!(j.contains("{\"op\":\"all_reduce\",\"x\":0}"));
        let m2 = from_json(&j).unwrap();
        assert_eq!(m2, m);
        assert_eq!(m2.world_size(), 4);
        assert_eq!(to_json(&m2), j);
        assert_ne!(
            hash(&m2),
            hash(&from_json(&j.replace(",\"world_size\":4", "")).unwrap())
        );
        let bad = j.replace("\"world_size\":4", "\"world_size\":0");
        assert_eq!(from_json(&bad).unwrap_err().kind(), ErrorKind::Graph);
    }

    /// exp(a) and square(b) added, built in either order, optionally with an unused tanh.
    fn two_branches(exp_first: bool, dead_op: bool) -> KernelGraph {
        let mut g = KernelGraph::new();
        let a = g.new_input(&[4, 8], DType::F32).unwrap();
        let b = g.new_input(&[4, 8], DType::F32).unwrap();
        let (e, q) = if exp_first {
            let e = g.unary(UnaryOp::Exp, a).unwrap();
            (e, g.unary(UnaryOp::Square, b).unwrap())
        } else {
            let q = g.unary(UnaryOp::Square, b).unwrap();
            (g.unary(UnaryOp::Exp, a).unwrap(), q)
        };
        if dead_op {
            g.unary(UnaryOp::Tanh, e).unwrap();
        }
        let o = g.binary(BinaryOp::Add, e, q).unwrap();
        g.mark_output(o).unwrap();
        g
    }

    #[test]
    fn one_canonical_form_per_graph() {
        let base = two_branches(true, false);
        for other in [
            two_branches(false, false),
            two_branches(true, true),
            two_branches(false, true),
        ] {
            assert_ne!(to_json(&other), to_json(&base)); // built differently
            assert_eq!(canonical_json(&other), canonical_json(&base));
            assert_eq!(hash(&other), hash(&base));
        }
        // the canonical form is a graph of its own, and its own canonical form
        let canon = from_json(&canonical_json(&base)).unwrap();
        assert_eq!(canonical_json(&canon), canonical_json(&base));
        // input order is the signature: swapping the inputs' roles is another graph
        let mut swapped = KernelGraph::new();
        let a = swapped.new_input(&[4, 8], DType::F32).unwrap();
        let b = swapped.new_input(&[4, 8], DType::F32).unwrap();
        let e = swapped.unary(UnaryOp::Exp, b).unwrap();
        let q = swapped.unary(UnaryOp::Square, a).unwrap();
        let o = swapped.binary(BinaryOp::Add, e, q).unwrap();
        swapped.mark_output(o).unwrap();
        assert_ne!(hash(&swapped), hash(&base));
    }

    /// The hash is part of every cache key: a change of it on any build or platform must be
    /// deliberate (update this value and say so in the changelog).
    #[test]
    fn the_hash_of_a_known_graph_is_pinned() {
        assert_eq!(
            hash(&two_branches(true, false)),
            "56835c74de761402a4b442583cde86337442d880d623a8ab539a48506cf7183d"
        );
    }
}
