"""Does multiply-add contraction speed up the fused attention prefill kernel? The search's
first candidate for 32 heads x 4096 x 4096 x 128 (float16, H200 spec) printed three ways and
timed side by side (CUDA-graph replays, medians of 3 interleaved rounds): as the printer
emits it (``enable_fp_fusion=False``: its safe-softmax shift must be exact), contracted, and
contracted with the shift taken on the raw scores, ``exp2((s - max s) * c)``, which no
contraction can make inexact. Then each on queries and keys holding 60000 (scores ~1e8).
``python benchmarks/probes/attention_contraction_probe.py`` (the search runs first)."""

import importlib.util
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

import yirage as yr
from yirage._workloads import get_workload
from yirage.devices import get_device_spec
from yirage_triton._codegen import TritonOptions, generate_triton

SCALE = "0.12751743082459868"  # 1/sqrt(128) * log2(e), as the printer writes it


def printings() -> dict[str, str]:
    dims = {"b": 1, "q_heads": 32, "kv_heads": 32, "d": 128, "kv": 4096, "q_len": 4096}
    g = get_workload("attention_prefill")._build({**dims, "dtype": yr.float16}, yr.float16)
    best = yr.search(g, device_spec=get_device_spec("H200"), cache=False, top_k=5).candidates[0]
    plan = best.kernel_plan()
    exact = generate_triton(plan, TritonOptions(exact_softmax_shift=True)).text
    fma = generate_triton(plan, TritonOptions(exact_softmax_shift=False)).text
    shifted = f"""        x1 = t3 * {SCALE}
        mn0 = tl.maximum(m0, tl.max(x1, axis=1, keep_dims=True))
        alpha0 = tl.exp2(m0 - mn0)
        m0 = mn0
        t5 = (tl.exp2(tl.minimum(x1 - m0, 0.0)))"""
    raw = f"""        mn0 = tl.maximum(m0, tl.max(t3, axis=1, keep_dims=True))
        alpha0 = tl.exp2((m0 - mn0) * {SCALE})
        m0 = mn0
        t5 = (tl.exp2(tl.minimum((t3 - m0) * {SCALE}, 0.0)))"""
    if shifted not in fma:
        raise SystemExit("the printed softmax changed; update this probe's edit")
    return {"exact": exact, "fma": fma, "fma_raw_shift": fma.replace(shifted, raw)}


def load(name: str, text: str, tmp: Path) -> ModuleType:
    path = tmp / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def graph_time(fn: Callable[[], object], reps: int = 10) -> float:
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    ts = []
    for _ in range(21):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / reps)
    return statistics.median(ts)


def main() -> None:
    torch.manual_seed(0)
    q = torch.randn(32, 4096, 128, device="cuda", dtype=torch.float16)
    kt = torch.randn(32, 128, 4096, device="cuda", dtype=torch.float16)
    v = torch.randn(32, 4096, 128, device="cuda", dtype=torch.float16)
    ref = torch.softmax((q.double() @ kt.double()) / 128**0.5, -1) @ v.double()
    with tempfile.TemporaryDirectory() as tmp:
        mods = {n: load(n, t, Path(tmp)) for n, t in printings().items()}
        times: dict[str, list[float]] = {n: [] for n in mods}
        for _ in range(3):
            for n, m in mods.items():
                times[n].append(graph_time(lambda m=m: m.launch([q, kt, v])))
        flops = 4 * 32 * 4096 * 4096 * 128
        for n, ts in times.items():
            t = statistics.median(ts)
            print(f"{n:14s} {t:8.1f} us  {flops / t / 1e6:7.1f} TFLOP/s", flush=True)
        q2, kt2 = q.clone(), kt.clone()
        q2[:, ::7, 3] = 60000.0
        kt2[:, 3, ::5] = 60000.0
        for n, m in mods.items():
            out = m.launch([q, kt, v])[0].double()
            err = ((out - ref).norm() / ref.norm()).item()
            bad = int((~torch.isfinite(m.launch([q2, kt2, v])[0])).sum())
            print(f"{n:14s} rel err {err:.2e}, non-finite on large scores: {bad}")


if __name__ == "__main__":
    main()
