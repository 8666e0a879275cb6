"""Ahead-of-time compiles of printed modules for named GPU targets, without the GPU.

``triton.compile`` with a ``GPUTarget`` runs Triton's whole pipeline (ttir → ttgir → llir →
AMDGCN → hsaco for "hip", → PTX → cubin for "cuda") on any machine: Triton's wheels carry the
AMD code generator and linker and NVIDIA's ptxas. :data:`AOT_TARGETS` names the targets
yirage compiles for; :func:`compile_for` compiles every kernel of a printed module for one,
reads the resources each kernel uses from the compiled kernel (LDS / shared memory, and on AMD
the VGPR, AGPR, SGPR and spill counts and scratch bytes of the code object's metadata) and
refuses a kernel that needs more LDS than the target has, or spills registers, with an error
naming the kernel, the candidate and the limit; :func:`export_plan` writes a plan's source
and compiled artifacts to a directory.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from yirage.plan import Plan, parse_plan
from yirage.plugin import ConfigError
from yirage_triton._codegen import TritonOptions, generate_triton
from yirage_triton._toolchain import (
    ToolchainError,
    dist_version,
    load_triton_module,
    pin_triton_defaults,
    write_triton_module,
)

__all__ = [
    "AOT_TARGETS",
    "AotTarget",
    "CompiledKernel",
    "ResourceError",
    "aot_target",
    "check_compile_options",
    "compile_for",
    "compile_kernels",
    "export_plan",
    "require_triton",
]


class ResourceError(ToolchainError):
    """A compiled kernel needs more of a per-workgroup resource (LDS, registers) than the
    target has; the message names the kernel, the candidate and the limit."""


@dataclass(frozen=True)
class AotTarget:
    """One named ahead-of-time target.

    ``backend``/``arch``/``warp_size``: Triton's ``GPUTarget``. ``vendor``: the yirage backend
    whose DeviceSpecs and printer options serve it. ``binary``/``assembly``: the names of the
    code object and the assembly in Triton's compiled kernel. ``matrix_instructions``: a
    regular expression of the matrix-core instructions a dot compiles to (MFMA on CDNA, WMMA
    on RDNA3, mma.sync / wgmma on NVIDIA). ``lds_bytes``: shared memory (LDS) one workgroup
    may use. ``min_triton``: the oldest Triton yirage has compiled this target with (for AMD
    3.9, whose wheel links the code object itself, without a ROCm install; older releases
    are untested, so they are refused with the version to install).
    ``max_vgprs``: vector registers one wave may hold (AMD: 512 architected + accumulation
    VGPRs on CDNA, 256 on RDNA3; None where the cubin's count is not read)."""

    name: str
    backend: str
    arch: str | int
    warp_size: int
    vendor: str
    description: str
    binary: str
    assembly: str
    matrix_instructions: str
    lds_bytes: int
    min_triton: tuple[int, int]
    max_vgprs: int | None = None

    @property
    def label(self) -> str:
        return f"{self.name} ({self.description})"


_AMD_LDS = 64 * 1024  # per workgroup on CDNA2, CDNA3 and RDNA3 (AMD ISA guides)

#: The targets ``compile_for`` and ``yirage export`` know, by name.
AOT_TARGETS: dict[str, AotTarget] = {
    t.name: t
    for t in (
        AotTarget(
            "gfx942", "hip", "gfx942", 64, "rocm", "AMD CDNA3: MI300X, MI325X", "hsaco",
            "amdgcn", r"v_mfma_\w+", _AMD_LDS, (3, 9), 512,
        ),
        AotTarget(
            "gfx90a", "hip", "gfx90a", 64, "rocm", "AMD CDNA2: MI250X, MI210", "hsaco",
            "amdgcn", r"v_mfma_\w+", _AMD_LDS, (3, 9), 512,
        ),
        AotTarget(
            "gfx1100", "hip", "gfx1100", 32, "rocm", "AMD RDNA3: Radeon RX 7900 XTX", "hsaco",
            "amdgcn", r"v_wmma_\w+", _AMD_LDS, (3, 9), 256,
        ),
        AotTarget(
            "sm_90", "cuda", 90, 32, "cuda", "NVIDIA Hopper: H100, H200", "cubin", "ptx",
            r"wgmma\.mma_async\S*|mma\.sync\.aligned\S*", 227 * 1024, (3, 2),
        ),
        AotTarget(
            "sm_80", "cuda", 80, 32, "cuda", "NVIDIA Ampere: A100", "cubin", "ptx",
            r"mma\.sync\.aligned\S*", 163 * 1024, (3, 2),
        ),
    )
}  # fmt: skip


def aot_target(name: str | AotTarget) -> AotTarget:
    """The target called ``name``; ConfigError listing the known ones otherwise."""
    if isinstance(name, AotTarget):
        return name
    target = AOT_TARGETS.get(str(name).strip().lower())
    if target is None:
        known = ", ".join(f"{t.name} ({t.description})" for t in AOT_TARGETS.values())
        raise ConfigError(f"unknown ahead-of-time target {name!r}; known targets: {known}")
    return target


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = re.findall(r"\d+", text.split("+")[0])[:3]
    return tuple(int(p) for p in parts)


def require_triton(target: AotTarget) -> None:
    """ToolchainError naming the version needed when the installed Triton is missing or
    older than ``target.min_triton``."""
    need = ".".join(map(str, target.min_triton))
    have = dist_version("triton")
    if have is None:
        raise ToolchainError(
            f"compiling for {target.name} needs triton>={need}, which is not installed "
            f"(pip install 'triton>={need}')"
        )
    if _version_tuple(have)[:2] < target.min_triton:
        raise ToolchainError(
            f"triton {have} is too old to compile for {target.label}: it needs "
            f"triton>={need} (pip install -U 'triton>={need}')"
        )


def check_compile_options(backend: str, options: Mapping[str, Any]) -> None:
    """ConfigError when an option is not a field of the Triton ``backend``'s compile options
    in the installed Triton (so a misspelt or removed option never vanishes silently)."""
    if not options:
        return
    module, cls = {
        "hip": ("triton.backends.amd.compiler", "HIPOptions"),
        "cuda": ("triton.backends.nvidia.compiler", "CUDAOptions"),
    }.get(backend, (None, None))
    if module is None or cls is None:
        raise ConfigError(f"no compile options are known for the Triton backend {backend!r}")
    try:
        fields = set(getattr(importlib.import_module(module), cls).__dataclass_fields__)
    except Exception as exc:
        raise ToolchainError(
            f"the installed triton has no {backend} backend ({exc}); install triton>=3.9"
        ) from exc
    unknown = sorted(set(options) - fields)
    if unknown:
        raise ConfigError(
            f"triton {dist_version('triton')} has no {backend} compile option(s) {unknown}; "
            f"it offers {sorted(fields)}"
        )


@dataclass
class CompiledKernel:
    """One kernel compiled for a target: its code object and assembly, and the resources
    the compiler reports for it."""

    name: str
    target: str
    binary: bytes
    assembly: str
    shared: int
    num_warps: int
    num_stages: int
    options: dict[str, Any]
    #: vgpr/agpr/sgpr counts, spills and scratch bytes (AMD; empty on NVIDIA, whose cubin
    #: keeps them where only the driver reads them)
    registers: dict[str, int] = field(default_factory=dict)
    matrix_instructions: tuple[str, ...] = ()

    def report(self) -> dict[str, Any]:
        """JSON-ready summary (no binary)."""
        return {
            "target": self.target,
            "binary_bytes": len(self.binary),
            "shared": self.shared,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "options": dict(self.options),
            "registers": dict(self.registers),
            "matrix_instructions": list(self.matrix_instructions),
        }


_TRITON_PTR = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}

#: amdhsa metadata keys (code-object v5 YAML in the assembly) -> report names
_AMD_RESOURCES = {
    ".vgpr_count": "vgpr",
    ".agpr_count": "agpr",
    ".sgpr_count": "sgpr",
    ".vgpr_spill_count": "vgpr_spill",
    ".sgpr_spill_count": "sgpr_spill",
    ".private_segment_fixed_size": "scratch_bytes",
    ".group_segment_fixed_size": "static_lds_bytes",
}


def amd_resources(amdgcn: str) -> dict[str, int]:
    """Register and memory use from the AMDGPU metadata of a compiled kernel's assembly."""
    out: dict[str, int] = {}
    for key, name in _AMD_RESOURCES.items():
        m = re.search(rf"^\s*-?\s*{re.escape(key)}:\s+(\d+)", amdgcn, re.M)
        if m:
            out[name] = int(m.group(1))
    return out


def _signature(fn: Any, buffer_dtypes: Mapping[int, str]) -> tuple[dict[str, str], dict[Any, Any]]:
    sig: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, arg in enumerate(fn.arg_names):
        if arg.startswith("buf"):
            sig[arg] = _TRITON_PTR[buffer_dtypes[int(arg[3:])]]
        elif arg == "ws":  # fp32 workspace of split-loop kernels
            sig[arg] = "*fp32"
        elif arg == "cnt":  # arrival counters of split-loop kernels
            sig[arg] = "*i32"
        else:
            sig[arg] = "constexpr"
            continue
        attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def compile_kernels(
    module: ModuleType,
    buffer_dtypes: Mapping[int, str],
    backend: str,
    arch: str | int,
    warp_size: int,
    *,
    label: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, CompiledKernel]:
    """Every kernel of a (non-interpreted) printed module compiled for
    ``GPUTarget(backend, arch, warp_size)``, with the compile options its ``KERNELS`` entry
    prints, ``options`` overriding them. ToolchainError with Triton's message when a kernel
    does not compile or the installed Triton has no such target."""
    pin_triton_defaults()
    try:
        triton = importlib.import_module("triton")
        GPUTarget = importlib.import_module("triton.backends.compiler").GPUTarget
        ASTSource = importlib.import_module("triton.compiler").ASTSource
    except Exception as exc:  # pragma: no cover - triton is a dependency
        raise ToolchainError(
            f"this triton cannot compile for a named target ({exc}); install triton>=3.2"
        ) from exc
    label = label or (f"sm_{arch}" if backend == "cuda" else f"{backend}:{arch}")
    out: dict[str, CompiledKernel] = {}
    for kname, info in module.KERNELS.items():
        fn = getattr(module, kname)
        if not hasattr(fn, "arg_names"):
            raise ToolchainError(
                f"{kname} is not a compiled @triton.jit kernel (interpreter mode?)"
            )
        sig, attrs = _signature(fn, buffer_dtypes)
        stages = int(info["num_stages"])
        extra = {**info.get("options", {}), **(options or {})}
        opts = {
            "num_warps": int(info["num_warps"]),
            "num_stages": stages,
            "launch_pdl": bool(info.get("pdl", False)),
            **extra,
        }
        try:
            compiled = triton.compile(
                ASTSource(fn, sig, {"NUM_STAGES": stages}, attrs),
                target=GPUTarget(backend, arch, warp_size),
                options=opts,
            )
        except Exception as exc:
            raise ToolchainError(
                f"Triton could not compile kernel {kname} for {label}: {exc}"
            ) from exc
        asm_name, bin_name = ("amdgcn", "hsaco") if backend == "hip" else ("ptx", "cubin")
        assembly = str(compiled.asm.get(asm_name, ""))
        out[kname] = CompiledKernel(
            name=kname,
            target=label,
            binary=bytes(compiled.asm.get(bin_name) or b""),
            assembly=assembly,
            shared=int(getattr(compiled.metadata, "shared", 0)),
            num_warps=int(info["num_warps"]),
            num_stages=stages,
            options={**extra, **({"launch_pdl": True} if opts["launch_pdl"] else {})},
            registers=amd_resources(assembly) if backend == "hip" else {},
        )
    return out


def compile_for(
    module: ModuleType,
    buffer_dtypes: Mapping[int, str],
    target: str | AotTarget,
    *,
    candidate: str = "the plan",
    options: Mapping[str, Any] | None = None,
    allow_spills: bool = False,
) -> dict[str, CompiledKernel]:
    """Every kernel of ``module`` compiled for the named target and checked against its
    limits: ResourceError naming ``candidate``, the kernel and the limit when a kernel needs
    more LDS than a workgroup has, or (unless ``allow_spills``) spills registers to scratch."""
    t = aot_target(target)
    require_triton(t)
    if options:
        check_compile_options(t.backend, options)
    kernels = compile_kernels(
        module, buffer_dtypes, t.backend, t.arch, t.warp_size, label=t.name, options=options
    )
    pattern = re.compile(t.matrix_instructions)
    for k in kernels.values():
        k.matrix_instructions = tuple(sorted(set(pattern.findall(k.assembly))))
        _check_limits(k, t, candidate, allow_spills)
    return kernels


def _check_limits(k: CompiledKernel, t: AotTarget, candidate: str, allow_spills: bool) -> None:
    lds = k.shared + k.registers.get("static_lds_bytes", 0)
    if lds > t.lds_bytes:
        raise ResourceError(
            f"{candidate}: kernel {k.name} needs {lds} bytes of LDS (shared memory) per "
            f"workgroup with {k.num_stages} pipeline stage(s); {t.label} allows {t.lds_bytes} "
            "bytes: choose smaller tiles or fewer stages (search with this target's DeviceSpec)"
        )
    spills = k.registers.get("vgpr_spill", 0) + k.registers.get("sgpr_spill", 0)
    if spills and not allow_spills:
        used = k.registers.get("vgpr", 0) + k.registers.get("agpr", 0)
        raise ResourceError(
            f"{candidate}: kernel {k.name} spills {spills} registers to scratch "
            f"({k.registers.get('scratch_bytes', 0)} bytes per lane) on {t.label}: it uses "
            f"{used} of the {t.max_vgprs} VGPRs a wave may hold; choose smaller tiles or "
            "fewer warps, or pass allow_spills=True to accept the slower kernel"
        )


def export_plan(
    plan: Any,
    target: str | AotTarget,
    options: TritonOptions,
    out_dir: Path,
    *,
    candidate: str = "plan",
    allow_spills: bool = False,
) -> dict[str, Any]:
    """Print ``plan`` with ``options``, compile it for ``target`` and write into ``out_dir``:
    ``<candidate>.py`` (the Triton module), per kernel ``<candidate>.<kernel>.<binary>`` and
    its assembly, and ``<candidate>.plan.json``. Returns the manifest entry (files and each
    kernel's :meth:`CompiledKernel.report`)."""
    t = aot_target(target)
    p: Plan = parse_plan(plan)
    src = generate_triton(p, options)
    module = load_triton_module(write_triton_module(src.text, src.codegen_version))
    kernels = compile_for(
        module,
        {b.id: b.dtype for b in p.buffers},
        t,
        candidate=candidate,
        allow_spills=allow_spills,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"source": f"{candidate}.py", "plan": f"{candidate}.plan.json"}
    (out_dir / files["source"]).write_text(src.text)
    (out_dir / files["plan"]).write_text(p.text)
    report: dict[str, Any] = {}
    for name, k in kernels.items():
        binary, asm = f"{candidate}.{name}.{t.binary}", f"{candidate}.{name}.{t.assembly}"
        (out_dir / binary).write_bytes(k.binary)
        (out_dir / asm).write_text(k.assembly)
        report[name] = {**k.report(), "binary": binary, "assembly": asm}
    return {
        "candidate": candidate,
        "files": files,
        "kernels": report,
        "options": json.loads(json.dumps(dataclasses.asdict(options))),
    }
