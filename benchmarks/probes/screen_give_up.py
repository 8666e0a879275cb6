"""Does the race's screen give up on a fast contender because of its eager launch times?

Superoptimizes LoRA b16 (4096 x 4096, rank 16, float16) cold in this process and prints every
contender the screen stopped early, with its eager and replayed times. ``old`` decides on the
eager probe alone (the rule before the graph-replay confirmation), ``new`` as shipped:

    python benchmarks/probes/screen_give_up.py old   # then: ... new (each in a fresh process)
"""

from __future__ import annotations

import sys
import time
from typing import Any

import yirage as yr
from yirage import _race
from yirage._workloads import get_workload
from yirage_triton import _runtime

if sys.argv[1:] == ["old"]:
    _runtime._replay_once = lambda *a, **k: None  # type: ignore[assignment]
log: list[tuple[Any, float, float, str]] = []


def _logged(be: Any, c: Any, inputs: Any, options: Any, result: Any, stand_in: Any) -> Any:
    with stand_in():
        r = be.profile(c.launcher, inputs, **options)
    log.append((c.key, r.median_us, r.launch_median_us, r.method))
    return _race._median_us(r)


_race._time = _logged  # type: ignore[assignment]
dims = {"b": 16, "h": 4096, "n": 4096, "r": 16, "dtype": yr.float16}
g = get_workload("lora")._build(dims, yr.float16)
t = time.perf_counter()
k = yr.superoptimize(g, backend="cuda", cache=False)
print(f"cold {time.perf_counter() - t:.1f} s, chosen variant {k.report.chosen_variant}")
for key, med, launch, method in log:
    if "stopped" in method:
        print(f"  stopped {key}: {med:.1f} µs ({launch:.1f} µs eager) {method}")
