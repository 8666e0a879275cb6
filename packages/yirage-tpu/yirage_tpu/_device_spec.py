"""TPU DeviceSpecs: a datasheet table of chips (v4, v5e, v5p, v6e), matched by jax's
``device_kind``, and the live spec of the chip jax sees.

Sources, per chip: Google Cloud's system-architecture pages (cloud.google.com/tpu/docs/v4,
/v5e, /v5p, /v6e: TensorCores per chip, MXUs per TensorCore, HBM capacity and bandwidth, peak
bf16 compute) and jax's Pallas TPU chip table (``jax/_src/pallas/mosaic/tpu_info.py``, jax
0.10: VMEM per TensorCore, MXU width 128 before v6e and 256 on v6e, 8 sublanes x 128 lanes).
Figures are per chip except VMEM and the MXU count, which are per TensorCore.

How they map onto the DeviceSpec the search reads: ``compute_units`` counts TensorCores (the
megacore chips v4 and v5p run one program on each), ``matrix_tile`` is the MXU, the bf16 peak
goes into ``peak_tflops_fp16`` (TPUs have no separate fp16 path) and fp32 is left out (not
published). ``shared_mem_per_block`` is half the 16 MiB scoped-VMEM limit every printed kernel
asks Mosaic for (``vmem_limit_bytes``; physical VMEM is larger from v5e on): the search keeps
a block's tiles inside it, and Pallas double-buffers every block it streams. ``tiling`` is
the (8, 128) 32-bit tile of the vector registers: the block-shape rule Mosaic enforces.
"""

from __future__ import annotations

from dataclasses import dataclass

from yirage import Backend, DeviceSpec
from yirage_tpu._pallas import VMEM_LIMIT_BYTES
from yirage_tpu._probe import jax_tpu_device

__all__ = ["KNOWN_CHIPS", "KNOWN_DEVICES", "SCOPED_VMEM_BYTES", "TPU_TILING", "TpuChip"]

#: The (sublane, lane) tile of 32-bit values; 16-bit blocks need 16 rows, 8-bit 32.
TPU_TILING = (8, 128)
#: VMEM a printed kernel may use (Mosaic's default scoped limit on v4/v5e/v5p).
SCOPED_VMEM_BYTES = VMEM_LIMIT_BYTES


@dataclass(frozen=True)
class TpuChip:
    """One TPU generation's datasheet figures (see the module doc for sources)."""

    name: str
    arch: str
    tensor_cores: int
    mxus_per_core: int
    mxu: int
    vmem_bytes_per_core: int
    hbm_bytes: int
    hbm_gbps: float
    bf16_tflops: float
    source: str

    def spec(self) -> DeviceSpec:
        return DeviceSpec(
            name=f"Google {self.name}",
            vendor="Google",
            arch=self.arch,
            compute_units=self.tensor_cores,
            warp_size=None,
            max_threads_per_block=None,
            shared_mem_per_block=SCOPED_VMEM_BYTES // 2,
            l2_bytes=None,
            mem_bandwidth_gbps=self.hbm_gbps,
            peak_tflops_fp16=self.bf16_tflops,
            peak_tflops_fp32=None,
            matrix_tile=(self.mxu, self.mxu, self.mxu),
            execution_model="tile",
            tiling=TPU_TILING,
        )


_MIB, _GB = 2**20, 10**9


def _chip(
    name: str,
    cores: int,
    mxus: int,
    mxu: int,
    vmem_mib: int,
    hbm_gb: int,
    gbps: float,
    tflops: float,
) -> TpuChip:
    gen = name.split()[-1]
    return TpuChip(
        name=name,
        arch=f"tpu_{gen}",
        tensor_cores=cores,
        mxus_per_core=mxus,
        mxu=mxu,
        vmem_bytes_per_core=vmem_mib * _MIB,
        hbm_bytes=hbm_gb * _GB,
        hbm_gbps=gbps,
        bf16_tflops=tflops,
        source=f"cloud.google.com/tpu/docs/{gen}; jax tpu_info TPU_{gen.upper()}",
    )


#: name: TensorCores, MXUs per core, MXU width, VMEM MiB per core, HBM GB, GB/s, bf16 TFLOPS
KNOWN_CHIPS: dict[str, TpuChip] = {
    c.name: c
    for c in (
        _chip("TPU v4", 2, 4, 128, 16, 32, 1200.0, 275.0),
        _chip("TPU v5e", 1, 4, 128, 128, 16, 819.0, 197.0),
        _chip("TPU v5p", 2, 4, 128, 64, 95, 2765.0, 459.0),
        _chip("TPU v6e", 1, 2, 256, 128, 32, 1640.0, 918.0),
    )
}
KNOWN_DEVICES: dict[str, DeviceSpec] = {k: c.spec() for k, c in KNOWN_CHIPS.items()}
#: jax device_kind needles → table entry (v5e reports "TPU v5 lite", v6e "TPU v6 lite").
_MATCH = (
    (("v4",), KNOWN_DEVICES["TPU v4"]),
    (("v5 lite",), KNOWN_DEVICES["TPU v5e"]),
    (("v5e",), KNOWN_DEVICES["TPU v5e"]),
    (("v5litepod",), KNOWN_DEVICES["TPU v5e"]),
    (("v5p",), KNOWN_DEVICES["TPU v5p"]),
    (("v5",), KNOWN_DEVICES["TPU v5p"]),
    (("v6 lite",), KNOWN_DEVICES["TPU v6e"]),
    (("v6e",), KNOWN_DEVICES["TPU v6e"]),
)


def spec_for_kind(kind: str) -> DeviceSpec | None:
    """The table spec for a jax ``device_kind`` ("TPU v5 lite" …), None when unknown."""
    return Backend._match_device(kind, _MATCH)


def device_spec() -> DeviceSpec | None:
    """The table entry for the chip jax reports, a minimal live spec for an unknown chip,
    or None when jax sees no TPU."""
    device, _ = jax_tpu_device()
    if device is None:
        return None
    kind = str(device.device_kind)
    # TensorCores behind one jax device: 2 on a megacore chip (v4, v5p), else 1
    cores = getattr(device, "num_cores", None)
    cores = int(cores) if isinstance(cores, int) and cores > 0 else None
    table = spec_for_kind(kind)
    if table is not None:
        return table.with_live(name=f"Google {kind}", compute_units=cores)
    return DeviceSpec(
        name=f"Google {kind}",
        vendor="Google",
        arch="tpu",
        compute_units=cores,
        warp_size=None,
        max_threads_per_block=None,
        shared_mem_per_block=SCOPED_VMEM_BYTES // 2,
        l2_bytes=None,
        mem_bandwidth_gbps=None,
        peak_tflops_fp16=None,
        peak_tflops_fp32=None,
        matrix_tile=(128, 128, 128),
        execution_model="tile",
        source="live",
        tiling=TPU_TILING,
    )
