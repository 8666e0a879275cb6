"""The CPU DeviceSpec that tests asserting what the search finds pin (``device_spec=``).

What the search finds depends on the DeviceSpec (the per-block tile budget above all: a
2-core EPYC with 1 MiB of L2 got 64 KiB per block and no single-kernel GQA decode), so a
test that reads the host's spec passes or fails by machine. Tests that assert on candidates
pin this one instead; only hardware-marked tests may depend on the host's spec. The code is
still printed for, compiled on and run on the host.
"""

from __future__ import annotations

import yirage as yr

#: A 2-core CPU with 2 MiB of L2 per core, 128 KiB per block (the CPU backend's budget before
#: it became half of L2; the tests' expectations were written for it) and 512-bit SIMD.
REFERENCE_CPU = yr.DeviceSpec(
    name="reference test CPU (2 cores, 128 KiB per block, 2 MiB L2, 512-bit SIMD)",
    vendor="pinned",
    arch="x86_64",
    compute_units=2,
    warp_size=None,
    max_threads_per_block=None,
    shared_mem_per_block=128 * 1024,
    l2_bytes=2 * 2**20,
    mem_bandwidth_gbps=None,
    peak_tflops_fp16=None,
    peak_tflops_fp32=None,
    simd_width_bits=512,
)
