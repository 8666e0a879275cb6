"""The Huawei Ascend backend of yirage: KernelPlans printed as Triton for Triton-Ascend by the
shared Triton layer (yirage-triton), held to the limits of an Ascend AI Core (Unified Buffer
bytes, cube-unit dot shapes, program count: :func:`check_printing`), run on ``torch.npu``.

yirage finds it through the ``yirage.backends`` entry point, which calls :func:`register`.
``AscendBackend(interpret=True)`` runs the printed kernels in the Triton interpreter on CPU
tensors (no NPU), which is how CI checks them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from yirage import Backend

__all__ = ["AscendBackend", "check_printing", "register"]


def register() -> Backend:
    """Return the backend object. Cheap: imports no vendor SDK."""
    from yirage_ascend._backend import AscendBackend

    return AscendBackend()


def __getattr__(name: str) -> Any:
    if name == "AscendBackend":
        from yirage_ascend._backend import AscendBackend

        return AscendBackend
    if name == "check_printing":
        from yirage_ascend._check import check_printing

        return check_printing
    raise AttributeError(name)
