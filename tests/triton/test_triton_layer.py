"""The shared Triton layer on its own: a vendor backend is a TritonTarget plus hardware
hooks on TritonBackend. A test target (64-wide wavefronts, one fp32 dot precision, chosen
variant families) prints, compiles, loads and runs fixture plans in the Triton interpreter
and matches float64 references; the target decides which printings are tried."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from yirage.plan import CodegenError, parse_plan
from yirage.plugin import ConfigError

# The fixture plans and their float64 references are the cuda tests' (tests/cuda/plans.py).
# No conftest.py here: tests/cuda's modules import theirs as ``conftest``.
sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))
# Pin Triton's announced default (it warns otherwise, and warnings are errors here).
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
import plans
from _interp_backend import backend_class, needs_triton, private_cache

pytestmark = needs_triton


_private_cache = private_cache("yirage-triton-cache")


ALL_NAMES = {
    "triton_split",
    "triton_split_half",
    "triton_split_quarter",
    "triton_deep",
    "triton_split_deep",
    "triton_fine",
    "triton_fine_deep",
    "triton_split_scaled",
    "triton_scaled",
    "triton_aligned",
}


def _backend(families: frozenset[str] | None = None, **kw: Any) -> Any:
    """A thin vendor backend: a target and the hardware hooks, nothing else."""
    from yirage_triton import VARIANT_FAMILIES, TritonTarget

    target = TritonTarget(
        name="testvendor",
        torch_device="cuda",
        warp_size=64,
        fp32_dot_precisions=("ieee",),
        variant_families=VARIANT_FAMILIES if families is None else families,
    )
    return backend_class(target, 120, 160 * 1024)(**kw)


def _rel_err(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape and np.isfinite(a).all()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def test_a_target_names_its_mistakes() -> None:
    from yirage_triton import TritonTarget

    with pytest.raises(ConfigError, match=r"unknown variant families \['wide'\]; choose from"):
        TritonTarget("x", "cuda", variant_families=frozenset({"split", "wide"}))
    with pytest.raises(ConfigError, match="default_stages <= deep_stages, got 4 and 3"):
        TritonTarget("x", "cuda", default_stages=4, deep_stages=3)
    with pytest.raises(ConfigError, match="positive warp_size"):
        TritonTarget("x", "cuda", warp_size=0)
    npu = TritonTarget("ascend", "npu", variant_families=frozenset())
    assert not npu.tries("split") and npu.aot_backend is None


def test_every_variant_of_a_thin_backend_matches_float64_in_the_interpreter() -> None:
    """The interpreter prints the plain and the split printing (the others need device
    timings to be chosen between); each variant's launcher runs on CPU tensors and matches
    the workload's float64 formula."""
    be = _backend(interpret=True)
    assert be.probe().available and be.torch_device == "cpu"
    case = plans.gated_mlp()
    kernel = be.load(be.compile(be.codegen(case.plan)))
    variants = be.variants(kernel)
    assert set(variants) == {"triton", "triton_split"}
    xs = case.random_inputs(4)
    tensors = be.from_numpy(xs, [d for _, d in case.inputs])
    (want,) = case.reference(*[t.double().numpy() for t in tensors])
    for name, launcher in variants.items():
        (out,) = launcher(*tensors)
        assert _rel_err(out.double().numpy(), want) <= 2e-5, name
    prof = be.profile(variants["triton_split"], tensors, repeats=2)
    assert prof.median_us > 0 and "interpreter" in prof.method
    assert be.warm_time_us(kernel, tensors) is None


def test_a_target_without_families_prints_one_variant() -> None:
    be = _backend(frozenset(), interpret=True)
    kernel = be.load(be.compile(be.codegen(plans.gated_mlp().plan)))
    assert set(be.variants(kernel)) == {"triton"} and kernel.variant == "triton"


@pytest.mark.parametrize(
    "families,names",
    [
        (None, {"triton_split", "triton_split_half", "triton_deep", "triton_split_deep"}),
        (frozenset({"split", "split_half"}), {"triton_split", "triton_split_half"}),
        (frozenset({"deep"}), {"triton_deep"}),
    ],
)
def test_the_target_chooses_the_printings(families: frozenset[str] | None, names: set[str]) -> None:
    """On a device (not the interpreter) the printings tried are the target's families:
    gated MLP at decode size leaves compute units idle (split, half split), streams weights
    (deep pipelines); a family left out is never printed."""
    be = _backend(families, interpret=False)
    plan = parse_plan(plans.gated_mlp().plan)
    tried = be.printings(plan, be.default_options(plan))
    assert names <= set(tried) <= ALL_NAMES
    if families is not None:
        assert set(tried) == names
    assert all(o.max_stages in (3, 4, 5) for o in tried.values())


def test_the_target_names_the_dot_precisions_it_offers() -> None:
    from yirage_triton import TritonOptions

    be = _backend(interpret=True, triton_options=TritonOptions(fp32_dot_precision="tf32"))
    with pytest.raises(
        CodegenError, match=r"not offered by the testvendor target; use one of \['ieee'\]"
    ):
        be.codegen(plans.gated_mlp().plan)


def test_inputs_on_another_device_type_are_refused_with_the_fix() -> None:
    import torch

    from yirage_triton import InputError, check_inputs

    x = torch.zeros(4, 8)
    with pytest.raises(
        InputError, match=r"input 0 is on cpu; the kernel runs on npu tensors.*to\('npu'\)"
    ):
        check_inputs([x], [((4, 8), "float32")], device="npu")
    assert check_inputs([x], [((4, 8), "float32")], interpret=True) == [x]


def test_compile_options_are_printed_only_where_a_target_sets_them() -> None:
    """A target's compile options go into every launch and the KERNELS table; without them
    the printed text and the options key are what they were."""
    from yirage_triton import TritonOptions, generate_triton

    case = plans.gated_mlp()
    plain = generate_triton(case.plan, TritonOptions())
    amd = generate_triton(
        case.plan, TritonOptions(launch_options=(("waves_per_eu", 2),), dot_sum_precision="ieee")
    )
    assert "waves_per_eu" not in plain.text and "'options'" not in plain.text
    assert "dotsum" not in TritonOptions().key() and "launch" not in TritonOptions().key()
    launches = [ln for ln in amd.text.splitlines() if "num_warps=" in ln]
    assert launches and all(ln.count("waves_per_eu=2") == 1 for ln in launches)
    assert "'options': {'waves_per_eu': 2}" in amd.text
