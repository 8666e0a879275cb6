"""Fixtures of the MPS backend tests.

Without a Mac the printed Metal Shading Language runs in yirage-mps's emulator (the source
compiled as C++ against a shim header, each threadgroup's threads as real threads meeting at
the barriers, :mod:`yirage_mps._emulate`). Tests marked ``mps`` need an Apple-silicon GPU with
torch's MPS backend: ``nox -s tests-mps`` (they skip without one unless
YIRAGE_REQUIRE_DEVICE=1).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# the CUDA tests' fixture plans (tests/cuda/plans.py) are vendor-neutral KernelPlans
sys.path.insert(0, str(Path(__file__).parents[1] / "cuda"))


@pytest.fixture(scope="session", autouse=True)
def _mps_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test of this folder writes into one fresh cache (not the user's)."""
    root = tmp_path_factory.mktemp("yirage-mps-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("YIRAGE_CACHE_DIR", str(root))
    yield root
    mp.undo()
