"""Whether the page size of a weight buffer moves the CPU's read rate: the same plain read
stream (the C/OpenMP sum of ``cpu_weight_stream.py``) over two buffers of one size and the
same values, one on 4 KiB pages and one on transparent 2 MiB pages (numpy's allocation with
``madvise(MADV_HUGEPAGE)`` on and off; the huge pages granted are read from
``/proc/self/smaps``), interleaved over ``--rounds`` rounds, 1 and 2 threads, medians::

    python benchmarks/cpu_page_size.py --mib 96 --rounds 21

PyTorch's CPU tensors (the bench's weights) are allocated without that advice, so on a host
whose transparent huge pages are ``madvise`` they sit on 4 KiB pages while a numpy copy of
the same size (the bench's copy-bandwidth measurement) may not.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_weight_stream import _read_stream


def _huge_kib() -> int:
    """AnonHugePages of this process, KiB."""
    text = Path("/proc/self/smaps_rollup").read_text(encoding="utf-8")
    m = re.search(r"AnonHugePages:\s+(\d+) kB", text)
    return int(m.group(1)) if m else 0


def _buffer(n: int, huge: bool, values: np.ndarray) -> tuple[torch.Tensor, int]:
    """n float32 on huge pages or not (as far as the kernel grants them), and the KiB of huge
    pages the allocation added."""
    core = np._core if hasattr(np, "_core") else np.core
    setter = core.multiarray._set_madvise_hugepage
    before = _huge_kib()
    previous = setter(huge)
    try:
        a = np.empty(n, np.float32)
    finally:
        setter(previous)
    a[:] = values
    return torch.from_numpy(a), _huge_kib() - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=96, help="buffer size (beyond the L3)")
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()
    n = args.mib * (1 << 20) // 4
    n -= n % 64
    values = np.random.default_rng(0).random(n, dtype=np.float32)
    small, small_huge = _buffer(n, False, values)
    large, large_huge = _buffer(n, True, values)
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    print(f"transparent huge pages: {thp.read_text().strip() if thp.exists() else 'unknown'}")
    print(f"huge pages granted: 4 KiB buffer {small_huge} KiB, 2 MiB buffer {large_huge} KiB")
    read = _read_stream()
    cases = {(name, t): [] for name in ("4 KiB pages", "2 MiB pages") for t in (1, 2)}
    buffers = {"4 KiB pages": small, "2 MiB pages": large}
    for _ in range(args.rounds):
        for name, threads in cases:
            t0 = time.perf_counter()
            read(buffers[name], threads)
            cases[(name, threads)].append(time.perf_counter() - t0)
    for (name, threads), times in cases.items():
        med = statistics.median(times)
        print(f"{name}, {threads} thread(s): {med * 1e6:9.1f} µs  {n * 4 / med / 1e9:5.1f} GB/s")


if __name__ == "__main__":
    main()
