"""Triton backends for printer tests: no device of their own, so they run in the Triton
interpreter (or only print and compile) on a target the test chooses."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from yirage.plugin import DeviceSpec, ProbeResult

#: module-level ``pytestmark`` of tests that print and run Triton kernels
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None,
    reason="torch and triton are not installed (pip install torch triton runs these tests)",
)


def host_launch(plan: Any, **options: Any) -> tuple[Callable[..., Any], str]:
    """``launch`` of ``plan``'s printed host code (``launcher_lines`` with ``options``; a
    generated kernel prints as a comment naming it, so only plans whose kernels are all
    library ones compute anything) and its source."""
    import torch

    from yirage.plan import Plan, parse_plan
    from yirage_triton import launcher_lines

    parsed = plan if isinstance(plan, Plan) else parse_plan(plan)
    lines = launcher_lines(parsed, lambda k, names: [f"pass  # kernel {k.name}"], **options)
    src = "\n".join(lines)
    scope: dict[str, Any] = {"torch": torch}
    exec(compile(src, "<host>", "exec"), scope)
    return scope["launch"], src


def private_cache(name: str) -> Callable[..., Any]:
    """An autouse module fixture pointing ``YIRAGE_CACHE_DIR`` at a fresh folder ``name``, so
    a module's tests write into their own cache, not the user's (assign it to a module
    global for pytest to collect it)."""

    @pytest.fixture(scope="module", autouse=True)
    def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
        root = tmp_path_factory.mktemp(name)
        mp = pytest.MonkeyPatch()
        mp.setenv("YIRAGE_CACHE_DIR", str(root))
        yield root
        mp.undo()

    return _private_cache


def backend_class(target: Any, compute_units: int, smem_limit: int) -> Any:
    """A ``TritonBackend`` subclass for ``target`` that finds no device and reports
    ``compute_units`` and ``smem_limit`` bytes of shared memory."""
    from yirage_triton import TritonBackend

    class Interp(TritonBackend):
        def probe_device(self) -> ProbeResult:
            return ProbeResult(False, "no test device: use interpret=True")

        def live_device_spec(self) -> DeviceSpec:
            raise self._unavailable("no test device")

        def interpreter_spec(self) -> DeviceSpec:
            raise self._unavailable("not needed by these tests")

        def compute_units(self) -> int:
            return compute_units

        def smem_limit(self) -> int | None:
            return smem_limit

    Interp.name = target.name
    Interp.target = target
    return Interp


def interp_backend(name: str, **options: Any) -> Any:
    """An H100-sized backend ``name`` without printing families of its own, printing with
    ``TritonOptions(**options)`` when given."""
    from yirage_triton import TritonOptions, TritonTarget

    target = TritonTarget(name, "cuda", variant_families=frozenset())
    cls = backend_class(target, 132, 227 * 1024)
    topts = TritonOptions(**options) if options else None
    return cls(interpret=True, triton_options=topts)
