"""The Apple Metal (MPS) backend of yirage: Metal Shading Language from KernelPlans, run on
torch.mps, and an emulator that runs the printed MSL on any machine with a C++20 compiler.

yirage finds it through the ``yirage.backends`` entry point, which calls :func:`register`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from yirage import Backend

__all__ = ["register"]


def register() -> Backend:
    """Return the backend object. Cheap: imports no vendor SDK."""
    from yirage_mps._backend import MpsBackend

    return MpsBackend()
