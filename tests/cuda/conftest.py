"""Fixtures of the CUDA backend tests.

Without a GPU the generated Triton kernels run in the Triton interpreter on CPU tensors
(``CudaBackend(interpret=True)`` switches TRITON_INTERPRET on while it imports and runs the
printed modules, so GPU tests in the same session are unaffected), Triton kernels are
compiled for sm_90 ahead of time, and CUDA C++ kernels are compiled to cubins with NVRTC.
Tests marked ``cuda`` need the GPU: ``pytest -m cuda tests/cuda`` (they skip without one
unless YIRAGE_REQUIRE_DEVICE=1).
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


def have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


needs_triton = pytest.mark.skipif(
    not (have("triton") and have("torch")),
    reason="torch and triton are not installed (pip install torch triton runs these tests)",
)


@pytest.fixture(scope="session", autouse=True)
def _cuda_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test of this folder writes into one fresh cache (not the user's)."""
    root = tmp_path_factory.mktemp("yirage-cuda-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("YIRAGE_CACHE_DIR", str(root))
    yield root
    mp.undo()


@pytest.fixture(scope="session")
def interp() -> Any:
    """The CUDA backend in Triton-interpreter mode."""
    if not (have("triton") and have("torch")):
        pytest.skip("torch and triton are not installed")
    from yirage_cuda import CudaBackend

    return CudaBackend(interpret=True)


@pytest.fixture(scope="session")
def gpu() -> Any:
    """The CUDA backend on the GPU (skips without one unless YIRAGE_REQUIRE_DEVICE=1)."""
    from yirage import _env

    ok = have("torch") and have("triton")
    if ok:
        import torch

        ok = torch.cuda.is_available()
    if not ok:
        if _env.require_device():
            pytest.fail("YIRAGE_REQUIRE_DEVICE=1 but no CUDA GPU (with torch and triton) is usable")
        pytest.skip("no CUDA GPU")
    from yirage_cuda import CudaBackend

    return CudaBackend()
