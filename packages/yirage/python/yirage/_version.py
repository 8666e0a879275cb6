"""``__version__`` of the meta package, in a module of its own so that modules which record
it (saved kernels, cache keys) need not import the package's ``__init__``."""

from __future__ import annotations

import importlib.metadata as _metadata

from yirage import _core

__all__ = ["__version__"]

try:
    __version__: str = _metadata.version("yirage")
except _metadata.PackageNotFoundError:  # running from a source tree
    __version__ = _core.__version__
