"""A thin Triton backend for printer tests: an H100-sized target run by the Triton
interpreter, with no printing families of its own."""

from __future__ import annotations

from typing import Any

from yirage.plugin import DeviceSpec, ProbeResult


def interp_backend(name: str, **options: Any) -> Any:
    """The backend ``name``, printing with ``TritonOptions(**options)`` when given."""
    from yirage_triton import TritonBackend, TritonOptions, TritonTarget

    class Interp(TritonBackend):
        def probe_device(self) -> ProbeResult:
            return ProbeResult(False, "no test device: use interpret=True")

        def live_device_spec(self) -> DeviceSpec:
            raise self._unavailable("no test device")

        def interpreter_spec(self) -> DeviceSpec:
            raise self._unavailable("not needed by these tests")

        def compute_units(self) -> int:
            return 132

        def smem_limit(self) -> int | None:
            return 227 * 1024

    Interp.name = name
    Interp.target = TritonTarget(name, "cuda", variant_families=frozenset())
    topts = TritonOptions(**options) if options else None
    return Interp(interpret=True, triton_options=topts)
