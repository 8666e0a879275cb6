"""Calibration of the cost model: predicted against measured time of every profiled candidate.

For each bench workload (``yirage._workloads``) this superoptimizes the graph on one backend
with the decision cache off, so every candidate is searched, built, checked and profiled
afresh. The superoptimize report gives, per candidate, the cost model's prediction for the
device spec the search used (the backend's own spec of this device) and the measured time of
its fastest variant; the library baseline is one of them. Per workload the script writes
Spearman's rank correlation between the two and the median and largest relative error
``|predicted - measured| / measured``, and whether the candidate the model ranks first is
also the fastest measured.

Writes ``<out>/<device-slug>/calibration.csv`` (one row per candidate),
``summary.md`` (the table, the device and the command) and ``summary.json``, and prints
where. No network; every input is generated here.

    OMP_NUM_THREADS=1 python benchmarks/calibration.py --backend cpu
    python benchmarks/calibration.py --backend cuda --out benchmarks/results/calibration
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results" / "calibration"


# -- statistics -------------------------------------------------------------------------------


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's of the tie-averaged ranks); None with fewer
    than 3 pairs or when either side is constant."""
    if len(xs) != len(ys):
        raise ValueError(f"spearman: {len(xs)} predictions but {len(ys)} measurements")
    if len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)


def rel_error(predicted: float, measured: float) -> float:
    """``|predicted - measured| / measured``."""
    return abs(predicted - measured) / measured


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0


@dataclass(frozen=True)
class Row:
    """One profiled candidate of one workload."""

    workload: str
    preset: str
    index: int
    baseline: bool
    chosen: bool
    predicted_us: float
    measured_us: float
    rel_err: float
    description: str


@dataclass(frozen=True)
class Summary:
    """Per-workload agreement of the model with the measurements."""

    workload: str
    preset: str
    candidates: int
    spearman: float | None
    median_rel_err: float
    max_rel_err: float
    #: Measured rank (1 = fastest) of the candidate the model predicts fastest.
    model_pick_measured_rank: int


def summarize(rows: Sequence[Row]) -> Summary:
    """The :class:`Summary` of one workload's rows."""
    pred = [r.predicted_us for r in rows]
    meas = [r.measured_us for r in rows]
    errs = [r.rel_err for r in rows]
    pick = min(range(len(rows)), key=lambda i: pred[i])
    measured_rank = 1 + sum(1 for m in meas if m < meas[pick])
    return Summary(
        workload=rows[0].workload,
        preset=rows[0].preset,
        candidates=len(rows),
        spearman=spearman(pred, meas),
        median_rel_err=median(errs),
        max_rel_err=max(errs),
        model_pick_measured_rank=measured_rank,
    )


# -- measuring --------------------------------------------------------------------------------


def profile_workload(
    name: str, preset: str, backend: str, top_k: int, spec: Any = None
) -> list[Row]:
    """Superoptimize one workload (cache off; ``spec``: the device spec to search with,
    None for the backend's own) and return its profiled candidates."""
    import yirage as yr
    from yirage._workloads import get_workload

    w = get_workload(name)
    options: dict[str, Any] = {} if w.search_config is None else {"config": w.search_config}
    if spec is not None:
        options["device_spec"] = spec
    kernel = yr.superoptimize(w.graph(preset), backend, top_k=top_k, cache=False, **options)
    rep = kernel.report
    rows = []
    for c in rep.candidates:
        if c.predicted_us is None or c.measured_us is None or c.status != "ok":
            continue
        rows.append(
            Row(
                workload=name,
                preset=preset,
                index=c.index,
                baseline=c.description.startswith("baseline"),
                chosen=c.index == rep.chosen_index,
                predicted_us=float(c.predicted_us),
                measured_us=float(c.measured_us),
                rel_err=rel_error(float(c.predicted_us), float(c.measured_us)),
                description=c.description,
            )
        )
    return rows


def _device(backend: str) -> tuple[str, str, Any, list[str]]:
    """(device name, results-folder slug, the spec to search with, notes) of ``backend``.

    On the CPU backend with ``OMP_NUM_THREADS`` below the core count, the spec's
    ``compute_units`` is that thread count: the kernels run on that many threads, and the
    model is calibrated for the machine as it runs them."""
    from yirage._bench._harness import device_name
    from yirage._registry import _get_backend

    name, slug = device_name("cuda" if backend in ("cuda", "rocm") else "cpu")
    spec = _get_backend(backend).device_spec()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    cores = spec.compute_units or 0
    if backend == "cpu" and threads.isdigit() and 0 < int(threads) < cores:
        note = f"compute_units {cores} -> {threads} (OMP_NUM_THREADS={threads})"
        return name, slug, replace(spec, compute_units=int(threads)), [note]
    return name, slug, None, []


def repeated(runs: Sequence[Sequence[Row]]) -> list[Row]:
    """One row per candidate profiled in every run (same index and description), with the
    median of its measured times: a busy machine's single timings swing by tens of percent."""
    if len(runs) == 1:
        return list(runs[0])

    def key(r: Row) -> tuple[int, str]:
        return (r.index, r.description)

    common = set.intersection(*({key(r) for r in run} for run in runs))
    out = []
    for first in runs[0]:
        if key(first) not in common:
            continue
        times = [r.measured_us for run in runs for r in run if key(r) == key(first)]
        m = median(times)
        out.append(replace(first, measured_us=m, rel_err=rel_error(first.predicted_us, m)))
    return out


def _load() -> float | None:
    """The 1-minute load average (None where the OS has none): a busy machine's timings
    are noisy, so the table states it."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


# -- writing ----------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def markdown(summaries: Sequence[Summary], meta: dict[str, Any]) -> str:
    """The results table with the device, the command and how to read it."""
    lines = [
        f"# Cost-model calibration: {meta['device']} ({meta['backend']})",
        "",
        f"Command: `{meta['command']}` (OMP_NUM_THREADS={meta['omp_num_threads']}, "
        f"{meta['date']}, {meta['wall_s']:.0f} s).",
        "",
        "Every profiled candidate of each bench workload (superoptimize, top_k "
        f"{meta['top_k']}, cache off, the library baseline included): the cost model's "
        "prediction for the search's device spec against the measured time of its fastest "
        f"variant (the median over {meta['repeats']} superoptimize run(s), candidates "
        "profiled in all of them). Spearman: rank correlation of predicted and measured "
        "times (n/a with fewer than 3 candidates or a constant side). Relative error: |predicted - "
        "measured| / measured. Pick: the measured rank of the candidate the model ranks "
        "first (1 = it is the fastest measured). Per-candidate rows: calibration.csv.",
        "",
        "| workload | preset | candidates | Spearman | median rel. error | max rel. error | pick |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.workload} | {s.preset} | {s.candidates} | {_fmt(s.spearman, '.3f')} "
            f"| {s.median_rel_err:.1%} | {s.max_rel_err:.1%} | {s.model_pick_measured_rank} |"
        )
    load = meta.get("load_average") or [None, None]
    if meta.get("spec_notes") or load[0] is not None:
        lines.insert(
            4,
            "Device spec of the search: "
            + ("; ".join(meta["spec_notes"]) or "the backend's own")
            + (
                f". 1-minute load average {load[0]:.1f} at the start, {load[1]:.1f} at the end."
                if load[0] is not None and load[1] is not None
                else "."
            )
            + "\n",
        )
    rhos = [s.spearman for s in summaries if s.spearman is not None]
    if rhos:
        lines += ["", f"Median Spearman over workloads: {median(rhos):.3f}."]
    if meta.get("skipped"):
        lines += ["", "Skipped: " + "; ".join(meta["skipped"]) + "."]
    return "\n".join(lines) + "\n"


def write(
    folder: Path, rows: Sequence[Row], summaries: Sequence[Summary], meta: dict[str, Any]
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    fields = list(Row.__dataclass_fields__)
    with open(folder / "calibration.csv", "w", newline="", encoding="utf-8") as f:
        out = csv.DictWriter(f, fieldnames=fields)
        out.writeheader()
        for r in rows:
            out.writerow(asdict(r))
    (folder / "summary.md").write_text(markdown(summaries, meta), encoding="utf-8")
    doc = {**meta, "summaries": [asdict(s) for s in summaries]}
    (folder / "summary.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


# -- main -------------------------------------------------------------------------------------


def _command(argv: Sequence[str]) -> str:
    """The command line that reproduces the table, ``--out`` left out (it names a folder of
    the machine that ran it; the default is the repository's results folder)."""
    kept: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            kept.append(a)
    return shlex.join(["python", "benchmarks/calibration.py", *kept])


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    from yirage._workloads import workload_names

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cpu", help="yirage backend (cpu, cuda, ...)")
    p.add_argument(
        "--preset", default=None, help="workload preset (default: cpu on the CPU, else gpu)"
    )
    p.add_argument(
        "--workloads",
        default=",".join(workload_names()),
        help="comma-separated workloads (default: all)",
    )
    p.add_argument("--top-k", type=int, default=8, help="fused candidates profiled per workload")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="superoptimize each workload this many times; measured: the median",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="results root; the files go to <out>/<device-slug>/",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> Path:
    from yirage import YirageError

    args = parse(argv)
    preset = args.preset or ("cpu" if args.backend == "cpu" else "gpu")
    from yirage._registry import _get_backend
    from yirage._search import device_spec_json

    device, slug, spec, spec_notes = _device(args.backend)
    spec_json = device_spec_json(spec or _get_backend(args.backend).device_spec(), args.backend)[0]
    load_start = _load()
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    rows: list[Row] = []
    summaries: list[Summary] = []
    skipped: list[str] = []
    t0 = time.perf_counter()
    for name in names:
        try:
            got = repeated(
                [
                    profile_workload(name, preset, args.backend, args.top_k, spec)
                    for _ in range(args.repeats)
                ]
            )
        except YirageError as exc:
            skipped.append(f"{name} ({type(exc).__name__}: {exc})")
            print(f"{name}: skipped, {exc}", flush=True)
            continue
        if not got:
            skipped.append(f"{name} (no candidate both predicted and measured)")
            continue
        rows += got
        summaries.append(summarize(got))
        s = summaries[-1]
        print(
            f"{name}: {s.candidates} candidates, Spearman {_fmt(s.spearman, '.3f')}, "
            f"median rel. error {s.median_rel_err:.1%}",
            flush=True,
        )
    meta = {
        "device": device,
        "backend": args.backend,
        "preset": preset,
        "top_k": args.top_k,
        "repeats": args.repeats,
        "command": _command(sys.argv[1:] if argv is None else argv),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "wall_s": time.perf_counter() - t0,
        "device_spec": json.loads(spec_json),
        "spec_notes": spec_notes,
        "load_average": [load_start, _load()],
        "skipped": skipped,
    }
    folder: Path = Path(args.out) / slug
    write(folder, rows, summaries, meta)
    print(f"wrote {folder}/calibration.csv, summary.md and summary.json", flush=True)
    return folder


if __name__ == "__main__":
    main()
