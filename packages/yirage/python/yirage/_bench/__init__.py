"""The benchmark harness: ``yirage bench`` (see benchmarks/README.md).

yirage vs PyTorch eager vs ``torch.compile`` vs expert kernels vs the measured roofline, on the
bundled workloads of ``yirage._workloads``, in one process. Needs torch (and matplotlib for
the chart): ``yirage bench`` checks both before it measures anything and names the
``pip install`` line of what is missing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_bench_parser", "cmd_bench", "missing_dependencies"]

DEFAULT_OUT = Path("benchmarks/results")
#: What ``yirage bench`` imports: (module, pip package, what it is for).
DEPENDENCIES = (
    ("torch", "torch", "the contestants and the timing"),
    ("matplotlib", "matplotlib", "the results.png chart (--no-plot skips it)"),
)


def missing_dependencies(*, plot: bool) -> list[tuple[str, str, str]]:
    """The optional dependencies a run needs that do not import here (matplotlib only when
    the chart is drawn): imported, not just looked up, so a broken install counts too."""
    missing = []
    for module, package, why in DEPENDENCIES:
        if module == "matplotlib" and not plot:
            continue
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append((module, package, why))
    return missing


def _missing_message(missing: list[tuple[str, str, str]]) -> str:
    needs = "; ".join(f"{module} for {why}" for module, _, why in missing)
    return (
        f"needs {needs}, which cannot be imported here: "
        f"pip install {' '.join(package for _, package, _ in missing)}"
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _size(text: str) -> tuple[str, int]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=N such as h=4096, got {text!r}")
    return key, _positive_int(value)


def add_bench_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the ``bench`` subcommand to the CLI's subparsers."""
    p: argparse.ArgumentParser = sub.add_parser(
        "bench",
        help="benchmark yirage against PyTorch eager, torch.compile, expert kernels, roofline "
        "(needs torch and matplotlib)",
        description=(
            "Benchmark yirage's superoptimized kernels against PyTorch eager, torch.compile "
            "(max-autotune-no-cudagraphs) and expert kernels (SDPA), with the roofline "
            "measured on the spot. Writes results.json, results.md, run.json and results.png "
            "under OUT/<device-slug>/. Needs torch (pip install torch) and, for the chart, "
            "matplotlib (pip install matplotlib; --no-plot skips the chart): both are checked "
            "before anything is measured."
        ),
    )
    p.add_argument(
        "--backend",
        default="cpu",
        help="yirage backend (cpu, cuda, rocm, …; one that cannot run here is refused with the "
        "reason); default cpu",
    )
    p.add_argument(
        "--workloads",
        nargs="+",
        default=["all"],
        metavar="NAME",
        help="'all' (default), workload names (rmsnorm_linear …) or case names "
        "(rmsnorm_linear_b16 …)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"results folder; files go to OUT/<device-slug>/ (default {DEFAULT_OUT})",
    )
    p.add_argument(
        "--shapes",
        default=None,
        help="shape presets: 'cpu' (reduced, float32), 'gpu' (full size, float16), 'model' "
        "(CPU model sizes, float32 and bfloat16, a prime hidden size and an odd output size), "
        "'prefill' (GPU, 256-4096 rows), 'ragged' (GPU, dims no power-of-two tile divides) or "
        "a preset name; "
        "default: cpu for the cpu backend, else gpu",
    )
    p.add_argument(
        "-b",
        "--batch",
        type=_positive_int,
        default=None,
        metavar="B",
        help="batch size: the rows of every workload's first dim (b), overriding the preset's",
    )
    p.add_argument(
        "--dims",
        nargs="+",
        type=_size,
        default=None,
        metavar="KEY=N",
        help="sizes overriding the presets' in every selected case (keys of the workload's "
        "presets: b, h, n, r, kv, q_len, d, q_heads, kv_heads), e.g. --dims h=3000 n=5000; "
        "the overridden sizes are part of the case names",
    )
    p.add_argument(
        "--dtype",
        choices=("float16", "bfloat16", "float32"),
        default=None,
        help="dtype of every selected case, overriding the presets'",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs (default 0)")
    p.add_argument(
        "--no-torch-compile",
        action="store_true",
        help="do not run torch.compile (recorded as skipped in the results)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="fewer repeats (smoke test; not for published numbers)",
    )
    p.add_argument(
        "--no-plot", action="store_true", help="skip the PNG chart (and the need for matplotlib)"
    )
    p.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="S",
        help="start no new workload after S seconds (the rest is listed in the notes); the "
        "results are rewritten after every workload anyway",
    )
    p.add_argument(
        "--search-presets",
        action="store_true",
        help="pass each workload's search preset (attention, mlp, lora) to superoptimize; "
        "default: the default search, without presets",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="keep the rows of other workloads already in OUT/<device-slug>/results.json "
        "(to finish a run that was split; each row records its run)",
    )
    p.set_defaults(func=cmd_bench)
    return p


def _command_line(args: argparse.Namespace) -> str:
    parts = ["yirage bench", f"--backend {args.backend}", "--workloads " + " ".join(args.workloads)]
    if args.shapes:
        parts.append(f"--shapes {args.shapes}")
    if args.batch is not None:
        parts.append(f"--batch {args.batch}")
    if args.dims:
        parts.append("--dims " + " ".join(f"{k}={v}" for k, v in args.dims))
    if args.dtype:
        parts.append(f"--dtype {args.dtype}")
    parts.append(f"--out {args.out}")
    if args.seed:
        parts.append(f"--seed {args.seed}")
    if args.time_budget is not None:
        parts.append(f"--time-budget {args.time_budget:g}")
    for flag in ("no_torch_compile", "quick", "no_plot", "search_presets", "append"):
        if getattr(args, flag):
            parts.append("--" + flag.replace("_", "-"))
    return " ".join(parts)


def cmd_bench(args: argparse.Namespace) -> int:
    missing = missing_dependencies(plot=not args.no_plot)
    if missing:
        print(f"yirage bench: {_missing_message(missing)}", file=sys.stderr)
        return 2
    from yirage._bench import _harness
    from yirage._errors import YirageError

    cfg = _harness.BenchConfig(
        backend=str(args.backend).lower(),
        shapes=args.shapes,
        batch=args.batch,
        dims=dict(args.dims) if args.dims else None,
        dtype=args.dtype,
        out=args.out,
        seed=args.seed,
        compile_mode=None if args.no_torch_compile else _harness.COMPILE_MODE,
        plot=not args.no_plot,
        time_budget_s=args.time_budget,
        search_presets=args.search_presets,
        append=args.append,
        command=_command_line(args),
    )
    if args.quick:
        cfg.cpu_rounds, cfg.cpu_min_time_s, cfg.cpu_min_repeats = 1, 0.05, 3
        cfg.gpu_repeats, cfg.graph_launches, cfg.graph_replays = 20, 5, 10
        cfg.extra_notes.append("--quick: reduced repeats; not for published numbers")
    try:
        results, folder = _harness.run_bench(args.workloads, cfg)
    except YirageError as exc:
        print(f"yirage bench: {exc}", file=sys.stderr)
        return 2
    from yirage._bench._report import headline, row_summary

    run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    print(f"yirage bench: {results['backend']} on {results['device']}")
    for row in results["rows"]:
        print(f"  {row['workload']}: {row_summary(row)}")
    print(f"  {headline(results, run)}")
    made = "results.json, results.md, run.json" + ("" if args.no_plot else ", results.png")
    print(f"wrote {made} in {folder}")
    return 0
