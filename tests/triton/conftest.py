"""Fixtures of the Triton layer's tests: they run its printer, runtime and reusable backend
through a vendor-neutral test target in the Triton interpreter (CPU tensors, no device)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# the fixture plans and their float64 references are the cuda tests' (tests/cuda/plans.py)
sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))
# Pin Triton's announced default (it warns otherwise, and warnings are errors here).
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


@pytest.fixture(scope="session", autouse=True)
def _triton_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test of this folder writes into one fresh cache (not the user's)."""
    root = tmp_path_factory.mktemp("yirage-triton-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("YIRAGE_CACHE_DIR", str(root))
    yield root
    mp.undo()
