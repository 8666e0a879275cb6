"""The CPU's cache hierarchy in the DeviceSpec and the search (issue #32 item 1).

The CPU backend reads L1d / L2 / L3 live and gives a block half of a core's L2
(``yirage_cpu._device_spec.block_bytes``); with it the search fuses model-sized programs
(hidden 4096, 8 rows; GQA decode at kv 8192) that a sixteenth of L2 left unfused. The search
tests pin a spec (the 2-core EPYC of the CPU benchmarks), never the host's.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

import yirage as yr
from yirage._search import device_spec_json
from yirage._workloads import get_workload

cpu_only = pytest.mark.skipif(
    not yr.is_backend_available("cpu"), reason="the cpu backend is not installed"
)

#: 2 cores, 32 KiB L1d and 1 MiB L2 per core, a shared 32 MiB L3, half of L2 per block.
MODEL_CPU = yr.DeviceSpec(
    name="pinned 2-core EPYC (32 KiB L1d, 1 MiB L2, 32 MiB L3, 512 KiB per block)",
    vendor="pinned",
    arch="x86_64",
    compute_units=2,
    warp_size=None,
    max_threads_per_block=None,
    shared_mem_per_block=512 * 1024,
    l2_bytes=2**20,
    mem_bandwidth_gbps=None,
    peak_tflops_fp16=None,
    peak_tflops_fp32=None,
    simd_width_bits=512,
    execution_model="cpu",
    l1d_bytes=32 * 1024,
    l3_bytes=32 * 2**20,
)


def _one_fused_kernel(label: str) -> bool:
    return label.startswith("custom[") and ";" not in label and "loop=1:" not in label


def test_block_budget_is_half_of_l2_and_at_least_l1d() -> None:
    from yirage_cpu._device_spec import block_bytes

    assert block_bytes({"L1d": 32 * 1024, "L2": 2**20}) == 512 * 1024
    assert block_bytes({"L1d": 48 * 1024, "L2": 2 * 2**20}) == 2**20
    assert block_bytes({"L1d": 64 * 1024, "L2": 64 * 1024}) == 64 * 1024  # never below L1d
    assert block_bytes({"L1d": 48 * 1024}) == 48 * 1024  # no L2 figure: L1d
    assert block_bytes({}) is None


def test_cache_sizes_reach_the_core_and_zero_is_refused() -> None:
    doc = json.loads(device_spec_json(MODEL_CPU, "cpu")[0])
    assert doc["l1d_bytes"] == 32 * 1024 and doc["l3_bytes"] == 32 * 2**20
    # a spec without them (every GPU table) leaves them out of the core's JSON
    plain = json.loads(device_spec_json(replace(MODEL_CPU, l1d_bytes=None, l3_bytes=None))[0])
    assert "l1d_bytes" not in plain and "l3_bytes" not in plain
    with pytest.raises(yr.YirageError, match="l3_bytes must be ≥ 1 byte"):
        yr.search(
            get_workload("rms_norm").graph("cpu"),
            device_spec=replace(MODEL_CPU, l3_bytes=0),
            backend="cpu",
            cache=False,
        )


@cpu_only
def test_live_cpu_spec_carries_the_cache_hierarchy() -> None:
    from yirage_cpu._device_spec import block_bytes, cache_sizes, device_spec

    caches = cache_sizes()
    spec = device_spec()
    assert spec.l1d_bytes == caches.get("L1d")
    assert spec.l2_bytes == caches.get("L2")
    assert spec.l3_bytes == caches.get("L3")
    assert spec.shared_mem_per_block == block_bytes(caches)


def test_search_fuses_gqa_decode_at_kv_8192() -> None:
    """GQA decode at kv 8192 (8 query heads on 2 KV heads, d 128) is one kernel walking kv."""
    wl = get_workload("gqa_decode")
    res = yr.search(
        wl.graph("model"), device_spec=MODEL_CPU, backend="cpu", config="attention", cache=False
    )
    assert _one_fused_kernel(res.best.label), [c.label for c in res.candidates]
    assert "exp" in res.best.label and "accum_iter" in res.best.label


@cpu_only
def test_model_sized_rmsnorm_linear_fuses_and_matches_float64() -> None:
    """RMSNorm + Linear at 8 x 4096 x 6144: the best candidate is one fused kernel (a
    sixteenth of L2 per block found none: the core's cpu_cache tests), and the C printed,
    compiled and run for it on the host matches numpy in float64."""
    wl = get_workload("rmsnorm_linear")
    graph = wl.graph("model")
    res = yr.search(graph, device_spec=MODEL_CPU, backend="cpu", cache=False)
    assert _one_fused_kernel(res.best.label), [c.label for c in res.candidates]
    assert "accum_rms" in res.best.label and "matmul" in res.best.label

    from yirage_cpu._backend import CpuBackend

    be = CpuBackend()
    launcher = be.load(be.compile(be.codegen(res.best.kernel_plan())))
    x, w = wl.inputs("model", numpy=True, seed=3)
    (out,) = launcher(x, w)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ref = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + 1e-6) @ w64
    err = np.linalg.norm(np.asarray(out, np.float64) - ref) / np.linalg.norm(ref)
    assert err < 1e-5, err
    assert math.isfinite(err)
