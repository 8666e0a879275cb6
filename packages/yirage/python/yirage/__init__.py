"""yirage: a multi-backend tensor-program superoptimizer (foundation release).

Build kernel graphs and thread-block graphs, evaluate them with the float64 reference
evaluator, compare them with finite-field fingerprints, serialize them, and discover the
installed hardware backends. See README.md for what exists today.
"""

from __future__ import annotations

import importlib.metadata as _metadata

from yirage import _core
from yirage._backend import (
    PLUGIN_API,
    Backend,
    DeviceSpec,
    ProbeResult,
    SearchSpace,
    VerificationLevel,
)
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
    PluginAPIError,
    SerializationError,
    ShapeError,
    YirageError,
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
from yirage._registry import (
    BackendInfo,
    get_available_backends,
    get_backend_info,
    is_backend_available,
)

try:
    __version__: str = _metadata.version("yirage")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = _core.__version__

__all__ = [
    "ENV_VARS",
    "PLUGIN_API",
    "Backend",
    "BackendError",
    "BackendInfo",
    "BackendUnavailableError",
    "ConfigError",
    "DTensor",
    "DType",
    "DTypeError",
    "DeviceSpec",
    "EnvVar",
    "EvaluationError",
    "GraphError",
    "KernelGraph",
    "MappingError",
    "NotImplementedBackendError",
    "PluginAPIError",
    "ProbeResult",
    "STensor",
    "SearchSpace",
    "SerializationError",
    "ShapeError",
    "ThreadBlockGraph",
    "VerificationLevel",
    "YirageError",
    "__version__",
    "bfloat16",
    "equivalent",
    "float16",
    "float32",
    "get_available_backends",
    "get_backend_info",
    "is_backend_available",
    "new_kernel_graph",
    "new_threadblock_graph",
]
