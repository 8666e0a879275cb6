"""Damaging yirage cache entries the way a full disk, a killed copy or bit rot would, and
running a workload in a fresh process where a crash in ``dlopen`` (SIGBUS, SIGSEGV) shows as
a signal exit instead of killing the test run.

Shared by tests/test_cache.py and the cpu and cuda cache-integrity tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from yirage import _cache

#: Every kind of damage: the entry cut short, one byte flipped, the entry replaced by bytes of
#: its own length, its checksum file deleted, its checksum file replaced by garbage.
DAMAGES = ("truncated", "flipped", "garbage", "no-checksum", "garbage-checksum")


def damage(path: Path, how: str) -> None:
    """Damage the entry at ``path`` in place (as the disk would, not through the cache)."""
    size = path.stat().st_size
    if how == "truncated":
        os.truncate(path, size // 2)
    elif how == "flipped":
        with open(path, "r+b") as handle:
            handle.seek(size // 2)
            byte = handle.read(1)
            handle.seek(size // 2)
            handle.write(bytes([byte[0] ^ 0x10]))
    elif how == "garbage":
        path.write_bytes(bytes((i * 131 + 7) % 251 for i in range(size)))
    elif how == "no-checksum":
        _cache.checksum_path(path).unlink()
    elif how == "garbage-checksum":
        _cache.checksum_path(path).write_bytes(b"\x00\xffnot a checksum\n")
    else:
        raise ValueError(f"unknown damage {how!r}")


def corrupt_warnings(messages: list[str], path: Path | None = None) -> list[str]:
    """The cache's corrupt-entry warnings among ``messages`` (naming ``path`` if given)."""
    return [
        m
        for m in messages
        if "corrupt entry" in m and (path is None or str(path) in m.split(" (")[0])
    ]


#: Prologue of every child script: collect the 'yirage' logger's warnings for the report.
CHILD_PROLOGUE = """
import json, logging, sys
WARNINGS = []
class _Collect(logging.Handler):
    def emit(self, record):
        WARNINGS.append(record.getMessage())
logging.getLogger("yirage").addHandler(_Collect(logging.WARNING))
"""


def run_child(script: str, cache_dir: Path, *args: str, timeout: float = 600) -> dict[str, Any]:
    """Run ``CHILD_PROLOGUE + script`` in a fresh interpreter with its own cache directory and
    return the JSON object it printed last. A child killed by a signal fails the test with the
    signal's name: that is the crash this cache must never cause."""
    env = dict(os.environ, YIRAGE_CACHE_DIR=str(cache_dir))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD_PROLOGUE + script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        raise AssertionError(f"the child process died with {name}:\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out
