"""``yirage_cuda.self_check()``: run two built-in plans end to end and record the result.

The plans (``_selfcheck_plans.json``: rms_norm(X) @ W with matmul and rms accumulators, and
a split-KV GQA decode with a safe-softmax group) go through codegen → compile → load → run
on random inputs and are compared with float64 numpy references. On a GPU every variant
(Triton, CUDA C++) runs on the device and a passing run writes a HARDWARE record for the
device's architecture; without a GPU (or with ``interpret=True``) the Triton variant runs in
the Triton interpreter and a passing run writes an EMULATED record.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Any

import numpy as np

from yirage.plugin import BackendError

__all__ = ["run"]


def _references(name: str, xs: list[np.ndarray]) -> list[np.ndarray]:
    if name == "rmsnorm_linear":
        x, w = xs
        return [x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) @ w]
    q, kt, v = xs
    s = q @ kt / math.sqrt(q.shape[-1])
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return [(e / e.sum(axis=-1, keepdims=True)) @ v]


def run(interpret: bool | None = None, record: bool = True) -> dict[str, Any]:
    import torch

    from yirage_cuda import _toolchain, _verification
    from yirage_cuda._backend import CudaBackend

    if interpret is None:
        interpret = not torch.cuda.is_available()
    be = CudaBackend(interpret=interpret)
    plans = json.loads(
        resources.files("yirage_cuda").joinpath("_selfcheck_plans.json").read_text()
    )["plans"]
    dtype = "float32" if interpret else "float16"
    tol = 1e-4 if dtype == "float32" else 2e-2
    results: dict[str, Any] = {}
    ok = True
    rng = np.random.default_rng(0)
    for name, plan in plans.items():
        for b in plan["buffers"]:
            b["dtype"] = "float32" if b["role"] == "intermediate" else dtype
        kernel = be.load(be.compile(be.codegen(plan)))
        xs = [rng.standard_normal(dims).astype(np.float32) for dims, _ in kernel.input_specs]
        if len(xs) == 2:
            xs[1] /= math.sqrt(xs[1].shape[0])
        tensors = be.from_numpy(xs, [d for _, d in kernel.input_specs])
        ref = _references(name, [t.double().cpu().numpy() for t in tensors])
        for variant, launcher in be.variants(kernel).items():
            try:
                outs = launcher(*tensors)
            except BackendError as exc:  # e.g. the CUDA C++ variant did not compile
                ok = False
                results[f"{name}/{variant}"] = {"passed": False, "error": str(exc)}
                continue
            err = max(
                float(np.linalg.norm(o.double().cpu().numpy() - r) / np.linalg.norm(r))
                for o, r in zip(outs, ref, strict=True)
            )
            passed = bool(err <= tol)
            ok &= passed
            results[f"{name}/{variant}"] = {"rel_err": err, "passed": passed}
    info = None if interpret else _toolchain.device_info()
    summary = {
        "passed": ok,
        "mode": "interpreter" if interpret else "gpu",
        "device": info.name if info else "Triton interpreter",
        "arch": info.arch if info else None,
        "checks": results,
    }
    if ok and record:
        level = "EMULATED" if interpret else "HARDWARE"
        desc = f"self_check: {len(results)} kernels matched float64 references ({summary['mode']})"
        details: dict[str, Any] = {"toolchain": _toolchain.toolchain_versions()}
        if info is not None:
            details.update(arch=info.arch, device=info.name)
        summary["record"] = _verification.record(level, desc, **details)
    return summary
