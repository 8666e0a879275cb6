"""Every exception yirage raises.

The native ones come from the Rust core (``yirage._core``); the Python-side ones below
subclass the same base, so ``except yirage.YirageError`` catches everything yirage raises.
"""

from __future__ import annotations

from yirage._core import (
    DTypeError,
    EvaluationError,
    GraphError,
    MappingError,
    SerializationError,
    ShapeError,
    YirageError,
)

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "ConfigError",
    "DTypeError",
    "EvaluationError",
    "GraphError",
    "MappingError",
    "NotImplementedBackendError",
    "NumericCheckError",
    "PluginAPIError",
    "SerializationError",
    "ShapeError",
    "YirageError",
]


class ConfigError(YirageError):
    """A ``YIRAGE_*`` environment variable holds a value yirage cannot use."""


class NumericCheckError(YirageError):
    """A kernel's outputs disagree with the float64 reference evaluator (or are not finite)."""


class BackendError(YirageError):
    """Base class of backend (vendor plugin) errors."""


class BackendUnavailableError(BackendError):
    """A backend was asked for but is not installed or its probe failed.

    ``name`` is the backend, ``reason`` says why (for a backend that is not installed the
    reason names the ``pip install yirage[<vendor>]`` command)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"backend {name!r} is not available: {reason}")
        self.name = name
        self.reason = reason


class PluginAPIError(BackendError):
    """A vendor package does not speak this yirage's plugin API (or broke the contract)."""


class NotImplementedBackendError(BackendError):
    """The backend has no implementation of this step yet (e.g. no code generator).

    yirage never pretends: it raises this instead of silently falling back."""

    def __init__(self, backend: str, version: str, what: str) -> None:
        super().__init__(
            f"backend {backend!r} (package version {version}) does not implement {what} yet: "
            "this backend has no code generator in this release"
        )
        self.backend = backend
        self.version = version
        self.what = what
