"""The Huawei Ascend Backend object."""

from __future__ import annotations

from yirage import Backend, DeviceSpec, ProbeResult, VerificationLevel
from yirage_ascend import _device_spec, _probe


class AscendBackend(Backend):
    """Huawei Ascend: probe and DeviceSpec. codegen/compile/load/profile are not implemented yet
    (they raise yirage.NotImplementedBackendError)."""

    name = "ascend"
    distribution = "yirage-ascend"
    verification_level = VerificationLevel.NONE

    def probe(self) -> ProbeResult:
        return _probe.probe()

    def device_spec(self) -> DeviceSpec:
        spec = _device_spec.device_spec()
        if spec is None:
            raise self._unavailable(self.probe().reason)
        return spec

    def known_devices(self) -> dict[str, DeviceSpec]:
        return dict(_device_spec.KNOWN_DEVICES)
