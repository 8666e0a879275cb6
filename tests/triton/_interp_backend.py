"""Triton backends for printer tests: no device of their own, so they run in the Triton
interpreter (or only print and compile) on a target the test chooses."""

from __future__ import annotations

from typing import Any

from yirage.plugin import DeviceSpec, ProbeResult


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
