"""Triton toolchain wrapper: versions, printed modules in the cache, the interpreter and
ahead-of-time compiles for a named target.

Printed modules are written to the yirage cache (``triton`` entries, keyed by the source hash,
the codegen version and the Triton/torch versions: one text is one module whatever the vendor)
and imported with importlib (``@triton.jit`` needs a real source file), stored with their
checksum (``yirage.plugin.store_artifact``) and verified before import: a damaged module is
reported once and written again. ``interpret_mode`` runs them in the Triton interpreter on
CPU tensors; ``aot_compile_triton`` compiles every kernel of a module for an explicit target
(``triton.compile`` with a ``GPUTarget``, no device needed where Triton ships the assembler,
as for NVIDIA's ptxas), which is how CI checks that printed kernels compile for the H100.

Nothing here imports torch or triton at module import time.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from yirage import plugin
from yirage.plugin import BackendError

__all__ = [
    "ToolchainError",
    "aot_compile_triton",
    "dist_version",
    "interpret_mode",
    "load_triton_module",
    "pin_triton_defaults",
    "triton_has_pdl",
    "triton_key",
    "triton_versions",
    "write_triton_module",
]

#: Cache kind of printed Triton modules.
MODULE_CACHE = "triton"


class ToolchainError(BackendError):
    """A compiler is missing or rejected generated code (the message carries its log)."""


def dist_version(name: str) -> str | None:
    """Installed version of a Python distribution (None when absent)."""
    try:
        return importlib.metadata.version(name)
    except Exception:
        return None


def triton_versions() -> dict[str, str]:
    """triton and torch versions, and the device runtime torch was built for."""
    out = {d: v for d in ("triton", "torch") if (v := dist_version(d))}
    if "torch" in out and importlib.util.find_spec("torch") is not None:
        with contextlib.suppress(Exception):
            import torch

            for name in ("cuda", "hip"):
                built = getattr(torch.version, name, None)
                if built:
                    out[f"torch.{name}"] = str(built)
    return out


_IMPORT_LOCK = threading.Lock()


@functools.cache
def triton_has_pdl() -> bool:
    """Whether the installed Triton prints programmatic dependent launch (``gdc_wait`` and
    ``gdc_launch_dependents`` in ``triton.language.extra.cuda``, Triton 3.3 and newer)."""
    try:
        cuda = importlib.import_module("triton.language.extra.cuda")
    except Exception:
        return False
    return hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents")


def pin_triton_defaults() -> None:
    """Pin Triton knobs whose defaults are announced to change (Triton 3.9 warns about
    TRITON_DEFAULT_FP_FUSION), so printed kernels compile the same way across Triton
    releases. Only sets what the user has not set."""
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


_MODULES: dict[tuple[str, bool], ModuleType] = {}


def triton_key(text: str, codegen_version: str) -> dict[str, str]:
    """The cache key of a printed module."""
    return {
        "source": hashlib.sha256(text.encode()).hexdigest(),
        "codegen": codegen_version,
        "triton": dist_version("triton") or "none",
        "torch": dist_version("torch") or "none",
    }


def write_triton_module(text: str, codegen_version: str) -> Path:
    """Write a printed Triton module into the cache (once) and return its path; an entry that
    fails its checksum is reported and written again."""
    path = plugin.entry_path(MODULE_CACHE, triton_key(text, codegen_version), ".py")
    data = text.encode()
    with plugin.locked(path):
        if plugin.load_verified_artifact(path) != data:
            plugin.store_artifact(path, data)
    return path


_STDLIB_LOCK = threading.RLock()
_STDLIB_WRAPPERS: dict[int, Any] = {}


@contextlib.contextmanager
def _interpreted_stdlib() -> Iterator[None]:
    """Make Triton's own ``@jit`` library functions (tl.zeros, tl.sum, tl.sigmoid …)
    interpretable while an interpreted kernel runs.

    Triton decides at *its* import whether those are compiled (JITFunction) or interpreted
    functions; when triton was imported without TRITON_INTERPRET (e.g. by torch, or by a GPU
    kernel earlier in the process), an interpreted kernel calling them fails. They are swapped
    for interpreter wrappers for the duration of the run and restored afterwards."""
    try:
        InterpretedFunction = importlib.import_module(
            "triton.runtime.interpreter"
        ).InterpretedFunction
        JITFunction = importlib.import_module("triton.runtime.jit").JITFunction
    except Exception:
        yield
        return
    with _STDLIB_LOCK:
        owners: list[Any] = [
            m
            for n, m in list(sys.modules.items())
            if m is not None and n.startswith("triton.language")
        ]
        classes = {
            id(v): v
            for m in owners
            for v in vars(m).values()
            if isinstance(v, type) and getattr(v, "__module__", "").startswith("triton.language")
        }
        owners += list(classes.values())
        # Snapshot everything: the interpreter patches language builtins for device-function
        # calls without undoing it, which would break later compilation for the GPU.
        snapshot = [(owner, dict(vars(owner))) for owner in owners]
        for owner in owners:
            for name, value in list(vars(owner).items()):
                if isinstance(value, JITFunction):
                    wrapper = _STDLIB_WRAPPERS.get(id(value))
                    if wrapper is None:
                        wrapper = _STDLIB_WRAPPERS[id(value)] = InterpretedFunction(value.fn)
                    setattr(owner, name, wrapper)
        try:
            yield
        finally:
            # Names the interpreter *added* to module globals (its helpers, which cached
            # rewritten functions refer to) stay; everything that existed is restored.
            for owner, before in snapshot:
                now = dict(vars(owner))
                for name, value in before.items():
                    if now.get(name, _MISSING) is not value:
                        with contextlib.suppress(AttributeError, TypeError):
                            setattr(owner, name, value)


_MISSING = object()


@contextlib.contextmanager
def interpret_mode(enabled: bool) -> Iterator[None]:
    """TRITON_INTERPRET on (or off) while importing or running printed modules; when on,
    Triton's library functions are made interpretable too (see ``_interpreted_stdlib``)."""
    old = os.environ.get("TRITON_INTERPRET")
    if enabled:
        os.environ["TRITON_INTERPRET"] = "1"
    elif old is not None:
        os.environ["TRITON_INTERPRET"] = "0"
    try:
        if enabled and "triton.language" in sys.modules:
            with _interpreted_stdlib():
                yield
        else:
            yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def load_triton_module(path: Path, interpret: bool = False) -> ModuleType:
    """Import a printed module; ``interpret`` makes its kernels run in the Triton interpreter
    (CPU tensors). Modules are cached per (file, mode) in this process."""
    key = (str(path), interpret)
    pin_triton_defaults()
    # TRITON_INTERPRET is process-wide and read at import: every import that sets it holds
    # the lock, or a build thread could import a module compiled while another flips it.
    with _IMPORT_LOCK:
        if "triton.language" not in sys.modules:
            # Import Triton itself in compiled mode, so its library stays usable by GPU
            # kernels in this process; interpreted runs swap in interpreter wrappers.
            with interpret_mode(False):
                importlib.import_module("triton.language")
        mod = _MODULES.get(key)
        if mod is not None:
            return mod
        if plugin.verified_path(Path(path)) is None:
            raise ToolchainError(
                f"the generated Triton module {path} is missing or damaged and was not "
                "imported; compile the source again (write_triton_module restores it)"
            )
        name = f"yirage_triton_gen_{Path(path).stem}_{'i' if interpret else 'c'}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ToolchainError(f"cannot import generated module {path}")
        mod = importlib.util.module_from_spec(spec)
        try:
            with interpret_mode(interpret):
                spec.loader.exec_module(mod)
        except Exception as exc:
            raise ToolchainError(f"generated Triton module {path} failed to import: {exc}") from exc
        sys.modules[name] = mod
        _MODULES[key] = mod
        return mod


def aot_compile_triton(
    module: ModuleType,
    buffer_dtypes: Mapping[int, str],
    arch: int | str = 90,
    *,
    backend: str = "cuda",
    warp_size: int = 32,
) -> dict[str, dict[str, Any]]:
    """Compile every kernel of a (non-interpreted) printed module ahead of time for the named
    target ``GPUTarget(backend, arch, warp_size)`` (``arch`` 90 with "cuda" is sm_90, "gfx942"
    with "hip" an MI300). Returns per kernel: shared memory bytes, stages, warps, the target,
    the binary's size, the compile options, the registers the compiler reports (AMD) and
    whether its PTX waits on the grid before (``pdl``: printed with programmatic dependent
    launch; NVIDIA only). Raises ToolchainError with Triton's message when a kernel does not
    compile, or when the installed Triton has no such target. :func:`yirage_triton.compile_for`
    compiles for a target by name and checks its limits."""
    from yirage_triton._aot import compile_kernels

    kernels = compile_kernels(module, buffer_dtypes, backend, arch, warp_size)
    return {
        name: {**k.report(), "pdl": "griddepcontrol.wait" in k.assembly}
        for name, k in kernels.items()
    }
