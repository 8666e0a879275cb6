"""Hardware tests, one marker per vendor; deselected by default (see pyproject addopts).

Run them with ``nox -s tests-<vendor>``. Without the device they skip, unless
``YIRAGE_REQUIRE_DEVICE=1`` makes them fail. Until a vendor has a code generator, what can be
checked on its hardware is the probe and the live DeviceSpec."""

from __future__ import annotations

import pytest

import yirage as yr
from yirage import _env


def _require(vendor: str) -> yr.BackendInfo:
    info = yr.get_backend_info(vendor)
    if not info.available:
        message = f"{vendor} hardware not available: {info.reason}"
        if _env.require_device():
            pytest.fail(message + " (YIRAGE_REQUIRE_DEVICE=1)")
        pytest.skip(message)
    return info


@pytest.mark.parametrize(
    "vendor",
    [
        pytest.param("cuda", marks=pytest.mark.cuda),
        pytest.param("rocm", marks=pytest.mark.rocm),
        pytest.param("mps", marks=pytest.mark.mps),
        pytest.param("ascend", marks=pytest.mark.ascend),
        pytest.param("tpu", marks=pytest.mark.tpu),
    ],
)
def test_device_is_probed_and_described(vendor: str) -> None:
    info = _require(vendor)
    assert info.hardware, "the probe names the hardware it found"
    assert vendor in yr.get_available_backends()
    spec = info.device_spec
    assert spec is not None, info.error
    assert spec.source in ("live", "table+live", "table")
    assert info.verification_level is not None
    assert info.codegen_implemented == (info.verification_level is not yr.VerificationLevel.NONE)


@pytest.mark.cuda
def test_cuda_live_query_reads_the_gpu() -> None:
    info = _require("cuda")
    spec = info.device_spec
    assert spec is not None and spec.source in ("live", "table+live")
    assert spec.arch.startswith("sm_") and spec.compute_units and spec.compute_units > 0
    assert spec.warp_size == 32
    assert spec.shared_mem_per_block and spec.shared_mem_per_block >= 48 * 1024
