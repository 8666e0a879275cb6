"""On-disk cache shared by the search, the compilers of every vendor package and saved kernels.

Layout: ``<root>/v1/<kind>/<key><suffix>`` where ``key`` is a hash of named parts, so a key
never depends on dict order or on the platform. Writes are atomic (temp file + ``os.replace``)
and guarded by a per-entry lock file, so concurrent processes never see half-written entries.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from yirage import _env

LAYOUT_VERSION = "v1"
_log = logging.getLogger("yirage.cache")


def cache_root() -> Path:
    """The cache directory (``YIRAGE_CACHE_DIR``, else ``$XDG_CACHE_HOME/yirage``, else
    ``~/.cache/yirage``; see ``yirage._env``)."""
    return _env.cache_dir()


def cache_key(parts: Mapping[str, str]) -> str:
    """Hash of named key parts (sorted by name); every part must be a string."""
    for name, value in parts.items():
        if not isinstance(value, str):
            raise TypeError(f"cache key part {name!r} must be a str, got {type(value).__name__}")
    blob = json.dumps(dict(sorted(parts.items())), separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def entry_path(kind: str, parts: Mapping[str, str], suffix: str = "") -> Path:
    """Path of the entry of ``kind`` (e.g. "search", "cpu-so") for the given key parts."""
    return cache_root() / LAYOUT_VERSION / kind / f"{cache_key(parts)}{suffix}"


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive inter-process lock for ``path`` (a sibling ``.lock`` file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see either the old or the new file, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def read_json(path: Path) -> dict[str, object] | None:
    """Read a JSON entry; a missing entry is None, a corrupt one is removed with a warning."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        _log.warning("yirage cache: corrupt entry %s (%s); rebuilding it", path, exc)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return None
    if not isinstance(data, dict):
        _log.warning("yirage cache: corrupt entry %s (not an object); rebuilding it", path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return None
    return data


def write_json(path: Path, data: Mapping[str, object]) -> None:
    """Atomically write a JSON entry."""
    atomic_write_bytes(path, json.dumps(data, sort_keys=True).encode("utf-8"))
