"""On triton-ascend's own Triton (its separate environment: ``nox -s triton-ascend``, a step
of ``nox -s ci``; skipped where ``import triton`` finds upstream triton): its interpreter runs
a masked add and every Ascend printing of the five bench workloads' search candidates at CI
size (float16) against the float64 reference, and its compiler lowers every printed kernel
through its frontend and adapter (TTIR → the linalg/HIVM IR that BiSheng compiles). The last
step, BiSheng itself, needs CANN's ``bishengir-compile`` and ``ASCEND_HOME_PATH``: without
them Triton-Ascend stops there, which a test asserts too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
import _ascend_cases as cases

from yirage_ascend._toolchain import triton_flavour

pytestmark = pytest.mark.skipif(
    triton_flavour() != "triton-ascend",
    reason="import triton finds upstream triton here; nox -s triton-ascend runs these on "
    "triton-ascend's",
)


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("yirage-triton-ascend-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("YIRAGE_CACHE_DIR", str(root))
    mp.setenv("TRITON_CACHE_DIR", str(root / "triton"))
    yield root
    mp.undo()


def test_interpreter_runs_a_masked_add_on_cpu_tensors() -> None:
    """What a new user tries first (``TRITON_INTERPRET=1``): 1000 elements in blocks of 128,
    the last block masked."""
    import torch

    from yirage_triton import interpret_mode

    with interpret_mode(True):
        import triton
        import triton.language as tl

        def add(x: Any, y: Any, o: Any, n: Any, block: tl.constexpr) -> None:
            offs = tl.program_id(0) * block + tl.arange(0, block)
            mask = offs < n
            tl.store(o + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask)

        kernel = triton.jit(add)
        x, y = torch.randn(1000), torch.randn(1000)
        out = torch.full((1000,), float("nan"))
        kernel[(8,)](x, y, out, 1000, block=128)
    np.testing.assert_array_equal(out.numpy(), (x + y).numpy())
    print(f"masked add on {cases.triton_label()}")


@pytest.fixture(scope="module")
def interp() -> Any:
    from yirage_ascend import AscendBackend

    return AscendBackend(interpret=True)


@pytest.mark.parametrize("name", list(cases.SMALL))
def test_every_candidate_runs_in_triton_ascend_s_interpreter_and_lowers(
    interp: Any, name: str, tmp_path: Path
) -> None:
    ran = cases.run_candidates(interp, name, "float16")
    paths = []
    for i, plan in enumerate(ran.plans):
        paths.append(tmp_path / f"plan{i}.json")
        paths[-1].write_text(plan.to_json())
    # a fresh process: the interpreter leaves triton.language patched in this one
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "_lower_plans.py"), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    lowered = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(lowered) >= ran.kernels > 0
    assert all(k["adapter_func"] and k["adapter_bytes"] > 0 for k in lowered)
    if name != "rmsnorm_linear" or any(k["ttir_dot"] for k in lowered):
        assert any(k["ttir_dot"] for k in lowered)  # the cube unit's dots reached TTIR
    print(f"{name}/float16 on {cases.triton_label()}: {ran}; {len(lowered)} kernels lowered")


_FULL_COMPILE = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

@triton.jit
def copy(x, o, block: tl.constexpr):
    offs = tl.arange(0, block)
    tl.store(o + offs, tl.load(x + offs))

src = ASTSource(copy, {"x": "*fp32", "o": "*fp32", "block": "constexpr"}, {"block": 64})
triton.compile(src, target=GPUTarget("npu", "Ascend910B3", 0))
"""


def test_bisheng_is_what_is_missing_without_cann(tmp_path: Path) -> None:
    """Triton-Ascend's full compile runs TTIR and the adapter here, then stops at BiSheng
    (``ConvertLinalgRToBinary``) for want of CANN (a fresh process: no interpreter patches)."""
    from yirage_ascend._toolchain import bishengir_compile, cann_home

    if cann_home()[0] is not None or bishengir_compile() is not None:
        pytest.skip("this machine has CANN")
    script = tmp_path / "full_compile.py"  # @triton.jit reads its source from a file
    script.write_text(_FULL_COMPILE)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=dict(os.environ, TRITON_CACHE_DIR=str(tmp_path)),
    )
    assert proc.returncode != 0
    assert "ConvertLinalgRToBinary" in proc.stderr and "ASCEND_HOME_PATH" in proc.stderr
