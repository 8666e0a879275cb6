"""The CPU DeviceSpec's per-block tile budget."""

from __future__ import annotations

from yirage_cpu._backend import CpuBackend
from yirage_cpu._device_spec import block_bytes


def test_block_budget_is_a_share_of_l2_within_bounds() -> None:
    assert block_bytes({"L1d": 48 * 1024, "L2": 2 * 2**20}) == 128 * 1024
    assert block_bytes({"L1d": 32 * 1024, "L2": 256 * 1024}) == 32 * 1024  # never below L1d
    assert block_bytes({"L1d": 48 * 1024, "L2": 32 * 2**20}) == 256 * 1024  # capped
    assert block_bytes({"L1d": 48 * 1024}) == 48 * 1024  # no L2 figure: L1d
    assert block_bytes({}) is None


def test_live_spec_has_a_budget_and_simd_width() -> None:
    spec = CpuBackend().device_spec()
    assert spec.shared_mem_per_block is not None and spec.shared_mem_per_block >= 16 * 1024
    assert spec.simd_width_bits in (128, 256, 512)
