"""Entry point of a profiling worker process: ``python -m yirage._spread_worker BACKEND
DEVICE`` (started by ``yirage._spread.WorkerPool``; see that module)."""

import sys

from yirage._spread import _serve

if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
