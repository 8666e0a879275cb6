"""Fixtures of the CPU backend tests: an isolated disk cache and a plan → launcher helper."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for cpu_plan_tools


@pytest.fixture(scope="session", autouse=True)
def _cpu_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every test of this folder compiles into one fresh cache (not the user's)."""
    root = tmp_path_factory.mktemp("yirage-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("YIRAGE_CACHE_DIR", str(root))
    yield root
    mp.undo()


@pytest.fixture(scope="session")
def simd_bits() -> int:
    """The width the backend prints for (the DeviceSpec's: it follows the compile flags)."""
    try:
        from yirage_cpu._backend import CpuBackend

        return int(CpuBackend().device_spec().simd_width_bits or 256)
    except Exception:
        return 256


@pytest.fixture(scope="session")
def build(simd_bits: int) -> Callable[..., Any]:
    """``build(plan)`` → a loaded CpuLauncher (codegen, compile with -Werror, ctypes load)."""
    from yirage_cpu import _codegen, _runtime, _toolchain

    try:
        _toolchain.find_compiler()
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"no C compiler: {exc}")

    def _build(plan: Any, **kw: Any) -> Any:
        src = _codegen.generate(plan, simd_width_bits=simd_bits)
        lib = _toolchain.compile_shared(src.code, simd_width_bits=simd_bits, **kw)
        return _runtime.CpuLauncher(src, lib)

    return _build
