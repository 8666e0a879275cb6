"""Which extreme input values make fused GQA decode kernels return NaN/Inf on the GPU.

Runs every variant of the search's top candidates on the check inputs with one kind of
extreme value sprinkled at a time, and prints the non-finite output count per kind."""

from __future__ import annotations

import json

import numpy as np

import yirage as yr
from yirage import _stress
from yirage._registry import resolve_backend
from yirage._shapes import Shapes
from yirage._workloads import get_workload

wl = get_workload("gqa_decode")
g = wl.graph("gpu")
be = resolve_backend("cuda")
shapes = Shapes(g)
base = wl.inputs("gpu", numpy=True)
res = yr.search(g, backend="cuda", config=wl.search_config, top_k=4)
cands = res.candidates[:5]
kinds = {"largest": [0, 1], "normal": [2, 3], "subnormal": [4, 5], "zero": [6, 7]}
ext = _stress.dtype_extremes("float16")
rng = np.random.default_rng(1)
for kind, idx in kinds.items():
    arrays = []
    for a in base:
        x = np.array(a, dtype=np.float32)
        where = rng.random(x.shape) < 1 / 64
        x[where] = ext[idx][rng.integers(0, len(idx), size=int(where.sum()))]
        arrays.append(x)
    for which in ((0,), (1,), (2,), (0, 1), (1, 2), (0, 2), (0, 1, 2)):  # inputs with extremes
        ins = [arrays[i] if i in which else np.asarray(base[i], np.float32) for i in range(3)]
        ref = g.evaluate([i.astype(np.float64) for i in ins])[0]
        ref16 = ref.astype(np.float16)
        tens = be.from_numpy(shapes.to_kernel(ins), ["float16"] * 3)
        for ci, c in enumerate(cands[:2]):
            plan = json.loads(c.kernel_plan().to_json())
            try:
                k = be.load(be.compile(be.codegen(plan)))
                for name, v in be.variants(k).items():
                    out = v(*tens)[0].float().cpu().numpy().reshape(ref.shape)
                    bad = np.isfinite(ref16) & ~np.isfinite(out)
                    if bad.any():
                        r = np.argwhere(bad)[0]
                        q64, k64 = ins[0].astype(np.float64), ins[1].astype(np.float64)
                        sc = (q64 @ k64)[r[0], r[1]] / np.sqrt(q64.shape[-1])
                        print(
                            "   scores of that row: max",
                            sc.max(),
                            "min",
                            sc.min(),
                            "second",
                            np.sort(sc)[-2],
                            "v col",
                            ins[2][r[0], :, r[2]].max(),
                        )
                        print(
                            f"{kind:9s} in input {which}: cand {ci} {c.label[:50]!r} {name}: "
                            f"{int(bad.sum())} bad, first at {r.tolist()} ref {ref[tuple(r)]:.4g}"
                            f" got {out[tuple(r)]}"
                        )
            except Exception as exc:
                print(f"cand {ci}: {type(exc).__name__}: {exc}"[:300])
print("done")
