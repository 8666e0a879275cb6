"""The Google TPU Backend object."""

from __future__ import annotations

from yirage.plugin import DeviceSpec, ProbeOnlyBackend, ProbeResult, VerificationLevel
from yirage_tpu import _device_spec, _probe


class TpuBackend(ProbeOnlyBackend):
    """Google TPU: probe and DeviceSpec; no code generator yet (codegen, compile, load and
    profile raise yirage.NotImplementedBackendError)."""

    name = "tpu"
    #: The plugin API this package was written against, declared here rather than inherited
    #: (inherited, it would always equal the installed yirage's and the registry's version
    #: check could never fire).
    plugin_api = (1, 1)
    distribution = "yirage-tpu"
    verification_level = VerificationLevel.NONE

    def probe(self) -> ProbeResult:
        return _probe.probe()

    def live_spec(self) -> DeviceSpec | None:
        return _device_spec.device_spec()

    def known_devices(self) -> dict[str, DeviceSpec]:
        return dict(_device_spec.KNOWN_DEVICES)
