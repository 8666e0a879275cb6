"""The Apple Metal (MPS) Backend object."""

from __future__ import annotations

from yirage import Backend, DeviceSpec, ProbeResult, VerificationLevel
from yirage_mps import _device_spec, _probe


class MpsBackend(Backend):
    """Apple Metal (MPS): probe and DeviceSpec. codegen/compile/load/profile are not implemented yet
    (they raise yirage.NotImplementedBackendError)."""

    name = "mps"
    distribution = "yirage-mps"
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
