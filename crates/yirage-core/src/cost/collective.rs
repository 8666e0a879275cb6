//! Collective terms: the time a multi-device graph's collectives spend on the links between
//! the devices, charged on top of the collective kernel's local memory traffic and launch.
//!
//! The model is the bandwidth-optimal ring over `p` ranks, each link carrying
//! [`DeviceSpec::link_bandwidth_gbps`] per direction (NVSwitch and fully connected xGMI
//! meshes give every rank that bandwidth to its ring neighbours; on TPU tori several rings
//! run at once over the ports the figure sums):
//! * **all-reduce** (reduce-scatter, then all-gather): `2(p−1)` steps, each moving
//!   `bytes / p` per rank: `2(p−1)/p · bytes / bandwidth + 2(p−1) · latency`;
//! * **all-gather** of a `bytes` result: `(p−1)` steps of `bytes / p`:
//!   `(p−1)/p · bytes / bandwidth + (p−1) · latency`.
//!
//! `latency` is [`DeviceSpec::link_latency_us`], the fixed cost of one ring step
//! (synchronisation plus link latency). A spec without link figures is charged as PCIe 4.0
//! x16 ([`PCIE_LINK_GBPS`], [`PCIE_LINK_LATENCY_US`]): devices without a dedicated
//! interconnect exchange data through the host bus. One rank (`p` = 1) costs nothing.

use super::DeviceSpec;

/// PCIe 4.0 x16 per direction (GB/s): 16 lanes × 16 GT/s × 128/130 encoding ≈ 31.5 GB/s.
pub const PCIE_LINK_GBPS: f64 = 32.0;
/// Per-step latency (µs) of a ring step through PCIe and host memory (an estimate: a DMA
/// round trip plus the step's synchronisation).
pub const PCIE_LINK_LATENCY_US: f64 = 5.0;
/// Per-step latency (µs) when a spec gives a link bandwidth but no latency (an estimate of
/// a direct device-to-device link's step: signal plus flag synchronisation).
pub const DEFAULT_LINK_LATENCY_US: f64 = 1.0;

/// Which collective a kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectiveKind {
    /// Sum over the ranks, every rank receives the sum (`bytes`: the tensor's size).
    AllReduce,
    /// Concatenation of the ranks' parts (`bytes`: the gathered result's size).
    AllGather,
}

/// One collective of a kernel: its kind, the bytes of its result on one rank and the ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CollectiveProfile {
    pub kind: CollectiveKind,
    pub bytes: f64,
    pub world_size: u32,
}

/// The link figures the model uses for `spec`: (bandwidth GB/s per direction, latency µs
/// per ring step, whether they are the PCIe fallback).
pub fn link(spec: &DeviceSpec) -> (f64, f64, bool) {
    match spec.link_bandwidth_gbps {
        Some(bw) => (
            bw,
            spec.link_latency_us.unwrap_or(DEFAULT_LINK_LATENCY_US),
            false,
        ),
        None => (
            PCIE_LINK_GBPS,
            spec.link_latency_us.unwrap_or(PCIE_LINK_LATENCY_US),
            true,
        ),
    }
}

/// Ring steps and the fraction of `bytes` each rank sends over them.
fn ring(kind: CollectiveKind, p: f64) -> (f64, f64) {
    let steps = match kind {
        CollectiveKind::AllReduce => 2.0 * (p - 1.0),
        CollectiveKind::AllGather => p - 1.0,
    };
    (steps, steps / p)
}

/// Predicted link time (µs) of one collective on `spec` (see the module doc).
pub fn collective_us(spec: &DeviceSpec, c: &CollectiveProfile) -> f64 {
    if c.world_size <= 1 {
        return 0.0;
    }
    let (bw, latency, _) = link(spec);
    let (steps, fraction) = ring(c.kind, c.world_size as f64);
    fraction * c.bytes / (bw * 1e3) + steps * latency
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nvlink() -> DeviceSpec {
        DeviceSpec {
            link_bandwidth_gbps: Some(450.0),
            link_latency_us: Some(2.0),
            ..DeviceSpec::h100()
        }
    }

    fn c(kind: CollectiveKind, bytes: f64, world_size: u32) -> CollectiveProfile {
        CollectiveProfile {
            kind,
            bytes,
            world_size,
        }
    }

    #[test]
    fn ring_all_reduce_and_all_gather_follow_the_formulas() {
        let s = nvlink();
        let mb = 4.5e6; // 4.5 MB at 450 GB/s: 10 µs for the full tensor
                        // p = 4: all-reduce 2·3/4 · 10 + 6 · 2; all-gather 3/4 · 10 + 3 · 2
        let ar = collective_us(&s, &c(CollectiveKind::AllReduce, mb, 4));
        assert!((ar - (15.0 + 12.0)).abs() < 1e-9, "{ar}");
        let ag = collective_us(&s, &c(CollectiveKind::AllGather, mb, 4));
        assert!((ag - (7.5 + 6.0)).abs() < 1e-9, "{ag}");
        // p = 2: all-reduce 1 · 10 + 2 · 2
        let ar2 = collective_us(&s, &c(CollectiveKind::AllReduce, mb, 2));
        assert!((ar2 - 14.0).abs() < 1e-9, "{ar2}");
    }

    #[test]
    fn one_rank_costs_nothing_and_missing_links_fall_back_to_pcie() {
        let s = nvlink();
        assert_eq!(
            collective_us(&s, &c(CollectiveKind::AllReduce, 1e9, 1)),
            0.0
        );
        let h = DeviceSpec::h100();
        assert_eq!(link(&h), (PCIE_LINK_GBPS, PCIE_LINK_LATENCY_US, true));
        let t = collective_us(&h, &c(CollectiveKind::AllReduce, 32e6, 2));
        assert!(
            (t - (1000.0 + 2.0 * PCIE_LINK_LATENCY_US)).abs() < 1e-9,
            "{t}"
        );
        // a bandwidth without a latency takes the direct-link default
        let bw_only = DeviceSpec {
            link_latency_us: None,
            ..nvlink()
        };
        assert_eq!(link(&bw_only), (450.0, DEFAULT_LINK_LATENCY_US, false));
    }

    /// An fp16 [64, 4096] all_reduce of a `world_size` graph, after a matmul.
    fn tp_graph(world_size: i64) -> crate::kernel_graph::KernelGraph {
        use crate::dtype::DType;
        let mut g = crate::kernel_graph::KernelGraph::with_world_size(world_size).unwrap();
        let x = g.new_input(&[64, 512], DType::F16).unwrap();
        let w = g.new_input(&[512, 4096], DType::F16).unwrap();
        let y = g.matmul(x, w).unwrap();
        let s = g.all_reduce(y).unwrap();
        g.mark_output(s).unwrap();
        g
    }

    #[test]
    fn a_multi_device_graph_pays_its_all_reduce_on_the_links() {
        let s = nvlink();
        let bytes = 64.0 * 4096.0 * 2.0;
        for ws in [1u32, 2, 4, 8] {
            let profiles = crate::plan::graph_profiles(&tp_graph(ws as i64)).unwrap();
            let costs: Vec<_> = profiles
                .iter()
                .map(|p| super::super::kernel_cost(&s, p))
                .collect();
            let p = ws as f64;
            let want = 2.0 * (p - 1.0) / p * bytes / 450e3 + 2.0 * (p - 1.0) * 2.0;
            assert_eq!(costs[0].collective_us, 0.0, "the matmul has no collective");
            let got = costs[1].collective_us;
            assert!(
                (got - want).abs() <= 1e-9 * want.max(1.0),
                "ws {ws}: {got} vs {want}"
            );
            assert_eq!(got == 0.0, ws == 1);
            // the search's cost counts it
            let total = super::super::total_cost(&s, &profiles);
            let sum: f64 = costs.iter().map(|c| c.total_us).sum();
            assert!((total - sum).abs() < 1e-9);
            let without: f64 = costs.iter().map(|c| c.total_us - c.collective_us).sum();
            assert!((total - without - want).abs() <= 1e-9 * want.max(1.0));
        }
    }
}
