//! The CPU's cache hierarchy in the cost model (execution model `cpu`).
//!
//! A CPU spec describes its caches with `l1d_bytes` (per core), `l2_bytes` (per core) and
//! `l3_bytes` (shared by all cores); the CPU backend reads them live. Two rules follow:
//! * **legality**: a block's tiles (accumulators, computed and converted tiles, which every
//!   for-loop iteration reuses) must stay in the core's L2 next to the panels it streams;
//!   the backend sets `shared_mem_per_block` to half of L2 (never below L1d), and the search
//!   keeps only mappings within it, as for any device;
//! * **re-reads**: a tensor that every block reads in full (an activation row, a small
//!   weight) is fetched from DRAM once and re-read from the cache level it fits in: the
//!   shared L3 when known (half of it, the rest is other traffic), else the L2.

use super::DeviceSpec;

/// Bytes of one tensor that stays in cache between the blocks re-reading it (half of the
/// level it fits in); re-reads of a larger tensor come from DRAM.
pub fn reread_cached_bytes(spec: &DeviceSpec) -> f64 {
    match spec.l3_bytes {
        Some(l3) if spec.is_cpu() => (l3.max(spec.l2_bytes)) as f64 / 2.0,
        _ => spec.l2_bytes as f64 / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{kernel_cost, KernelProfile, ReadProfile};
    use crate::kernel_graph::KernelGraph;
    use crate::ops::{BinaryOp, UnaryOp};
    use crate::search::{search, SearchConfig, SearchControl};
    use crate::DType;

    /// The 2-core EPYC of the CPU benchmarks: 32 KiB L1d, 1 MiB L2 per core, 32 MiB L3,
    /// half of L2 per block.
    fn epyc2() -> DeviceSpec {
        DeviceSpec {
            shared_mem_per_block: 512 * 1024,
            l2_bytes: 1024 * 1024,
            l1d_bytes: Some(32 * 1024),
            l3_bytes: Some(32 * 1024 * 1024),
            ..DeviceSpec::cpu2()
        }
    }

    fn reread_profile(unique: f64) -> KernelProfile {
        KernelProfile {
            blocks: 8,
            forloop: 1,
            reads: vec![ReadProfile {
                unique_bytes: unique,
                total_bytes: 8.0 * unique,
                run_bytes: 4096.0,
                staged: false,
                once: true,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn rereads_of_a_tensor_that_fits_in_l3_are_cheaper_than_dram() {
        let with_l3 = epyc2();
        let without = DeviceSpec {
            l3_bytes: None,
            ..epyc2()
        };
        // 4 MiB: over half of L2, within half of L3
        let p = reread_profile(4.0 * 1024.0 * 1024.0);
        let a = kernel_cost(&with_l3, &p).memory_us;
        let b = kernel_cost(&without, &p).memory_us;
        assert!(a < b, "{a} vs {b}");
        // 64 MiB fits in neither: the same DRAM re-reads
        let big = reread_profile(64.0 * 1024.0 * 1024.0);
        let a = kernel_cost(&with_l3, &big).memory_us;
        let b = kernel_cost(&without, &big).memory_us;
        assert!((a - b).abs() < 1e-9, "{a} vs {b}");
        // a GPU's L2 rule is untouched by an l3 figure
        let gpu = DeviceSpec {
            l3_bytes: Some(1 << 30),
            ..DeviceSpec::h100()
        };
        assert_eq!(
            reread_cached_bytes(&gpu),
            DeviceSpec::h100().l2_bytes as f64 / 2.0
        );
    }

    #[test]
    fn cache_sizes_are_optional_in_json_and_zero_is_refused() {
        let s = epyc2();
        let back = DeviceSpec::from_json(&s.to_json()).unwrap();
        assert_eq!(back.l1d_bytes, Some(32 * 1024));
        assert_eq!(back.l3_bytes, Some(32 * 1024 * 1024));
        let plain = DeviceSpec::cpu2().to_json();
        assert!(!plain.contains("l1d_bytes") && !plain.contains("l3_bytes"));
        assert_eq!(DeviceSpec::from_json(&plain).unwrap().l3_bytes, None);
        let bad = s
            .to_json()
            .replace("\"l3_bytes\":33554432", "\"l3_bytes\":0");
        let err = DeviceSpec::from_json(&bad).unwrap_err().to_string();
        assert!(err.contains("l3_bytes"), "{err}");
    }

    fn rmsnorm_linear(m: i64, k: i64, n: i64) -> KernelGraph {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[m, k], DType::F32).unwrap();
        let w = g.new_input(&[k, n], DType::F32).unwrap();
        let xn = g.rms_norm(x, &[k], None, 1e-6).unwrap();
        let y = g.matmul(xn, w).unwrap();
        g.mark_output(y).unwrap();
        g
    }

    fn attention(m: i64, d: i64, kv: i64) -> KernelGraph {
        let mut g = KernelGraph::new();
        let q = g.new_input(&[1, m, d], DType::F32).unwrap();
        let k = g.new_input(&[1, d, kv], DType::F32).unwrap();
        let v = g.new_input(&[1, kv, d], DType::F32).unwrap();
        let s = g.matmul(q, k).unwrap();
        let e = g.unary(UnaryOp::Exp, s).unwrap();
        let r = g.reduction(e, -1).unwrap();
        let p = g.binary(BinaryOp::Div, e, r).unwrap();
        let o = g.matmul(p, v).unwrap();
        g.mark_output(o).unwrap();
        g
    }

    /// Whether the best candidate of `g` on `spec` is one fused kernel (a single
    /// customized op with a for-loop).
    fn best_is_one_fused_kernel(g: &KernelGraph, spec: &DeviceSpec, preset: Option<&str>) -> bool {
        let mut cfg = SearchConfig {
            time_limit_s: Some(300.0),
            preset: preset.map(String::from),
            deterministic: true,
            ..Default::default()
        };
        cfg.apply_preset().unwrap();
        let r = search(g, spec, &cfg, &SearchControl::default()).expect("search");
        let best = &r.candidates[0];
        eprintln!("{}: {}", r.report.stop_reason, best.label);
        let kernels: Vec<_> = best
            .graph
            .ops()
            .iter()
            .filter(|o| !matches!(o.kind, crate::kernel_graph::KernelOpKind::Input { .. }))
            .collect();
        !best.baseline
            && kernels.len() == 1
            && matches!(
                &kernels[0].kind,
                crate::kernel_graph::KernelOpKind::Customized { graph, .. }
                    if graph.forloop_range() > 1
            )
    }

    #[test]
    fn half_of_l2_per_block_fuses_model_sized_rmsnorm_linear() {
        // 8 rows, hidden 4096, 6144 outputs: the fused kernel keeps an 8x3072 accumulator
        // and a 16x3072 weight panel per block (~300 KiB); a sixteenth of L2 (64 KiB)
        // leaves only unfused programs.
        let g = rmsnorm_linear(8, 4096, 6144);
        assert!(best_is_one_fused_kernel(&g, &epyc2(), None));
        let l2_16th = DeviceSpec {
            shared_mem_per_block: 64 * 1024,
            ..epyc2()
        };
        assert!(!best_is_one_fused_kernel(&g, &l2_16th, None));
    }

    #[test]
    fn half_of_l2_per_block_fuses_attention_at_kv_4096() {
        // multi-query attention, 1024 query rows of 64 against kv 4096 (kv 32768 fuses the
        // same way: the kv loop only runs longer; left to the Python search test)
        let g = attention(1024, 64, 4096);
        assert!(best_is_one_fused_kernel(&g, &epyc2(), Some("attention")));
    }
}
