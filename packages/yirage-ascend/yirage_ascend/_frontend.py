"""Triton-Ascend's compiler run as far as it goes without CANN: each printed kernel through
Triton-Ascend's frontend (Python AST → TTIR) and its adapter (``triton-adapter-opt``, shipped
in the wheel: TTIR → the linalg/HIVM IR that BiSheng takes). The last step,
``bishengir-compile`` (IR → NPU binary), comes with the CANN toolkit and is not run here;
:func:`lower_printed_module` says so when asked for it.

Runs only where Python's ``triton`` is triton-ascend's (its own environment: upstream triton
installs the same module over it; ``nox -s tests-ascend`` keeps one apart).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType

from yirage.plugin import BackendError
from yirage_ascend._toolchain import triton_flavour

__all__ = ["LoweredKernel", "lower_printed_module"]

_PTR = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}


@dataclass(frozen=True)
class LoweredKernel:
    """One kernel as Triton-Ascend's frontend left it: TTIR and the adapter's IR text."""

    name: str
    ttir: str
    adapter_ir: str
    target: str


def _signature(fn: object, buffer_dtypes: Mapping[int, str]) -> dict[str, str]:
    sig: dict[str, str] = {}
    for arg in fn.arg_names:  # type: ignore[attr-defined]
        if arg.startswith("buf"):
            sig[arg] = _PTR[buffer_dtypes[int(arg[3:])]]
        elif arg == "ws":
            sig[arg] = "*fp32"
        elif arg == "cnt":
            sig[arg] = "*i32"
        else:
            sig[arg] = "constexpr"
    return sig


def lower_printed_module(
    module: ModuleType, buffer_dtypes: Mapping[int, str], arch: str = "Ascend910B3"
) -> dict[str, LoweredKernel]:
    """Every kernel of a printed module (imported without the interpreter) lowered by
    Triton-Ascend for ``arch`` to the IR BiSheng compiles. BackendError with Triton-Ascend's
    message when a kernel does not lower, or when this ``triton`` is not triton-ascend's."""
    if triton_flavour() != "triton-ascend":
        raise BackendError(
            "lowering for Ascend needs triton-ascend's triton (this one is "
            f"{triton_flavour()}): pip uninstall -y triton && pip install triton-ascend pybind11"
        )
    compiler = importlib.import_module("triton.compiler.compiler")
    ir = importlib.import_module("triton._C.libtriton").ir
    target = importlib.import_module("triton.backends.compiler").GPUTarget("npu", arch, 0)
    out: dict[str, LoweredKernel] = {}
    for kname, info in module.KERNELS.items():
        fn = getattr(module, kname)
        if not hasattr(fn, "arg_names"):
            raise BackendError(f"{kname} is not a @triton.jit kernel (imported interpreted?)")
        stages_n = int(info["num_stages"])
        src = compiler.ASTSource(fn, _signature(fn, buffer_dtypes), {"NUM_STAGES": stages_n})
        backend = compiler.make_backend(target)
        options = backend.parse_options({"num_warps": int(info["num_warps"])})
        stages: dict[str, object] = {}
        backend.add_stages(stages, options)
        metadata = {"hash": f"yirage-{kname}", "target": target, **options.__dict__}
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        try:
            mod = src.make_ir(
                options, backend.get_codegen_implementation(), backend.get_module_map(), context
            )
            ttir = stages["ttir"](mod, metadata)  # type: ignore[operator]
            ttir_text = str(ttir)
            adapter = stages["ttadapter"](ttir, metadata)  # type: ignore[operator]
        except Exception as exc:
            detail = getattr(exc, "stderr", None)
            text = detail.decode(errors="replace") if isinstance(detail, bytes) else str(exc)
            raise BackendError(
                f"Triton-Ascend could not lower kernel {kname} for {arch}: {text[:2000]}"
            ) from exc
        out[kname] = LoweredKernel(kname, ttir_text, str(adapter), arch)
    return out
