"""What does moving a stress set's inputs for one perturbed reference cost on the host? The
float64 draw as the exemptions make it (``yirage._stress._perturbed``), written out with
temporaries against in place (the same values), at GQA decode kv16384's and the gated MLP
8x4096x11008's input sizes; interleaved, medians of 5. CPU only:
``OMP_NUM_THREADS=2 python benchmarks/probes/perturb_cost.py``"""

import statistics
import time
from collections.abc import Callable

import numpy as np

Move = Callable[[list[np.ndarray], float, int], list[np.ndarray]]


def with_temporaries(arrays: list[np.ndarray], eta: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, 0x7065727475])
    return [a * (1 + eta * rng.uniform(-1, 1, a.shape)) for a in arrays]


def in_place(arrays: list[np.ndarray], eta: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, 0x7065727475])
    out = []
    for a in arrays:
        m = rng.uniform(-1, 1, a.shape)
        m *= eta
        m += 1
        m *= a
        out.append(m)
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    cases = {
        "gqa_decode kv16384 (Q 16x4x128, K and V 16x128x16384)": [
            (16, 4, 128),
            (16, 128, 16384),
            (16, 16384, 128),
        ],
        "gated_mlp 8x4096x11008 (x, W1, W3)": [(8, 4096), (4096, 11008), (4096, 11008)],
    }
    moves: dict[str, Move] = {"with temporaries": with_temporaries, "in place": in_place}
    for name, dims in cases.items():
        arrays = [rng.standard_normal(d, dtype=np.float32) for d in dims]
        times: dict[str, list[float]] = {k: [] for k in moves}
        for r in range(5):
            for k in list(moves)[:: 1 if r % 2 == 0 else -1]:
                t0 = time.perf_counter()
                moves[k](arrays, 1e-3, 1)
                times[k].append(time.perf_counter() - t0)
        pairs = zip(with_temporaries(arrays, 1e-3, 1), in_place(arrays, 1e-3, 1), strict=True)
        same = all(np.array_equal(x, y) for x, y in pairs)
        cells = ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in times.items())
        print(f"{name}: {cells} (identical values: {same})")


if __name__ == "__main__":
    main()
