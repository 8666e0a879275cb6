"""The four search workloads at CI sizes (float32), and device specs for the search tests."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

import yirage as yr

search = yr.search

#: An H100-like DeviceSpec (a GPU with enough units that the split-KV form pays off).
H100 = json.dumps(
    {
        "compute_units": 132,
        "warp_size": 32,
        "max_threads_per_block": 1024,
        "shared_mem_per_block": 232448,
        "l2_bytes": 52428800,
        "mem_bandwidth_gbps": 3000.0,
        "peak_tflops_fp16": 700.0,
        "peak_tflops_fp32": 60.0,
        "matrix_tile": [16, 8, 16],
        "vendor": "cuda",
    }
)

#: A small 2-core CPU with a roomy per-block budget (deterministic across machines).
CPU2 = json.dumps(
    {
        "compute_units": 2,
        "warp_size": 1,
        "max_threads_per_block": 1,
        "shared_mem_per_block": 1048576,
        "l2_bytes": 33554432,
        "mem_bandwidth_gbps": 20.0,
        "peak_tflops_fp16": 0.1,
        "peak_tflops_fp32": 0.1,
        "matrix_tile": None,
        "vendor": "cpu",
    }
)


def rmsnorm_linear(m: int = 8, k: int = 512, n: int = 768) -> yr.KernelGraph:
    g = yr.KernelGraph()
    x = g.new_input((m, k), yr.float32)
    w = g.new_input((k, n), yr.float32)
    g.mark_output(g.matmul(g.rms_norm(x, (k,)), w))
    return g


def gated_mlp(m: int = 8, k: int = 512, n: int = 512) -> yr.KernelGraph:
    g = yr.KernelGraph()
    x = g.new_input((m, k), yr.float32)
    w1 = g.new_input((k, n), yr.float32)
    w2 = g.new_input((k, n), yr.float32)
    g.mark_output(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2)))
    return g


def lora(m: int = 8, k: int = 512, n: int = 512, r: int = 16) -> yr.KernelGraph:
    g = yr.KernelGraph()
    x = g.new_input((m, k), yr.float32)
    w = g.new_input((k, n), yr.float32)
    a = g.new_input((k, r), yr.float32)
    b = g.new_input((r, n), yr.float32)
    g.mark_output(g.add(g.matmul(x, w), g.matmul(g.matmul(x, a), b)))
    return g


def attention(b: int = 2, m: int = 256, d: int = 64, n: int = 4096) -> yr.KernelGraph:
    g = yr.KernelGraph()
    q = g.new_input((b, m, d), yr.float32)
    k = g.new_input((b, d, n), yr.float32)
    v = g.new_input((b, n, d), yr.float32)
    e = g.exp(g.matmul(q, k))
    g.mark_output(g.matmul(g.div(e, g.reduction(e, -1)), v))
    return g


def scaled_attention(
    heads: int, rows: int, d: int, kv: int, dtype: Any = yr.float32, *, transpose_k: bool = False
) -> yr.KernelGraph:
    """softmax(Q Kᵀ / √d) V over ``kv`` keys: Kᵀ given as [heads, d, kv], or with
    ``transpose_k`` K given as [heads, kv, d] and transposed in the graph."""
    g = yr.KernelGraph()
    q = g.new_input((heads, rows, d), dtype)
    if transpose_k:
        kt = g.transpose(g.new_input((heads, kv, d), dtype), -1, -2)
    else:
        kt = g.new_input((heads, d, kv), dtype)
    v = g.new_input((heads, kv, d), dtype)
    scores = g.mul_scalar(g.matmul(q, kt), 1.0 / np.sqrt(d))
    g.mark_output(g.matmul(g.softmax(scores, -1), v))
    return g


def check_numerics(target: yr.KernelGraph, cand: yr.KernelGraph, seed: int = 3) -> None:
    """The candidate agrees with the target in float64 and by fingerprints."""
    rng = np.random.default_rng(seed)
    ins = [rng.uniform(-1, 1, size=t.dims) for t in target.inputs]
    want = target.evaluate(ins)
    got = cand.evaluate(ins)
    for w, o in zip(want, got, strict=True):
        assert w.shape == o.shape
        scale = max(float(np.max(np.abs(w))), 1e-30)
        assert float(np.max(np.abs(w - o))) <= 1e-9 * scale
    assert yr.equivalent(target, cand, trials=3, seed=seed + 11)


def plan_of(cand: Any) -> dict[str, Any]:
    return cand.kernel_plan().to_dict()  # type: ignore[no-any-return]


def generated(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [k for k in plan["kernels"] if k["kind"] == "generated"]


def ops_of(kernel: dict[str, Any], op: str) -> list[dict[str, Any]]:
    return [o for o in kernel["ops"] if o["op"] == op]
