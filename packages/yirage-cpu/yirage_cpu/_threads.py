"""How many threads a CPU kernel runs on, and how OpenMP's idle threads wait.

On a busy machine an OpenMP team degrades badly: a thread that spins at a barrier burns the
time slice the thread it waits for needs, and a team wider than the idle cores waits, at
every barrier, for a thread the scheduler has parked behind other processes (measured: a
fused RMSNorm + Linear kernel of 80 µs took 24 ms per call at load 15 on 2 cores). So:

* **wait policy**: before the OpenMP runtime starts (the first kernel library is loaded),
  ``OMP_WAIT_POLICY=passive`` is set unless the environment already chose one
  (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT`` or ``KMP_BLOCKTIME``): idle threads sleep at
  once instead of spinning, and a thread woken from sleep gets a core quickly;
* **thread count**: ``YIRAGE_CPU_THREADS`` when set, else the idle cores among those the
  process may use (its CPU affinity and cgroup CPU quota): the cores *other* processes kept
  busy over the last :data:`WINDOW_SECONDS` (the machine's busy time from ``/proc/stat``
  less this process's CPU time) are taken, the rest rounded to whole cores; before the
  first window, the runnable-task count of ``/proc/loadavg``. This process's own threads
  never count against it: torch's OpenMP workers spin for a while after each op, and a
  kernel team's threads are still on their way to sleep when the call returns, so an
  instant runnable count right after either made most calls run on one thread (measured:
  RMSNorm + Linear at 8x4096x6144 on 2 cores ran every call on one thread when it
  alternated with torch ops, and half the calls alone). At least 1 and at most
  ``OMP_NUM_THREADS`` (its first count) when that is set, as OpenMP's dynamic adjustment
  treats it (a team held at ``OMP_NUM_THREADS`` while other processes take the cores
  waits a scheduler tick at its barriers: measured, GQA decode's four library kernels in
  bfloat16 at 2 threads under load 5 on 2 cores took 55 ms per call, 1.9 ms on 1 thread).
  Where that count cannot tell (a restricted affinity or quota, or an environment that
  makes idle threads spin): ``OMP_NUM_THREADS``, else all of those cores. The count goes to
  the kernel library's ``yr_nt``, which every parallel region of the printed code reads
  (``num_threads(yr_threads())``).
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from yirage_cpu._env import cpu_threads

__all__ = [
    "WINDOW_SECONDS",
    "ThreadPolicy",
    "configure_openmp",
    "idle_cores",
    "machine_busy_seconds",
    "policy",
    "quota_cores",
    "runnable_tasks",
    "usable_cores",
]

#: How long the other processes' load is averaged before the thread count follows it
#: (/proc/stat counts CPU time in 10 ms ticks: over 0.1 s on 2 cores that is within 0.2 of
#: a core, and the count is rounded to whole cores).
WINDOW_SECONDS = 0.1
#: Variables that choose how idle OpenMP threads wait (the standard one, GNU's, LLVM's).
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
_LOADAVG = Path("/proc/loadavg")
_STAT = Path("/proc/stat")
_MAPS = Path("/proc/self/maps")
#: Shared objects of the OpenMP runtimes the printed code links (GNU, LLVM, Intel).
_OPENMP_LIBS = ("/libgomp.so", "/libomp.so", "/libiomp5.so", "/libomp.dylib")


def quota_cores(cpu_max: Path = _CPU_MAX) -> int | None:
    """Cores a cgroup v2 CPU quota allows (``cpu.max`` "quota period", rounded up), or None
    when there is no quota (``max``) or no such file."""
    try:
        quota, _, period = cpu_max.read_text(encoding="ascii").strip().partition(" ")
        if quota == "max":
            return None
        return max(1, math.ceil(int(quota) / int(period or "100000")))
    except (OSError, ValueError, ZeroDivisionError):
        return None


def usable_cores() -> int:
    """Cores this process may use: its CPU affinity, bounded by a cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = quota_cores()
    return max(1, min(cores, quota) if quota is not None else cores)


def runnable_tasks(loadavg: Path = _LOADAVG) -> int | None:
    """Tasks running or ready to run on the whole machine right now (the fourth field of
    ``/proc/loadavg``, "running/total"), or None where there is no such file."""
    try:
        field = loadavg.read_text(encoding="ascii").split()[3]
        return int(field.partition("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def machine_busy_seconds(stat: Path = _STAT) -> float | None:
    """CPU seconds every CPU of the machine has spent busy since boot (user, nice, system,
    irq and softirq of the first line of ``/proc/stat``; idle, iowait and time stolen by a
    hypervisor are not busy here), or None where there is no such file."""
    try:
        with stat.open(encoding="ascii") as f:
            fields = f.readline().split()
        if fields[0] != "cpu":
            return None
        user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
        return (user + nice + system + irq + softirq) / _CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


def _clock_ticks() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK")) or 100
    except (AttributeError, ValueError, OSError):
        return 100


_CLOCK_TICKS = _clock_ticks()


def idle_cores(cores: int, runnable: int, own: int = 1) -> int:
    """Cores of ``cores`` left to a kernel when ``runnable`` tasks want a core, ``own`` of
    them this process's (the calling thread); at least 1."""
    return max(1, min(cores, cores - (runnable - own)))


@dataclass
class ThreadPolicy:
    """The thread count of the next kernel call: ``fixed`` when a variable sets it, else
    the cores of ``cores`` other processes left idle over the last window, at most ``cap``."""

    cores: int
    fixed: int | None
    source: str
    cap: int | None = None
    #: (monotonic time, machine busy seconds or None, this process's CPU seconds) at the
    #: start of the current window; None before the first call
    _window: tuple[float, float | None, float] | None = None
    _last: int = 0

    @property
    def adaptive(self) -> bool:
        return self.fixed is None

    @property
    def max_threads(self) -> int:
        """The most threads a call may get."""
        if self.fixed is not None:
            return self.fixed
        return min(self.cores, self.cap) if self.cap is not None else self.cores

    def current(self) -> int:
        """Threads for a kernel starting now."""
        if self.fixed is not None:
            return self.fixed
        now = time.monotonic()
        start = self._window
        if start is not None and now - start[0] < WINDOW_SECONDS:
            return self._last
        mark = (now, machine_busy_seconds(), time.process_time())
        if start is None or start[1] is None or mark[1] is None:
            # no window yet (this process's threads are not running before its first
            # call) or no /proc/stat: the instant runnable count
            runnable = runnable_tasks()
            idle = self.cores if runnable is None else idle_cores(self.cores, runnable)
        else:
            others = (mark[1] - start[1]) - (mark[2] - start[2])
            idle = self.cores - round(max(0.0, others / (now - start[0])))
        self._last = max(1, min(idle, self.max_threads))
        self._window = mark
        return self._last

    def describe(self) -> str:
        if self.fixed is not None:
            return f"{self.fixed} (from {self.source})"
        cap = f", at most {self.cap} ({self.source})" if self.cap is not None else ""
        return (
            f"the cores of {self.cores} other processes left idle{cap} (averaged over "
            f"{WINDOW_SECONDS * 1000:g} ms)"
        )


def _omp_num_threads() -> int | None:
    """The first count of ``OMP_NUM_THREADS`` (it may list one per nesting level), or None."""
    raw = os.environ.get("OMP_NUM_THREADS", "").strip()
    try:
        value = int(raw.split(",")[0]) if raw else 0
    except ValueError:
        return None
    return value if value >= 1 else None


def _machine_wide(cores: int) -> bool:
    """Whether the process may use every online CPU: only then does the machine's runnable
    count say how many of *its* cores are idle."""
    return cores >= (os.cpu_count() or cores)


def policy() -> ThreadPolicy:
    """The thread policy the environment asks for (read now: tests change it)."""
    cores = usable_cores()
    fixed = cpu_threads()
    if fixed is not None:
        return ThreadPolicy(cores, fixed, "YIRAGE_CPU_THREADS")
    omp = _omp_num_threads()
    if not _machine_wide(cores) or runnable_tasks() is None:
        if omp is not None:
            return ThreadPolicy(cores, omp, "OMP_NUM_THREADS")
        return ThreadPolicy(cores, cores, "the cores this process may use")
    if _spinning():
        if omp is not None:
            return ThreadPolicy(cores, omp, "OMP_NUM_THREADS (threads spin)")
        return ThreadPolicy(cores, cores, "the cores this process may use (threads spin)")
    if omp is not None:
        return ThreadPolicy(cores, None, "OMP_NUM_THREADS", cap=omp)
    return ThreadPolicy(cores, None, "idle cores")


def _spinning() -> bool:
    """Whether the environment asks idle OpenMP threads to spin: the runnable count would
    then include this process's own idle threads, so it cannot tell the idle cores."""
    policy = os.environ.get("OMP_WAIT_POLICY", "").strip().lower()
    spin = os.environ.get("GOMP_SPINCOUNT", "").strip()
    block = os.environ.get("KMP_BLOCKTIME", "").strip()
    return policy == "active" or spin not in ("", "0") or block not in ("", "0")


_lock = threading.Lock()
_wait_note: str | None = None


def openmp_started(maps: Path | None = None) -> bool:
    """Whether an OpenMP runtime the printed code links is already loaded in this process
    (it read its wait policy when it started); ``maps`` defaults to ``/proc/self/maps``."""
    try:
        text = (maps or _MAPS).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(lib in text for lib in _OPENMP_LIBS)


def configure_openmp() -> str:
    """Choose the passive wait policy before the OpenMP runtime starts (once per process);
    returns how idle threads wait, for reports."""
    global _wait_note
    with _lock:
        if _wait_note is None:
            _wait_note = _choose_wait_policy()
        return _wait_note


def _choose_wait_policy() -> str:
    chosen = [f"{v}={os.environ[v]}" for v in WAIT_VARS if os.environ.get(v, "").strip()]
    if chosen:
        return f"{', '.join(chosen)} (from the environment)"
    if openmp_started():
        return (
            "the OpenMP runtime's default (it was started before yirage-cpu could set "
            "OMP_WAIT_POLICY=passive: set it in the environment)"
        )
    os.environ["OMP_WAIT_POLICY"] = "passive"
    return "OMP_WAIT_POLICY=passive (set by yirage-cpu)"
