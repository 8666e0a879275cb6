#!/usr/bin/env python3
"""One-command check of the CUDA backend on a GPU machine.

    python benchmarks/gpu_check.py            # full run (≈ 5-8 min on an H100)
    python benchmarks/gpu_check.py --quick    # fewer fixtures/configs, no torch.compile

Steps (each prints as it goes; JSON goes to $OUT/gpu_check.json, or --out):

1. device, toolchain, measured copy bandwidth and fp16 matmul peak;
2. ``yirage_cuda.self_check()`` on the GPU;
3. every fixture plan of tests/cuda/plans.py (fp32/fp16/bf16) through every variant
   (Triton, CUDA C++ with mma.sync, CUDA C++ with FMA) against float64 references;
4. the bench workloads at full size in fp16: hand-tiled plans (a small sweep of tile
   configurations), checked against an fp32 reference, timed as CUDA-graph replay medians
   (L2 flushed between replays) next to PyTorch eager, torch.compile and the expert kernel
   (SDPA) on the same inputs, with the roofline from the measured bandwidth/peak;
   when ``yirage.search`` exists, the superoptimized kernel is timed too;
5. when everything passed, a HARDWARE verification record for this GPU's architecture is
   written to the yirage cache (``yirage doctor`` then reports "ran on hardware"), and the
   record is printed so it can be added to packages/yirage-cuda/yirage_cuda/_verification.json.

Exit status 0 when every correctness check passed (timings never fail the run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "cuda"))
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import numpy as np  # noqa: E402
import plans  # noqa: E402

TARGET_US = {
    "rmsnorm_linear": 19.0,
    "gated_mlp": 25.0,
    "lora": 14.0,
    "gqa_decode_b8_kv4096": 12.0,
    "gqa_decode_b8_kv16384": 50.0,
    "qknorm_gqa_b8_kv4096": 14.0,
}


def log(msg: str = "") -> None:
    print(msg, flush=True)


def target_for(name: str) -> float | None:
    for key, v in TARGET_US.items():
        if name == key or name.startswith(key + "_b"):
            return v
    return None


# ---------------------------------------------------------------------------------------------
# measurement helpers


def graph_median(
    fn: Any, input_sets: list[list[Any]], repeats: int, flush: bool
) -> tuple[float | None, float, str | None]:
    from yirage_triton import time_callable

    launch, replay, err = time_callable(
        fn, input_sets, warmup=10, repeats=repeats, flush_l2=flush, graph=True
    )
    return (statistics.median(replay) if replay else None), statistics.median(launch), err


def machine_peaks(torch: Any) -> dict[str, float]:
    """Copy bandwidth (read+write bytes / time) and dense fp16 matmul throughput, measured."""
    n = 1 << 28  # 256 MiB per buffer
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    copy_us, _, _ = graph_median(lambda s: b.copy_(a), [[a]], 20, False)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    mm_us, _, _ = graph_median(lambda s: torch.matmul(x, x), [[x]], 10, False)
    return {
        "copy_tb_s": 2 * n / ((copy_us or 1e9) * 1e-6) / 1e12,
        "fp16_tflops": 2 * 8192**3 / ((mm_us or 1e9) * 1e-6) / 1e12,
    }


def workload_cost(case: plans.Case) -> tuple[float, float]:
    """(minimum bytes moved, flops) of the unfused workload."""
    dims = [d for d, _ in case.inputs]
    outs = [b["dims"] for b in case.plan["buffers"] if b["role"] == "output"]
    nbytes = 2.0 * (sum(math.prod(d) for d in dims) + sum(math.prod(d) for d in outs))
    w = case.workload
    if w == "rmsnorm_linear":
        (b, h), (_, n) = dims
        flops = 2.0 * b * h * n
    elif w == "gated_mlp":
        (b, h), (_, n), _ = dims
        flops = 4.0 * b * h * n
    elif w == "lora":
        (b, h), (_, n), (_, r), _ = dims
        flops = 2.0 * b * h * n + 2.0 * b * h * r + 2.0 * b * r * n
    else:
        (bb, g, d), (_, _, kv), _ = dims
        flops = 4.0 * bb * g * kv * d
    return nbytes, flops


# ---------------------------------------------------------------------------------------------
# building


def build(plan: dict[str, Any], mma: bool = True, cuda_cpp: bool = True) -> tuple[Any, Any, Any]:
    from yirage_cuda import CudaBackend, _toolchain
    from yirage_cuda._cuda_codegen import CudaCppOptions

    info = _toolchain.device_info()
    copts = CudaCppOptions(arch=info.arch, smem_limit=info.smem_per_block_optin, use_mma=mma)
    be = CudaBackend(cuda_cpp=cuda_cpp, cuda_options=copts)
    art = be.compile(be.codegen(plan))
    return be, art, be.load(art)


def rel_err_np(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape or not np.isfinite(a).all():
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# ---------------------------------------------------------------------------------------------
# steps


def step_fixtures(torch: Any, quick: bool) -> dict[str, Any]:
    tol = {"float32": 1e-4, "float16": 3e-3, "bfloat16": 2e-2}
    dtypes = ("float32", "float16") if quick else ("float32", "float16", "bfloat16")
    results: dict[str, Any] = {}
    for dt in dtypes:
        for case in plans.small_cases(dt):
            for mma in (True, False) if not quick else (True,):
                if dt == "float32" and not mma:
                    continue  # fp32 plans never use mma: the mma run already covered them
                try:
                    be, art, kernel = build(case.plan, mma=mma)
                except Exception as exc:
                    results[f"{dt}/{case.name}/build"] = {
                        "passed": False,
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                    log(f"  FAIL {dt:8s} {case.name:18s} build: {exc}")
                    continue
                xs = case.random_inputs(0)
                tensors = be.from_numpy(
                    [x.astype(np.float32) for x in xs], [d for _, d in case.inputs]
                )
                ref = case.reference(*[t.double().cpu().numpy() for t in tensors])
                variants = dict(kernel.variants)
                if not mma:
                    variants.pop("triton", None)
                if "cuda" not in kernel.variants:
                    results[f"{dt}/{case.name}/cuda{'-mma' if mma else '-fma'}"] = {
                        "passed": False,
                        "error": f"no CUDA C++ variant: {art.cuda_error}",
                    }
                for vname, launcher in variants.items():
                    key = f"{dt}/{case.name}/{vname}" + (
                        "" if vname == "triton" else ("-mma" if mma else "-fma")
                    )
                    try:
                        outs = launcher(*tensors)
                        torch.cuda.synchronize()
                        err = max(
                            rel_err_np(o.double().cpu().numpy(), r)
                            for o, r in zip(outs, ref, strict=True)
                        )
                        ok = err <= tol[dt]
                        results[key] = {"passed": ok, "rel_err": err}
                    except Exception as exc:
                        ok = False
                        results[key] = {"passed": False, "error": f"{type(exc).__name__}: {exc}"}
                    log(
                        f"  {'ok  ' if ok else 'FAIL'} {key:44s} "
                        f"{results[key].get('rel_err', results[key].get('error'))}"
                    )
    return results


def sweep_cases(case: plans.Case, quick: bool) -> list[tuple[str, plans.Case]]:
    """The default hand plan plus a few other tilings of the same workload."""
    w, dt = case.workload, "float16"
    d = [x for x, _ in case.inputs]
    out: list[tuple[str, plans.Case]] = [("default", case)]
    if quick:
        return out
    if w == "rmsnorm_linear":
        b = d[0][0]
        for tn, tk, warps in ((32, 256, 4), (128, 128, 4), (64, 256, 8)):
            out.append(
                (
                    f"tn{tn}-tk{tk}-w{warps}",
                    plans.rmsnorm_linear(b=b, h=4096, n=6144, tn=tn, tk=tk, dtype=dt, warps=warps),
                )
            )
    elif w == "gated_mlp":
        b = d[0][0]
        for tn, tk, warps in ((32, 128, 4), (16, 256, 4), (32, 256, 8)):
            out.append(
                (
                    f"tn{tn}-tk{tk}-w{warps}",
                    plans.gated_mlp(b=b, h=4096, n=4096, tn=tn, tk=tk, dtype=dt, warps=warps),
                )
            )
    elif w == "lora":
        b = d[0][0]
        for tn, tk, splits in ((32, 128, 16), (32, 128, 32), (16, 256, 16)):
            out.append(
                (
                    f"tn{tn}-tk{tk}-s{splits}",
                    plans.lora(b=b, h=4096, n=4096, r=16, tn=tn, tk=tk, splits=splits, dtype=dt),
                )
            )
    else:
        kv = d[1][2]
        qk = w == "qknorm_gqa"
        for splits, tl in ((kv // 512, 128), (kv // 128, 64), (kv // 64, 64)):
            out.append(
                (
                    f"s{splits}-tl{tl}",
                    plans.gqa_decode(
                        bb=16,
                        group=4,
                        d=128,
                        kv_len=kv,
                        splits=splits,
                        tl=tl,
                        dtype=dt,
                        qk_norm=qk,
                        combine="loop",
                    ),
                )
            )
    for _, c in out:
        c.workload, c.preset = case.workload, case.preset
    return out


def rel_err_t(outs: list[Any], ref: list[Any]) -> float:
    return max(float((o.float() - r).norm() / r.norm()) for o, r in zip(outs, ref, strict=True))


def over_budget(args: argparse.Namespace) -> bool:
    return time.time() - START > args.budget_s


def run_config(
    c: plans.Case, sets: list[list[Any]], ref: list[Any], args: argparse.Namespace
) -> dict[str, Any]:
    """Build one hand plan, check every variant against ``ref`` and time it."""
    try:
        _, art, kernel = build(c.plan)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "passed": False}
    cfg: dict[str, Any] = {"variants": {}, "passed": True}
    art.wait_cuda()
    if art.cuda_error:
        cfg["cuda_error"] = art.cuda_error.splitlines()[0][:300]
    for vname, launcher in kernel.variants.items():
        try:
            err = rel_err_t(launcher(*sets[0]), ref)
        except Exception as exc:
            cfg["variants"][vname] = {"error": f"{type(exc).__name__}: {exc}"}
            cfg["passed"] = False
            continue
        ok = err <= 1e-2
        cfg["passed"] &= ok
        g, lmed, gerr = graph_median(launcher.run_unchecked, sets, args.repeats, not args.no_flush)
        cfg["variants"][vname] = {
            "rel_err": err,
            "passed": ok,
            "graph_us": g,
            "launch_us": lmed,
            "graph_error": gerr,
        }
    return cfg


def step_workloads(
    torch: Any, args: argparse.Namespace, peaks: dict[str, float], out: dict[str, Any], save: Any
) -> bool:
    """Per workload, in order of importance (later items are skipped past --budget-s): the
    default hand plan, superoptimize, eager/expert, torch.compile, the other tilings."""
    from yirage._workloads import get_workload

    all_ok = True
    rows = out.setdefault("workloads", {})
    have_search = importlib.util.find_spec("yirage._search") is not None
    log(
        f"{'workload':24s} {'yirage':>8s} {'from':>18s} {'triton':>8s} {'cuda':>8s} "
        f"{'eager':>8s} {'compile':>8s} {'expert':>8s} {'roofline':>8s} {'target':>7s} "
        f"{'vs comp':>7s} {'rel err':>8s}"
    )
    cases = plans.target_cases("float16")
    cases.sort(key=lambda c: 0 if c.preset == "gpu" else 1)  # the headline shapes first
    for case in cases:
        if args.only and not any(x in case.name for x in args.only):
            continue
        t_case = time.time()
        wl = get_workload(case.workload or "")
        preset = case.preset or "gpu"
        sets = [wl.inputs(preset, device="cuda", seed=i) for i in range(args.input_sets)]
        ref = wl.reference(*[t.float() for t in sets[0]])
        row: dict[str, Any] = {"target_us": target_for(case.name), "configs": {}, "skipped": []}
        rows[case.name] = row
        row["configs"]["default"] = cfg = run_config(case, sets, ref, args)
        all_ok &= bool(cfg.get("passed"))
        if have_search and not args.no_search:
            try:
                import yirage as yr
                from yirage_cuda import CudaBackend

                t_so = time.time()
                k = yr.superoptimize(
                    wl.graph(preset),
                    backend=CudaBackend(),
                    cache=False,
                    top_k=args.top_k,
                    time_limit=args.search_s,
                )
                so_s = time.time() - t_so
                err = rel_err_t(k(*sets[0]), ref)
                g, _, _ = graph_median(
                    lambda s, k=k: k.launcher.run_unchecked(s),
                    sets,
                    args.repeats,
                    not args.no_flush,
                )
                row["superoptimize"] = {
                    "rel_err": err,
                    "passed": err <= 1e-2,
                    "graph_us": g,
                    "variant": getattr(k.launcher, "variant", None),
                    "timings_us": getattr(k.launcher, "timings", None),
                    "seconds": so_s,
                    "report": str(k.report),
                }
                all_ok &= err <= 1e-2
                log(
                    f"  superoptimize ({so_s:.1f} s):\n"
                    + "\n".join("    " + x for x in str(k.report).splitlines())
                )
            except Exception as exc:
                all_ok = False
                row["superoptimize"] = {
                    "error": f"{type(exc).__name__}: {exc}",
                    "trace": traceback.format_exc()[-3000:],
                }
                log(f"  superoptimize FAILED: {type(exc).__name__}: {exc}")
        row["eager_us"] = graph_median(
            lambda s, wl=wl: wl.reference(*s), sets, args.repeats, not args.no_flush
        )[0]
        if wl.has_expert:
            row["expert_us"] = graph_median(
                lambda s, wl=wl: wl.expert(*s), sets, args.repeats, not args.no_flush
            )[0]
        if args.no_compile:
            row["skipped"].append("torch.compile (--no-compile)")
        elif over_budget(args):
            row["skipped"].append("torch.compile (time budget)")
        else:
            try:
                fn = torch.compile(wl.reference, mode=args.compile_mode, dynamic=False)
                row["compile_us"] = graph_median(
                    lambda s, fn=fn: fn(*s), sets, args.repeats, not args.no_flush
                )[0]
                row["compile_mode"] = args.compile_mode
            except Exception as exc:
                row["compile_error"] = f"{type(exc).__name__}: {exc}"
        for cname, c in sweep_cases(case, args.quick)[1:]:
            if over_budget(args):
                row["skipped"].append(f"tiling {cname} (time budget)")
                continue
            row["configs"][cname] = cfg = run_config(c, sets, ref, args)
            all_ok &= bool(cfg.get("passed"))
        nbytes, flops = workload_cost(case)
        row["roofline_us"] = (
            max(nbytes / (peaks["copy_tb_s"] * 1e12), flops / (peaks["fp16_tflops"] * 1e12)) * 1e6
        )
        cands: list[tuple[float, str]] = []
        for cname, cfg in row["configs"].items():
            for vname, v in cfg.get("variants", {}).items():
                if v.get("passed") and v.get("graph_us") is not None:
                    cands.append((v["graph_us"], f"{cname}/{vname}"))
        so = row.get("superoptimize", {})
        if so.get("passed") and so.get("graph_us") is not None:
            cands.append((so["graph_us"], f"search/{so.get('variant')}"))
        best = min(cands) if cands else None
        if best is not None:
            row["best"] = {"us": best[0], "from": best[1]}
        save()

        def f(v: Any) -> str:
            return f"{v:8.1f}" if isinstance(v, (int, float)) else f"{'-':>8s}"

        dflt = row["configs"]["default"].get("variants", {})
        comp = row.get("compile_us")
        speed = f"{comp / best[0]:6.2f}x" if best and comp else f"{'-':>7s}"
        errs = [v["rel_err"] for v in dflt.values() if v.get("rel_err") is not None]
        src = (best[1] if best else "-")[-18:]
        tri, cu = dflt.get("triton", {}), dflt.get("cuda", {})
        log(
            f"{case.name:24s} {f(best[0] if best else None)} {src:>18s} "
            f"{f(tri.get('graph_us'))} {f(cu.get('graph_us'))} "
            f"{f(row.get('eager_us'))} {f(comp)} {f(row.get('expert_us'))} {f(row['roofline_us'])} "
            f"{f(row['target_us'])[1:]} {speed} {max(errs) if errs else float('nan'):8.1e}  "
            f"({time.time() - t_case:.0f} s)"
        )
        if row["skipped"]:
            log(f"  skipped: {', '.join(row['skipped'])}")
    return all_ok


START = time.time()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick", action="store_true", help="fewer fixtures and tilings, no torch.compile"
    )
    ap.add_argument(
        "--out", default=os.environ.get("OUT"), help="directory for gpu_check.json (default $OUT)"
    )
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--input-sets", type=int, default=2, help="rotating input sets per timing")
    ap.add_argument("--no-flush", action="store_true", help="do not flush L2 between timed replays")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument(
        "--compile-mode",
        default="default",
        help="torch.compile mode (the peers ran max-autotune: pass max-autotune-no-cudagraphs)",
    )
    ap.add_argument("--skip-fixtures", action="store_true")
    ap.add_argument("--no-search", action="store_true", help="skip yr.superoptimize")
    ap.add_argument("--search-s", type=float, default=10.0, help="search time limit per workload")
    ap.add_argument("--top-k", type=int, default=4, help="candidates superoptimize profiles")
    ap.add_argument("--only", nargs="*", help="substrings of workload names to run")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="skip optional work (sweeps, torch.compile) after this",
    )
    ap.add_argument(
        "--no-record", action="store_true", help="do not write the HARDWARE verification record"
    )
    args = ap.parse_args()
    if args.quick:
        args.no_compile = True

    import torch

    if not torch.cuda.is_available():
        log("no CUDA GPU visible to torch: nothing to check")
        return 2
    import yirage_cuda
    from yirage_cuda import _toolchain, _verification

    info = _toolchain.device_info()
    assert info is not None
    out: dict[str, Any] = {
        "device": {
            "name": info.name,
            "arch": info.arch,
            "sms": info.sm_count,
            "smem_optin": info.smem_per_block_optin,
        },
        "toolchain": _toolchain.toolchain_versions(),
        "args": vars(args),
    }
    out_path = Path(args.out) / "gpu_check.json" if args.out else None

    def save() -> None:
        if out_path is not None:
            out_path.parent.mkdir(parents=True, exist_ok=True)
            out_path.write_text(json.dumps(out, indent=1, sort_keys=True, default=str))

    log(
        f"device: {info.name} ({info.arch}, {info.sm_count} SMs, "
        f"{info.smem_per_block_optin // 1024} KiB smem opt-in)"
    )
    log(f"toolchain: {out['toolchain']}")
    peaks = machine_peaks(torch)
    out["peaks"] = peaks
    log(
        f"measured: copy {peaks['copy_tb_s']:.2f} TB/s, "
        f"fp16 matmul {peaks['fp16_tflops']:.0f} TFLOP/s"
    )
    save()

    log("\n[1] self_check on the GPU")
    sc = yirage_cuda.self_check(interpret=False, record=False)
    out["self_check"] = sc
    log(f"  {'ok' if sc['passed'] else 'FAIL'}: {sc['checks']}")
    ok = bool(sc["passed"])
    save()

    if not args.skip_fixtures:
        log("\n[2] fixture plans x dtypes x variants against float64")
        fx = step_fixtures(torch, args.quick)
        out["fixtures"] = fx
        n_ok = sum(1 for r in fx.values() if r.get("passed"))
        log(f"  {n_ok}/{len(fx)} passed")
        ok &= n_ok == len(fx)
        save()

    log(
        "\n[3] bench workloads, fp16, CUDA-graph replay medians in µs"
        + ("" if args.no_flush else " (L2 flushed between replays)")
    )
    ok &= step_workloads(torch, args, peaks, out, save)
    out["passed"] = ok
    log(f"\nall correctness checks passed: {ok}  ({time.time() - START:.0f} s)")
    if ok and not args.no_record:
        n_fx = len(out.get("fixtures", {}))
        rec = _verification.record(
            "HARDWARE",
            f"benchmarks/gpu_check.py on {info.name}: self_check, {n_fx} fixture kernel checks and "
            f"{len(out['workloads'])} full-size bench workloads matched their references",
            arch=info.arch,
            device=info.name,
            toolchain=out["toolchain"],
        )
        out["record"] = rec
        log(
            "HARDWARE record written; to ship it, add this to "
            "yirage_cuda/_verification.json records:"
        )
        log(json.dumps({k: v for k, v in rec.items() if k != "host"}, indent=1))
    save()
    if out_path is not None:
        log(f"JSON: {out_path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
