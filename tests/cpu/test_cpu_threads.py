"""The CPU runtime's thread count and OpenMP wait policy (yirage_cpu._threads).

The oversubscription test is a behaviour test ("no spin-wait collapse on a busy machine"),
not a speed threshold: it loads every core with several busy processes and checks that a
kernel's median call stays within a generous factor of its unloaded single-thread median
(before the thread policy it was ~300x: 33 ms against 110 µs on 2 cores at load 17).
Deselect it with ``-m "not oversubscribed"``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from yirage import ConfigError
from yirage_cpu import _threads

CHILD = Path(__file__).parent / "oversubscribe_child.py"
_POLICY_VARS = ("YIRAGE_CPU_THREADS", "OMP_NUM_THREADS", *_threads.WAIT_VARS)


def test_cgroup_quota_rounds_up_and_max_is_none(tmp_path: Path) -> None:
    f = tmp_path / "cpu.max"
    f.write_text("150000 100000\n")
    assert _threads.quota_cores(f) == 2
    f.write_text("50000 100000\n")
    assert _threads.quota_cores(f) == 1
    f.write_text("max 100000\n")
    assert _threads.quota_cores(f) is None
    assert _threads.quota_cores(tmp_path / "absent") is None


def test_runnable_tasks_reads_the_fourth_field(tmp_path: Path) -> None:
    f = tmp_path / "loadavg"
    f.write_text("15.02 9.81 4.10 17/412 99812\n")
    assert _threads.runnable_tasks(f) == 17
    f.write_text("garbage\n")
    assert _threads.runnable_tasks(f) is None


@pytest.mark.parametrize(
    ("cores", "runnable", "expected"),
    [(2, 1, 2), (2, 2, 1), (2, 17, 1), (8, 3, 6), (8, 0, 8), (1, 1, 1)],
)
def test_idle_cores(cores: int, runnable: int, expected: int) -> None:
    assert _threads.idle_cores(cores, runnable) == expected


def test_policy_follows_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in _POLICY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3,2")
    monkeypatch.setattr(_threads, "_machine_wide", lambda cores: False)
    p = _threads.policy()  # the runnable count cannot tell: OMP_NUM_THREADS fixes it
    assert (p.fixed, p.source, p.current()) == (3, "OMP_NUM_THREADS", 3)
    monkeypatch.undo()
    monkeypatch.setenv("OMP_NUM_THREADS", "3,2")
    monkeypatch.setenv("YIRAGE_CPU_THREADS", "1")  # wins over OMP_NUM_THREADS
    p = _threads.policy()
    assert (p.fixed, p.source, p.current()) == (1, "YIRAGE_CPU_THREADS", 1)
    monkeypatch.setenv("YIRAGE_CPU_THREADS", "zero")
    with pytest.raises(ConfigError, match=r"YIRAGE_CPU_THREADS='zero'.*positive integer"):
        _threads.policy()
    monkeypatch.delenv("YIRAGE_CPU_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS")
    p = _threads.policy()
    assert 1 <= p.current() <= _threads.usable_cores()
    assert p.cores == _threads.usable_cores()
    monkeypatch.setattr(_threads, "_machine_wide", lambda cores: True)
    monkeypatch.setattr(_threads, "runnable_tasks", lambda: 1)
    assert _threads.policy().adaptive
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # own spinning threads would look busy
    p = _threads.policy()
    assert p.fixed == p.cores and "spin" in p.source


class _Machine:
    """A fake clock, machine busy time and process CPU time for the thread policy."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, runnable: int = 1) -> None:
        self.now, self.busy, self.own = 100.0, 5000.0, 10.0
        self.runnable = runnable
        monkeypatch.setattr(_threads.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(_threads.time, "process_time", lambda: self.own)
        monkeypatch.setattr(_threads, "machine_busy_seconds", lambda: self.busy)
        monkeypatch.setattr(_threads, "runnable_tasks", lambda: self.runnable)

    def run(self, seconds: float, own_cores: float, other_cores: float) -> None:
        """``seconds`` (and a microsecond, past a window's end) pass with this process busy
        on ``own_cores`` and others on ``other_cores``."""
        seconds += 1e-6
        self.now += seconds
        self.own += own_cores * seconds
        self.busy += (own_cores + other_cores) * seconds


def test_omp_num_threads_caps_the_idle_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """OMP_NUM_THREADS is the most threads a call gets; fewer while other processes hold
    the cores (OpenMP's dynamic adjustment), never more than the cores."""
    for var in _POLICY_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(_threads, "_machine_wide", lambda cores: True)
    monkeypatch.setattr(_threads, "usable_cores", lambda: 4)
    m = _Machine(monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    p = _threads.policy()
    assert p.adaptive and (p.cap, p.max_threads, p.source) == (2, 2, "OMP_NUM_THREADS")
    assert "at most 2" in p.describe()
    assert p.current() == 2  # idle machine: the cap
    m.run(_threads.WINDOW_SECONDS, own_cores=2, other_cores=3.2)
    assert p.current() == 1  # others held 3 of 4 cores
    m.run(_threads.WINDOW_SECONDS, own_cores=1, other_cores=2.0)
    assert p.current() == 2  # 2 idle cores
    monkeypatch.setenv("OMP_NUM_THREADS", "16")
    assert _threads.policy().max_threads == 4
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")  # spinning: the count cannot tell
    p = _threads.policy()
    assert (p.fixed, p.adaptive) == (16, False)


def test_adaptive_policy_follows_other_processes_not_its_own_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = _Machine(monkeypatch, runnable=1)
    p = _threads.ThreadPolicy(cores=4, fixed=None, source="idle cores")
    assert p.current() == 4  # before the first window: the runnable count (1: this thread)
    m.runnable = 9  # from here on: this process's own threads (torch's spinning workers)
    m.run(_threads.WINDOW_SECONDS, own_cores=4, other_cores=0)
    assert p.current() == 4  # the machine was busy with this process only
    m.run(_threads.WINDOW_SECONDS * 0.6, own_cores=0, other_cores=4)
    assert p.current() == 4  # within the window: the count is reused
    m.run(_threads.WINDOW_SECONDS * 0.6, own_cores=0, other_cores=4)
    assert p.current() == 1  # others held every core; never fewer than one thread
    m.run(_threads.WINDOW_SECONDS, own_cores=1.4, other_cores=2.6)
    assert p.current() == 1  # others held about 3 cores
    m.run(_threads.WINDOW_SECONDS, own_cores=2, other_cores=1.2)
    assert p.current() == 3
    m.run(_threads.WINDOW_SECONDS, own_cores=2, other_cores=0.3)
    assert p.current() == 4  # a background trickle rounds away


def test_adaptive_policy_without_proc_stat_uses_the_runnable_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    m = _Machine(monkeypatch, runnable=1)
    monkeypatch.setattr(_threads, "machine_busy_seconds", lambda: None)
    p = _threads.ThreadPolicy(cores=4, fixed=None, source="idle cores")
    assert p.current() == 4
    m.runnable = 9
    m.run(_threads.WINDOW_SECONDS, own_cores=1, other_cores=0)
    assert p.current() == 1  # 9 runnable on 4 cores


def test_machine_busy_seconds_reads_the_first_line(tmp_path: Path) -> None:
    f = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    f.write_text("cpu  100 20 30 9000 50 5 7 400 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    tick = _threads._CLOCK_TICKS
    assert _threads.machine_busy_seconds(f) == pytest.approx((100 + 20 + 30 + 5 + 7) / tick)
    f.write_text("intr 1 2 3\n")
    assert _threads.machine_busy_seconds(f) is None
    assert _threads.machine_busy_seconds(tmp_path / "absent") is None
    assert _threads.machine_busy_seconds() is not None or not Path("/proc/stat").exists()


def test_wait_policy_is_passive_unless_the_environment_chose(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 0:0 0 /usr/lib/libc.so.6\n")
    monkeypatch.setattr(_threads, "_MAPS", maps)
    for var in _threads.WAIT_VARS:
        monkeypatch.setenv(var, "x")  # monkeypatch restores them, even what the code sets
        monkeypatch.delenv(var)
    assert "passive (set by yirage-cpu)" in _threads._choose_wait_policy()
    assert os.environ["OMP_WAIT_POLICY"] == "passive"
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    assert _threads._choose_wait_policy() == "OMP_WAIT_POLICY=active (from the environment)"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    maps.write_text("7f00-7f01 r-xp 0 0:0 0 /usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0\n")
    note = _threads._choose_wait_policy()  # too late: the runtime read its policy already
    assert "started before" in note and "OMP_WAIT_POLICY" not in os.environ


def test_printed_parallel_regions_take_the_runtime_thread_count(build: Any) -> None:
    from cpu_plan_tools import PLANS

    launcher = build((PLANS / "rmsnorm_matmul.json").read_text(encoding="utf-8"))
    code = launcher.program.code
    assert "#pragma omp parallel num_threads(yr_threads())" in code
    assert "int yr_nt = 0;" in code
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(d, dtype=np.float32) for d, _ in launcher.input_specs]
    want = launcher(*ins)[0]
    for n in (1, 2, 3):
        launcher.thread_policy = _threads.ThreadPolicy(cores=n, fixed=n, source="test")
        np.testing.assert_array_equal(launcher(*ins)[0], want)  # static split: same sums
        assert launcher._nt.value == n


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _POLICY_VARS}


@pytest.mark.oversubscribed
def test_a_busy_machine_does_not_collapse_a_kernel(build: Any) -> None:
    """Every core runs several busy processes: the kernel, with the policy the runtime picks
    by itself, stays within 10x its single-thread median on the unloaded machine."""
    from cpu_plan_tools import PLANS

    build((PLANS / "rmsnorm_matmul.json").read_text(encoding="utf-8"))  # warm the cache
    busy_count = min(64, 8 * _threads.usable_cores())
    busy: list[subprocess.Popen[bytes]] = []
    with subprocess.Popen(
        [sys.executable, str(CHILD), "--calls", "300"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_clean_env(),
    ) as child:
        try:
            assert child.stdout is not None and child.stdin is not None
            single = json.loads(child.stdout.readline())["single_us"]
            busy = [
                subprocess.Popen([sys.executable, "-S", "-c", "while True: pass"])
                for _ in range(busy_count)
            ]
            time.sleep(1.0)  # every busy process is spinning
            child.stdin.write("go\n")
            child.stdin.flush()
            loaded = json.loads(child.stdout.readline())
        finally:
            for p in busy:
                p.kill()
                p.wait()
            child.kill()
    ratio = loaded["loaded_us"] / single
    assert ratio < 10.0, (
        f"under {busy_count} busy processes a call took {loaded['loaded_us']:.0f} us, "
        f"{ratio:.1f}x the unloaded single-thread {single:.0f} us ({loaded})"
    )
