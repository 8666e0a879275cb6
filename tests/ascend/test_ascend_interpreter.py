"""The Ascend printing in the Triton interpreter, with the Ascend limits checked: every
candidate ``yr.search`` emits for the five bench workloads at CI size (float32 and float16,
searched for the Ascend 910B3 spec) fits the limits and matches the float64 reference; the
static checker rejects printings that break a limit, naming the rule.

These run on the Triton that the test environment imports (upstream triton in ``nox -s
tests``; each test records it in its output). tests/ascend/test_triton_ascend.py runs the
same candidates on triton-ascend's own Triton in its separate environment.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The fixture plans and their float64 references are the cuda tests' (tests/cuda/plans.py).
# No conftest.py here: tests/cuda's modules import theirs as ``conftest``.
sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
import _ascend_cases as cases
import plans

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None,
    reason="torch and triton are not installed (pip install torch triton runs these tests)",
)


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("yirage-ascend-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("YIRAGE_CACHE_DIR", str(root))
    yield root
    mp.undo()


@pytest.fixture(scope="module")
def interp() -> Any:
    from yirage_ascend import AscendBackend

    return AscendBackend(interpret=True)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", list(cases.SMALL))
def test_every_search_candidate_fits_and_matches_float64(
    interp: Any, name: str, dtype: str
) -> None:
    ran = cases.run_candidates(interp, name, dtype)
    assert ran.kernels > 0, "no candidate had a generated kernel"
    print(f"{name}/{dtype} on {cases.triton_label()}: {ran}")


def test_a_plan_that_overflows_the_ub_is_rejected_naming_the_limit(interp: Any) -> None:
    """RMSNorm + Linear with 64x256 X and 256x256 W chunks in fp32: the loop's loads alone,
    double-buffered, need 640 KiB; the UB holds 192 KiB."""
    from yirage_ascend._check import AscendLimitError

    case = plans.rmsnorm_linear(b=64, h=512, n=256, tn=256, tk=256)
    with pytest.raises(AscendLimitError, match="ub-bytes") as err:
        interp.codegen(case.plan)
    (finding,) = [f for f in err.value.findings if f.rule == "ub-bytes"]
    assert "196608 B per core" in str(err.value) and finding.kernel == "rms_mm"
    # the same plan with small chunks fits and runs
    small = plans.rmsnorm_linear(b=64, h=512, n=256, tn=32, tk=64)
    out, xs = cases.run_fixture(interp, small)
    assert cases.rel(out[0], small.reference(*xs)[0]) <= 2e-5


def test_the_ub_model_counts_loop_loads_per_buffer_and_pads_rows(interp: Any) -> None:
    """The footprint of the documented example: M = 8 rows padded to the cube's 16, so X
    [16,32] and W [32,16] fp32 loads (two buffers each), the [16,16] accumulator, the [16,1]
    rms accumulator with each row padded to a 32-byte block, and the [16,16] quotient in the
    epilogue."""
    from yirage_ascend._check import footprints

    case = plans.rmsnorm_linear(b=8, h=512, n=768, tn=16, tk=32)
    (fp,) = footprints(interp.codegen(case.plan).triton)
    loads = 2 * (16 * 32 * 4 + 32 * 16 * 4)
    kept = 16 * 16 * 4 + 16 * 32  # accumulator, rms rows of one 32-byte block each
    assert fp.ub_bytes == kept + max(loads, 16 * 16 * 4) == 9728
    assert fp.programs == 768 // 16


def test_dot_rules_name_the_rule(interp: Any) -> None:
    """The printer pads dot dims to 16, which the A2 cube takes; a cube with 32-wide
    fractals would not take the 16-row operand, and an fp32 dot asking tf32 (an NVIDIA
    precision Triton-Ascend does not offer) is refused."""
    from yirage_ascend._check import check_printing
    from yirage_ascend._rules import ATLAS_A2
    from yirage_triton import TritonOptions, generate_triton

    case = plans.rmsnorm_linear(b=8, h=512, n=768, tn=16, tk=32)
    src = interp.codegen(case.plan).triton
    assert check_printing(src, ATLAS_A2) == []
    wide = dataclasses.replace(ATLAS_A2, cube_fractal=32)
    assert [f.rule for f in check_printing(src, wide)] == ["dot-shape"]
    tf32 = generate_triton(src.plan, TritonOptions(fp32_dot_precision="tf32", max_stages=1))
    found = check_printing(tf32, ATLAS_A2)
    assert [f.rule for f in found] == ["dot-precision"] and "hf32" in str(found[0])
    small_l0c = dataclasses.replace(ATLAS_A2, l0c_bytes=8 * 16 * 4 // 2)
    assert "cube-l0c-bytes" in [f.rule for f in check_printing(src, small_l0c)]


def test_grid_limit_and_dtypes_are_checked(interp: Any) -> None:
    from yirage_ascend._check import check_printing
    from yirage_ascend._rules import ATLAS_A2

    case = plans.rmsnorm_linear(b=8, h=512, n=768, tn=16, tk=32)
    src = interp.codegen(case.plan).triton
    few = dataclasses.replace(ATLAS_A2, max_grid=32)
    (grid,) = check_printing(src, few)
    assert grid.rule == "grid" and "48 programs" in str(grid)
    no_fp32 = dataclasses.replace(ATLAS_A2, dtypes=frozenset({"float16"}))
    assert {f.rule for f in check_printing(src, no_fp32)} == {"dtype"}


def test_printing_follows_the_ascend_target(interp: Any) -> None:
    """One pipeline stage (the compiler multibuffers), no programmatic dependent launch, the
    fp32 dot precision Triton-Ascend offers, modules named for the ascend backend."""
    case = plans.rmsnorm_linear()
    printed = interp.codegen(case.plan)
    code = printed.code
    assert "num_stages': 1" in code and "'pdl': False" in code
    assert 'input_precision="tf32"' not in code and "griddepcontrol" not in code
    assert printed.footprints and printed.rejected == {}
    kernel = interp.load(interp.compile(printed))
    assert kernel.interpret and type(kernel.active).__module__.startswith("yirage_triton")


def test_superoptimize_with_the_ascend_interpreter_backend(interp: Any) -> None:
    """End to end: candidates built on superoptimize's threads, checked, stressed and raced
    in the interpreter; every candidate ran (none lost to a module the build threads imported
    compiled instead of interpreted)."""
    import yirage as yr
    from yirage._workloads import get_workload

    # float32: the stress set's fp16 extremes make numpy warn in the interpreter (an error here)
    graph = get_workload("rmsnorm_linear")._build(cases.SMALL["rmsnorm_linear"], yr.float32)
    kernel = yr.superoptimize(graph, backend=interp, top_k=2, cache=False, time_limit=60)
    assert kernel.backend == "ascend"
    assert kernel.report.verification_level == "ran emulated"
    errors = [c.error for c in kernel.report.candidates]
    assert errors == [None] * len(errors) and kernel.report.chosen_index is not None, errors
    tensors = interp.random_inputs([(t.dims, t.dtype.name) for t in graph.inputs])
    ref = graph.evaluate([t.double().numpy() for t in tensors])
    assert cases.rel(kernel(*tensors)[0].double().numpy(), ref[0]) <= cases.TOL["float32"]
