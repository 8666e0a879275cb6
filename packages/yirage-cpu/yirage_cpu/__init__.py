"""The CPU backend of yirage: probe, live DeviceSpec, and a code generator that prints
KernelPlans as C11 + OpenMP, builds them with the system C compiler and runs them through
ctypes on numpy arrays and torch CPU tensors.

yirage finds it through the ``yirage.backends`` entry point, which calls :func:`register`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from yirage import Backend

__all__ = ["register"]


def register() -> Backend:
    """Return the backend object. Cheap: imports no vendor SDK."""
    from yirage_cpu._backend import CpuBackend

    return CpuBackend()
