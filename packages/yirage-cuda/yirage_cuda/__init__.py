"""The NVIDIA CUDA backend of yirage: KernelPlans printed as Triton by the shared Triton layer
(yirage-triton, for the NVIDIA target) and as CUDA C++ (one more variant that superoptimize
checks and times beside the Triton ones), compiled with Triton / NVRTC or nvcc, run through
torch.cuda on the current stream.

yirage finds it through the ``yirage.backends`` entry point, which calls :func:`register`.
``CudaBackend(interpret=True)`` runs the generated Triton kernels in the Triton interpreter on
CPU tensors (no GPU), which is how CI verifies them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from yirage import Backend

__all__ = ["CudaBackend", "register", "self_check"]


def register() -> Backend:
    """Return the backend object. Cheap: imports no vendor SDK."""
    from yirage_cuda._backend import CudaBackend

    return CudaBackend()


def self_check(interpret: bool | None = None, record: bool = True) -> dict[str, Any]:
    """Run the built-in check plans through the backend (see ``yirage_cuda._selfcheck``)."""
    from yirage_cuda._selfcheck import run

    return run(interpret=interpret, record=record)


def __getattr__(name: str) -> Any:
    if name == "CudaBackend":
        from yirage_cuda._backend import CudaBackend

        return CudaBackend
    raise AttributeError(name)
