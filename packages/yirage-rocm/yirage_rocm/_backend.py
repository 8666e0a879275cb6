"""The AMD ROCm Backend: the shared Triton layer (:class:`yirage_triton.TritonBackend`) for
the AMD :data:`TARGET`, run through torch for ROCm (``torch.cuda`` is HIP there: streams,
events and graph capture through HIP graphs).

``RocmBackend(interpret=True)`` runs the AMD printing in the Triton interpreter on CPU tensors
(no GPU): that is how CI checks its numbers; CI also compiles every printed kernel for
gfx942, gfx90a and gfx1100 (``yirage_triton.compile_for``).
"""

from __future__ import annotations

from typing import Any

from yirage.plan import CodegenError, parse_plan
from yirage.plugin import DeviceSpec, ProbeResult, VerificationLevel
from yirage_rocm import _device_spec, _probe
from yirage_triton import (
    AOT_TARGETS,
    TritonBackend,
    TritonPrinted,
    TritonTarget,
    triton_versions,
)

__all__ = ["COMPILE_OPTIONS", "TARGET", "RocmBackend"]

#: Options of Triton's HIP backend printed into every launch: the compiler picks the
#: occupancy (``waves_per_eu=0``); dots use the 16x16 matrix instructions (MFMA 16x16x16 on
#: CDNA, the only WMMA shape on RDNA3), which the plans' 16-row decode tiles fill, where the
#: 32x32 ones would run half empty; ``kpack=1``, Triton's default (other values are
#: deprecated from gfx950 on).
COMPILE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("waves_per_eu", 0),
    ("matrix_instr_nonkdim", 16),
    ("kpack", 1),
)

#: AMD's Triton target: torch.cuda of ROCm torch, 64-wide wavefronts (CDNA; the RDNA3 AOT
#: target compiles wave32), IEEE fp32 dots (TF32 exists on gfx942 only), no programmatic
#: dependent launch, 2 and 3 pipeline stages (Triton's HIP default is 2: stage buffers live
#: in the 64 KiB of LDS), every variant family, ahead-of-time "hip".
TARGET = TritonTarget(
    name="rocm",
    torch_device="cuda",
    warp_size=64,
    fp32_dot_precisions=("ieee",),
    pdl=False,
    default_stages=2,
    deep_stages=3,
    aot_backend="hip",
    compile_options=COMPILE_OPTIONS,
)


def aot_targets(vendor: str) -> list[str]:
    """Names of the ahead-of-time targets served by ``vendor``'s DeviceSpecs and printer."""
    return [t.name for t in AOT_TARGETS.values() if t.vendor == vendor]


class RocmBackend(TritonBackend):
    """AMD ROCm: Triton code from KernelPlans for AMD GPUs, run through torch for ROCm."""

    name = "rocm"
    target = TARGET
    #: The plugin API this package was written against, declared here rather than inherited
    #: (inherited, it would always equal the installed yirage's and the registry's version
    #: check could never fire).
    plugin_api = (1, 2)
    distribution = "yirage-rocm"
    #: CI runs every candidate of the bench workloads in the Triton interpreter with this
    #: printing and compiles each for gfx942, gfx90a and gfx1100; nothing has run on AMD
    #: hardware yet (docs/backends.md).
    verification_level = VerificationLevel.EMULATED

    # -- hardware hooks ------------------------------------------------------------------------
    def probe_device(self) -> ProbeResult:
        result = _probe.probe()
        try:
            tools = {**result.toolchain, **triton_versions()}
            if _probe.triton_has_amd_backend():
                tools["ahead-of-time targets"] = ", ".join(aot_targets("rocm"))
        except Exception:
            tools = dict(result.toolchain)
        return ProbeResult(result.available, result.reason, result.hardware, tools)

    def live_device_spec(self) -> DeviceSpec:
        spec = _device_spec.device_spec()
        if spec is None:
            raise self._unavailable(self.probe().reason)
        return spec

    def interpreter_spec(self) -> DeviceSpec:
        return _device_spec.MI300X

    def known_devices(self) -> dict[str, DeviceSpec]:
        return dict(_device_spec.KNOWN_DEVICES)

    def toolchain(self) -> dict[str, str]:
        tools = {**_probe.toolchain(), **triton_versions()}
        if self.interpret:
            tools["mode"] = "Triton interpreter (CPU)"
        return tools

    # -- codegen ---------------------------------------------------------------------------------
    def codegen(self, plan: Any) -> TritonPrinted:
        """Print a KernelPlan for the AMD device; CodegenError naming the kernel and the LDS
        limit when a kernel's resident tiles exceed what one workgroup may hold (a plan made
        for another device: the printer can lower stages, not shrink tiles)."""
        p = parse_plan(plan)
        limit = self.smem_limit()
        for k in p.generated:
            if limit is not None and k.smem_bytes > limit:
                raise CodegenError(
                    f"kernel {k.name!r} of plan {p.graph_hash or '?'} holds {k.smem_bytes} "
                    f"bytes of tiles per workgroup; the {self.device_spec().name} has "
                    f"{limit} bytes of LDS per workgroup: search with backend='rocm' (its "
                    "DeviceSpec) for tiles that fit"
                )
        return super().codegen(p)
