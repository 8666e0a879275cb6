//! Analytic cost model: predicted time of a sequence of kernels on a [`DeviceSpec`].
//!
//! The search ranks candidates with it before verifying them (fingerprints are costly at
//! full size, so the cheapest-looking candidates are verified first) and the results are
//! returned best predicted first; the device profiles the top-k afterwards, so the model
//! only has to order candidates sensibly, not predict microseconds exactly.
//!
//! Per kernel it charges:
//! * **memory**: bytes moved to/from device memory. A generated kernel reads every input
//!   tile once per block (and once per loop iteration when the tile walks the for-loop),
//!   so tiles replicated across blocks are re-read; re-reads of a tensor that fits in half
//!   of the L2 cache (of a CPU's L3 when the spec gives one, see [`cpu_cache`]) are charged
//!   at cache bandwidth ([`L2_SPEEDUP`] × DRAM), others at DRAM.
//! * **compute**: matmul flops at the matrix-unit peak (fp16 peak when the dtype is 16-bit
//!   and the device has a matrix tile, else the fp32 peak) divided by the *tile efficiency*
//!   (the fraction of each matrix-unit tile the block tile fills); other flops at a quarter
//!   of the fp32 peak (transcendentals, reductions, no FMA pairing).
//! * **wave quantization**: `blocks` over `compute_units` run in `ceil(blocks/CU)` waves;
//!   compute scales with the used fraction of the last wave. Memory saturates with fewer
//!   units ([`MEM_UNITS_FACTOR`]× their share) because one unit can draw more than its
//!   share of bandwidth.
//! * **launch overhead** per kernel ([`DeviceSpec::launch_us`]: the spec's
//!   `launch_overhead_us`, else the execution model's typical launch/sync gap).
//!
//! * **pipelining**: loads and compute of a block overlap only across for-loop iterations
//!   (double buffering), so `min(memory, compute) / F` stays exposed; a library kernel is
//!   assumed pipelined like an [`LIBRARY_STAGES`]-step loop.
//!
//! A kernel's time is `max(memory, compute) + min(memory, compute) / F` plus the launch
//! overhead; a collective kernel of a multi-device graph (`all_reduce`) adds its time on the
//! device links ([`collective`]: a ring over `world_size` ranks).
//!
//! Which further terms apply follows from the spec's [`ExecutionModel`], never from the
//! vendor name.
//!
//! **GPU streaming terms** (execution model `simt`, generated kernels only; measured on an
//! H100, where fused kernels with 64 blocks and 16-row K tiles ran 3–6× slower than the
//! bytes predict): with `tile` = bytes one block reads per for-loop iteration, `S` =
//! min([`GPU_STAGES`], F, tiles that fit in shared memory) pipeline stages and `resident` =
//! blocks per unit that fit in shared memory with `S` stage buffers (≤
//! [`GPU_MAX_RESIDENT`]),
//! * **idle units**: fewer blocks than units draw at most [`GPU_UNIT_SHARE`] × `blocks /
//!   units` of the bandwidth (replaces the [`MEM_UNITS_FACTOR`] rule);
//! * **bytes in flight** (Little's law): the running blocks keep `running × S × tile` bytes
//!   in flight, so bandwidth ≤ that / [`GPU_MEM_LATENCY_US`] — small tiles starve DRAM;
//! * **oversized tiles**: above [`GPU_TILE_BYTES_MAX`] per iteration the tiles staged
//!   through registers (those feeding non-matmul ops) spill / cut occupancy; bandwidth
//!   scales by `max / staged`; the same for the largest tile a block loads once (not
//!   pipelined: GQA decode loading a 128 KB V tile after a loop over the head dim ran
//!   85–99 µs where the bytes predict 51); a loop with one stage whose tile leaves one
//!   block per unit stages every tile in registers, matmul operands included;
//! * **wide accumulators**: above [`GPU_ACCUM_BYTES_MAX`] of fp32 accumulators per block
//!   (rows padded to [`GPU_DOT_MIN_ROWS`] as the printers pad dots) the registers spill;
//!   bandwidth scales by `max / accumulator bytes`;
//! * **per-iteration latency**: every iteration costs [`GPU_ITER_US`] (barrier, address
//!   math, pipeline bookkeeping) plus [`GPU_COMPUTED_OPERAND_US`] per matmul whose operand
//!   is computed in the loop, overlapping only across resident blocks:
//!   `F × per-iteration × max(1, blocks / (resident × units))` is added;
//! * **unbuffered loops**: where shared memory holds fewer than two tiles, every
//!   iteration also waits [`GPU_MEM_LATENCY_US`] for its load (GQA decode at kv 16384 with
//!   128 KB of K and V per iteration ran 66 µs on the H100, with 64 KB ones 54 µs);
//! * **coalescing**: an input tile whose rows are shorter than [`GPU_COALESCE_BYTES`] is
//!   charged `GPU_COALESCE_BYTES / row bytes` times its bytes;
//! * **skinny library matmuls** (≤ [`GPU_SKINNY_ROWS`] rows) reach only
//!   [`GPU_LIBRARY_SKINNY_BW`] of the bandwidth;
//! * **wave reuse** ([`wave`]): in a grid of row tiles × column tiles, the blocks resident
//!   at once share tiles through L2: a tensor larger than half of L2 is fetched from DRAM
//!   once per wave for each distinct tile the wave touches (in the printer's grouped tile
//!   order), and the other re-reads use the L2's bandwidth ([`L2_SPEEDUP`] × DRAM) beside
//!   DRAM's, the larger of the two bounding the kernel;
//! * **tensor-core-sized tiles** (16-bit matmuls of ≥ [`GPU_MMA_ROWS`] rows): the vector
//!   work runs beside the matrix work (compute is the larger of the two, not their sum),
//!   the per-iteration bookkeeping overlaps the iteration's matrix work, and the
//!   accumulator budget grows with the rows (up to [`GPU_MMA_ACCUM_ROWS`]); decode-sized
//!   tiles (≤ 16 rows) keep the terms above unchanged;
//! * **padded lanes**: a loop streams its tiles at their power-of-two padded size (the Triton
//!   printer pads every tile dim, `tl.arange`), so memory time scales with
//!   [`KernelProfile::lane_padding`]: on an H200, fused RMSNorm + Linear (24 × 3000 × 7000,
//!   bf16) ran 36.5 µs walking K in 8 tiles of 375, against 27.0 µs in 12 tiles of 256 or 6
//!   of 512: the 1.37× of 512 / 375;
//! * **loop split**: a kernel that leaves units idle may run split ([`gpu_loop_split`]):
//!   `S`× the blocks with `F / S` iterations each (rounded up: the shares of a loop `S` does
//!   not divide differ by one), a combine step run by the last part of
//!   each block in the same kernel, and the traffic of the fp32 partial outputs through a
//!   workspace; the cheaper of the split and unsplit forms is charged, as the profiler
//!   keeps the faster variant.
//!
//! **Tile machines** (execution model `tile`: TPU TensorCores, Ascend AI Cores) get only the
//! terms above: one single-threaded program per block (no warps), matmuls at the matrix-unit
//! peak divided by the tile efficiency of `matrix_tile` (a 128×128 MXU fed 16-row tiles runs
//! at an eighth of its peak). Nothing tile-specific has been measured yet.
//!
//! **CPU terms** (execution model `cpu`, generated kernels only):
//! * **narrow rows**: an input tile whose rows are shorter than [`CPU_ROW_BYTES`] is charged
//!   `CPU_ROW_BYTES / row bytes` times its bytes (strided rows of a few cache lines defeat
//!   the prefetchers), unless its tensor is small enough to stay in cache (≤ a quarter of
//!   `l2_bytes`; the tile may then even be contiguous, e.g. LoRA's A[h, 16]). Measured on a
//!   2-core Xeon, GQA decode reading Kᵀ in tiles of 16, 32 and ≥ 64 columns (64-, 128- and
//!   ≥ 256-byte rows): 1.4-1.5×, 1.15× and 1×.

use serde::Serialize;

pub mod collective;
pub mod cpu_cache;
mod spec;
pub mod wave;
pub use collective::{CollectiveKind, CollectiveProfile};
pub use spec::{DeviceSpec, ExecutionModel};

/// Re-reads served from L2 run this many times faster than DRAM reads.
pub const L2_SPEEDUP: f64 = 3.0;
/// One compute unit can draw this many times its fair share of DRAM bandwidth.
pub const MEM_UNITS_FACTOR: f64 = 4.0;
/// Loop steps a library kernel is assumed to pipeline over.
pub const LIBRARY_STAGES: f64 = 8.0;
/// Non-matmul flops run at this fraction of the fp32 peak.
pub const OTHER_FLOPS_FRACTION: f64 = 0.25;
/// GPU: software-pipelining depth of a generated for-loop (the Triton printer's default).
pub const GPU_STAGES: u32 = 3;
/// GPU: device-memory latency (µs) that the bytes in flight must cover (Little's law).
pub const GPU_MEM_LATENCY_US: f64 = 1.0;
/// GPU: non-overlapped cost of one for-loop iteration of a block (µs).
pub const GPU_ITER_US: f64 = 0.1;
/// GPU: per-iteration bytes of a block's register-staged tiles (those feeding elementwise
/// ops or reductions) above which they spill or cut occupancy; bandwidth is charged at
/// `GPU_TILE_BYTES_MAX / staged` beyond it. Tiles read only by matmuls go to shared memory
/// through the pipeline and do not count (on the H100, GQA decode with 64 KB K+V tiles per
/// iteration ran 1.9x faster than with 16 KB ones; QK-norm attention with 32 KB K tiles
/// normalised in registers ran 17.6 µs split 16 ways, with 16 KB ones 19.4 µs).
pub const GPU_TILE_BYTES_MAX: f64 = 32.0 * 1024.0;
/// GPU: extra latency (µs) per for-loop iteration of each matmul whose operand is computed
/// in the loop: the operand goes from registers through shared memory (layout conversion,
/// barrier) after the ops that produce it, so loads cannot hide it. On the H100, fused GQA
/// decode with 32-wide kv tiles took 1.3 µs per iteration alone on a unit, against 0.3 µs
/// for the bytes it streams; 128-wide tiles (4x fewer iterations) ran 1.9x faster split.
pub const GPU_COMPUTED_OPERAND_US: f64 = 0.5;
/// GPU: fp32 accumulator bytes per block above which they spill out of registers. On the
/// H100, fused LoRA at batch 1 accumulating 512 output columns per block (32 KB with the
/// row padding) ran 45-58 µs and 1024 columns 550 µs, against 17.7 µs for 256 columns (16
/// KB), where the model had put all three within 2 %.
pub const GPU_ACCUM_BYTES_MAX: f64 = 16.0 * 1024.0;
/// GPU: rows a tile matmul is padded to by the code generators (Triton's `tl.dot` needs
/// 16), which the accumulators of skinny matmuls occupy in registers.
pub const GPU_DOT_MIN_ROWS: usize = 16;
/// GPU: rows from which a tile matmul counts as tensor-core sized (a Hopper warpgroup's
/// matrix instruction covers 64 rows): its accumulators may be wider
/// ([`GPU_MMA_ACCUM_ROWS`]) and its loop bookkeeping overlaps the matrix work.
pub const GPU_MMA_ROWS: u64 = 64;
/// GPU: rows up to which the accumulator budget grows with a tensor-core-sized tile.
pub const GPU_MMA_ACCUM_ROWS: u64 = 128;
/// GPU: most blocks of one kernel resident on a unit at once.
pub const GPU_MAX_RESIDENT: u64 = 4;
/// GPU: contiguous bytes per tile row below which loads waste DRAM bursts (on the H100,
/// 64-byte weight-tile rows streamed well in the gated MLP, 48-byte rows at half speed).
pub const GPU_COALESCE_BYTES: f64 = 64.0;
/// GPU: a streaming block draws up to this many times its unit's share of DRAM bandwidth.
/// On the H100, RMSNorm + Linear streaming W over 96 of the 132 SMs (64-column tiles) ran
/// 18.9-19.0 µs against 19.3-19.6 over 128 SMs (48-column tiles): 73% of the units
/// saturate DRAM.
pub const GPU_UNIT_SHARE: f64 = 1.4;
/// GPU: most ways a for-loop is split across blocks (see [`gpu_loop_split`]), the one cap of
/// the cost model and the plan's `loop_split`. On the H100 every 16-block kernel measured (GQA
/// decode, QK-norm attention, fused LoRA) ran faster split 16 ways than 32, and a 32-part
/// kernel's unrolled combine doubled its Triton compile time.
pub const GPU_MAX_SPLIT: u32 = 16;
/// GPU: time of a split kernel's combine step (µs), run at the tail by the last part of
/// each block to finish.
pub const GPU_COMBINE_US: f64 = 1.0;
/// Fraction of the memory bandwidth a vendor library reaches on a skinny matmul (at most
/// [`GPU_SKINNY_ROWS`] rows: memory-bound, GEMV-like) relative to a generated kernel.
/// Measured on an H100: cuBLAS ran X[8,4096]·W[4096,6144] fp16 in 20.5 µs where the model
/// predicted 17.7 µs, while its 20.1 µs for the fused RMSNorm + Linear kernel held.
pub const GPU_LIBRARY_SKINNY_BW: f64 = 0.85;
/// Rows up to which a matmul counts as skinny for [`GPU_LIBRARY_SKINNY_BW`].
pub const GPU_SKINNY_ROWS: u64 = 16;
/// CPU: contiguous bytes per tile row below which a strided tile streams slower than the
/// bytes predict (see the module doc).
pub const CPU_ROW_BYTES: f64 = 256.0;

/// One tensor read by a kernel: its size and how many bytes the kernel requests in all.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ReadProfile {
    /// Bytes of the tensor (each byte read at least once from DRAM).
    pub unique_bytes: f64,
    /// Bytes requested by all blocks together (≥ unique: replicated tiles are re-read).
    pub total_bytes: f64,
    /// Contiguous bytes per row of the tile a block loads (0: unknown, e.g. library calls).
    pub run_bytes: f64,
    /// The tile feeds an op other than a matmul, so it is held in registers; tiles read only
    /// by matmuls are streamed through shared memory (see [`GPU_TILE_BYTES_MAX`]).
    pub staged: bool,
    /// The tile is loaded once per block (it does not walk the for-loop, or there is no
    /// loop): it is not software-pipelined and sits in registers (see [`GPU_TILE_BYTES_MAX`]).
    pub once: bool,
}

/// One block-level matmul: tile dims and total flops over the whole kernel.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct MatmulProfile {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub flops: f64,
}

/// Everything the model needs about one kernel (filled by the search and the lowering).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KernelProfile {
    /// Library call (the vendor library picks its own grid: full utilization assumed).
    pub library: bool,
    /// Thread blocks (generated kernels).
    pub blocks: u64,
    pub reads: Vec<ReadProfile>,
    pub write_bytes: f64,
    pub matmuls: Vec<MatmulProfile>,
    pub other_flops: f64,
    /// 16-bit operands (matrix units at the fp16 peak).
    pub low_precision: bool,
    /// For-loop steps of a generated kernel (0 or 1: no loop).
    pub forloop: u32,
    /// Dots in the loop body (one per batch entry of a tile matmul) with an operand computed
    /// in the loop (attention's P·V) or converted from fp32 for 16-bit matrix units: see
    /// [`GPU_COMPUTED_OPERAND_US`].
    pub computed_operand_matmuls: u32,
    /// Bytes of the block's fp32 accumulators, rows padded to [`GPU_DOT_MIN_ROWS`] (see
    /// [`GPU_ACCUM_BYTES_MAX`]).
    pub accum_bytes: f64,
    /// The collective a library kernel runs over the device links (see [`collective`]).
    pub collective: Option<CollectiveProfile>,
    /// Bytes of the tiles walking the for-loop with every dim rounded up to a power of two,
    /// over their bytes (≥ 1; 0 taken as 1): see the module doc's "padded lanes".
    pub lane_padding: f64,
}

/// Predicted time of one kernel, with its parts (µs).
///
/// Memory and compute overlap: only the larger counts in full, so `total_us` is
/// `max(memory_us, compute_us) + exposed_us + loop_us + combine_us + launch_us`
/// (see [`KernelCost::additive_terms`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct KernelCost {
    pub total_us: f64,
    /// DRAM (and L2 re-read) traffic at the bandwidth the kernel's blocks can draw.
    pub memory_us: f64,
    /// Matrix-unit and vector work at the peaks, scaled by tile efficiency and utilization.
    pub compute_us: f64,
    pub launch_us: f64,
    /// Used fraction of the machine (wave quantization), 1 for library kernels.
    pub utilization: f64,
    /// The smaller of memory and compute not hidden behind the larger (pipeline fill and
    /// drain: the smaller divided by the loop stages).
    pub exposed_us: f64,
    /// Per-iteration overhead of a generated GPU kernel's for-loop (0 elsewhere).
    pub loop_us: f64,
    /// Combine step of a split for-loop (0 when the loop is not split).
    pub combine_us: f64,
    /// Ways the for-loop is split across blocks (1: not split; see [`gpu_loop_split`]).
    pub loop_split: u32,
    /// Time on the device links of a collective kernel (0 elsewhere; see [`collective`]).
    pub collective_us: f64,
}

impl KernelCost {
    /// The parts that add up to `total_us`, by name: the larger of memory and compute under
    /// `"memory"` or `"compute"` (the other is 0), then `"exposed"`, `"loop"`, `"combine"`,
    /// `"launch"` and `"collective"`.
    pub fn additive_terms(&self) -> [(&'static str, f64); 7] {
        let memory_bound = self.memory_us >= self.compute_us;
        let (mem, comp) = if memory_bound {
            (self.memory_us, 0.0)
        } else {
            (0.0, self.compute_us)
        };
        [
            ("memory", mem),
            ("compute", comp),
            ("exposed", self.exposed_us),
            ("loop", self.loop_us),
            ("combine", self.combine_us),
            ("launch", self.launch_us),
            ("collective", self.collective_us),
        ]
    }
}

/// Fraction of a matrix-unit tile that a block tile of `(m, n, k)` fills.
pub fn tile_efficiency(spec: &DeviceSpec, m: u64, n: u64, k: u64) -> f64 {
    let Some([tm, tn, tk]) = spec.matrix_tile else {
        return 1.0;
    };
    let eff = |x: u64, t: u32| {
        let t = t as u64;
        x as f64 / (x.div_ceil(t) * t) as f64
    };
    eff(m, tm) * eff(n, tn) * eff(k, tk)
}

/// Loop split a GPU code generator applies to a generated kernel (1: none): the smallest
/// power of two ≤ [`GPU_MAX_SPLIT`] and ≤ the for-loop that gives every unit two blocks,
/// as a GPU printer's split-loop variant does (split-K, flash-decoding); the lowering emits
/// it as the plan's `loop_split` ([`crate::plan::loop_split`]). Part `p` of `S` walks
/// iterations `⌊p·F/S⌋ .. ⌊(p+1)·F/S⌋` ([`split_iterations`]): shares that differ by at most
/// one, none empty, so a loop no power of two divides (a masked loop over 6000 keys in 47
/// tiles of 128) splits as well as one that does. The profiler keeps the split variant only
/// where it wins, so the model charges the cheaper of both.
pub fn gpu_loop_split(spec: &DeviceSpec, blocks: u64, forloop: u32) -> u32 {
    let target = 2 * spec.compute_units as u64;
    let mut split = 1u32;
    while blocks * (split as u64) < target && split * 2 <= GPU_MAX_SPLIT.min(forloop) {
        split *= 2;
    }
    split
}

/// Iterations of the longest part of a for-loop of `forloop` iterations split `split` ways
/// (the parts' shares differ by at most one; see [`gpu_loop_split`]).
pub fn split_iterations(forloop: u32, split: u32) -> u32 {
    forloop.div_ceil(split.max(1)).max(1)
}

/// Predicted cost of one kernel: its time on the device plus, for a collective, its time
/// on the links.
pub fn kernel_cost(spec: &DeviceSpec, p: &KernelProfile) -> KernelCost {
    let mut c = device_cost(spec, p);
    if let Some(coll) = &p.collective {
        c.collective_us = collective::collective_us(spec, coll);
        c.total_us += c.collective_us;
    }
    c
}

/// Predicted time of one kernel on the device (the cheaper of split and unsplit loops).
fn device_cost(spec: &DeviceSpec, p: &KernelProfile) -> KernelCost {
    let base = kernel_cost_split(spec, p, 1);
    let streams = p.reads.iter().any(|r| !r.once);
    if !spec.is_streaming_gpu() || p.library || p.blocks == 0 || p.forloop < 2 || !streams {
        return base;
    }
    let split = gpu_loop_split(spec, p.blocks, p.forloop);
    if split == 1 {
        return base;
    }
    let mut parts = kernel_cost_split(spec, p, split);
    // the combine step: every part writes its fp32 partial outputs to a workspace that the
    // last part of its block reads back (no second kernel: a combine kernel cost GQA
    // decode about 4 µs on the H100, the in-kernel combine about 1)
    let widen = if p.low_precision { 2.0 } else { 1.0 };
    let workspace = 2.0 * split as f64 * p.write_bytes * widen;
    parts.combine_us = GPU_COMBINE_US + workspace / (spec.mem_bandwidth_gbps * 1e3);
    parts.total_us += parts.combine_us;
    if parts.total_us < base.total_us {
        parts
    } else {
        base
    }
}

/// Cost of `p` with its for-loop split `split` ways across `split`× the blocks.
fn kernel_cost_split(spec: &DeviceSpec, p: &KernelProfile, split: u32) -> KernelCost {
    let bw = spec.mem_bandwidth_gbps * 1e3; // bytes per µs
    let mut mem = p.write_bytes / bw;
    let streaming = spec.is_streaming_gpu() && !p.library;
    let wave_dram = wave_reuse(spec, p, split);
    // where the wave model applies, re-reads served by L2 use the L2's own bandwidth beside
    // DRAM's (the larger of the two bounds the kernel) instead of adding to DRAM time
    let l2_pipe = wave_dram.iter().any(Option::is_some);
    let mut l2 = 0.0;
    for (r, wave) in p.reads.iter().zip(wave_dram) {
        // rows shorter than a coalesced segment waste the rest of each DRAM burst
        let coalesced = if streaming && r.run_bytes > 0.0 {
            (r.run_bytes / GPU_COALESCE_BYTES).min(1.0)
        } else if spec.is_cpu()
            && !p.library
            && r.run_bytes > 0.0
            && r.unique_bytes > spec.l2_bytes as f64 / 4.0
        {
            (r.run_bytes / CPU_ROW_BYTES).min(1.0)
        } else {
            1.0
        };
        let unique = r.unique_bytes.min(r.total_bytes);
        let reread = (r.total_bytes - unique).max(0.0);
        let cached = r.unique_bytes <= cpu_cache::reread_cached_bytes(spec);
        // re-reads from DRAM: all of them for a tensor larger than the cache share, but
        // only those of later waves where the wave model applies
        let dram_reread = match wave {
            _ if cached => 0.0,
            Some(dram) => (dram - unique).clamp(0.0, reread),
            None => reread,
        };
        let l2_reread = reread - dram_reread;
        let l2_us = l2_reread / (bw * L2_SPEEDUP) / coalesced;
        mem += (unique + dram_reread) / bw / coalesced;
        if l2_pipe {
            l2 += l2_us;
        } else {
            mem += l2_us;
        }
    }
    let mem = mem.max(l2);
    let mma_peak = if p.low_precision && spec.matrix_tile.is_some() {
        spec.peak_tflops_fp16
    } else {
        spec.peak_tflops_fp32
    } * 1e6; // flops per µs
    let mut compute = 0.0;
    for m in &p.matmuls {
        let eff = tile_efficiency(spec, m.m, m.n, m.k).max(1e-3);
        compute += m.flops / (mma_peak * eff);
    }
    let vector = p.other_flops / (spec.peak_tflops_fp32 * 1e6 * OTHER_FLOPS_FRACTION);
    // the vector work of a tensor-core-sized tile (the accumulator update, a norm's sums)
    // runs beside its asynchronous matrix instructions; narrower kernels add the two
    if streaming && matmul_rows(spec, p) >= GPU_MMA_ROWS {
        compute = compute.max(vector);
    } else {
        compute += vector;
    }
    let cu = spec.compute_units as f64;
    let blocks = p.blocks * split as u64;
    let util = if p.library || blocks == 0 {
        1.0
    } else {
        let b = blocks as f64;
        b / ((b / cu).ceil() * cu)
    };
    let mut mem_util = (util * MEM_UNITS_FACTOR).min(1.0);
    if spec.is_streaming_gpu() && p.library && p.matmuls.iter().any(|m| m.m <= GPU_SKINNY_ROWS) {
        mem_util = GPU_LIBRARY_SKINNY_BW;
    }
    let mut iter_us = 0.0;
    if spec.is_streaming_gpu() && !p.library && blocks > 0 {
        let b = blocks as f64;
        let f = split_iterations(p.forloop, split);
        let Residency {
            tile,
            fit,
            stages,
            resident,
        } = residency(spec, p, split);
        // A loop that is not pipelined loads every tile through registers, matmul operands
        // too; a block alone on its unit then has nothing to overlap that load with (GQA
        // decode at kv 16384 with 128 KB V tiles, one stage and one block per SM, ran 73-100
        // µs where the bytes predict 53).
        let staged = if stages < 2.0 && resident < 2.0 {
            tile
        } else {
            p.reads
                .iter()
                .filter(|r| r.staged)
                .map(|r| r.total_bytes)
                .sum::<f64>()
                / (b * f as f64)
        };
        let running = b.min(resident * cu);
        let mut u = (GPU_UNIT_SHARE * b / cu).min(1.0);
        if tile > 0.0 {
            u = u.min(running * stages * tile / GPU_MEM_LATENCY_US / bw);
            u *= (GPU_TILE_BYTES_MAX / staged.max(1.0)).min(1.0);
            let once = p
                .reads
                .iter()
                .filter(|r| r.once)
                .map(|r| r.total_bytes / p.blocks as f64)
                .fold(0.0, f64::max);
            u *= (GPU_TILE_BYTES_MAX / once.max(1.0)).min(1.0);
        }
        u *= (accum_bytes_max(spec, p) / p.accum_bytes.max(1.0)).min(1.0);
        mem_util = u.max(1e-6);
        // a loop whose tiles cannot be double-buffered waits for each tile's load
        let unbuffered = if f > 1 && fit < 2.0 {
            GPU_MEM_LATENCY_US
        } else {
            0.0
        };
        let per_iter =
            GPU_ITER_US + p.computed_operand_matmuls as f64 * GPU_COMPUTED_OPERAND_US + unbuffered;
        let per_iter = (per_iter - mma_us_per_iteration(spec, p, b * f as f64)).max(0.0);
        iter_us = f as f64 * per_iter * (b / (resident * cu)).max(1.0);
    }
    let lanes = if streaming {
        p.lane_padding.max(1.0)
    } else {
        1.0
    };
    let memory_us = mem / mem_util * lanes;
    let compute_us = compute / util;
    let launch_us = spec.launch_us();
    let stages = if p.library {
        LIBRARY_STAGES
    } else {
        split_iterations(p.forloop, split) as f64
    };
    let exposed = memory_us.min(compute_us) / stages;
    KernelCost {
        total_us: memory_us.max(compute_us) + exposed + iter_us + launch_us,
        memory_us,
        compute_us,
        launch_us,
        utilization: util,
        exposed_us: exposed,
        loop_us: iter_us,
        combine_us: 0.0,
        loop_split: split,
        collective_us: 0.0,
    }
}

/// Whether none of the prefill terms (wave reuse, tensor-core-sized tiles) applies to `p`,
/// so that its cost is what the model predicted before them.
#[cfg(test)]
pub(crate) fn prefill_terms_off(spec: &DeviceSpec, p: &KernelProfile) -> bool {
    matmul_rows(spec, p) < GPU_MMA_ROWS
        && (1..=GPU_MAX_SPLIT).all(|s| wave_reuse(spec, p, s).iter().all(Option::is_none))
}

/// Rows of the narrowest tile matmul of a kernel whose matmuls run on 16-bit matrix units
/// (0 without matmuls, and for fp32 operands, whose dots are not tensor-core instructions).
fn matmul_rows(spec: &DeviceSpec, p: &KernelProfile) -> u64 {
    if !p.low_precision || spec.matrix_tile.is_none() {
        return 0;
    }
    p.matmuls.iter().map(|m| m.m).min().unwrap_or(0)
}

/// Accumulator bytes per block before registers spill: [`GPU_ACCUM_BYTES_MAX`] for skinny
/// tiles (measured with 16 padded rows), growing with the rows of tensor-core-sized tiles
/// (≥ [`GPU_MMA_ROWS`]) up to [`GPU_MMA_ACCUM_ROWS`]: such accumulators are spread over the
/// warps by rows as well as columns (the 128 × 256 fp32 accumulator of an 8-warp matmul
/// tile is the common Hopper configuration).
fn accum_bytes_max(spec: &DeviceSpec, p: &KernelProfile) -> f64 {
    let rows = matmul_rows(spec, p);
    if rows < GPU_MMA_ROWS {
        return GPU_ACCUM_BYTES_MAX;
    }
    GPU_ACCUM_BYTES_MAX * (rows.min(GPU_MMA_ACCUM_ROWS) / GPU_DOT_MIN_ROWS as u64) as f64
}

/// Matrix-unit time (µs) of one for-loop iteration of one block whose tile matmuls have
/// ≥ [`GPU_MMA_ROWS`] rows: the per-iteration bookkeeping ([`GPU_ITER_US`]) of such loops
/// overlaps the asynchronous matrix work of the iteration. 0 for narrower matmuls (the
/// decode kernels the bookkeeping term was measured on). `block_iters`: blocks × iterations.
fn mma_us_per_iteration(spec: &DeviceSpec, p: &KernelProfile, block_iters: f64) -> f64 {
    if matmul_rows(spec, p) < GPU_MMA_ROWS || block_iters <= 0.0 {
        return 0.0;
    }
    let per_unit =
        spec.peak_tflops_fp16.max(spec.peak_tflops_fp32) * 1e6 / spec.compute_units as f64;
    let peak = if p.low_precision && spec.matrix_tile.is_some() {
        per_unit
    } else {
        spec.peak_tflops_fp32 * 1e6 / spec.compute_units as f64
    };
    p.matmuls.iter().map(|m| m.flops).sum::<f64>() / block_iters / peak
}

/// How a generated GPU kernel's blocks sit on a unit (see the module doc).
struct Residency {
    /// Bytes one block reads per for-loop iteration.
    tile: f64,
    /// Iteration tiles that fit in a block's shared memory.
    fit: f64,
    /// Pipeline stages: min([`GPU_STAGES`], iterations, `fit`), at least 1.
    stages: f64,
    /// Blocks per unit with `stages` buffers each (1 to [`GPU_MAX_RESIDENT`]).
    resident: f64,
}

fn residency(spec: &DeviceSpec, p: &KernelProfile, split: u32) -> Residency {
    let b = (p.blocks * split as u64).max(1) as f64;
    let f = split_iterations(p.forloop, split);
    let read: f64 = p.reads.iter().map(|r| r.total_bytes).sum();
    let tile = read / (b * f as f64);
    // pipeline stages whose tiles fit in a block's shared memory
    let fit = (spec.shared_mem_per_block as f64 / tile.max(1.0)).floor();
    let stages = (GPU_STAGES.min(f) as f64).min(fit).max(1.0);
    let resident = ((spec.shared_mem_per_block as f64 / (stages * tile).max(1.0)).floor() as u64)
        .clamp(1, GPU_MAX_RESIDENT) as f64;
    Residency {
        tile,
        fit,
        stages,
        resident,
    }
}

/// DRAM bytes per read under L2 reuse within a wave ([`wave`]), for generated GPU kernels
/// whose grid spans rows and columns (None per read elsewhere, and for split loops).
fn wave_reuse(spec: &DeviceSpec, p: &KernelProfile, split: u32) -> Vec<Option<f64>> {
    if !spec.is_streaming_gpu() || p.library || p.blocks == 0 || split != 1 {
        return vec![None; p.reads.len()];
    }
    let resident = residency(spec, p, split).resident as u64;
    let reads: Vec<wave::WaveRead> = p
        .reads
        .iter()
        .map(|r| wave::WaveRead {
            unique_bytes: r.unique_bytes,
            total_bytes: r.total_bytes,
        })
        .collect();
    wave::wave_dram_bytes(
        &reads,
        p.blocks,
        resident * spec.compute_units as u64,
        p.forloop.max(1),
        cpu_cache::reread_cached_bytes(spec),
    )
}

/// Predicted time (µs) of kernels run one after the other.
pub fn total_cost(spec: &DeviceSpec, kernels: &[KernelProfile]) -> f64 {
    kernels.iter().map(|k| kernel_cost(spec, k).total_us).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec JSON as written before `execution_model` existed (`extra` appended).
    fn legacy_json(vendor: &str, warp_size: u32, extra: &str) -> String {
        format!(
            r#"{{"compute_units":2,"warp_size":{warp_size},"max_threads_per_block":1,
            "shared_mem_per_block":1048576,"l2_bytes":1048576,"mem_bandwidth_gbps":20,
            "peak_tflops_fp16":0.1,"peak_tflops_fp32":0.1,"matrix_tile":null,
            "vendor":"{vendor}"{extra}}}"#
        )
    }

    #[test]
    fn spec_json_round_trip_and_validation() {
        let s = DeviceSpec::h100();
        let back = DeviceSpec::from_json(&s.to_json()).unwrap();
        assert_eq!(back, s);
        assert!(s.to_json().contains(r#""execution_model":"simt""#));
        let mut bad = s.clone();
        bad.compute_units = 0;
        assert!(DeviceSpec::from_json(&bad.to_json()).is_err());
        assert!(DeviceSpec::from_json("{}").is_err());
        let c = DeviceSpec::from_json(&legacy_json("cpu", 1, "")).unwrap();
        assert!(c.is_cpu());
        assert_eq!(c.warp_choices(), vec![1]);
        assert_eq!(DeviceSpec::h100().warp_choices(), vec![4, 8]);
    }

    #[test]
    fn specs_without_execution_model_derive_it_from_the_old_vendor_names_only() {
        let model = |vendor: &str, warp: u32| {
            DeviceSpec::from_json(&legacy_json(vendor, warp, ""))
                .map(|s| s.execution_model)
                .map_err(|e| e.to_string())
        };
        assert_eq!(model("cpu", 1), Ok(ExecutionModel::Cpu));
        assert_eq!(model("cuda", 32), Ok(ExecutionModel::Simt));
        assert_eq!(model("rocm", 64), Ok(ExecutionModel::Simt));
        assert_eq!(model("mps", 32), Ok(ExecutionModel::Simt));
        assert_eq!(model("tpu", 32), Ok(ExecutionModel::Tile));
        assert_eq!(model("ascend", 32), Ok(ExecutionModel::Tile));
        // a single-lane "warp" was a CPU whatever the name
        assert_eq!(model("pinned", 1), Ok(ExecutionModel::Cpu));
        // a new vendor must say how it runs
        let e = model("newchip", 32).unwrap_err();
        assert!(
            e.contains("execution_model") && e.contains(r#""simt", "cpu", "tile""#),
            "{e}"
        );
        // an explicit field wins over the name, and is checked
        let tile = legacy_json("cuda", 32, r#","execution_model":"tile""#);
        assert_eq!(
            DeviceSpec::from_json(&tile).unwrap().execution_model,
            ExecutionModel::Tile
        );
        let e = DeviceSpec::from_json(&legacy_json("cuda", 32, r#","execution_model":"gpu""#))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("execution_model") && e.contains(r#""gpu""#),
            "{e}"
        );
        assert!(e.contains(r#""simt", "cpu", "tile""#), "{e}");
        let e = DeviceSpec::from_json(&legacy_json("cpu", 1, r#","launch_overhead_us":-1"#))
            .unwrap_err()
            .to_string();
        assert!(e.contains("launch_overhead_us"), "{e}");
    }

    /// Profiles touching every term: streaming, split, library skinny, CPU narrow rows.
    fn sample_profiles() -> Vec<KernelProfile> {
        let read = |run_bytes, staged, once| ReadProfile {
            unique_bytes: 33.5e6,
            total_bytes: 67e6,
            run_bytes,
            staged,
            once,
        };
        let mm = |m| MatmulProfile {
            m,
            n: 64,
            k: 64,
            flops: 1e10,
        };
        vec![
            KernelProfile {
                blocks: 16,
                forloop: 64,
                reads: vec![read(32.0, true, false), read(256.0, false, true)],
                write_bytes: 1e5,
                matmuls: vec![mm(16)],
                other_flops: 1e8,
                low_precision: true,
                computed_operand_matmuls: 1,
                accum_bytes: 64.0 * 1024.0,
                ..Default::default()
            },
            KernelProfile {
                library: true,
                reads: vec![read(0.0, false, false)],
                matmuls: vec![mm(8)],
                low_precision: true,
                ..Default::default()
            },
            KernelProfile {
                blocks: 264,
                forloop: 1,
                reads: vec![read(128.0, false, true)],
                ..Default::default()
            },
        ]
    }

    #[test]
    fn the_additive_terms_sum_to_the_total() {
        let mut split_seen = false;
        for spec in [DeviceSpec::h100(), DeviceSpec::cpu2(), tile_machine()] {
            for p in sample_profiles() {
                let c = kernel_cost(&spec, &p);
                let sum: f64 = c.additive_terms().iter().map(|(_, v)| v).sum();
                assert!((sum - c.total_us).abs() <= 1e-9 * c.total_us, "{c:?}");
                assert_eq!(c.combine_us > 0.0, c.loop_split > 1, "{c:?}");
                split_seen |= c.loop_split > 1;
            }
        }
        assert!(
            split_seen,
            "no sample profile exercised the split loop's combine step"
        );
    }

    #[test]
    fn the_vendor_name_does_not_change_any_cost() {
        for base in [DeviceSpec::h100(), DeviceSpec::cpu2(), tile_machine()] {
            let renamed = DeviceSpec {
                vendor: "some other vendor".into(),
                ..base.clone()
            };
            for p in sample_profiles() {
                assert_eq!(kernel_cost(&base, &p), kernel_cost(&renamed, &p));
            }
            assert_eq!(base.warp_choices(), renamed.warp_choices());
            assert_eq!(base.launch_us(), renamed.launch_us());
        }
    }

    /// The H100 figures driven as a tile machine (one program per unit, no warps).
    fn tile_machine() -> DeviceSpec {
        DeviceSpec {
            execution_model: ExecutionModel::Tile,
            matrix_tile: Some([128, 128, 128]),
            vendor: "tpu".into(),
            ..DeviceSpec::h100()
        }
    }

    #[test]
    fn the_execution_model_selects_the_terms() {
        let simt = DeviceSpec::h100();
        let tile = DeviceSpec {
            execution_model: ExecutionModel::Tile,
            ..simt.clone()
        };
        let attention = &sample_profiles()[0];
        // only SIMT devices split loops and pay the streaming terms
        let s = kernel_cost(&simt, attention);
        assert_ne!(s, kernel_cost_split(&simt, attention, 1));
        assert_eq!(
            kernel_cost(&tile, attention),
            kernel_cost_split(&tile, attention, 1)
        );
        // a tile machine has no warps: one thread of control per block
        assert_eq!(tile.warp_choices(), vec![1]);
        assert_eq!(tile.block_threads(8), 1);
        assert_eq!(simt.block_threads(8), 256);
        // launch gaps default by execution model and an explicit value wins
        assert_eq!(simt.launch_us(), 2.0);
        assert_eq!(DeviceSpec::cpu2().launch_us(), 1.0);
        assert_eq!(tile.launch_us(), 3.0);
        let quick = DeviceSpec {
            launch_overhead_us: Some(0.5),
            ..tile.clone()
        };
        assert_eq!(quick.launch_us(), 0.5);
        // a 128-wide matrix unit fed 16-row tiles runs at an eighth of its peak
        let mxu = tile_machine();
        assert_eq!(tile_efficiency(&mxu, 16, 128, 128), 0.125);
        let mm = |m: u64| KernelProfile {
            blocks: 132,
            matmuls: vec![MatmulProfile {
                m,
                n: 128,
                k: 128,
                flops: 1e12,
            }],
            low_precision: true,
            ..Default::default()
        };
        let ratio = kernel_cost(&mxu, &mm(16)).compute_us / kernel_cost(&mxu, &mm(128)).compute_us;
        assert!((ratio - 8.0).abs() < 1e-9, "{ratio}");
    }

    /// x[8,256] · w[256,256] then silu: a small graph the search settles quickly.
    fn small_graph() -> crate::KernelGraph {
        let mut g = crate::KernelGraph::new();
        let x = g.new_input(&[8, 256], crate::DType::F32).unwrap();
        let w = g.new_input(&[256, 256], crate::DType::F32).unwrap();
        let y = g.matmul(x, w).unwrap();
        let z = g.unary(crate::UnaryOp::Silu, y).unwrap();
        g.mark_output(z).unwrap();
        g
    }

    fn searched(spec: &DeviceSpec) -> Vec<(String, f64)> {
        let r = crate::search::search(
            &small_graph(),
            spec,
            &crate::search::SearchConfig::default(),
            &crate::search::SearchControl::default(),
        )
        .unwrap();
        r.candidates
            .iter()
            .map(|c| (c.label.clone(), c.predicted_us))
            .collect()
    }

    #[test]
    fn search_decisions_follow_capabilities_not_vendor_names() {
        let simt = DeviceSpec::h100();
        let renamed = DeviceSpec {
            vendor: "rocm".into(),
            ..simt.clone()
        };
        let found = searched(&simt);
        assert!(found.len() > 1, "{found:?}");
        assert_eq!(found, searched(&renamed));
        // the same figures as a tile machine: the candidates' blocks have one thread
        let tile = DeviceSpec {
            execution_model: ExecutionModel::Tile,
            ..simt.clone()
        };
        let threads = |spec: &DeviceSpec| -> Vec<u32> {
            let r = crate::search::search(
                &small_graph(),
                spec,
                &crate::search::SearchConfig::default(),
                &crate::search::SearchControl::default(),
            )
            .unwrap();
            r.candidates
                .iter()
                .filter(|c| !c.baseline)
                .flat_map(|c| c.kernel_plan(spec).unwrap().kernels)
                .filter_map(|k| match k {
                    crate::plan::PlanKernel::Generated(g) => Some(g.block_threads),
                    crate::plan::PlanKernel::Library(_) => None,
                })
                .collect()
        };
        let gpu_threads = threads(&simt);
        assert!(gpu_threads.iter().all(|&t| t >= 128), "{gpu_threads:?}");
        let tile_threads = threads(&tile);
        assert!(!tile_threads.is_empty());
        assert!(tile_threads.iter().all(|&t| t == 1), "{tile_threads:?}");
        // the launch overhead alone decides between one fused kernel and the two library
        // kernels of the baseline
        assert!(!found[0].0.starts_with("baseline"), "{found:?}");
        let free_launch = DeviceSpec {
            launch_overhead_us: Some(0.0),
            ..simt.clone()
        };
        let ranked = searched(&free_launch);
        assert!(ranked[0].0.starts_with("baseline"), "{ranked:?}");
    }

    #[test]
    fn model_orders_sensibly() {
        let spec = DeviceSpec::h100();
        assert_eq!(tile_efficiency(&spec, 16, 16, 16), 1.0);
        assert_eq!(tile_efficiency(&spec, 8, 16, 16), 0.5);
        let read = |u: f64, t: f64| ReadProfile {
            unique_bytes: u,
            total_bytes: t,
            ..Default::default()
        };
        // Same bytes, 132 blocks vs 33 blocks: fewer blocks cannot be faster.
        let mk = |blocks| KernelProfile {
            blocks,
            reads: vec![read(1e8, 1e8)],
            write_bytes: 1e6,
            matmuls: vec![MatmulProfile {
                m: 64,
                n: 64,
                k: 64,
                flops: 1e11,
            }],
            ..Default::default()
        };
        let full = kernel_cost(&spec, &mk(132));
        let quarter = kernel_cost(&spec, &mk(33));
        assert!(full.total_us < quarter.total_us);
        // Two launches cost more than one with the same work.
        let one = total_cost(&spec, &[mk(132)]);
        let two = total_cost(&spec, &[mk(132), KernelProfile::default()]);
        assert!(two > one);
        // Re-reads of a small tensor are cheaper than of a huge one.
        let small = kernel_cost(
            &spec,
            &KernelProfile {
                blocks: 132,
                reads: vec![read(1e6, 1e8)],
                ..Default::default()
            },
        );
        let big = kernel_cost(
            &spec,
            &KernelProfile {
                blocks: 132,
                reads: vec![read(1e8, 1e8)],
                ..Default::default()
            },
        );
        assert!(small.memory_us < big.memory_us);
    }

    #[test]
    fn skinny_library_matmuls_are_charged_below_bandwidth() {
        let spec = DeviceSpec::h100();
        let lib = |m: u64| KernelProfile {
            library: true,
            reads: vec![ReadProfile {
                unique_bytes: 5e7,
                total_bytes: 5e7,
                ..Default::default()
            }],
            matmuls: vec![MatmulProfile {
                m,
                n: 6144,
                k: 4096,
                flops: 2.0 * (m * 6144 * 4096) as f64,
            }],
            low_precision: true,
            ..Default::default()
        };
        let skinny = kernel_cost(&spec, &lib(8));
        let wide = kernel_cost(&spec, &lib(64));
        let bytes_us = 5e7 / (spec.mem_bandwidth_gbps * 1e3);
        assert!((skinny.memory_us - bytes_us / GPU_LIBRARY_SKINNY_BW).abs() < 1e-9);
        assert!((wide.memory_us - bytes_us).abs() < 1e-9);
        // the CPU has no such rule
        let cpu = DeviceSpec::cpu2();
        let c8 = kernel_cost(&cpu, &lib(8));
        let c64 = kernel_cost(&cpu, &lib(64));
        assert_eq!(c8.memory_us, c64.memory_us);
    }

    #[test]
    fn only_register_staged_tiles_are_capped() {
        let spec = DeviceSpec::h100();
        // 132 blocks, 8 iterations, 64 KB per block and iteration (over the register cap)
        let kernel = |staged, once| KernelProfile {
            blocks: 132,
            forloop: 8,
            reads: vec![ReadProfile {
                unique_bytes: 132.0 * 8.0 * 65536.0,
                total_bytes: 132.0 * 8.0 * 65536.0,
                run_bytes: 256.0,
                staged,
                once,
            }],
            low_precision: true,
            ..Default::default()
        };
        let streamed = kernel_cost_split(&spec, &kernel(false, false), 1).memory_us;
        let staged = kernel_cost_split(&spec, &kernel(true, false), 1).memory_us;
        assert!((staged / streamed - 65536.0 / GPU_TILE_BYTES_MAX).abs() < 1e-9);
        // the same bytes as one tile per block, loaded once: 8 x 64 KB in registers
        let once = kernel_cost_split(&spec, &kernel(false, true), 1).memory_us;
        assert!((once / streamed - 8.0 * 65536.0 / GPU_TILE_BYTES_MAX).abs() < 1e-9);
    }

    #[test]
    fn wide_accumulators_cut_bandwidth() {
        let spec = DeviceSpec::h100();
        // LoRA at b1 split 16 ways: 8 blocks of 512 output columns or 16 of 256
        let kernel = |blocks: u64, accum_bytes| KernelProfile {
            blocks,
            forloop: 128,
            reads: vec![ReadProfile {
                unique_bytes: 32.0 * 1024.0 * 1024.0,
                total_bytes: 32.0 * 1024.0 * 1024.0,
                run_bytes: 1024.0,
                staged: false,
                once: false,
            }],
            low_precision: true,
            accum_bytes,
            ..Default::default()
        };
        let mem = |blocks, acc| kernel_cost_split(&spec, &kernel(blocks, acc), 16).memory_us;
        // up to the cap the accumulators cost nothing; beyond it bandwidth falls with them
        assert_eq!(mem(8, 0.0), mem(8, GPU_ACCUM_BYTES_MAX));
        assert!((mem(8, 2.0 * GPU_ACCUM_BYTES_MAX) / mem(8, 0.0) - 2.0).abs() < 1e-9);
        // 512 columns x 16 padded rows of fp32 lose to 256 columns for the same bytes
        let wide = kernel_cost(&spec, &kernel(8, 16.0 * 512.0 * 4.0)).total_us;
        let narrow = kernel_cost(&spec, &kernel(16, 16.0 * 256.0 * 4.0)).total_us;
        assert!(wide > 1.5 * narrow, "{wide} vs {narrow}");
    }

    #[test]
    fn computed_matmul_operands_add_iteration_latency() {
        let spec = DeviceSpec::h100();
        // GQA decode kv 4096: 16 blocks, K and V tiles of 128 x d 128, loop 32 or 128
        let attention = |forloop: u32, computed| KernelProfile {
            blocks: 16,
            forloop,
            reads: vec![ReadProfile {
                unique_bytes: 33.5e6,
                total_bytes: 33.5e6,
                run_bytes: 256.0,
                staged: false,
                once: false,
            }],
            low_precision: true,
            computed_operand_matmuls: computed,
            ..Default::default()
        };
        let extra = |f: u32| {
            kernel_cost_split(&spec, &attention(f, 1), 1).total_us
                - kernel_cost_split(&spec, &attention(f, 0), 1).total_us
        };
        // one block per unit: every iteration pays the latency, 4x the iterations 4x of it
        assert!((extra(128) - 128.0 * GPU_COMPUTED_OPERAND_US).abs() < 1e-6);
        assert!((extra(128) / extra(32) - 4.0).abs() < 1e-9);
        // so wider kv tiles (fewer iterations) win once the latency is charged
        assert!(
            kernel_cost(&spec, &attention(32, 1)).total_us
                < kernel_cost(&spec, &attention(128, 1)).total_us
        );
    }

    #[test]
    fn loops_whose_tiles_cannot_be_double_buffered_wait_for_each_load() {
        let spec = DeviceSpec::h100();
        // the same bytes and iterations, 64 KB or 128 KB of tiles per iteration (blocks 8 or
        // 16 so the grid stays the same size per byte)
        let kernel = |blocks: u64, forloop| KernelProfile {
            blocks,
            forloop,
            reads: vec![ReadProfile {
                unique_bytes: 134e6,
                total_bytes: 134e6,
                run_bytes: 256.0,
                staged: false,
                once: false,
            }],
            low_precision: true,
            ..Default::default()
        };
        // 64 KB: three stages fit in shared memory; 128 KB: one, every iteration waits
        let buffered = kernel_cost_split(&spec, &kernel(16, 128), 16);
        let unbuffered = kernel_cost_split(&spec, &kernel(16, 64), 16);
        let waves = (256.0 / spec.compute_units as f64).max(1.0);
        let extra = unbuffered.total_us - buffered.total_us;
        assert!(extra > 0.9 * 4.0 * GPU_MEM_LATENCY_US * waves, "{extra}");
    }

    #[test]
    fn unpipelined_tiles_alone_on_a_unit_go_through_registers() {
        let spec = DeviceSpec::h100();
        // 67 MB streamed by `blocks` blocks over a 32-step loop, matmul operands only
        let kernel = |blocks: u64| KernelProfile {
            blocks,
            forloop: 32,
            reads: vec![ReadProfile {
                unique_bytes: 67e6,
                total_bytes: 67e6,
                run_bytes: 256.0,
                staged: false,
                once: false,
            }],
            low_precision: true,
            ..Default::default()
        };
        // split 32 ways, one step per part: 131 KB tiles leave one block per unit, 65 KB
        // tiles three; only the former pay for staging in registers (4x the bytes' time)
        let alone = kernel_cost_split(&spec, &kernel(16), 32);
        let shared = kernel_cost_split(&spec, &kernel(32), 32);
        assert!(
            alone.memory_us > 3.5 * shared.memory_us,
            "{alone:?} {shared:?}"
        );
    }

    #[test]
    fn three_quarters_of_the_units_saturate_memory() {
        let spec = DeviceSpec::h100();
        let stream = |blocks: u64| KernelProfile {
            blocks,
            reads: vec![ReadProfile {
                unique_bytes: 50.3e6,
                total_bytes: 50.3e6,
                run_bytes: 128.0,
                staged: false,
                once: false,
            }],
            forloop: 32,
            low_precision: true,
            ..Default::default()
        };
        let mem = |blocks: u64| kernel_cost_split(&spec, &stream(blocks), 1).memory_us;
        let units = spec.compute_units as u64;
        // 96 of 132 SMs stream as fast as all of them (GPU_UNIT_SHARE); fewer do not
        assert_eq!(mem(96), mem(units));
        assert!(mem(64) > 1.4 * mem(units));
        assert!(mem(16) > 5.0 * mem(units));
    }

    #[test]
    fn padded_lanes_scale_a_loops_memory_time() {
        // W[3000, 7000] bf16 streamed by 110 blocks in 8 tiles of 375 rows, which the printer
        // pads to 512: charged as 512 rows per tile; not on a CPU, whose printer does not pad
        let w = |lanes: f64| KernelProfile {
            blocks: 110,
            reads: vec![ReadProfile {
                unique_bytes: 42e6,
                total_bytes: 42e6,
                run_bytes: 128.0,
                staged: false,
                once: false,
            }],
            forloop: 8,
            low_precision: true,
            lane_padding: lanes,
            ..Default::default()
        };
        let padded = 512.0 / 375.0;
        for spec in [DeviceSpec::h100(), DeviceSpec::cpu2()] {
            let mem = |lanes| kernel_cost_split(&spec, &w(lanes), 1).memory_us;
            let want = if spec.is_streaming_gpu() { padded } else { 1.0 };
            assert!((mem(padded) / mem(1.0) - want).abs() < 1e-9, "{spec:?}");
            assert_eq!(mem(0.0), mem(1.0)); // unset counts as unpadded
        }
    }

    #[test]
    fn loop_split_fills_idle_units() {
        let spec = DeviceSpec::h100();
        // 16 blocks (GQA decode: batch × kv heads) over 132 units want 32 parts (512 ≥ 264):
        // capped at 16
        assert_eq!(gpu_loop_split(&spec, 16, 64), GPU_MAX_SPLIT);
        assert_eq!(GPU_MAX_SPLIT, 16);
        // capped by the loop's iterations; a loop no power of two divides splits too, in
        // shares that differ by one (12 in 8 parts: four of 2, four of 1)
        assert_eq!(gpu_loop_split(&spec, 16, 8), 8);
        assert_eq!(gpu_loop_split(&spec, 16, 12), 8);
        assert_eq!(gpu_loop_split(&spec, 16, 47), 16);
        assert_eq!(gpu_loop_split(&spec, 16, 3), 2);
        assert_eq!(split_iterations(47, 16), 3);
        assert_eq!(split_iterations(64, 16), 4);
        // enough blocks already
        assert_eq!(gpu_loop_split(&spec, 264, 64), 1);
        let attention = |forloop| KernelProfile {
            blocks: 16,
            reads: vec![ReadProfile {
                unique_bytes: 33.5e6,
                total_bytes: 33.5e6,
                run_bytes: 128.0,
                staged: false,
                once: false,
            }],
            forloop,
            low_precision: true,
            ..Default::default()
        };
        // the split form of a 16-block streaming kernel is charged, and is far cheaper than
        // the 16 blocks alone would be; a kernel without a loop cannot split
        let split = kernel_cost(&spec, &attention(64));
        let unsplit = kernel_cost_split(&spec, &attention(64), 1);
        assert!(split.total_us < unsplit.total_us / 4.0);
        // one launch: the last part of each block combines in the same kernel
        assert_eq!(split.launch_us, spec.launch_us());
        let split_only = kernel_cost_split(&spec, &attention(64), GPU_MAX_SPLIT);
        assert!(split.total_us >= split_only.total_us + GPU_COMBINE_US);
        let no_loop = kernel_cost(&spec, &attention(1));
        assert_eq!(no_loop, kernel_cost_split(&spec, &attention(1), 1));
        // a loop that walks no input streams nothing: not split (as the plan's loop_split)
        let mut resident = attention(64);
        resident.reads[0].once = true;
        assert_eq!(
            kernel_cost(&spec, &resident),
            kernel_cost_split(&spec, &resident, 1)
        );
        // 32-byte rows cost twice the bytes of 128-byte rows on the GPU, the same on the CPU
        let mut narrow = attention(64);
        narrow.reads[0].run_bytes = 32.0;
        let wide = kernel_cost_split(&spec, &attention(64), 1);
        assert!(kernel_cost_split(&spec, &narrow, 1).memory_us > 1.9 * wide.memory_us);
        // on the CPU, rows shorter than CPU_ROW_BYTES cost their share of it
        let cpu = DeviceSpec::cpu2();
        let cpu_cost = |run: f64| {
            let mut k = attention(64);
            k.low_precision = false;
            k.reads[0].run_bytes = run;
            kernel_cost(&cpu, &k).memory_us
        };
        assert!((cpu_cost(64.0) / cpu_cost(128.0) - 2.0).abs() < 1e-9);
        assert_eq!(cpu_cost(CPU_ROW_BYTES), cpu_cost(4096.0));
        // ... but not for a tensor that stays in cache
        let mut small = attention(64);
        small.reads[0].unique_bytes = 1e6;
        small.reads[0].total_bytes = 1e6;
        let narrow = kernel_cost(&cpu, &small).memory_us;
        small.reads[0].run_bytes = 4096.0;
        assert_eq!(narrow, kernel_cost(&cpu, &small).memory_us);
        // the CPU never splits
        assert_eq!(
            kernel_cost(&cpu, &attention(64)),
            kernel_cost_split(&cpu, &attention(64), 1)
        );
    }
}
