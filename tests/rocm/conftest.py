"""Fixtures of the ROCm backend tests.

Without an AMD GPU the AMD printing runs in the Triton interpreter on CPU tensors
(``RocmBackend(interpret=True)``) and every printed kernel is compiled ahead of time for
gfx942, gfx90a and gfx1100 with Triton's AMD backend. Tests marked ``rocm`` need the GPU:
``pytest -m rocm tests/rocm`` (they skip without one unless YIRAGE_REQUIRE_DEVICE=1). The
resources of every compiled kernel are listed at the end of the run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# Pin Triton's announced default (it warns otherwise, and warnings are errors here).
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import rocm_cases


@pytest.fixture(scope="session", autouse=True)
def _rocm_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test of this folder writes into one fresh cache (not the user's)."""
    root = tmp_path_factory.mktemp("yirage-rocm-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("YIRAGE_CACHE_DIR", str(root))
    yield root
    mp.undo()


@pytest.fixture(scope="session")
def interp() -> Any:
    """The ROCm backend in Triton-interpreter mode."""
    rocm_cases.skip_without_triton()
    from yirage_rocm import RocmBackend

    return RocmBackend(interpret=True)


@pytest.fixture(scope="session")
def gpu() -> Any:
    """The ROCm backend on the AMD GPU (skips without one unless YIRAGE_REQUIRE_DEVICE=1)."""
    from yirage import _env

    ok = rocm_cases.have("torch") and rocm_cases.have("triton")
    if ok:
        import torch

        ok = getattr(torch.version, "hip", None) is not None and torch.cuda.is_available()
    if not ok:
        if _env.require_device():
            pytest.fail("YIRAGE_REQUIRE_DEVICE=1 but no AMD GPU with torch for ROCm is usable")
        pytest.skip("no AMD GPU with torch for ROCm")
    from yirage_rocm import RocmBackend

    return RocmBackend()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The registers and LDS of every kernel compiled for an AMD target in this run."""
    rows = rocm_cases.RESOURCES
    if not rows:
        return
    terminalreporter.section("AMD kernels compiled ahead of time (resources from the code object)")
    for row in rows:
        terminalreporter.write_line(row)
