//! [`DeviceSpec`]: the device's capabilities as the search and the cost model read them.
//!
//! The model never looks at the vendor name: which terms it charges follows from
//! [`ExecutionModel`], the per-kernel launch gap from `launch_overhead_us` (defaulting by
//! execution model), and the rest from the numeric fields. `vendor` is kept for reports and
//! cache keys only.
//!
//! Backward compatibility: a spec JSON written before `execution_model` existed has it
//! derived from `vendor` (and `warp_size` 1) at the JSON boundary, in
//! [`legacy_execution_model`]; a vendor without a known execution model is refused with a
//! message naming the field.

use crate::error::{CoreError, Result};
use serde::{Deserialize, Serialize};

/// How a device runs a block of a generated kernel; selects the cost model's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionModel {
    /// Many threads per block in warps / wavefronts / SIMD groups, latency hidden by
    /// resident blocks (NVIDIA, AMD, Apple GPUs): the streaming-GPU terms apply.
    Simt,
    /// A block is one single-threaded task on a core (SIMD inside the thread): the CPU terms
    /// apply and a block has one thread.
    Cpu,
    /// One program per core driving vector and matrix units on tiles in a software-managed
    /// buffer (TPU TensorCore, Ascend AI Core): no warps, no streaming-GPU terms; matmuls pay
    /// the matrix-unit tile efficiency from `matrix_tile`.
    Tile,
}

impl ExecutionModel {
    /// Spellings accepted in JSON, in the order error messages list them.
    pub const NAMES: [&'static str; 3] = ["simt", "cpu", "tile"];

    /// Parse a JSON spelling; the error names the field and the allowed values.
    pub fn parse(name: &str) -> Result<ExecutionModel> {
        match name {
            "simt" => Ok(ExecutionModel::Simt),
            "cpu" => Ok(ExecutionModel::Cpu),
            "tile" => Ok(ExecutionModel::Tile),
            other => Err(spec_error(&format!(
                "execution_model must be one of \"simt\", \"cpu\", \"tile\", got {other:?}"
            ))),
        }
    }

    /// Per-kernel launch/sync gap (µs) when the spec does not give `launch_overhead_us`:
    /// a GPU kernel launch and the gap to the next ~2 µs, an OpenMP-style parallel region
    /// ~1 µs, a tile machine's program dispatch ~3 µs (rough figures; the profiler decides).
    pub fn default_launch_us(self) -> f64 {
        match self {
            ExecutionModel::Simt => 2.0,
            ExecutionModel::Cpu => 1.0,
            ExecutionModel::Tile => 3.0,
        }
    }
}

/// What the search and the cost model know about the target device.
///
/// Sent from Python as JSON (a backend's `device_spec()`); every field but
/// `launch_overhead_us` (and, for old specs, `execution_model`) is required so a backend
/// cannot silently leave a limit out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawDeviceSpec")]
pub struct DeviceSpec {
    /// SMs / CUs / cores / AI cores: the number of blocks that run at once (one per unit).
    pub compute_units: u32,
    /// Threads per warp / wavefront / SIMD group (read for `simt` only; 1 elsewhere).
    pub warp_size: u32,
    /// Largest block (threads; read for `simt` only).
    pub max_threads_per_block: u32,
    /// Fast on-chip memory one block may use (shared memory / LDS, threadgroup memory,
    /// unified buffer or VMEM, the L1/L2 slice of a CPU core).
    pub shared_mem_per_block: u64,
    /// Last-level cache shared by all units.
    pub l2_bytes: u64,
    /// Device-memory bandwidth (GB/s, 1e9 bytes/s).
    pub mem_bandwidth_gbps: f64,
    /// Dense fp16/bf16 matrix peak (TFLOP/s).
    pub peak_tflops_fp16: f64,
    /// fp32 peak (TFLOP/s).
    pub peak_tflops_fp32: f64,
    /// Matrix-unit tile `[m, n, k]` (mma / MFMA / simdgroup matrix / Cube / MXU shape), or
    /// null when the device has none (CPU).
    pub matrix_tile: Option<[u32; 3]>,
    /// Name of the backend or vendor (`cpu`, `cuda`, …): reports and cache keys only, the
    /// cost model does not read it.
    pub vendor: String,
    /// How a block runs (see [`ExecutionModel`]).
    pub execution_model: ExecutionModel,
    /// Per-kernel launch/sync overhead in µs; None: the execution model's default (see
    /// [`DeviceSpec::launch_us`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_overhead_us: Option<f64>,
    /// Block-shape rule of a tile machine, `[sublane, lane]` for 32-bit elements (TPU:
    /// `[8, 128]`): the last dim of every block a generated kernel loads or stores must be
    /// a multiple of `lane` or the whole dim, the second-to-last a multiple of
    /// `sublane · 4 / element bytes` (16 for 16-bit) or the whole dim. None: any dividing
    /// tile. See [`DeviceSpec::block_legal`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tiling: Option<[u32; 2]>,
    /// Device-to-device link bandwidth (GB/s per direction, per device) the collectives'
    /// ring uses; None: PCIe (see [`super::collective`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_bandwidth_gbps: Option<f64>,
    /// Fixed cost (µs) of one ring step of a collective; None: the link's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_latency_us: Option<f64>,
    /// L1 data cache of one core (bytes; CPUs): the CPU cost terms of [`super::cpu_cache`].
    /// None: not known (the terms that need it are left out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l1d_bytes: Option<u64>,
    /// Last-level cache shared by all cores (bytes; a CPU's L3, where `l2_bytes` is the
    /// per-core L2): re-reads of tensors that fit in it run from cache (see
    /// [`super::cpu_cache`]). None: not known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub l3_bytes: Option<u64>,
}

/// The JSON as sent, before `execution_model` is resolved and the limits are checked.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeviceSpec {
    compute_units: u32,
    warp_size: u32,
    max_threads_per_block: u32,
    shared_mem_per_block: u64,
    l2_bytes: u64,
    mem_bandwidth_gbps: f64,
    peak_tflops_fp16: f64,
    peak_tflops_fp32: f64,
    matrix_tile: Option<[u32; 3]>,
    vendor: String,
    #[serde(default)]
    execution_model: Option<String>,
    #[serde(default)]
    launch_overhead_us: Option<f64>,
    #[serde(default)]
    tiling: Option<[u32; 2]>,
    #[serde(default)]
    link_bandwidth_gbps: Option<f64>,
    #[serde(default)]
    link_latency_us: Option<f64>,
    #[serde(default)]
    l1d_bytes: Option<u64>,
    #[serde(default)]
    l3_bytes: Option<u64>,
}

impl TryFrom<RawDeviceSpec> for DeviceSpec {
    type Error = CoreError;

    fn try_from(raw: RawDeviceSpec) -> Result<DeviceSpec> {
        let execution_model = match raw.execution_model.as_deref() {
            Some(name) => ExecutionModel::parse(name)?,
            None => legacy_execution_model(&raw.vendor, raw.warp_size)?,
        };
        let spec = DeviceSpec {
            compute_units: raw.compute_units,
            warp_size: raw.warp_size,
            max_threads_per_block: raw.max_threads_per_block,
            shared_mem_per_block: raw.shared_mem_per_block,
            l2_bytes: raw.l2_bytes,
            mem_bandwidth_gbps: raw.mem_bandwidth_gbps,
            peak_tflops_fp16: raw.peak_tflops_fp16,
            peak_tflops_fp32: raw.peak_tflops_fp32,
            matrix_tile: raw.matrix_tile,
            vendor: raw.vendor,
            execution_model,
            launch_overhead_us: raw.launch_overhead_us,
            tiling: raw.tiling,
            link_bandwidth_gbps: raw.link_bandwidth_gbps,
            link_latency_us: raw.link_latency_us,
            l1d_bytes: raw.l1d_bytes,
            l3_bytes: raw.l3_bytes,
        };
        spec.validate()?;
        Ok(spec)
    }
}

fn spec_error(what: &str) -> CoreError {
    CoreError::Serialization(format!("device spec: {what}"))
}

/// The execution model of a spec JSON without `execution_model` (written before the field
/// existed), from the backend names that existed then; anything else is refused.
fn legacy_execution_model(vendor: &str, warp_size: u32) -> Result<ExecutionModel> {
    match vendor {
        "cpu" => Ok(ExecutionModel::Cpu),
        _ if warp_size == 1 => Ok(ExecutionModel::Cpu),
        "cuda" | "nvidia" | "rocm" | "amd" | "mps" | "apple" => Ok(ExecutionModel::Simt),
        "tpu" | "google" | "ascend" | "huawei" => Ok(ExecutionModel::Tile),
        other => Err(spec_error(&format!(
            "execution_model is missing and vendor {other:?} has no default; set \
             execution_model to one of \"simt\", \"cpu\", \"tile\""
        ))),
    }
}

impl DeviceSpec {
    /// Parse and validate a JSON document.
    pub fn from_json(s: &str) -> Result<DeviceSpec> {
        let raw: RawDeviceSpec = serde_json::from_str(s).map_err(|e| {
            spec_error(&format!(
                "{e}; expected an object with compute_units, warp_size, \
                 max_threads_per_block, shared_mem_per_block, l2_bytes, mem_bandwidth_gbps, \
                 peak_tflops_fp16, peak_tflops_fp32, matrix_tile ([m,n,k] or null), vendor, \
                 execution_model (simt, cpu or tile) and optionally launch_overhead_us, \
                 tiling ([sublane, lane]), link_bandwidth_gbps, link_latency_us, l1d_bytes \
                 and l3_bytes"
            ))
        })?;
        DeviceSpec::try_from(raw)
    }

    /// Canonical JSON (field order fixed, `execution_model` always present), used in cache
    /// keys.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Check every limit is positive and finite.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: &str| Err(spec_error(what));
        if self.compute_units == 0 {
            return bad("compute_units must be ≥ 1");
        }
        if self.warp_size == 0 {
            return bad("warp_size must be ≥ 1");
        }
        if self.max_threads_per_block == 0 {
            return bad("max_threads_per_block must be ≥ 1");
        }
        if self.shared_mem_per_block == 0 {
            return bad("shared_mem_per_block must be ≥ 1 byte");
        }
        for (n, v) in [
            ("mem_bandwidth_gbps", self.mem_bandwidth_gbps),
            ("peak_tflops_fp16", self.peak_tflops_fp16),
            ("peak_tflops_fp32", self.peak_tflops_fp32),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(&format!("{n} must be a finite number > 0, got {v}"));
            }
        }
        if let Some(t) = self.matrix_tile {
            if t.contains(&0) {
                return bad("matrix_tile entries must be ≥ 1");
            }
        }
        if let Some(l) = self.launch_overhead_us {
            if !(l.is_finite() && l >= 0.0) {
                return bad("launch_overhead_us must be a finite number ≥ 0");
            }
        }
        if self.vendor.is_empty() {
            return bad("vendor must be a non-empty string");
        }
        if let Some(t) = self.tiling {
            if t.contains(&0) {
                return bad("tiling entries [sublane, lane] must be ≥ 1");
            }
        }
        self.validate_links()?;
        self.validate_caches()
    }

    /// The optional cache sizes, when given, must be ≥ 1 byte.
    fn validate_caches(&self) -> Result<()> {
        for (n, v) in [("l1d_bytes", self.l1d_bytes), ("l3_bytes", self.l3_bytes)] {
            if v == Some(0) {
                return Err(spec_error(&format!(
                    "{n} must be ≥ 1 byte, or null when the cache size is not known"
                )));
            }
        }
        Ok(())
    }

    /// The optional link figures, when given, must be finite (bandwidth > 0, latency ≥ 0).
    fn validate_links(&self) -> Result<()> {
        if let Some(b) = self.link_bandwidth_gbps {
            if !(b.is_finite() && b > 0.0) {
                return Err(spec_error(&format!(
                    "link_bandwidth_gbps must be a finite number > 0 (GB/s per direction), or \
                     null for PCIe; got {b}"
                )));
            }
        }
        if let Some(l) = self.link_latency_us {
            if !(l.is_finite() && l >= 0.0) {
                return Err(spec_error(&format!(
                    "link_latency_us must be a finite number ≥ 0, or null; got {l}"
                )));
            }
        }
        Ok(())
    }

    /// True for SIMT devices, whose streaming terms the model charges (see the cost module
    /// doc).
    pub fn is_streaming_gpu(&self) -> bool {
        self.execution_model == ExecutionModel::Simt
    }

    /// True for CPU-like devices whose "blocks" are single-threaded tasks.
    pub fn is_cpu(&self) -> bool {
        self.execution_model == ExecutionModel::Cpu
    }

    /// Whether a block is one thread of control (CPU task, tile-machine program): no warps.
    pub fn single_threaded_blocks(&self) -> bool {
        self.execution_model != ExecutionModel::Simt
    }

    /// Launch/sync overhead per kernel (µs): the explicit value, else the execution model's
    /// default ([`ExecutionModel::default_launch_us`]).
    pub fn launch_us(&self) -> f64 {
        self.launch_overhead_us
            .unwrap_or_else(|| self.execution_model.default_launch_us())
    }

    /// Warp counts the search may give a block (threads = warps × warp_size); one for
    /// devices without warps.
    pub fn warp_choices(&self) -> Vec<u32> {
        if self.single_threaded_blocks() {
            return vec![1];
        }
        let v: Vec<u32> = [4u32, 8]
            .into_iter()
            .filter(|w| w * self.warp_size <= self.max_threads_per_block)
            .collect();
        if v.is_empty() {
            vec![(self.max_threads_per_block / self.warp_size).max(1)]
        } else {
            v
        }
    }

    /// Threads per block for `warps` warps (1 for devices without warps).
    pub fn block_threads(&self, warps: u32) -> u32 {
        if self.single_threaded_blocks() {
            1
        } else {
            (warps * self.warp_size).min(self.max_threads_per_block)
        }
    }

    /// Whether a block of `tile` elements of a tensor of `full` dims (same rank) with
    /// `elem_bytes`-byte elements obeys [`DeviceSpec::tiling`] (always true without one).
    pub fn block_legal(&self, tile: &[usize], full: &[usize], elem_bytes: usize) -> bool {
        let Some([sublane, lane]) = self.tiling else {
            return true;
        };
        let rank = tile.len().min(full.len());
        let fits = |i: usize, multiple: usize| {
            let (t, f) = (tile[tile.len() - i], full[full.len() - i]);
            t == f || t % multiple.max(1) == 0
        };
        // a 32-bit row of `sublane` elements packs 4 / elem_bytes narrower ones
        let packed = sublane as usize * 4 / elem_bytes.clamp(1, 4);
        (rank < 1 || fits(1, lane as usize)) && (rank < 2 || fits(2, packed))
    }

    /// A typical NVIDIA H100 SXM (used by tests and as an example).
    pub fn h100() -> DeviceSpec {
        DeviceSpec {
            compute_units: 132,
            warp_size: 32,
            max_threads_per_block: 1024,
            shared_mem_per_block: 227 * 1024,
            l2_bytes: 50 * 1024 * 1024,
            mem_bandwidth_gbps: 3000.0,
            peak_tflops_fp16: 700.0,
            peak_tflops_fp32: 60.0,
            matrix_tile: Some([16, 8, 16]),
            vendor: "cuda".into(),
            execution_model: ExecutionModel::Simt,
            launch_overhead_us: None,
            tiling: None,
            link_bandwidth_gbps: None,
            link_latency_us: None,
            l1d_bytes: None,
            l3_bytes: None,
        }
    }

    /// A small 2-core CPU (used by tests; the CPU backend reports the real machine).
    pub fn cpu2() -> DeviceSpec {
        DeviceSpec {
            compute_units: 2,
            warp_size: 1,
            max_threads_per_block: 1,
            shared_mem_per_block: 1024 * 1024,
            l2_bytes: 32 * 1024 * 1024,
            mem_bandwidth_gbps: 20.0,
            peak_tflops_fp16: 0.1,
            peak_tflops_fp32: 0.1,
            matrix_tile: None,
            vendor: "cpu".into(),
            execution_model: ExecutionModel::Cpu,
            launch_overhead_us: None,
            tiling: None,
            link_bandwidth_gbps: None,
            link_latency_us: None,
            l1d_bytes: None,
            l3_bytes: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tpu() -> DeviceSpec {
        DeviceSpec {
            execution_model: ExecutionModel::Tile,
            tiling: Some([8, 128]),
            ..DeviceSpec::h100()
        }
    }

    #[test]
    fn tiling_rule_takes_multiples_of_sublane_and_lane_or_the_whole_dim() {
        let s = tpu();
        assert!(s.block_legal(&[8, 128], &[64, 1024], 4));
        assert!(s.block_legal(&[64, 256], &[64, 1024], 4));
        assert!(s.block_legal(&[4, 96], &[4, 96], 4)); // whole dims
        assert!(s.block_legal(&[1, 2, 8, 128], &[4, 4, 64, 1024], 4)); // leading dims free
        assert!(!s.block_legal(&[8, 64], &[64, 1024], 4));
        assert!(!s.block_legal(&[4, 128], &[64, 1024], 4));
        // 16-bit elements pack two rows per 32-bit sublane: 16 rows, 8-bit 32
        assert!(!s.block_legal(&[8, 128], &[64, 1024], 2));
        assert!(s.block_legal(&[16, 128], &[64, 1024], 2));
        assert!(!s.block_legal(&[16, 128], &[64, 1024], 1));
        assert!(s.block_legal(&[32, 128], &[64, 1024], 1));
        assert!(s.block_legal(&[256], &[1024], 4));
        assert!(!s.block_legal(&[64], &[1024], 4));
        // without a rule every dividing tile is legal
        assert!(DeviceSpec::h100().block_legal(&[4, 3], &[64, 1024], 2));
    }

    #[test]
    fn tiling_round_trips_and_is_left_out_of_json_without_one() {
        let s = tpu();
        let back = DeviceSpec::from_json(&s.to_json()).unwrap();
        assert_eq!(back.tiling, Some([8, 128]));
        assert!(!DeviceSpec::h100().to_json().contains("tiling"));
        let bad = s.to_json().replace("[8,128]", "[0,128]");
        let err = DeviceSpec::from_json(&bad).unwrap_err().to_string();
        assert!(err.contains("tiling"), "{err}");
    }
}
