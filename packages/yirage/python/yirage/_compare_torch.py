"""The numeric check's comparisons on a torch device (private).

A prefill-sized output holds tens of millions of elements. Compared on the host, every
contender's output is copied off the GPU, widened to float64 and passed over a dozen times by
numpy (finite masks, signs, masked copies, norms): about a second per contender and stress
set, most of ``superoptimize``'s cold check time. Where the kernel's outputs are on a GPU the
reference is copied there once (:func:`to_device`) and each contender is compared there, with
the same formulas as :func:`yirage._check.rel_frobenius` and :func:`yirage._stress.stress_error`
(norms of float64 values: they agree to rounding, masks and counts exactly).

The rounded reference of a stress set is still rounded on the host (numpy rounds float64 to
float16 directly; a device conversion through float32 could round twice and move an element
across float16's overflow threshold) and copied over with the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from yirage import _reference_torch
from yirage._logging import get_logger

__all__ = ["is_torch_tensor", "rel_frobenius", "stress_error", "to_device"]

_log = get_logger("yirage.check")

#: A torch tensor (torch is imported only where a caller already holds its tensors).
Tensor = Any


def is_torch_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor (the form :func:`to_device` gives references)."""
    tensor = _reference_torch.tensor_type()
    return tensor is not None and isinstance(x, tensor)


def to_device(arrays: Sequence[Any], like: Sequence[Any]) -> list[Any]:
    """``arrays`` (numpy) as tensors on the GPU that ``like`` (a kernel's check tensors) live
    on, float64 (bool arrays stay bool); unchanged where ``like`` is not on a GPU or the
    device has no room for them (the comparisons then run on the host)."""
    device = _reference_torch.device_of(like)
    if device is None or not arrays or any(is_torch_tensor(a) for a in arrays):
        return list(arrays)
    import torch

    oom = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
    try:
        return [
            torch.from_numpy(
                np.ascontiguousarray(a if a.dtype == np.bool_ else a.astype("<f8"))
            ).to(device)
            for a in arrays
        ]
    except oom:
        _log.debug("no room on %s for the check reference; comparing on the host", device)
        return list(arrays)


def _float64_on(x: Any, like: Tensor) -> Tensor:
    """``x`` (a torch tensor or a numpy array) as float64 on ``like``'s device."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().to(device=like.device, dtype=torch.float64)
    return torch.as_tensor(np.asarray(x, dtype=np.float64), device=like.device)


def rel_frobenius(actual: Any, expected: Tensor) -> float:
    """‖actual - expected‖ / ‖expected‖ (absolute when the reference is 0), NaN/inf → inf:
    :func:`yirage._check.rel_frobenius` on ``expected``'s device."""
    import torch

    got = _float64_on(actual, expected)
    if tuple(got.shape) != tuple(expected.shape):
        return math.inf
    if not bool(torch.isfinite(got).all()) or not bool(torch.isfinite(expected).all()):
        return math.inf
    denom = float(torch.linalg.vector_norm(expected))
    err = float(torch.linalg.vector_norm(got - expected))
    return err / denom if denom > 0 else err


def stress_error(
    outputs: Sequence[Any],
    reference: Sequence[Tensor],
    rounded: Sequence[Tensor],
    dtypes: Sequence[str],
    largest: Sequence[float],
    edge: float,
    exempt: Sequence[Tensor] | None,
    unbounded: Sequence[Tensor] | None = None,
) -> tuple[float, str | None]:
    """:func:`yirage._stress.stress_error` on the references' device: ``reference`` and
    ``rounded`` float64 tensors there, ``largest`` the largest finite value of each output's
    dtype (``dtypes``),
    ``exempt`` and ``unbounded`` bool tensors there (or None)."""
    import torch

    worst = 0.0
    for i, (o, r, want, d) in enumerate(zip(outputs, reference, rounded, dtypes, strict=True)):
        got = _float64_on(o, want)
        if tuple(got.shape) != tuple(want.shape):
            return math.inf, (
                f"output {i} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
            )
        finite = torch.isfinite(want)
        past = finite & torch.isinf(got) & (torch.sign(got) == torch.sign(r))
        past &= r.abs() * (1 + edge) > largest[i]
        finite &= ~past
        if unbounded is not None:
            finite &= ~unbounded[i].reshape(finite.shape)
        got_finite = torch.isfinite(got)
        lost = int(torch.count_nonzero(finite & ~got_finite))
        if lost:
            return math.inf, (
                f"output {i}: {lost} of {finite.numel()} elements are NaN/Inf where the float64 "
                "reference is finite"
            )
        overflows = torch.isinf(want)
        if exempt is not None:
            overflows &= ~exempt[i].reshape(overflows.shape)
        # a reference just past the largest value, within the tolerance: may stay finite
        overflows &= ~(torch.isfinite(r) & ((got - r).abs() <= edge * r.abs()))
        extra = int(torch.count_nonzero(overflows & got_finite))
        if extra:
            return math.inf, (
                f"output {i}: {extra} elements are finite where the float64 reference overflows {d}"
            )
        if exempt is not None:
            finite &= ~exempt[i].reshape(finite.shape)
        zero = torch.zeros((), dtype=torch.float64, device=want.device)
        denom = float(torch.linalg.vector_norm(torch.where(finite, want, zero)))
        err = float(torch.linalg.vector_norm(torch.where(finite, got - want, zero)))
        worst = max(worst, err / denom if denom > 0 else err)
    return worst, None
