"""The CPU backend's environment variables, registered with yirage's one registry."""

from __future__ import annotations

from yirage.plugin import ConfigError, EnvVar, register_env_var

YIRAGE_CPU_THREADS = register_env_var(
    EnvVar(
        "YIRAGE_CPU_THREADS",
        None,
        "Threads of every CPU-backend kernel (a positive integer; at most the cores the "
        "process may use). Unset: as many as other processes left idle among those the "
        "process may use over the last 0.1 s, at most OMP_NUM_THREADS when that is set.",
    )
)


def cpu_threads() -> int | None:
    """The fixed thread count from ``YIRAGE_CPU_THREADS``, or None when unset."""
    raw = YIRAGE_CPU_THREADS.raw()
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(
            f"YIRAGE_CPU_THREADS={raw!r}: expected a positive integer (or unset it to let the "
            "CPU backend follow the idle cores)"
        )
    return value
