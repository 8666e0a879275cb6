"""Seeded random shapes (the bench's workloads at sizes no preset has, many of them ragged)
through the H100-spec search: the best fused candidates of each, printed by the Triton
layer and run by the interpreter, match the float64 reference evaluator. Guards the
tilings the search picks for shapes nobody tuned for (masked edge tiles, power-of-two loop
tiles over extents no range divides)."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest
from _interp_backend import interp_backend, needs_triton, private_cache
from _search_graphs import H100

import yirage as yr

os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

pytestmark = needs_triton


_private_cache = private_cache("yirage-random-shapes")


def _graph(kind: str, rng: random.Random) -> yr.KernelGraph:
    r, f32 = rng.randint, yr.float32
    g = yr.new_kernel_graph()
    if kind == "attention":
        heads, m, d, kv = r(1, 3), r(1, 40), rng.choice([16, 32, 64]), r(20, 400)
        q = g.new_input((heads, m, d), f32)
        kt, v = g.new_input((heads, d, kv), f32), g.new_input((heads, kv, d), f32)
        s = g.mul_scalar(g.matmul(q, kt), 1.0 / np.sqrt(d))
        g.mark_output(g.matmul(g.softmax(s, -1), v))
        return g
    b, h, n = r(1, 24), r(20, 300), r(5, 300)
    x = g.new_input((b, h), f32)
    if kind == "rmsnorm_linear":
        g.mark_output(g.matmul(g.rms_norm(x, (h,), eps=1e-6), g.new_input((h, n), f32)))
    elif kind == "gated_mlp":
        w1, w2 = g.new_input((h, n), f32), g.new_input((h, n), f32)
        g.mark_output(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2)))
    else:  # lora
        rank = r(1, 16)
        w, a, bb = (
            g.new_input((h, n), f32),
            g.new_input((h, rank), f32),
            g.new_input((rank, n), f32),
        )
        g.mark_output(g.add(g.matmul(x, w), g.matmul(g.matmul(x, a), bb)))
    return g


@pytest.mark.parametrize("seed", range(8))
def test_random_shapes_run_correctly_in_the_interpreter(seed: int) -> None:
    rng = random.Random(seed)
    kind = ["rmsnorm_linear", "gated_mlp", "lora", "attention"][seed % 4]
    g = _graph(kind, rng)
    result = yr.search(g, device_spec=H100, top_k=4, cache=False)
    fused = [c for c in result.candidates if not c.baseline][:2]
    assert fused, [c.label for c in result.candidates]
    nprng = np.random.default_rng(seed)
    arrays = [
        nprng.standard_normal(t.dims) / (np.sqrt(t.dims[-2]) if len(t.dims) > 1 else 1.0)
        for t in g.inputs
    ]
    (want,) = g.evaluate(arrays)
    be: Any = interp_backend("randomshapes")
    for cand in fused:
        kernel = be.load(be.compile(be.codegen(cand.kernel_plan())))
        tensors = be.from_numpy([a.astype(np.float32) for a in arrays], ["float32"] * len(arrays))
        # the plain printing and, where the plan splits a loop, the split one (its parts'
        # shares differ by one where the split does not divide the loop)
        for name, launcher in be.variants(kernel).items():
            (out,) = launcher(*tensors)
            got = out.double().numpy()
            assert got.shape == want.shape and np.isfinite(got).all(), (cand.label, name)
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            assert err < 1e-4, (cand.label, name, err)
