"""The Huawei Ascend Backend: the shared Triton layer (:class:`yirage_triton.TritonBackend`)
printing for Triton-Ascend (:data:`TARGET`), every printing held to the Ascend limits
(:mod:`yirage_ascend._check`) before it is written, loaded or run.

On an Ascend host the printed modules are compiled by Triton-Ascend (BiSheng) at their first
launch and run on ``torch.npu`` tensors through the shared torch host glue and launcher.
``AscendBackend(interpret=True)`` runs them in the Triton interpreter on CPU tensors, which is
how CI checks their numbers without an NPU.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from yirage.plan import Plan, parse_plan
from yirage.plugin import (
    DeviceSpec,
    ProbeResult,
    VerificationLevel,
)
from yirage_ascend import _device_spec, _probe, _toolchain
from yirage_ascend._check import KernelFootprint, check_printing, footprints, require_fits
from yirage_ascend._rules import ATLAS_A2, AscendRules
from yirage_triton import (
    Launcher,
    TritonArtifact,
    TritonBackend,
    TritonPrinted,
    TritonTarget,
)

__all__ = ["TARGET", "AscendBackend", "AscendPrinted"]

#: Triton-Ascend's target: torch_npu's "npu" tensors; no warps (an AI Core runs one program,
#: the printed ``num_warps`` is ignored by its SIMD compile); ``tl.dot`` on fp32 takes "ieee"
#: or "hf32"; one pipeline stage (the compiler multibuffers loop loads itself); only the split
#: printing (more programs for AI cores a plan leaves idle), no named ahead-of-time target
#: (Triton-Ascend's last step needs CANN; see ``_frontend`` for what runs without it).
TARGET = TritonTarget(
    name="ascend",
    torch_device="npu",
    warp_size=1,
    fp32_dot_precisions=ATLAS_A2.fp32_dot_precisions,
    pdl=False,
    default_stages=1,
    deep_stages=1,
    variant_families=frozenset({"split"}),
    aot_backend=None,
)


@dataclass
class AscendPrinted(TritonPrinted):
    """The printings that fit the Ascend limits, their UB footprints, and the further
    printings rejected by the checker (variant name → the rules broken)."""

    footprints: list[KernelFootprint] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)


class AscendBackend(TritonBackend):
    """Huawei Ascend: Triton for Triton-Ascend from KernelPlans, run through torch_npu."""

    name = "ascend"
    target = TARGET
    #: The plugin API this package was written against, declared here rather than inherited
    #: (inherited, it would always equal the installed yirage's and the registry's version
    #: check could never fire).
    plugin_api = (1, 2)
    distribution = "yirage-ascend"
    #: CI runs every printed kernel of the bench workloads in the Triton interpreter with the
    #: Ascend limits checked; none has been compiled by BiSheng or run on an NPU.
    verification_level = VerificationLevel.EMULATED
    rules: AscendRules = ATLAS_A2

    # -- hardware hooks ------------------------------------------------------------------------
    def probe_device(self) -> ProbeResult:
        result = _probe.probe()
        tools = dict(result.toolchain)
        try:
            tools.update(_toolchain.toolchain_versions())
            tools.update({k: f"missing; fix: {v}" for k, v in _toolchain.missing().items()})
        except Exception as exc:  # never raise from a probe
            tools["toolchain"] = f"probe failed: {type(exc).__name__}: {exc}"
        return ProbeResult(result.available, result.reason, result.hardware, tools)

    def live_device_spec(self) -> DeviceSpec:
        spec = _device_spec.device_spec()
        if spec is None:
            raise self._unavailable(self.probe().reason)
        return spec

    def interpreter_spec(self) -> DeviceSpec:
        return _device_spec.ASCEND_910B3

    def known_devices(self) -> dict[str, DeviceSpec]:
        return dict(_device_spec.KNOWN_DEVICES)

    def toolchain(self) -> dict[str, str]:
        tools = _toolchain.toolchain_versions()
        if self.interpret:
            tools["mode"] = "Triton interpreter (CPU), Ascend limits checked"
        return tools

    # -- the NPU ---------------------------------------------------------------------------------
    def _device_api(self) -> Any:
        """``torch.npu``: it exists once torch_npu is imported."""
        try:
            importlib.import_module("torch_npu")
        except Exception as exc:
            raise self._unavailable(
                f"kernels run on torch.npu, which needs torch_npu ({exc}): pip install "
                "torch-npu (matching torch and CANN), or use AscendBackend(interpret=True)"
            ) from exc
        return super()._device_api()

    def triton_launchers(self, artifact: TritonArtifact) -> dict[str, Launcher]:
        if not self.interpret:
            self._device_api()  # torch.npu before any launcher touches it
        return super().triton_launchers(artifact)

    # -- codegen ---------------------------------------------------------------------------------
    def codegen(self, plan: Any) -> AscendPrinted:
        """Print a KernelPlan for Triton-Ascend. AscendLimitError (a CodegenError naming the
        rule) when the plain printing breaks a limit; a further printing that does is left
        out and listed in ``rejected``."""
        p: Plan = parse_plan(plan)
        base, variants = self.print_triton(p)
        require_fits(base, self.rules)
        kept, rejected = {}, {}
        for name, src in variants.items():
            findings = check_printing(src, self.rules)
            if findings:
                rejected[name] = "; ".join(str(f) for f in findings)
            else:
                kept[name] = src
        return AscendPrinted(p, base, kept, footprints(base, self.rules), rejected)
