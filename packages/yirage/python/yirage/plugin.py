"""The public surface for vendor packages (plugin API ``PLUGIN_API``, see docs/backends.md).

A vendor package imports from here and from ``yirage`` only, never from a private
``yirage._*`` module, so it can be versioned on its own: within one plugin API major, every
name below keeps its meaning, and a minor adds names. A backend declares the
``plugin_api`` it was written for; yirage refuses one with another major or a newer minor.

- the Backend contract: :class:`Backend` (its :meth:`~Backend.variants` names every code path
  printed for one plan; ``DEFAULT_VARIANT`` is the name of a backend's only one),
  :class:`ProbeOnlyBackend` (hardware probe and DeviceSpec, no code generator yet),
  :class:`DeviceSpec`, :class:`ProbeResult`, :class:`VerificationLevel`;
- errors: :class:`BackendError` and the other ``yirage`` errors a backend raises;
- the disk cache: :func:`entry_path` (a key from named parts), :func:`locked`,
  :func:`read_json` / :func:`write_json`, and for compiled artifacts :func:`store_artifact`,
  :func:`load_verified_artifact` and :func:`verified_path` (checked against a stored
  checksum before use; a damaged entry is reported once and removed, so it is rebuilt);
- environment variables: :class:`EnvVar` and :func:`register_env_var` (a backend registers
  its own ``YIRAGE_<VENDOR>_*`` variables);
- timing: :func:`pick_cold_tie`, ``PRUNE_AFTER_ROUNDS`` and ``PRUNE_RATIO`` (the rules of
  ``superoptimize``'s race; a backend no longer races its own variants, it offers them
  through :meth:`Backend.variants`);
- :func:`bfloat16_bits` (float32 rounded to bfloat16 bit patterns),
  :func:`all_reduce` (the runtime's collective, for multi-device library kernels),
  :func:`get_logger`, ``CORE_VERSION`` (the native core's version, for cache keys).
"""

from __future__ import annotations

from yirage import _core
from yirage._backend import (
    DEFAULT_VARIANT,
    PLUGIN_API,
    Backend,
    DeviceSpec,
    ProbeOnlyBackend,
    ProbeResult,
    VerificationLevel,
)
from yirage._cache import (
    LAYOUT_VERSION,
    DamagedEntryError,
    atomic_write_bytes,
    cache_root,
    discard,
    entry_path,
    load_verified_artifact,
    locked,
    read_json,
    store_artifact,
    verified_path,
    write_json,
)
from yirage._collectives import all_reduce
from yirage._dtypes import bfloat16_bits
from yirage._env import EnvVar, register_env_var
from yirage._errors import (
    BackendError,
    BackendUnavailableError,
    ConfigError,
    DTypeError,
    NotImplementedBackendError,
    SerializationError,
    ShapeError,
    YirageError,
)
from yirage._logging import get_logger
from yirage._race import PRUNE_AFTER_ROUNDS, PRUNE_RATIO, pick_cold_tie

#: Version of the native core (``yirage._core``): part of vendor cache keys.
CORE_VERSION: str = str(_core.__version__)

__all__ = [
    "CORE_VERSION",
    "DEFAULT_VARIANT",
    "LAYOUT_VERSION",
    "PLUGIN_API",
    "PRUNE_AFTER_ROUNDS",
    "PRUNE_RATIO",
    "Backend",
    "BackendError",
    "BackendUnavailableError",
    "ConfigError",
    "DTypeError",
    "DamagedEntryError",
    "DeviceSpec",
    "EnvVar",
    "NotImplementedBackendError",
    "ProbeOnlyBackend",
    "ProbeResult",
    "SerializationError",
    "ShapeError",
    "VerificationLevel",
    "YirageError",
    "all_reduce",
    "atomic_write_bytes",
    "bfloat16_bits",
    "cache_root",
    "discard",
    "entry_path",
    "get_logger",
    "load_verified_artifact",
    "locked",
    "pick_cold_tie",
    "read_json",
    "register_env_var",
    "store_artifact",
    "verified_path",
    "write_json",
]
