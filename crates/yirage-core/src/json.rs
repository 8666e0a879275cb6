//! Canonical JSON form and content hash of kernel graphs.
//!
//! The document is a versioned envelope
//! `{"format":"yirage.kernel_graph","version":1,"ops":[…],"outputs":[…]}`; each op is an
//! object tagged by `"op"` with its fields in a fixed order; tensor ids are implicit (each
//! op appends its results in order) and all dims are stored normalised. Floats are printed
//! by serde_json (shortest round-trip form), so `to_json(from_json(to_json(g)))` is
//! byte-identical. `from_json` replays the ops through the validating builders, so a
//! hand-edited document can only yield a well-formed graph or an error.
//!
//! The hash is the blake3 hex digest of the canonical JSON bytes: platform independent
//! (no Rust struct layout, no HashMap order involved).

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
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockGraphDoc {
    grid_dim: [i64; 3],
    block_dim: [i64; 3],
    forloop_range: i64,
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

/// Canonical JSON of a kernel graph.
pub fn to_json(g: &KernelGraph) -> String {
    let ops = g
        .ops()
        .iter()
        .map(|op| match &op.kind {
            KernelOpKind::Input { dims, dtype } => KernelOpDoc::Input {
                dims: dims_i(dims),
                dtype: dtype.name().into(),
            },
            KernelOpKind::Matmul { a, b } => KernelOpDoc::Matmul {
                a: *a as u64,
                b: *b as u64,
            },
            KernelOpKind::Unary { op, x } => KernelOpDoc::Unary {
                kind: op.name().into(),
                x: *x as u64,
                params: op.params(),
            },
            KernelOpKind::Binary { op, a, b } => KernelOpDoc::Binary {
                kind: op.name().into(),
                a: *a as u64,
                b: *b as u64,
            },
            KernelOpKind::Reduction { x, dim } => KernelOpDoc::Reduction {
                x: *x as u64,
                dim: *dim as i64,
            },
            KernelOpKind::RmsNorm {
                x,
                normalized_shape,
                weight,
                eps,
            } => KernelOpDoc::RmsNorm {
                x: *x as u64,
                normalized_shape: dims_i(normalized_shape),
                weight: weight.map(|w| w as u64),
                eps: *eps,
            },
            KernelOpKind::Softmax { x, dim } => KernelOpDoc::Softmax {
                x: *x as u64,
                dim: *dim as i64,
            },
            KernelOpKind::Concat { xs, dim } => KernelOpDoc::Concat {
                xs: ids(xs),
                dim: *dim as i64,
            },
            KernelOpKind::Chunk {
                x,
                chunks,
                dim,
                index,
            } => KernelOpDoc::Chunk {
                x: *x as u64,
                chunks: *chunks as i64,
                dim: *dim as i64,
                index: *index as i64,
            },
            KernelOpKind::Customized { inputs, graph } => KernelOpDoc::Customized {
                inputs: ids(inputs),
                block_graph: block_doc(graph),
            },
            KernelOpKind::AllReduce { x } => KernelOpDoc::AllReduce { x: *x as u64 },
        })
        .collect();
    let doc = KernelGraphDoc {
        format: FORMAT.into(),
        version: VERSION,
        world_size: g.world_size() as u64,
        ops,
        outputs: ids(g.outputs()),
    };
    // Serialising plain structs of strings/ints/finite floats cannot fail.
    serde_json::to_string(&doc).unwrap_or_default()
}

/// Content hash: blake3 hex digest of the canonical JSON.
pub fn hash(g: &KernelGraph) -> String {
    blake3::hash(to_json(g).as_bytes()).to_hex().to_string()
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
}
