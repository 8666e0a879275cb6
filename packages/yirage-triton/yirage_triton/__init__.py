"""The shared Triton layer of yirage's vendor backends.

KernelPlans (read through ``yirage.plan``) printed as Triton modules, the torch host glue that
runs them, the Triton launcher, runtime and timer, and the Triton toolchain wrapper (JIT, the
interpreter, ahead-of-time compiles for a named target: :data:`AOT_TARGETS`, :func:`compile_for`,
:func:`export_plan`). What differs per vendor is one
:class:`TritonTarget`; a vendor backend subclasses :class:`TritonBackend` with its target and
its hardware hooks (docs/backends.md, "The Triton layer"). yirage-cuda is one such backend.

Importing this package imports neither torch nor triton.
"""

from __future__ import annotations

from yirage_triton._aot import (
    AOT_TARGETS,
    AotTarget,
    CompiledKernel,
    ResourceError,
    aot_target,
    check_compile_options,
    compile_for,
    compile_kernels,
    export_plan,
    require_triton,
)
from yirage_triton._backend import TritonArtifact, TritonBackend, TritonKernel, TritonPrinted
from yirage_triton._codegen import (
    CODEGEN_VERSION,
    DEEP_STAGES,
    DEFAULT_STAGES,
    TritonOptions,
    TritonSource,
    generate_triton,
    padded_dims,
)
from yirage_triton._host import (
    TORCH_DTYPE,
    fmt_float,
    is_library_plan,
    launcher_lines,
    library_lines,
    narrowed_intermediates,
)
from yirage_triton._rownorm import rms_norm_rows
from yirage_triton._runtime import (
    GraphTimer,
    InputError,
    Launcher,
    ProfileResult,
    TimingSession,
    TritonLauncher,
    check_inputs,
    matmul_fp32,
    profile,
    time_callable,
    warm_median_us,
)
from yirage_triton._subtile import loop_subtile, subtile_kernel
from yirage_triton._target import VARIANT_FAMILIES, TritonTarget
from yirage_triton._toolchain import (
    MODULE_CACHE,
    ToolchainError,
    aot_compile_triton,
    dist_version,
    interpret_mode,
    load_triton_module,
    pin_triton_defaults,
    triton_has_pdl,
    triton_key,
    triton_versions,
    write_triton_module,
)
from yirage_triton._transpose import transposed_copy

__all__ = [
    "AOT_TARGETS",
    "CODEGEN_VERSION",
    "DEEP_STAGES",
    "DEFAULT_STAGES",
    "MODULE_CACHE",
    "TORCH_DTYPE",
    "VARIANT_FAMILIES",
    "AotTarget",
    "CompiledKernel",
    "GraphTimer",
    "InputError",
    "Launcher",
    "ProfileResult",
    "ResourceError",
    "TimingSession",
    "ToolchainError",
    "TritonArtifact",
    "TritonBackend",
    "TritonKernel",
    "TritonLauncher",
    "TritonOptions",
    "TritonPrinted",
    "TritonSource",
    "TritonTarget",
    "aot_compile_triton",
    "aot_target",
    "check_compile_options",
    "check_inputs",
    "compile_for",
    "compile_kernels",
    "dist_version",
    "export_plan",
    "fmt_float",
    "generate_triton",
    "interpret_mode",
    "is_library_plan",
    "launcher_lines",
    "library_lines",
    "load_triton_module",
    "loop_subtile",
    "matmul_fp32",
    "narrowed_intermediates",
    "padded_dims",
    "pin_triton_defaults",
    "profile",
    "require_triton",
    "rms_norm_rows",
    "subtile_kernel",
    "time_callable",
    "transposed_copy",
    "triton_has_pdl",
    "triton_key",
    "triton_versions",
    "warm_median_us",
    "write_triton_module",
]
