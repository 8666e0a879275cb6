"""The CPU DeviceSpec: the per-block tile budget, and what it reads on macOS."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from yirage_cpu import _device_spec
from yirage_cpu._backend import CpuBackend
from yirage_cpu._device_spec import block_bytes


def test_block_budget_is_a_share_of_l2_within_bounds() -> None:
    assert block_bytes({"L1d": 48 * 1024, "L2": 2 * 2**20}) == 2**20  # half of L2
    assert block_bytes({"L1d": 64 * 1024, "L2": 64 * 1024}) == 64 * 1024  # never below L1d
    assert block_bytes({"L1d": 48 * 1024}) == 48 * 1024  # no L2 figure: L1d
    assert block_bytes({}) is None


def test_live_spec_has_a_budget_and_simd_width() -> None:
    spec = CpuBackend().device_spec()
    assert spec.shared_mem_per_block is not None and spec.shared_mem_per_block >= 16 * 1024
    assert spec.simd_width_bits in (128, 256, 512)


def test_live_spec_records_the_isa_features_the_compile_enables() -> None:
    be = CpuBackend()
    spec = be.device_spec()
    assert spec.isa_features == be.isa_features()
    if spec.simd_width_bits == 512:  # -march=native on an AVX-512 host
        assert spec.isa_features is not None and "avx512f" in spec.isa_features


def _fake_sysctl(values: dict[str, str]) -> Callable[[str], str | None]:
    return values.get


def test_macos_caches_and_flags_come_from_sysctl(monkeypatch: pytest.MonkeyPatch) -> None:
    """macOS has no sysfs caches or /proc/cpuinfo: the spec asks sysctl (faked here; this
    Linux machine has no macOS sysctl names)."""
    apple_silicon = _fake_sysctl(
        {
            "hw.perflevel0.l1dcachesize": "131072",  # P-cores first
            "hw.l1dcachesize": "65536",
            "hw.perflevel0.l2cachesize": "16777216",
            "hw.l3cachesize": "0",  # none
        }
    )
    assert _device_spec.sysctl_cache_sizes(apple_silicon) == {"L1d": 131072, "L2": 16777216}
    intel_mac = _fake_sysctl(
        {
            "machdep.cpu.features": "FPU SSE SSE2 AVX1.0",
            "machdep.cpu.leaf7_features": "AVX2 AVX512F",
        }
    )
    flags = _device_spec.sysctl_cpu_flags(intel_mac)
    assert {"sse2", "avx", "avx2", "avx512f"} <= flags
    assert _device_spec.simd_width_bits(flags, "x86_64") == 512

    # device_spec() on "Darwin" with neither sysfs nor /proc/cpuinfo
    monkeypatch.setattr(_device_spec.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(_device_spec.platform, "machine", lambda: "arm64")
    monkeypatch.setattr(_device_spec, "cache_sizes", lambda: {})
    monkeypatch.setattr(_device_spec, "cpu_flags", lambda: (None, set()))
    monkeypatch.setattr(_device_spec, "sysctl", apple_silicon)
    spec = _device_spec.device_spec()
    assert spec.vendor == "Apple" and spec.l2_bytes == 16777216
    assert spec.shared_mem_per_block == block_bytes({"L1d": 131072, "L2": 16777216})
    assert spec.simd_width_bits == 128  # NEON
