"""Shared fixtures. Tests need the native module and the six vendor packages installed
(``nox -s tests`` does both)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import numpy as np
import pytest

from yirage import _registry


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh generator per test; its seed is printed so a failure can be replayed."""
    seed = secrets.randbits(32)
    print(f"numpy seed: {seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def fresh_registry() -> Iterator[None]:
    """Forget the cached backend discovery before and after the test."""
    _registry._reset()
    yield
    _registry._reset()
