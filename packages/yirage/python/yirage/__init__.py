"""yirage: a multi-backend tensor-program superoptimizer (foundation release).

Build kernel graphs and thread-block graphs, evaluate them with the float64 reference
evaluator, compare them with finite-field fingerprints, serialize them, and discover the
installed hardware backends. See README.md for what exists today.
"""

from __future__ import annotations

from yirage import devices, kernel
from yirage._backend import (
    PLUGIN_API,
    Backend,
    DeviceSpec,
    ProbeResult,
    VerificationLevel,
)
from yirage._capture import CapturedKernel
from yirage._dtypes import DType, bfloat16, float16, float32
from yirage._env import ENV_VARS, EnvVar
from yirage._errors import (
    BackendError,
    BackendUnavailableError,
    ConfigError,
    DTypeError,
    EvaluationError,
    GraphError,
    MappingError,
    NotImplementedBackendError,
    NumericCheckError,
    PluginAPIError,
    SerializationError,
    ShapeError,
    YirageError,
)
from yirage._estimate import (
    Estimate,
    KernelEstimate,
    Variant,
    VariantComparison,
    compare_variants,
    estimate,
)
from yirage._graph import (
    DTensor,
    KernelGraph,
    STensor,
    ThreadBlockGraph,
    equivalent,
    new_kernel_graph,
    new_threadblock_graph,
)
from yirage._kernel import OptimizedKernel, load_kernel
from yirage._registry import (
    BackendInfo,
    get_available_backends,
    get_backend_info,
    is_backend_available,
)
from yirage._report import CandidateReport, SuperoptimizeReport
from yirage._search import Candidate, KernelPlan, SearchReport, SearchResult, search
from yirage._superoptimize import SuperoptimizeError, superoptimize
from yirage._version import __version__
from yirage.devices import DeviceEntry, get_device_spec, register_custom_device
from yirage.export import ExportResult, export_kernels

__all__ = [
    "ENV_VARS",
    "PLUGIN_API",
    "Backend",
    "BackendError",
    "BackendInfo",
    "BackendUnavailableError",
    "Candidate",
    "CandidateReport",
    "CapturedKernel",
    "ConfigError",
    "DTensor",
    "DType",
    "DTypeError",
    "DeviceEntry",
    "DeviceSpec",
    "EnvVar",
    "Estimate",
    "EvaluationError",
    "ExportResult",
    "GraphError",
    "KernelEstimate",
    "KernelGraph",
    "KernelPlan",
    "MappingError",
    "NotImplementedBackendError",
    "NumericCheckError",
    "OptimizedKernel",
    "PluginAPIError",
    "ProbeResult",
    "STensor",
    "SearchReport",
    "SearchResult",
    "SerializationError",
    "ShapeError",
    "SuperoptimizeError",
    "SuperoptimizeReport",
    "ThreadBlockGraph",
    "Variant",
    "VariantComparison",
    "VerificationLevel",
    "YirageError",
    "__version__",
    "bfloat16",
    "compare_variants",
    "devices",
    "equivalent",
    "estimate",
    "export_kernels",
    "float16",
    "float32",
    "get_available_backends",
    "get_backend_info",
    "get_device_spec",
    "is_backend_available",
    "kernel",
    "load_kernel",
    "new_kernel_graph",
    "new_threadblock_graph",
    "register_custom_device",
    "search",
    "superoptimize",
]
