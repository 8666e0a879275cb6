"""``python -m yirage``: the ``yirage`` command line (doctor, demo, bench)."""

from __future__ import annotations

import sys

from yirage.cli import main

if __name__ == "__main__":
    sys.exit(main())
