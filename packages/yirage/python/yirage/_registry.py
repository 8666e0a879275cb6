"""Discovery of installed backends through the ``yirage.backends`` entry-point group.

Discovery never raises: a plugin that fails to import, to register, or that speaks another
plugin API is recorded with its error and shown by ``get_backend_info`` / ``yirage doctor``.
Only an explicit selection (``YIRAGE_BACKENDS``) turns such failures into
:class:`BackendUnavailableError`.
"""

from __future__ import annotations

import importlib.metadata
import threading
from dataclasses import dataclass, field
from typing import Any

from yirage import _env
from yirage._backend import PLUGIN_API, Backend, DeviceSpec, ProbeResult, VerificationLevel
from yirage._errors import BackendError, BackendUnavailableError, PluginAPIError, YirageError
from yirage._logging import get_logger

__all__ = [
    "KNOWN_BACKENDS",
    "BackendInfo",
    "get_available_backends",
    "get_backend_info",
    "is_backend_available",
    "resolve_backend",
]

GROUP = "yirage.backends"
#: Vendor backends shipped by the yirage project, best first.
KNOWN_BACKENDS: tuple[str, ...] = ("cuda", "rocm", "tpu", "ascend", "mps", "cpu")

_log = get_logger("yirage.registry")


@dataclass
class _Entry:
    name: str
    backend: Backend | None = None
    error: YirageError | None = None
    dist_version: str | None = None
    _probe: ProbeResult | None = None

    def probe(self) -> ProbeResult:
        if self._probe is None:
            if self.backend is None or self.error is not None:
                reason = str(self.error) if self.error else "not loaded"
                self._probe = ProbeResult(available=False, reason=reason)
            else:
                self._probe = _safe_probe(self.backend)
        return self._probe

    @property
    def usable(self) -> bool:
        return self.backend is not None and self.error is None and self.probe().available


@dataclass(frozen=True)
class BackendInfo:
    """Everything yirage knows about one backend (``yirage doctor`` prints this)."""

    name: str
    installed: bool
    available: bool
    reason: str
    package_version: str | None = None
    plugin_api: tuple[int, int] | None = None
    hardware: str | None = None
    toolchain: dict[str, str] = field(default_factory=dict)
    device_spec: DeviceSpec | None = None
    verification_level: VerificationLevel | None = None
    codegen_implemented: bool = False
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "installed": self.installed,
            "available": self.available,
            "reason": self.reason,
            "package_version": self.package_version,
            "plugin_api": list(self.plugin_api) if self.plugin_api else None,
            "hardware": self.hardware,
            "toolchain": dict(self.toolchain),
            "device_spec": self.device_spec.to_dict() if self.device_spec else None,
            "verification_level": (
                self.verification_level.value if self.verification_level else None
            ),
            "codegen_implemented": self.codegen_implemented,
            "error": self.error,
        }


_lock = threading.Lock()
_cache: dict[str, _Entry] | None = None


def _entry_points() -> list[Any]:
    """The installed entry points of the group (tests replace this)."""
    return list(importlib.metadata.entry_points(group=GROUP))


def _reset() -> None:
    """Forget the cached discovery (tests; after installing a plugin at runtime)."""
    global _cache
    with _lock:
        _cache = None


def _safe_probe(backend: Backend) -> ProbeResult:
    try:
        result: object = backend.probe()
    except Exception as exc:  # the contract says probe() never raises; enforce it
        _log.debug("probe of %s raised", backend.name, exc_info=True)
        return ProbeResult(available=False, reason=f"probe raised {type(exc).__name__}: {exc}")
    if not isinstance(result, ProbeResult):
        return ProbeResult(
            available=False,
            reason=f"probe returned {type(result).__name__}, not a yirage.ProbeResult",
        )
    return result


def _load(ep: Any) -> _Entry:
    name = str(ep.name)
    dist = getattr(ep, "dist", None)
    entry = _Entry(name=name, dist_version=getattr(dist, "version", None))
    try:
        register = ep.load()
        backend = register()
    except Exception as exc:
        _log.debug("backend %s failed to load", name, exc_info=True)
        entry.error = BackendError(
            f"the plugin for {name!r} failed to load: {type(exc).__name__}: {exc}"
        )
        return entry
    if not isinstance(backend, Backend):
        entry.error = PluginAPIError(
            f"the plugin for {name!r}: register() returned {type(backend).__name__}, "
            "not a yirage.Backend"
        )
        return entry
    entry.backend = backend
    api = getattr(backend, "plugin_api", None)
    if (
        not isinstance(api, tuple)
        or len(api) != 2
        or not all(isinstance(v, int) for v in api)
        or api[0] != PLUGIN_API[0]
        or api[1] > PLUGIN_API[1]  # written for a newer minor: members this yirage lacks
    ):
        have = ".".join(map(str, api)) if isinstance(api, tuple) else repr(api)
        entry.error = PluginAPIError(
            f"the plugin for {name!r} (package version {entry.dist_version or 'unknown'}) speaks "
            f"plugin API {have}, this yirage speaks {PLUGIN_API[0]}.{PLUGIN_API[1]}: install "
            f"matching versions (pip install -U yirage yirage-{name})"
        )
    elif backend.name != name:
        entry.error = PluginAPIError(
            f"the plugin registered as {name!r} reports name {backend.name!r}"
        )
    return entry


def _discover() -> dict[str, _Entry]:
    global _cache
    with _lock:
        if _cache is not None:
            return _cache
        found: dict[str, _Entry] = {}
        try:
            eps = _entry_points()
        except Exception:
            _log.warning("listing the %s entry points failed", GROUP, exc_info=True)
            eps = []
        for ep in eps:
            name = str(getattr(ep, "name", ""))
            if not name or name in found:
                continue  # first wins (duplicates come from one package on two sys.path roots)
            found[name] = _load(ep)
        _cache = found
        return found


def _ordered(names: list[str]) -> list[str]:
    rank = {n: i for i, n in enumerate(KNOWN_BACKENDS)}
    return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))


def _not_installed_reason(name: str) -> str:
    if name in KNOWN_BACKENDS:
        return (
            f"not installed: pip install yirage[{name}] "
            f"(from a checkout: pip install ./packages/yirage-{name})"
        )
    return f"no backend called {name!r} is installed (yirage's own: {', '.join(KNOWN_BACKENDS)})"


def _all_names() -> list[str]:
    """Every backend worth listing: yirage's own plus any installed third-party ones."""
    return _ordered(list(dict.fromkeys([*KNOWN_BACKENDS, *_discover()])))


def get_available_backends() -> list[str]:
    """Installed backends whose probe passes, best first (cuda, rocm, tpu, ascend, mps, cpu).

    With ``YIRAGE_BACKENDS`` set, returns exactly those backends in the given order and raises
    BackendUnavailableError for any that is not installed, failed to load, or failed its
    probe."""
    entries = _discover()
    selected = _env.backends()
    if selected is None:
        return [n for n in _ordered(list(entries)) if entries[n].usable]
    for name in selected:
        entry = entries.get(name)
        if entry is None:
            raise BackendUnavailableError(name, _not_installed_reason(name) + " (YIRAGE_BACKENDS)")
        if entry.error is not None:
            raise BackendUnavailableError(name, str(entry.error)) from entry.error
        probe = entry.probe()
        if not probe.available:
            raise BackendUnavailableError(name, probe.reason)
    return list(selected)


def is_backend_available(name: str) -> bool:
    """True when backend ``name`` is installed, loaded and its probe passes. Never raises."""
    entry = _discover().get(str(name).lower())
    return entry is not None and entry.usable


def _get_backend(name: str) -> Backend:
    """The loaded Backend object for ``name`` (raises BackendUnavailableError)."""
    entry = _discover().get(name)
    if entry is None:
        raise BackendUnavailableError(name, _not_installed_reason(name))
    if entry.backend is None or entry.error is not None:
        raise BackendUnavailableError(name, str(entry.error)) from entry.error
    return entry.backend


def get_backend_info(name: str) -> BackendInfo:
    """Installation, probe, versions, DeviceSpec and verification level of one backend.

    Never raises: problems are reported in ``reason`` and ``error``."""
    key = str(name).lower()
    entry = _discover().get(key)
    if entry is None:
        return BackendInfo(
            name=key, installed=False, available=False, reason=_not_installed_reason(key)
        )
    backend = entry.backend
    if backend is None:
        return BackendInfo(
            name=key,
            installed=True,
            available=False,
            reason=str(entry.error),
            package_version=entry.dist_version,
            error=str(entry.error),
        )
    probe = entry.probe()
    problems = [str(entry.error)] if entry.error is not None else []
    spec: DeviceSpec | None = None
    if entry.error is None and probe.available:
        try:
            spec = backend.device_spec()
        except Exception as exc:  # reported, not fatal: the probe decides availability
            problems.append(f"device_spec() raised {type(exc).__name__}: {exc}")
    try:
        codegen = bool(backend.codegen_implemented)
    except Exception:
        codegen = False
    return BackendInfo(
        name=key,
        installed=True,
        available=entry.error is None and probe.available,
        reason=str(entry.error) if entry.error is not None else probe.reason,
        package_version=_safe_version(backend, entry),
        plugin_api=backend.plugin_api if isinstance(backend.plugin_api, tuple) else None,
        hardware=probe.hardware,
        toolchain=dict(probe.toolchain),
        device_spec=spec,
        verification_level=backend.verification_level,
        codegen_implemented=codegen,
        error="; ".join(problems) or None,
    )


def _safe_version(backend: Backend, entry: _Entry) -> str | None:
    try:
        return str(backend.package_version)
    except Exception:
        return entry.dist_version


def resolve_backend(backend: str | Backend | None) -> Backend:
    """A Backend object: the given one, the named one, or the best available one that has a
    code generator (a backend that only probes its hardware cannot superoptimize)."""
    if isinstance(backend, Backend):
        return backend
    if backend is None:
        names = get_available_backends()
        usable = [n for n in names if get_backend_info(n).codegen_implemented]
        if not usable:
            found = f" ({', '.join(names)} found, without a code generator yet)" if names else ""
            raise BackendUnavailableError(
                "any",
                f"no backend with a code generator is available{found}: "
                'pip install "yirage[cpu]" (from a checkout: pip install ./packages/yirage-cpu) '
                "and a C compiler, or see `yirage doctor`",
            )
        skipped = names[: names.index(usable[0])]
        if skipped:
            _log.info("using %s: %s has no code generator yet", usable[0], ", ".join(skipped))
        backend = usable[0]
    name = str(backend).lower()
    be = _get_backend(name)
    if not is_backend_available(name):  # the discovery caches the probe
        raise BackendUnavailableError(name, get_backend_info(name).reason)
    return be
