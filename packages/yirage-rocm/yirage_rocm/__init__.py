"""The AMD ROCm backend of yirage: Triton for AMD GPUs on the shared Triton layer.

yirage finds it through the ``yirage.backends`` entry point, which calls :func:`register`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from yirage import Backend
    from yirage_rocm._backend import TARGET, RocmBackend

__all__ = ["TARGET", "RocmBackend", "register"]


def __getattr__(name: str) -> object:
    """``RocmBackend`` and ``TARGET`` on first use (importing the package stays cheap)."""
    if name in ("RocmBackend", "TARGET"):
        from yirage_rocm import _backend

        return getattr(_backend, name)
    raise AttributeError(f"module 'yirage_rocm' has no attribute {name!r}")


def register() -> Backend:
    """Return the backend object. Cheap: imports no vendor SDK."""
    from yirage_rocm._backend import RocmBackend

    return RocmBackend()
