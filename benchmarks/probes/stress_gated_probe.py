"""Does PyTorch eager's own float32 arithmetic pass the dtype-extremes stress check of the
bfloat16 gated MLP (8x4096x11008)? For each check seed: ``silu(x @ w1) * (x @ w3)`` in
bfloat16 on the extremes set, judged as the check did before (exemptions from one draw of
the inputs, every exempt element required finite) and as it does now (the steps of
``yirage._stress.Exemptions``). CPU only:
``OMP_NUM_THREADS=2 python benchmarks/probes/stress_gated_probe.py --seeds 8``"""

import argparse

import numpy as np
import torch

import yirage as yr
from yirage import _check, _stress
from yirage._kernel import Shapes
from yirage._workloads import get_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    args = ap.parse_args()
    dims = {"b": 8, "h": 4096, "n": 11008, "dtype": yr.bfloat16}
    g = get_workload("gated_mlp")._build(dims, yr.bfloat16)
    shapes = Shapes(g)
    tol = _stress.stress_tolerance("bfloat16")

    def reference(ins: list[np.ndarray]) -> list[np.ndarray]:
        return _check.reference_outputs(g, shapes, ins, None)

    failed_before = 0
    for seed in range(args.seeds):
        s = _stress.extremes_stress(g, shapes, _check.check_inputs(g, seed), reference, seed)
        x, w1, w3 = (torch.from_numpy(np.asarray(a)).bfloat16() for a in s.arrays)
        outs = [torch.nn.functional.silu(x @ w1) * (x @ w3)]
        ex = _stress.Exemptions(g, s, tol, [x])
        verdicts = []
        for steps in (1, ex.STEPS):  # before: the first step only; now: every step
            err, why = _stress.stress_error(outs, s.reference, ["bfloat16"], edge=tol)
            for step in range(steps):
                if why is None and (err <= tol or step == ex.STEPS - 1):
                    break
                exempt, unbounded = ex.step(step)
                err, why = _stress.stress_error(
                    outs, s.reference, ["bfloat16"], edge=tol, exempt=exempt, unbounded=unbounded
                )
            verdicts.append("pass" if why is None and err <= tol else f"fail ({why or err})")
        failed_before += verdicts[0] != "pass"
        print(f"seed {seed}: before {verdicts[0]}; now {verdicts[1]}", flush=True)
    print(f"PyTorch eager failed the check as it was on {failed_before} of {args.seeds} seeds")


if __name__ == "__main__":
    main()
