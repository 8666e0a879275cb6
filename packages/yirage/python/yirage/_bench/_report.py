"""results.json (fixed schema), results.md, run.json and the bar chart of a benchmark run."""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "REQUIRED_ROW_KEYS",
    "TOP_LEVEL_KEYS",
    "build_results",
    "geomean_speedup",
    "headline",
    "noise_flags",
    "validate_results",
    "write_all",
    "write_markdown",
    "write_plot",
]

#: The keys of results.json, exactly.
TOP_LEVEL_KEYS = (
    "device",
    "backend",
    "versions",
    "copy_bw_TBps",
    "matmul_TFLOPs",
    "rows",
    "geomean_speedup_vs_compile",
    "geomean_speedup_vs_eager",
)
#: Keys every row has (rows may carry more), with the types they may take.
REQUIRED_ROW_KEYS: dict[str, tuple[type, ...]] = {
    "workload": (str,),
    "yirage_us": (float, type(None)),
    "eager_us": (float, type(None)),
    "compile_us": (float, type(None)),
    "expert_us": (float, type(None)),
    "roofline_us": (float,),
    "search_s": (float,),
    "codegen_compile_s": (float,),
    "warm_s": (float,),
    "max_rel_err": (float,),
    "timing": (str,),
}
TIMINGS = ("cudagraph", "events", "wall")
LABELS = {
    "yirage": "yirage",
    "eager": "PyTorch eager",
    "compile": "torch.compile",
    "expert": "expert",
}


def geomean_speedup(rows: Sequence[Mapping[str, Any]], other: str) -> float | None:
    """Geometric mean over the rows of ``<other>_us / yirage_us``, over the rows where both
    are present (a contestant that was wrong or could not run has no time); None if none."""
    ratios = [
        r[f"{other}_us"] / r["yirage_us"]
        for r in rows
        if r.get("yirage_us") and r.get(f"{other}_us")
    ]
    if not ratios:
        return None
    return math.exp(sum(math.log(x) for x in ratios) / len(ratios))


def noise_flags(results: Mapping[str, Any], run: Mapping[str, Any]) -> list[str]:
    """Why the run's ratios are not a result to quote (empty for a quiet run): rows whose
    samples were noisy (``row["noisy"]``: the contestants with q3/q1 over the limit) or whose
    yirage decision was profiled with noisy timings, and the run's own signs of other load
    (``run["noise"]``: rates that moved between start and end, a busy machine at the start).
    One noisy contestant is enough: a ratio is only as good as its worse side."""
    flags = []
    for r in results["rows"]:
        who = list(r.get("noisy", {}))
        if any("timings were noisy" in str(n) for n in r.get("yirage_notes", [])):
            who.append("yirage's own profiling")
        if who:
            flags.append(f"{r['workload']} ({', '.join(who)})")
    return flags + [str(n) for n in run.get("noise", [])]


def headline(results: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    """The summary line of a run: the geomean speedups, flagged NOISY (with the reasons)
    when any of its timings were, so a noisy ratio is never presented as a result."""
    gc, ge = results["geomean_speedup_vs_compile"], results["geomean_speedup_vs_eager"]
    line = (
        f"geomean speedup of yirage: {'-' if gc is None else f'{gc:.2f}x'} vs torch.compile, "
        f"{'-' if ge is None else f'{ge:.2f}x'} vs eager"
    )
    flags = noise_flags(results, run)
    if flags:
        line += " — NOISY, not a result to quote (re-run on a quiet machine): " + "; ".join(flags)
    return line


def _finite(x: Any) -> Any:
    """JSON has no NaN/inf: a non-finite float becomes None (only where None is allowed) or
    a string; containers are converted recursively."""
    if isinstance(x, Mapping):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):  # numpy scalars
        return _finite(x.item())
    return x


def build_results(
    *,
    device: str,
    backend: str,
    versions: Mapping[str, str],
    copy_bw_Bps: float,
    matmul_flops: float,
    rows: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """results.json's object. Times are floats; ``max_rel_err`` of a non-finite error is
    stored as 1e308 (JSON has no inf) and flagged by ``correct``."""
    clean: list[dict[str, Any]] = []
    for r in rows:
        row = dict(r)
        for k in ("yirage_us", "eager_us", "compile_us", "expert_us"):
            if row.get(k) is not None:
                row[k] = float(row[k])
        for k in ("roofline_us", "search_s", "codegen_compile_s", "warm_s", "max_rel_err"):
            v = float(row[k])
            row[k] = v if math.isfinite(v) else 1e308
        clean.append(_finite(row))
    results = {
        "device": device,
        "backend": backend,
        "versions": dict(versions),
        "copy_bw_TBps": copy_bw_Bps / 1e12,
        "matmul_TFLOPs": matmul_flops / 1e12,
        "rows": clean,
        "geomean_speedup_vs_compile": geomean_speedup(clean, "compile"),
        "geomean_speedup_vs_eager": geomean_speedup(clean, "eager"),
    }
    validate_results(results)
    return results


def validate_results(results: Mapping[str, Any]) -> None:
    """Raise ValueError unless ``results`` follows the results.json schema."""
    if tuple(sorted(results)) != tuple(sorted(TOP_LEVEL_KEYS)):
        raise ValueError(f"results.json keys {sorted(results)} != {sorted(TOP_LEVEL_KEYS)}")
    for key, typ in (("device", str), ("backend", str), ("versions", dict), ("rows", list)):
        if not isinstance(results[key], typ):
            raise ValueError(f"{key} must be {typ.__name__}")
    for key in ("copy_bw_TBps", "matmul_TFLOPs"):
        v = results[key]
        if not isinstance(v, float) or not v > 0:
            raise ValueError(f"{key} must be a positive float, got {v!r}")
    for key in ("geomean_speedup_vs_compile", "geomean_speedup_vs_eager"):
        v = results[key]
        if v is not None and (not isinstance(v, float) or not v > 0):
            raise ValueError(f"{key} must be a positive float (or null without rows), got {v!r}")
    for i, row in enumerate(results["rows"]):
        for key, types in REQUIRED_ROW_KEYS.items():
            if key not in row:
                raise ValueError(f"row {i} lacks {key!r}")
            if not isinstance(row[key], types):
                raise ValueError(f"row {i}: {key} is {type(row[key]).__name__}: {row[key]!r}")
        if row["timing"] not in TIMINGS:
            raise ValueError(f"row {i}: timing {row['timing']!r} not in {TIMINGS}")
        for key in ("yirage_us", "eager_us", "compile_us", "expert_us", "roofline_us"):
            if row[key] is not None and not row[key] > 0:
                raise ValueError(f"row {i}: {key} must be positive, got {row[key]!r}")


# -- text ---------------------------------------------------------------------------------------


def _f(v: Any, spec: str = ".1f") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, spec)


def row_summary(row: Mapping[str, Any]) -> str:
    return (
        f"yirage {_f(row['yirage_us'])} µs, eager {_f(row['eager_us'])} µs, "
        f"compile {_f(row['compile_us'])} µs, expert {_f(row['expert_us'])} µs, "
        f"roofline {_f(row['roofline_us'])} µs, max rel err {_f(row['max_rel_err'], '.1e')} "
        f"({row['timing']})"
    )


def _cell(row: Mapping[str, Any], who: str) -> str:
    v = row.get(f"{who}_us")
    if v is not None:
        return _f(v) + ("*" if who in row.get("noisy", {}) else "")
    if row.get("correct", {}).get(who) is False:
        return "WRONG"
    return "-"


def write_markdown(results: Mapping[str, Any], run: Mapping[str, Any], path: Path) -> None:
    rows = results["rows"]
    out: list[str] = [
        f"# yirage bench: {results['backend']} backend on {results['device']}",
        "",
        f"- date: {run.get('date', '?')} (UTC)",
        f"- reproduce: `{run.get('command', '?')}`",
        f"- shapes: {run.get('shapes', '?')}; seed {run.get('seed', '?')}; torch.compile mode "
        f"`{run.get('compile_mode')}`",
        f"- measured now: copy bandwidth {results['copy_bw_TBps'] * 1e3:.1f} GB/s "
        f"(read + written), matmul {results['matmul_TFLOPs']:.3g} TFLOP/s",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in results["versions"].items()),
        "- YIRAGE_* variables set: "
        + (", ".join(f"{k}={v}" for k, v in run.get("yirage_env", {}).items()) or "none"),
        f"- {headline(results, run)}",
        "",
        "| workload | yirage µs | eager µs | torch.compile µs | expert µs | roofline µs | "
        "yirage % of roofline | x vs compile | x vs eager | search s | codegen+compile s | "
        "cold s | warm s | torch.compile s | max rel err | timing |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        y = r["yirage_us"]
        frac = f"{100 * r['roofline_us'] / y:.0f}%" if y else "-"
        vs_c = _f(r["compile_us"] / y, ".2f") if y and r["compile_us"] else "-"
        vs_e = _f(r["eager_us"] / y, ".2f") if y and r["eager_us"] else "-"
        expert = _cell(r, "expert")
        if r.get("expert_name") and r.get("expert_us") is not None:
            expert = f"{expert} ({r['expert_name']})"
        out.append(
            f"| {r['workload']} | {_cell(r, 'yirage')} | {_cell(r, 'eager')} | "
            f"{_cell(r, 'compile')} | {expert} | {_f(r['roofline_us'])} | {frac} | {vs_c} | "
            f"{vs_e} | {_f(r['search_s'], '.2f')} | {_f(r['codegen_compile_s'], '.2f')} | "
            f"{_f(r.get('yirage_cold_s'), '.2f')} | {_f(r['warm_s'], '.3f')} | "
            f"{_f(r.get('torch_compile_s'), '.1f')} | "
            f"{_f(r['max_rel_err'], '.1e')} | {r['timing']} |"
        )
    if not rows:
        out.append("| (no rows: see the notes) |" + " |" * 15)
    chosen = [
        f"- {r['workload']}: {r.get('yirage_chosen') or '?'}"
        + (f" (variant `{r['yirage_chosen_variant']}`)" if r.get("yirage_chosen_variant") else "")
        for r in rows
        if r.get("yirage_chosen") is not None
    ]
    if chosen:
        out += ["", "yirage's chosen kernels:", "", *chosen]
    notes = list(run.get("notes", []))
    for n in dict.fromkeys(r["note"] for r in rows if r.get("note")):
        notes.append(n)
    for r in rows:
        for who, why in r.get("skipped", {}).items():
            if who != "expert" or "no expert" not in why:
                notes.append(f"{r['workload']}: {who} skipped: {why}")
    if notes:
        out += ["", "Notes:", "", *(f"- {n}" for n in notes)]
    out += [
        "",
        "Columns: medians in µs of the same inputs in the same process; `roofline` = max(min "
        "bytes / copy bandwidth, matmul flops / matmul rate) with the better of the "
        "rates measured at the start and at the end of this run; WRONG = the contestant's "
        "output failed the check against the float64 reference evaluator (not timed); "
        "* = noisy samples (third quartile / first quartile > 1.5: other load?); "
        "- = not applicable or could not run (see notes). See benchmarks/README.md.",
        "",
    ]
    path.write_text("\n".join(out), encoding="utf-8")


# -- chart --------------------------------------------------------------------------------------


def write_plot(results: Mapping[str, Any], path: Path) -> None:
    """Grouped bars (µs, log scale) per workload and contestant; the roofline as a black
    line across each group."""
    # imported by name: matplotlib is optional (and has no stubs in the lint environment)
    matplotlib: Any = importlib.import_module("matplotlib")
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")

    rows = results["rows"]
    who = ("yirage", "eager", "compile", "expert")
    colors = {"yirage": "#d62728", "eager": "#1f77b4", "compile": "#2ca02c", "expert": "#9467bd"}
    width = 0.8 / len(who)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.1 * len(rows) + 2), 5.5), dpi=120)
    for j, name in enumerate(who):
        xs, ys = [], []
        for i, r in enumerate(rows):
            v = r.get(f"{name}_us")
            if v:
                xs.append(i - 0.4 + (j + 0.5) * width)
                ys.append(v)
        ax.bar(xs, ys, width=width * 0.95, label=LABELS[name], color=colors[name])
    for i, r in enumerate(rows):
        ax.hlines(
            r["roofline_us"],
            i - 0.45,
            i + 0.45,
            colors="black",
            linewidth=2,
            label="roofline" if i == 0 else "_nolegend_",
        )
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([r["workload"] for r in rows], rotation=20, ha="right")
    ax.set_ylabel("time per call, µs (median; log scale)")
    if rows:
        ax.set_yscale("log")
    timings = sorted({r["timing"] for r in rows}) or ["-"]
    ax.set_title(
        f"yirage ({results['backend']}) vs PyTorch on {results['device']}\n"
        f"timing: {', '.join(timings)}",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def write_all(
    results: Mapping[str, Any], run: Mapping[str, Any], folder: Path, *, plot: bool = True
) -> Path:
    """Write results.json, run.json, results.md and results.png into ``folder``."""
    validate_results(results)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(
        json.dumps(results, indent=2, allow_nan=False) + "\n", encoding="utf-8"
    )
    (folder / "run.json").write_text(
        json.dumps(_finite(dict(run)), indent=2, allow_nan=False, default=str) + "\n",
        encoding="utf-8",
    )
    write_markdown(results, run, folder / "results.md")
    if plot:
        write_plot(results, folder / "results.png")
    return folder
