"""On-disk cache shared by the search, the compilers of every vendor package and saved kernels.

Layout: ``<root>/v1/<kind>/<key><suffix>`` where ``key`` is a hash of named parts, so a key
never depends on dict order or on the platform. Writes are atomic (temp file + ``os.replace``)
and guarded by a per-entry lock file, so concurrent processes never see half-written entries.

Entries are verified before use: :func:`store_artifact` writes the entry, then a checksum
file beside it (``<entry>.sha256``: SHA-256 and size), and :func:`load_verified_artifact` /
:func:`verified_path` trust an entry only when both agree. An entry cut short (a full disk, a
killed process), with flipped bytes, or without a readable checksum is reported once through
the ``yirage.cache`` logger, removed, and rebuilt by its owner — a truncated shared object is
never handed to ``dlopen``, where it would kill the process with SIGBUS.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from yirage import _env

LAYOUT_VERSION = "v1"
#: Suffix of the checksum file beside each entry; written after the entry, it commits it.
CHECKSUM_SUFFIX = ".sha256"
_log = logging.getLogger("yirage.cache")
_CHECKSUM_LINE = re.compile(r"sha256 ([0-9a-f]{64}) ([0-9]+)\n")
#: Entry locks this thread holds: ``locked`` is re-entrant, so a reader that finds a damaged
#: entry can take the lock even when its caller already holds it.
_held = threading.local()


class DamagedEntryError(OSError):
    """A cache entry failed verification (it has been removed; building again rebuilds it)."""


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
    """Hold an exclusive inter-process lock for ``path`` (a sibling ``.lock`` file).

    Re-entrant within a thread; other threads and processes wait."""
    held: set[str] = _held.__dict__.setdefault("paths", set())
    key = str(path)
    if key in held:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        held.add(key)
        try:
            yield
        finally:
            held.discard(key)
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


def checksum_path(path: Path) -> Path:
    """The checksum file of the entry at ``path``."""
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def _checksum_line(data: bytes) -> bytes:
    return f"sha256 {hashlib.sha256(data).hexdigest()} {len(data)}\n".encode("ascii")


def store_artifact(path: Path, data: bytes) -> None:
    """Atomically write the entry ``path``, then its checksum (under the entry's lock).

    The checksum goes last, so an interrupted write leaves an entry that is never trusted."""
    with locked(path):
        atomic_write_bytes(path, data)
        atomic_write_bytes(checksum_path(path), _checksum_line(data))


def _verify(path: Path) -> tuple[bytes | None, str | None]:
    """(data, None) for an intact entry, (None, None) for a missing one, else (None, reason)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"unreadable: {exc}"
    try:
        line = checksum_path(path).read_bytes()
    except FileNotFoundError:
        return None, "no checksum file (an interrupted write?)"
    except OSError as exc:
        return None, f"unreadable checksum file: {exc}"
    match = _CHECKSUM_LINE.fullmatch(line.decode("ascii", errors="replace"))
    if match is None:
        return None, "unreadable checksum file"
    size = int(match.group(2))
    if len(data) != size:
        return None, f"{len(data)} bytes where {size} were written (truncated or overwritten)"
    if hashlib.sha256(data).hexdigest() != match.group(1):
        return None, "content does not match its checksum"
    return data, None


def discard(path: Path) -> None:
    """Remove the entry ``path`` and its checksum (the entry first: a checksum without its
    entry reads as a missing entry, an entry without its checksum as a damaged one)."""
    for p in (path, checksum_path(path)):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def _report(path: Path, reason: str) -> None:
    _log.warning("yirage cache: corrupt entry %s (%s); rebuilding it", path, reason)


def load_verified_artifact(path: Path) -> bytes | None:
    """The content of the entry ``path`` when it matches its checksum; None when it is missing
    or damaged. A damaged entry is logged (file and reason) and removed, so its owner rebuilds
    it and later readers find it missing instead of warning again."""
    data, reason = _verify(path)
    if reason is None:
        return data
    try:
        with locked(path):  # a writer may be between the entry and its checksum: wait for it
            data, reason = _verify(path)
            if reason is None:
                return data
            discard(path)
    except OSError as exc:  # e.g. a read-only cache: the entry is still never trusted
        reason = f"{reason}; it could not be removed: {exc}"
    _report(path, str(reason))
    return None


def verified_path(path: Path) -> Path | None:
    """``path`` when the entry there matches its checksum (check before ``dlopen`` or an
    import, which need a file); None when it is missing or damaged (see
    :func:`load_verified_artifact`)."""
    return path if load_verified_artifact(path) is not None else None


def read_json(path: Path) -> dict[str, object] | None:
    """Read a verified JSON entry; None when it is missing or damaged (reported, removed)."""
    blob = load_verified_artifact(path)
    if blob is None:
        return None
    try:
        data = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        data, reason = None, str(exc)
    else:
        reason = "not an object"
    if not isinstance(data, dict):
        with contextlib.suppress(OSError), locked(path):
            discard(path)
        _report(path, reason)
        return None
    return data


def write_json(path: Path, data: Mapping[str, object]) -> None:
    """Atomically write a JSON entry and its checksum."""
    store_artifact(path, json.dumps(data, sort_keys=True).encode("utf-8"))
