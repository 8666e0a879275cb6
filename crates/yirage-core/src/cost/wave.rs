//! L2 reuse within a wave of a GPU kernel tiled over rows and columns (execution model
//! `simt`, generated kernels).
//!
//! A kernel whose grid has one axis of row tiles and one of column tiles (a matmul's
//! `X[m, k]` split by rows, `W[k, n]` by columns) reads every W tile once per row tile and
//! every X tile once per column tile. The blocks resident at once (a *wave*: units × blocks
//! per unit) start together and walk K together, so those of one wave that share a tile
//! read it from DRAM once and from L2 afterwards; only the next wave fetches it again. How
//! many distinct tiles a wave touches follows from the tile order: the Triton printer runs
//! grids with two axes of more than one block in the **grouped order** of [`grouped_tile`]
//! ([`GROUP_TILES`] tiles of the longer axis, then the shorter axis, group after group), so
//! that a wave of 132 blocks over a 32 × 32 grid touches 8 + 17 tiles rather than 4 + 32.
//!
//! The model identifies the two axes from the reads alone (the search estimates profiles
//! before it builds the grid): a read shared by `R = total / unique` blocks has `P = blocks /
//! R` distinct tiles, and two reads whose tile counts multiply to the block count are the
//! two axes. Reads on neither axis keep the whole-kernel rule (re-reads at L2 speed only for
//! a tensor that fits in half of L2).

/// Tiles of the longer grid axis per group of the grouped tile order (Triton's classic
/// `GROUP_M`); the Triton printer uses the same constant (`GROUP_TILES` in its codegen).
pub const GROUP_TILES: u64 = 8;

/// The `(a, b)` tile of linear block `pid` in the grouped order of a grid with `ga` tiles on
/// the grouped axis and `gb` on the other: groups of `GROUP_TILES` consecutive `a` tiles (the
/// last group may be smaller), and within a group `a` varies fastest.
pub fn grouped_tile(pid: u64, ga: u64, gb: u64) -> (u64, u64) {
    let width = GROUP_TILES * gb;
    let first = (pid / width) * GROUP_TILES;
    let size = GROUP_TILES.min(ga - first);
    let local = pid % width;
    (first + local % size, local / size)
}

/// Distinct `(a, b)` tiles touched by the blocks `start..end` in the grouped order.
pub fn wave_tiles(start: u64, end: u64, ga: u64, gb: u64) -> (u64, u64) {
    let width = GROUP_TILES * gb;
    let mut a_tiles = 0;
    let mut b_spans: Vec<(u64, u64)> = vec![];
    let mut pid = start;
    while pid < end {
        let group = pid / width;
        let first = group * GROUP_TILES;
        let size = GROUP_TILES.min(ga - first);
        let group_start = group * width;
        let group_end = group_start + size * gb;
        let (lo, hi) = (pid - group_start, end.min(group_end) - group_start);
        a_tiles += size.min(hi - lo);
        b_spans.push((lo / size, (hi - 1) / size));
        pid = group_start + hi;
    }
    b_spans.sort_unstable();
    let (mut b_tiles, mut reach) = (0, None::<u64>);
    for (lo, hi) in b_spans {
        let from = reach.map_or(lo, |r| lo.max(r + 1));
        if hi >= from {
            b_tiles += hi - from + 1;
        }
        reach = Some(reach.map_or(hi, |r| r.max(hi)));
    }
    (a_tiles, b_tiles)
}

/// One read as the wave model sees it: its bytes and how many distinct tiles the grid has.
#[derive(Debug, Clone, Copy)]
pub struct WaveRead {
    pub unique_bytes: f64,
    pub total_bytes: f64,
}

impl WaveRead {
    /// Distinct tiles of the read over `blocks` blocks (`blocks / sharers`), 0 when the
    /// sharing is not a whole number of blocks.
    fn tiles(&self, blocks: u64) -> u64 {
        if self.unique_bytes <= 0.0 || self.total_bytes < self.unique_bytes {
            return 0;
        }
        let sharers = self.total_bytes / self.unique_bytes;
        let tiles = blocks as f64 / sharers;
        if (tiles - tiles.round()).abs() > 1e-6 * tiles.max(1.0) {
            return 0;
        }
        tiles.round() as u64
    }
}

/// DRAM bytes of each read under wave-local L2 reuse (None where the read is on neither
/// grid axis, or no two reads span the grid): a read on an axis is fetched once per wave for
/// every distinct tile that wave touches. `running`: blocks resident at once; `iters`:
/// for-loop iterations; `l2_budget`: bytes of L2 the wave's tiles may occupy. The wave's
/// tiles of [`crate::cost::GPU_STAGES`] + 1 iterations must fit in it (the blocks of a wave
/// walk the loop together), else no read gets wave reuse.
pub fn wave_dram_bytes(
    reads: &[WaveRead],
    blocks: u64,
    running: u64,
    iters: u32,
    l2_budget: f64,
) -> Vec<Option<f64>> {
    let none = vec![None; reads.len()];
    if blocks < 2 || running == 0 {
        return none;
    }
    let tiles: Vec<u64> = reads.iter().map(|r| r.tiles(blocks)).collect();
    // the two axes: the first pair of tile counts (both > 1) whose product is the grid
    let mut axes = None;
    for &p in &tiles {
        if p > 1 && p < blocks && blocks % p == 0 && tiles.contains(&(blocks / p)) {
            axes = Some((p.max(blocks / p), p.min(blocks / p)));
            break;
        }
    }
    let Some((ga, gb)) = axes else {
        return none;
    };
    // the printer groups the longer axis; with equal extents a read's axis is not known
    // from its tile count, so each is charged the axis that touches more tiles per wave
    let window = running.min(blocks);
    let per_wave: Vec<(u64, u64)> = (0..blocks.div_ceil(window))
        .map(|w| wave_tiles(w * window, blocks.min((w + 1) * window), ga, gb))
        .collect();
    let fetched = |p: u64, (a, b): (u64, u64)| match (p == ga, p == gb) {
        (true, true) => a.max(b),
        (true, false) => a,
        _ => b,
    };
    let mut out = none.clone();
    let mut footprint = 0.0f64;
    for (i, r) in reads.iter().enumerate() {
        let p = tiles[i];
        if p != ga && p != gb {
            continue;
        }
        let slab = r.unique_bytes / p as f64;
        let total: u64 = per_wave.iter().map(|&w| fetched(p, w)).sum();
        let widest = per_wave.iter().map(|&w| fetched(p, w)).max().unwrap_or(0);
        footprint += widest as f64 * slab / iters.max(1) as f64;
        out[i] = Some((total as f64 * slab).clamp(r.unique_bytes, r.total_bytes));
    }
    if footprint * (crate::cost::GPU_STAGES as f64 + 1.0) > l2_budget {
        return none;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{kernel_cost, total_cost, DeviceSpec, KernelProfile};
    use crate::plan::{graph_profiles, profile_of, TileDesc, TileKind};
    use crate::{DType, KernelGraph};

    /// The fused RMSNorm + Linear block program (sum of squares and X·W accumulated over
    /// K, divided after the loop) for `m × k × n` in fp16, tiled `bm × bn` with `bk`-wide
    /// K tiles.
    fn fused_rmsnorm_linear(
        m: usize,
        k: usize,
        n: usize,
        bm: usize,
        bn: usize,
        bk: usize,
    ) -> KernelProfile {
        let input = |numel| TileKind::Input {
            kernel_numel: numel,
            elem_bytes: 2,
            walks_loop: true,
        };
        let tile = |kind, operands: Vec<usize>, dims: Vec<usize>, in_loop| TileDesc {
            kind,
            operands,
            dims,
            in_loop,
        };
        let acc = TileKind::Reduce { accumulator: true };
        let tiles = vec![
            tile(input(m * k), vec![], vec![bm, bk], true),
            tile(input(k * n), vec![], vec![bk, bn], true),
            tile(TileKind::Matmul, vec![0, 1], vec![bm, bn], true),
            tile(acc, vec![2], vec![bm, bn], true),
            tile(acc, vec![0], vec![bm, 1], true),
            tile(
                TileKind::Elementwise { weight: 1.0 },
                vec![3, 4],
                vec![bm, bn],
                false,
            ),
        ];
        let blocks = ((m / bm) * (n / bn)) as u64;
        profile_of(&tiles, blocks, (k / bk) as u32, &[(m * n * 2) as f64], true)
    }

    fn baseline_rmsnorm_linear(m: i64, k: i64, n: i64) -> Vec<KernelProfile> {
        let mut g = KernelGraph::new();
        let x = g.new_input(&[m, k], DType::F16).unwrap();
        let w = g.new_input(&[k, n], DType::F16).unwrap();
        let y = g.rms_norm(x, &[k], None, 1e-6).unwrap();
        let z = g.matmul(y, w).unwrap();
        g.mark_output(z).unwrap();
        graph_profiles(&g).unwrap()
    }

    /// The tilings a search at prefill sizes offers (tensor-core rows, up to 4 blocks per unit).
    const TILES: [(usize, usize, usize); 4] =
        [(64, 128, 64), (128, 128, 64), (128, 256, 64), (64, 256, 64)];

    fn best_fused(spec: &DeviceSpec, m: usize) -> f64 {
        TILES
            .iter()
            .filter(|&&(bm, bn, _)| (m / bm) * (4096 / bn) <= 4 * spec.compute_units as usize)
            .map(|&(bm, bn, bk)| {
                kernel_cost(spec, &fused_rmsnorm_linear(m, 4096, 4096, bm, bn, bk)).total_us
            })
            .fold(f64::INFINITY, f64::min)
    }

    #[test]
    fn fused_prefill_tiles_rank_near_the_roofline_and_below_the_library() {
        let spec = DeviceSpec::h100();
        let (m, k, n) = (1024.0, 4096.0, 4096.0);
        let flops_us = 2.0 * m * k * n / (spec.peak_tflops_fp16 * 1e6);
        let bytes_us = 2.0 * (m * k + k * n + m * n) / (spec.mem_bandwidth_gbps * 1e3);
        let roofline = flops_us.max(bytes_us);
        let p = fused_rmsnorm_linear(1024, 4096, 4096, 128, 256, 64);
        let fused = kernel_cost(&spec, &p).total_us;
        let library = total_cost(&spec, &baseline_rmsnorm_linear(1024, 4096, 4096));
        assert!(
            fused >= roofline && fused < 1.3 * roofline,
            "{fused} vs {roofline}"
        );
        assert!(fused < library, "{fused} vs {library}");
        // and at the other prefill sizes the best tensor-core tiling beats the library too
        for m in [256usize, 4096] {
            let library = total_cost(&spec, &baseline_rmsnorm_linear(m as i64, 4096, 4096));
            let fused = best_fused(&spec, m);
            assert!(fused < library, "{m} rows: {fused} vs {library}");
        }
    }

    #[test]
    fn a_wave_rereads_shared_tiles_from_l2() {
        // 128 x 256 tiles at 1024 rows: 8 x 16 blocks, one wave; W (32 MiB, over half of the
        // L2) is fetched once, not once per row tile
        let p = fused_rmsnorm_linear(1024, 4096, 4096, 128, 256, 64);
        let reads: Vec<WaveRead> = p
            .reads
            .iter()
            .map(|r| WaveRead {
                unique_bytes: r.unique_bytes,
                total_bytes: r.total_bytes,
            })
            .collect();
        let dram = wave_dram_bytes(&reads, p.blocks, 132, p.forloop, 25e6);
        assert_eq!(dram[1], Some(p.reads[1].unique_bytes));
        // two waves of 64 blocks: one group each (8 of the 16 column tiles, the longer axis,
        // times all 8 row tiles): W is fetched once, X once per wave
        let dram = wave_dram_bytes(&reads, p.blocks, 64, p.forloop, 25e6);
        assert_eq!(dram[1], Some(p.reads[1].unique_bytes));
        assert_eq!(dram[0], Some(2.0 * p.reads[0].unique_bytes));
        // a wave whose tiles overflow the L2 budget gets no reuse
        let none = wave_dram_bytes(&reads, p.blocks, 132, p.forloop, 1e3);
        assert!(none.iter().all(Option::is_none));
    }

    #[test]
    fn the_grouped_order_visits_every_tile_once_and_groups_the_long_axis() {
        // 19 x 5 tiles: two full groups of 8 and a partial last group of 3
        let (ga, gb) = (19, 5);
        let mut seen = vec![false; (ga * gb) as usize];
        for pid in 0..ga * gb {
            let (a, b) = grouped_tile(pid, ga, gb);
            assert!(a < ga && b < gb);
            assert!(!std::mem::replace(&mut seen[(a * gb + b) as usize], true));
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(grouped_tile(7, ga, gb), (7, 0));
        assert_eq!(grouped_tile(8, ga, gb), (0, 1));
        assert_eq!(grouped_tile(80, ga, gb), (16, 0));
        assert_eq!(grouped_tile(83, ga, gb), (16, 1));
        // wave counts agree with walking the order
        for (start, end) in [(0, 20), (10, 50), (35, 95), (78, 95), (0, 95)] {
            let mut a_set = std::collections::BTreeSet::new();
            let mut b_set = std::collections::BTreeSet::new();
            for pid in start..end {
                let (a, b) = grouped_tile(pid, ga, gb);
                a_set.insert(a);
                b_set.insert(b);
            }
            assert_eq!(
                wave_tiles(start, end, ga, gb),
                (a_set.len() as u64, b_set.len() as u64),
                "{start}..{end}"
            );
        }
    }

    #[test]
    fn decode_kernels_see_none_of_the_prefill_terms() {
        // the tilings of decode (16 rows or fewer, grids over columns only) get neither wave
        // reuse, nor the wider accumulator budget, nor overlapped loop bookkeeping
        let spec = DeviceSpec::h100();
        for (m, bn, bk) in [(1, 64, 64), (8, 64, 128), (16, 128, 64), (16, 512, 64)] {
            let p = fused_rmsnorm_linear(m, 4096, 6144, m, bn, bk);
            assert!(super::super::prefill_terms_off(&spec, &p), "{m} {bn} {bk}");
        }
        let p = fused_rmsnorm_linear(1024, 4096, 4096, 128, 256, 64);
        assert!(!super::super::prefill_terms_off(&spec, &p));
    }

    #[test]
    fn decode_candidates_are_costed_as_before() {
        // every kernel of every candidate the search returns for a decode-sized RMSNorm +
        // Linear and gated MLP (8 rows, fp16) is outside the prefill terms, so decode
        // rankings are what they were before them
        let spec = DeviceSpec::h100();
        let mut rmsnorm_linear = KernelGraph::new();
        let x = rmsnorm_linear.new_input(&[8, 1024], DType::F16).unwrap();
        let w = rmsnorm_linear.new_input(&[1024, 1536], DType::F16).unwrap();
        let y = rmsnorm_linear.rms_norm(x, &[1024], None, 1e-6).unwrap();
        let z = rmsnorm_linear.matmul(y, w).unwrap();
        rmsnorm_linear.mark_output(z).unwrap();
        let mut gated = KernelGraph::new();
        let x = gated.new_input(&[8, 1024], DType::F16).unwrap();
        let w1 = gated.new_input(&[1024, 1024], DType::F16).unwrap();
        let w2 = gated.new_input(&[1024, 1024], DType::F16).unwrap();
        let a = gated.matmul(x, w1).unwrap();
        let b = gated.matmul(x, w2).unwrap();
        let s = gated.unary(crate::UnaryOp::Silu, a).unwrap();
        let o = gated.binary(crate::BinaryOp::Mul, s, b).unwrap();
        gated.mark_output(o).unwrap();
        for g in [rmsnorm_linear, gated] {
            let r = crate::search::search(
                &g,
                &spec,
                &crate::search::SearchConfig::default(),
                &crate::search::SearchControl::default(),
            )
            .unwrap();
            assert!(r.candidates.iter().any(|c| !c.baseline));
            for c in &r.candidates {
                for p in graph_profiles(&c.graph).unwrap() {
                    assert!(super::super::prefill_terms_off(&spec, &p), "{}", c.label);
                }
            }
        }
    }
}
