"""The Huawei Ascend backend of yirage (probe and DeviceSpec; no code generator yet).

yirage finds it through the ``yirage.backends`` entry point, which calls :func:`register`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from yirage import Backend

__all__ = ["register"]


def register() -> Backend:
    """Return the backend object. Cheap: imports no vendor SDK."""
    from yirage_ascend._backend import AscendBackend

    return AscendBackend()
