"""Precompiling Triton kernels must leave no asynchronous compile mode behind: a later compile
on the same thread (the next ``superoptimize``) would go to the precompile's pool after its
shutdown."""

from __future__ import annotations

import contextvars
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

pytest.importorskip("yirage_triton")
from yirage_triton._backend import compile_all

#: Stands in for Triton's module-level "active mode" variable.
ACTIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("active", default=None)


class ExitRaisesMode:
    """Triton 3.6's ``AsyncCompileMode`` as far as this matters: no ``ignore_errors``
    option here, and ``__exit__`` re-raises a failed compile before it resets the variable."""

    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self.executor = executor
        self.futures: list[Future[None]] = []

    def __enter__(self) -> ExitRaisesMode:
        ACTIVE.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self.futures:
            f.result()
        ACTIVE.set(None)


class Module:
    """A kernel module whose warm-up submits a compile that fails."""

    __name__ = "kernel_module"

    def warmup(self, inputs: list[Any]) -> None:
        mode = ACTIVE.get()
        assert mode is not None

        def fail() -> None:
            raise RuntimeError("PassManager::run failed")

        mode.futures.append(mode.executor.submit(fail))


def later_compile() -> str:
    """What a compile on this thread does afterwards: use the active mode if there is one."""
    mode = ACTIVE.get()
    if mode is None:
        return "compiled"
    mode.executor.submit(lambda: None)  # raises once the pool is shut down
    return "submitted"


def test_a_failed_precompile_leaves_no_mode_active() -> None:
    with ThreadPoolExecutor(2) as pool:
        compile_all(ExitRaisesMode, pool, [Module()], [])
    assert ACTIVE.get() is None
    assert later_compile() == "compiled"


def test_the_failure_it_prevents() -> None:
    # the same mode entered directly on this thread stays active and poisons later compiles
    def direct() -> None:
        with ThreadPoolExecutor(2) as pool:
            with pytest.raises(RuntimeError), ExitRaisesMode(pool):
                Module().warmup([])
        with pytest.raises(RuntimeError, match="cannot schedule new futures"):
            later_compile()

    contextvars.copy_context().run(direct)
