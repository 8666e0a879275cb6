"""The 'yirage' logger, configured once from ``YIRAGE_LOGS``."""

from __future__ import annotations

import logging

from yirage import _env

_configured = False


def get_logger(name: str = "yirage") -> logging.Logger:
    """A logger under 'yirage'; the first call sets the level from YIRAGE_LOGS."""
    global _configured
    root = logging.getLogger("yirage")
    if not _configured:
        _configured = True
        try:
            root.setLevel(_env.log_level())
        except Exception:  # a bad YIRAGE_LOGS must not break logging; doctor reports it
            root.setLevel(logging.WARNING)
    return root if name == "yirage" else root.getChild(name.removeprefix("yirage."))
