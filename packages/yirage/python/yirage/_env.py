"""The one registry of yirage's environment variables.

Nothing else in yirage reads ``os.environ`` for ``YIRAGE_*`` names: code calls the accessors
below, and ``yirage doctor`` and ``docs/env.md`` list :data:`ENV_VARS`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from yirage._errors import ConfigError

__all__ = [
    "ENV_VARS",
    "EnvVar",
    "all_env_vars",
    "backends",
    "cache_dir",
    "device_graphs",
    "log_level",
    "profile_workers",
    "ray_address",
    "register_env_var",
    "require_device",
    "threads",
    "worker_environment",
]


@dataclass(frozen=True)
class EnvVar:
    """One documented environment variable. ``default`` is shown as text (None: unset)."""

    name: str
    default: str | None
    description: str

    def raw(self) -> str | None:
        """The variable's value, or None when unset or empty."""
        value = os.environ.get(self.name)
        if value is None or value.strip() == "":
            return None
        return value.strip()

    def flag(self, unset: bool) -> bool:
        """The value as an on/off switch (1/0, true/false, yes/no, on/off); ``unset`` when
        unset. Anything else is a ConfigError naming the variable."""
        raw = self.raw()
        if raw is None:
            return unset
        if raw.lower() in {"1", "true", "yes", "on"}:
            return True
        if raw.lower() in {"0", "false", "no", "off"}:
            return False
        raise ConfigError(f"{self.name}={raw!r}: expected 1 or 0")


YIRAGE_BACKENDS = EnvVar(
    "YIRAGE_BACKENDS",
    None,
    "Comma-separated backend names (e.g. 'cuda,cpu') to use, in this order. Unset: every "
    "installed backend whose probe passes, best first. A backend named here that is not "
    "installed, fails to load or fails its probe raises BackendUnavailableError instead of "
    "being skipped.",
)
YIRAGE_CACHE_DIR = EnvVar(
    "YIRAGE_CACHE_DIR",
    "$XDG_CACHE_HOME/yirage, or ~/.cache/yirage when XDG_CACHE_HOME is unset",
    "Directory of yirage's on-disk cache.",
)
YIRAGE_DEVICE_GRAPHS = EnvVar(
    "YIRAGE_DEVICE_GRAPHS",
    "1",
    "'0' makes every call of a GPU backend's kernel launch its kernels from the host. With "
    "it, the second call on the same input tensors (addresses, shapes, strides, dtypes, "
    "stream) is captured into a device graph that later such calls replay, returning fresh "
    "outputs.",
)
YIRAGE_LOGS = EnvVar(
    "YIRAGE_LOGS",
    "WARNING",
    "Log level of the 'yirage' logger: DEBUG, INFO, WARNING, ERROR or CRITICAL.",
)
YIRAGE_PROFILE_WORKERS = EnvVar(
    "YIRAGE_PROFILE_WORKERS",
    None,
    "Worker processes superoptimize compiles and profiles candidates in, worker i on the "
    "backend's device i modulo the device count (e.g. the GPU count). Unset or 0: none, "
    "everything in this process.",
)
YIRAGE_RAY_ADDRESS = EnvVar(
    "YIRAGE_RAY_ADDRESS",
    None,
    "Address of the Ray cluster that search(..., executor='ray') connects to (e.g. "
    "'ray://head:10001' or 'auto'). Unset: an already initialised Ray, else a local Ray "
    "started in this process.",
)
YIRAGE_REQUIRE_DEVICE = EnvVar(
    "YIRAGE_REQUIRE_DEVICE",
    "0",
    "Tests only: '1' makes hardware tests fail instead of skip when the device is absent.",
)
YIRAGE_THREADS = EnvVar(
    "YIRAGE_THREADS",
    None,
    "Number of threads for search and fingerprinting (a positive integer). Unset: all cores. "
    "Results are bit-identical for any value.",
)

ENV_VARS: tuple[EnvVar, ...] = (
    YIRAGE_BACKENDS,
    YIRAGE_CACHE_DIR,
    YIRAGE_DEVICE_GRAPHS,
    YIRAGE_LOGS,
    YIRAGE_PROFILE_WORKERS,
    YIRAGE_RAY_ADDRESS,
    YIRAGE_REQUIRE_DEVICE,
    YIRAGE_THREADS,
)

_REGISTERED: dict[str, EnvVar] = {v.name: v for v in ENV_VARS}


def register_env_var(var: EnvVar) -> EnvVar:
    """Add a vendor package's variable to the registry, so ``yirage doctor`` and the bench
    record list it (call it when the package is imported; registering the same variable
    again is a no-op). Names start with ``YIRAGE_``; a name registered with another
    definition is a ConfigError."""
    if not var.name.startswith("YIRAGE_"):
        raise ConfigError(f"environment variable {var.name!r}: yirage's names start with YIRAGE_")
    known = _REGISTERED.setdefault(var.name, var)
    if known != var:
        raise ConfigError(f"environment variable {var.name} is already registered differently")
    return var


def all_env_vars() -> tuple[EnvVar, ...]:
    """The meta package's variables and those vendor packages registered, by name."""
    return tuple(sorted(_REGISTERED.values(), key=lambda v: v.name))


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def backends() -> tuple[str, ...] | None:
    """Backend names selected by ``YIRAGE_BACKENDS`` (lower-cased), or None when unset."""
    raw = YIRAGE_BACKENDS.raw()
    if raw is None:
        return None
    names: list[str] = []
    for part in raw.split(","):
        name = part.strip().lower()
        if name and name not in names:
            names.append(name)
    if not names:
        return None
    return tuple(names)


def cache_dir() -> Path:
    """The cache directory (not created here)."""
    raw = YIRAGE_CACHE_DIR.raw()
    if raw is not None:
        return Path(raw).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "yirage"


def device_graphs() -> bool:
    """Whether repeated kernel calls on a GPU replay a device graph (``YIRAGE_DEVICE_GRAPHS``)."""
    return YIRAGE_DEVICE_GRAPHS.flag(unset=True)


def log_level() -> int:
    """The logging level from ``YIRAGE_LOGS`` (a name or a number)."""
    raw = YIRAGE_LOGS.raw()
    if raw is None:
        return logging.WARNING
    if raw.isdigit():
        return int(raw)
    upper = raw.upper()
    if upper == "WARN":
        upper = "WARNING"
    if upper not in _LEVELS:
        raise ConfigError(f"YIRAGE_LOGS={raw!r} is not a log level: expected one of {_LEVELS}")
    return int(getattr(logging, upper))


def profile_workers() -> int | None:
    """Worker processes from ``YIRAGE_PROFILE_WORKERS`` (0 or more), or None when unset."""
    raw = YIRAGE_PROFILE_WORKERS.raw()
    if raw is None:
        return None
    if not raw.isdigit():
        raise ConfigError(
            f"YIRAGE_PROFILE_WORKERS={raw!r}: expected a whole number of worker processes "
            "(0: profile in this process)"
        )
    return int(raw)


def worker_environment() -> dict[str, str]:
    """This process's environment for a profiling worker: the same, with workers of its own
    turned off."""
    return {**os.environ, YIRAGE_PROFILE_WORKERS.name: "0"}


def ray_address() -> str | None:
    """The Ray cluster address from ``YIRAGE_RAY_ADDRESS``, or None."""
    return YIRAGE_RAY_ADDRESS.raw()


def require_device() -> bool:
    """True when ``YIRAGE_REQUIRE_DEVICE`` asks hardware tests to fail instead of skip."""
    return YIRAGE_REQUIRE_DEVICE.flag(unset=False)


def threads() -> int | None:
    """Thread count from ``YIRAGE_THREADS``, or None (use all cores)."""
    raw = YIRAGE_THREADS.raw()
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"YIRAGE_THREADS={raw!r}: expected a positive integer")
    return value
