"""The ``torch_eager`` variant of the cpu backend: a plan of library kernels alone, run op by
op through torch in the graph's dtype as PyTorch eager runs it, beside the numpy/C printing.
Checked against float64 and against the workload written in PyTorch."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from _plan_ref import rel_err
from _search_graphs import CPU2

import yirage as yr
from yirage import _core, _workloads

torch = pytest.importorskip("torch")


def _baseline_launcher(graph: yr.KernelGraph) -> Any:
    """The cpu launcher of ``graph`` lowered as library kernels (the search's baseline)."""
    from yirage_cpu._backend import CpuBackend

    be = CpuBackend()
    plan = json.loads(_core.kernel_plan(graph._g, CPU2))
    assert all(k["kind"] == "library" for k in plan["kernels"])
    return be, be.load(be.compile(be.codegen(plan)))


@pytest.mark.parametrize(
    "name,shape,dtype,tol",
    [
        (
            "attention_prefill",
            {"b": 1, "q_heads": 2, "kv_heads": 2, "d": 32, "kv": 77, "q_len": 45},
            "float32",
            1e-5,
        ),
        ("rmsnorm_linear", {"b": 5, "h": 96, "n": 40}, "float32", 1e-5),
        ("gated_mlp", {"b": 3, "h": 64, "n": 50}, "bfloat16", 3e-2),
    ],
)
def test_eager_variant_of_a_library_plan_matches_float64(
    name: str, shape: dict[str, int], dtype: str, tol: float
) -> None:
    dt = getattr(yr, dtype)
    wl = _workloads.get_workload(name)
    g = wl._build({**shape, "dtype": dt}, dt)
    be, launcher = _baseline_launcher(g)
    variants = be.variants(launcher)
    widen = {"bf16_widen"} if launcher.program.bf16_dot else set()  # hosts with AVX512-BF16
    assert set(variants) == {yr.plugin.DEFAULT_VARIANT, "torch_eager", *widen}
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(t.dims) / np.sqrt(t.dims[-1]) for t in g.inputs]
    (want,) = g.evaluate(arrays)
    tensors = be.from_numpy([a.astype(np.float32) for a in arrays], [dtype] * len(arrays))
    (got,) = variants["torch_eager"](*tensors)
    got64 = got.double().numpy() if isinstance(got, torch.Tensor) else got.astype(np.float64)
    assert got64.shape == want.shape and np.isfinite(got64).all()
    assert rel_err(got64, want) < tol
    # numpy in, numpy out (as the default variant returns) where numpy holds the dtype
    assert isinstance(got, np.ndarray) == (dtype != "bfloat16")
    # the same values as the workload in PyTorch eager on the same inputs
    ref = wl.reference(*[torch.as_tensor(t) for t in tensors])[0]
    assert torch.allclose(torch.as_tensor(got).float(), ref.float(), rtol=1e-5, atol=1e-6)


def test_only_library_plans_get_the_eager_variant() -> None:
    """A plan with a generated kernel keeps its one printing."""
    from yirage_cpu._backend import CpuBackend

    be = CpuBackend()
    g = _workloads.get_workload("rmsnorm_linear")._build(
        {"b": 4, "h": 64, "n": 48, "dtype": yr.float32}, yr.float32
    )
    res = yr.search(g, device_spec=CPU2, cache=False, top_k=2)
    fused = next(c for c in res.candidates if not c.baseline)
    launcher = be.load(be.compile(be.codegen(fused.kernel_plan())))
    assert set(be.variants(launcher)) == {yr.plugin.DEFAULT_VARIANT}


def test_the_eager_variant_refuses_bad_inputs() -> None:
    g = _workloads.get_workload("rmsnorm_linear")._build(
        {"b": 4, "h": 64, "n": 48, "dtype": yr.float32}, yr.float32
    )
    be, launcher = _baseline_launcher(g)
    eager = be.variants(launcher)["torch_eager"]
    x, w = np.zeros((4, 64), np.float32), np.zeros((64, 48), np.float32)
    with pytest.raises(yr.plugin.ShapeError, match="takes 2 inputs"):
        eager(x)
    with pytest.raises(yr.plugin.BackendError, match="expected a CPU tensor of dims"):
        eager(x, np.zeros((48, 64), np.float32))
    out = np.empty((4, 48), np.float32)
    assert eager.run([x, w], outputs=[out])[0] is out
    # tensors that require grad are read without autograd, as the C launcher reads them
    (y,) = eager(torch.from_numpy(x).requires_grad_(True), torch.from_numpy(w))
    assert not y.requires_grad


def test_superoptimize_races_the_eager_variant() -> None:
    """The baseline's candidate row lists both printings, checked and timed."""
    g = _workloads.get_workload("attention_prefill")._build(
        {"b": 1, "q_heads": 1, "kv_heads": 1, "d": 32, "kv": 64, "q_len": 33, "dtype": yr.float32},
        yr.float32,
    )
    k = yr.superoptimize(g, backend="cpu", cache=False)
    (base,) = [c for c in k.report.candidates if "baseline" in c.description]
    assert "torch_eager" in base.variant_us or "torch_eager" in base.dropped_variants
