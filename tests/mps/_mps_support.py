"""Helpers of the MPS tests: the emulator's skip marker, tensors, relative errors."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def host_compiler() -> str | None:
    from yirage_mps._emulate import host_compiler

    return host_compiler()


needs_emulator = pytest.mark.skipif(
    not _have("torch") or host_compiler() is None,
    reason="the MSL emulator needs torch and a host C++20 compiler (g++ or clang++)",
)


def to_torch(arrays: list[Any], dtypes: list[str], device: str = "cpu") -> list[Any]:
    """float32 numpy arrays as torch tensors of the plan's dtypes."""
    import numpy as np
    import torch

    return [
        torch.from_numpy(np.asarray(a, dtype=np.float32)).to(getattr(torch, d)).to(device)
        for a, d in zip(arrays, dtypes, strict=True)
    ]


def rel_err(a: Any, b: Any) -> float:
    """Relative Frobenius error of ``a`` against the float64 reference ``b`` (inf when ``a``
    has a non-finite value or another shape)."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or not np.isfinite(a).all():
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
