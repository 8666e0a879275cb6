"""Plans from the real search for an Apple GPU: every candidate ``yr.search`` emits for the
five bench workloads (at CI shapes, float32 and float16, searched with the M2 Ultra DeviceSpec)
is printed as Metal Shading Language, built for the emulator and run against the core's
float64 reference evaluator; ``superoptimize`` works end to end with the emulating backend."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _mps_support import needs_emulator, rel_err

from yirage import _core
from yirage_mps._backend import MpsBackend
from yirage_mps._device_spec import M2_ULTRA

pytestmark = [
    needs_emulator,
    pytest.mark.skipif(
        not hasattr(_core, "search") or not hasattr(_core, "kernel_plan"),
        reason="the installed yirage._core has no search/kernel_plan yet",
    ),
]

# the CI shapes of each bench workload family (yirage._workloads builders)
SMALL: dict[str, dict[str, Any]] = {
    "rmsnorm_linear": {"b": 4, "h": 256, "n": 384},
    "gated_mlp": {"b": 4, "h": 256, "n": 256},
    "lora": {"b": 4, "h": 256, "n": 256, "r": 16},
    "gqa_decode": {"b": 1, "q_heads": 8, "kv_heads": 2, "d": 64, "kv": 512},
    "qknorm_gqa": {"b": 1, "q_heads": 8, "kv_heads": 2, "d": 64, "kv": 512},
}
TOL = {"float32": 1e-4, "float16": 1e-2}


def small_graph(name: str, dtype: str) -> Any:
    import yirage as yr
    from yirage._workloads import get_workload

    return get_workload(name)._build(SMALL[name], getattr(yr, dtype))


@pytest.fixture(scope="module")
def emulator() -> MpsBackend:
    return MpsBackend(emulate=True)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", list(SMALL))
def test_every_search_candidate_runs_in_the_emulator(
    emulator: MpsBackend, name: str, dtype: str
) -> None:
    import yirage as yr
    from yirage._kernel import check_inputs, to_numpy64

    graph = small_graph(name, dtype)
    result = yr.search(
        graph, backend="mps", device_spec=M2_ULTRA, time_limit=60, top_k=6, deterministic=True
    )
    cands = list(result.candidates)
    assert cands, "the search returned no candidate"
    arrays = check_inputs(graph, seed=11)
    tensors = emulator.from_numpy(
        [np.asarray(a, dtype=np.float32) for a in arrays], [t.dtype.name for t in graph.inputs]
    )
    reference = graph.evaluate([to_numpy64(t) for t in tensors])
    generated = 0
    for cand in cands:
        kernel = emulator.load(emulator.compile(emulator.codegen(cand.kernel_plan())))
        generated += len(kernel.plan.generated)
        for o, r in zip(kernel(*tensors), reference, strict=True):
            assert rel_err(to_numpy64(o), np.asarray(r)) <= TOL[dtype], cand.label
    assert generated, "no candidate has a generated kernel: nothing was printed as MSL"
    print(f"{name}/{dtype}: {len(cands)} candidates, {generated} MSL kernels emulated")


def test_superoptimize_with_the_emulating_backend(emulator: MpsBackend) -> None:
    from yirage._superoptimize import superoptimize

    graph = small_graph("rmsnorm_linear", "float32")
    kernel = superoptimize(graph, backend=emulator, top_k=3, cache=False, time_limit=60)
    assert kernel.backend == "mps"
    assert kernel.report.verification_level == "ran emulated"
    tensors = emulator.from_numpy(
        [np.random.default_rng(1).standard_normal(t.dims).astype(np.float32) for t in graph.inputs],
        [t.dtype.name for t in graph.inputs],
    )
    out = kernel(*tensors)[0]
    ref = graph.evaluate([t.double().numpy() for t in tensors])[0]
    assert rel_err(out.double().numpy(), np.asarray(ref)) <= TOL["float32"]
