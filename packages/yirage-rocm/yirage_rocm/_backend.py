"""The AMD ROCm Backend object."""

from __future__ import annotations

from yirage import Backend, DeviceSpec, ProbeResult, VerificationLevel
from yirage_rocm import _device_spec, _probe


class RocmBackend(Backend):
    """AMD ROCm: probe and DeviceSpec. codegen/compile/load/profile are not implemented yet
    (they raise yirage.NotImplementedBackendError)."""

    name = "rocm"
    #: The plugin API this package was written against (yirage.PLUGIN_API of its release),
    #: declared here rather than inherited from yirage.Backend: inherited, it would always
    #: equal the installed yirage's PLUGIN_API and the registry's mismatch check could never
    #: fire; declared, a yirage of another major API version refuses this package with an
    #: error naming the versions to install.
    plugin_api = (1, 0)
    distribution = "yirage-rocm"
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
