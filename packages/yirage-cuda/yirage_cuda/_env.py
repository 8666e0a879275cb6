"""The cuda backend's environment variables, registered with yirage's one registry (so
``yirage doctor`` lists them and the bench records them)."""

from __future__ import annotations

from yirage.plugin import EnvVar, register_env_var

YIRAGE_CUDA_PDL = register_env_var(
    EnvVar(
        "YIRAGE_CUDA_PDL",
        "1",
        "'0' launches the cuda backend's Triton kernels without programmatic dependent launch. "
        "With it (sm_90 and newer; attention kernels excepted), each kernel waits for the "
        "kernels before it and lets the next one launch early, so back-to-back kernels overlap "
        "their launch gap.",
    )
)


def pdl_enabled() -> bool:
    """False when ``YIRAGE_CUDA_PDL`` turns programmatic dependent launch off (default on)."""
    return YIRAGE_CUDA_PDL.flag(unset=True)
