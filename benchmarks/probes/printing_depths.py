"""Are the Triton printings of a workload's candidates right at every pipeline depth?

Searches the workload for the H200's datasheet spec, prints each of the first candidates
with ``max_stages`` 1..6 (and the finer printing where one applies), and runs every printing
in a subprocess of its own (a fault must not end the probe; a failed run prints the end of
its error) on random inputs against the workload's float64 reference:

    python benchmarks/probes/printing_depths.py lora b=75 h=375 n=2559 r=32
    python benchmarks/probes/printing_depths.py norm_transformer b=93 h=7801
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

RUN = """
import ast, importlib.util, sys, torch
import yirage as yr
from yirage._workloads import get_workload
name, path, dims = sys.argv[1], sys.argv[2], ast.literal_eval(sys.argv[3])
spec = importlib.util.spec_from_file_location("m", path)
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
g = get_workload(name)._build({**dims, "dtype": yr.float16}, yr.float16)
ins = [(torch.randn(*t.dims, device="cuda", dtype=torch.float64) * 0.1).half() for t in g.inputs]
out = m.launch([x.reshape(d) for x, (d, _) in zip(ins, m.INPUTS)])[0]
ref = get_workload(name).reference(*[x.double() for x in ins])[0]
print(f"err {float((out.double().reshape(ref.shape) - ref).norm() / ref.norm()):.2e}")
"""


def main() -> None:
    import yirage as yr
    from yirage._workloads import get_workload
    from yirage.plan import parse_plan
    from yirage_triton import TritonOptions, generate_triton, loop_subtile

    name = sys.argv[1]
    dims = {k: int(v) for k, v in (a.split("=") for a in sys.argv[2:])}
    g = get_workload(name)._build({**dims, "dtype": yr.float16}, yr.float16)
    result = yr.search(g, device_spec=yr.get_device_spec("H200"), top_k=5, cache=False)
    out = Path(tempfile.mkdtemp(prefix="depths-"))
    for i, cand in enumerate(result.candidates[:3]):
        plan = parse_plan(cand.kernel_plan())
        fine = tuple((k.name, f) for k in plan.generated if (f := loop_subtile(k)) > 1)
        for sub in ((), fine) if fine else ((),):
            for st in range(1, 7):
                opts = TritonOptions(max_stages=st, smem_limit=232448, subtile=sub)
                path = out / f"c{i}_st{st}{'_fine' if sub else ''}.py"
                path.write_text(generate_triton(plan, opts).text)
                run = subprocess.run(
                    [sys.executable, "-c", RUN, name, str(path), repr(dims)],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                last = (run.stdout.strip().splitlines() or ["failed: " + run.stderr[-200:]])[-1]
                print(f"{cand.label[:60]:60s} {path.stem:14s} {last}", flush=True)


if __name__ == "__main__":
    main()
