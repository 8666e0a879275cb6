"""The benchmark harness behind ``yirage bench``.

For every selected workload case (a workload from ``yirage._workloads`` at one shape preset),
in this one process:

1. the same seeded inputs go to every contestant;
2. the float64 reference is the graph's own evaluator (``KernelGraph.evaluate``) on those
   inputs; every contestant's outputs are checked against it (relative Frobenius error,
   tolerance by dtype as in ``superoptimize``); a contestant that fails is flagged in the row
   and not timed (its time is null);
3. yirage: ``superoptimize`` cold (a fresh temporary ``YIRAGE_CACHE_DIR``), then warm (a second
   call hitting that cache: the cold call passes ``cache_noisy=True``, so the warm path is
   measured even when its profiling was noisy, which the row's notes and the headline then
   say); search, codegen+compile and profiling times come from its report;
4. PyTorch eager (the workload's reference function), ``torch.compile`` of it
   (``mode="max-autotune-no-cudagraphs"``, first-call compile time recorded; skipped with the
   reason when it fails) and the expert kernel where one exists (SDPA for attention);
5. timing: on GPUs both CUDA-graph replay and CUDA events with L2 flushed (the row's primary
   ``timing`` is "cudagraph" when every contestant could be captured, else "events"); on the
   CPU wall-clock medians in interleaved rounds;
6. roofline from the copy bandwidth and matmul rate measured at the start of the run.

Noise: a contestant whose samples spread over ``NOISY_SPREAD`` (q3/q1) is flagged in its row;
rates that moved by more than that between the start and the end of the run, and a load
average at the start of at least the core count, are flagged for the run (``run.json``
``noise``). Any of them marks the headline geomean NOISY (``_report.headline``).

Nothing is faked: a case that cannot run is left out with a note, a contestant that cannot
run or is wrong has a null time and a reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import re
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from yirage._bench import _report, _roofline, _timing
from yirage._env import all_env_vars
from yirage._errors import ConfigError, YirageError

__all__ = ["COMPILE_MODE", "CONTESTANTS", "BenchConfig", "Case", "run_bench", "select_cases"]

#: torch.compile mode of the "compile" contestant.
COMPILE_MODE = "max-autotune-no-cudagraphs"
#: Contestants in table order.
CONTESTANTS = ("yirage", "eager", "compile", "expert")
#: A contestant whose samples have q3/q1 above this is flagged as noisy in its row.
NOISY_SPREAD = 1.5
#: backend name → torch device type of its tensors.
_TORCH_DEVICE = {"cpu": "cpu", "cuda": "cuda", "rocm": "cuda"}


@dataclass(frozen=True)
class Case:
    """One workload at one shape preset (one row of the results)."""

    workload: Any  # yirage._workloads.Workload
    preset: str
    #: sizes (and "dtype") set on the command line: always part of the name
    overridden: tuple[str, ...] = ()

    @property
    def shape(self) -> Mapping[str, Any]:
        return dict(self.workload.shapes[self.preset])

    @property
    def name(self) -> str:
        """``<workload>_b<b>[_h<h>][_n<n>][_q<q_len>][_kv<kv>][_bf16]`` from the preset's
        sizes and dtype (bfloat16 is named, so a float32 and a bfloat16 case of one size are
        two rows; so are the hidden size of a ragged preset and the output size of a
        ragged-output one). Sizes and a dtype set by ``--dims``/``--dtype`` are always named."""
        s = self.shape
        parts = [str(self.workload.name)]
        if "b" in s:
            parts.append(f"b{s['b']}")
        if "h" in s and ("ragged" in self.preset or "h" in self.overridden):
            parts.append(f"h{s['h']}")
        if "n" in s and (self.preset.endswith("ragged_n") or "n" in self.overridden):
            parts.append(f"n{s['n']}")
        named = ("b", "h", "n", "q_len", "kv", "dtype")
        parts.extend(f"{k}{s[k]}" for k in self.overridden if k not in named)
        if "q_len" in s:
            parts.append(f"q{s['q_len']}")
        if "kv" in s:
            parts.append(f"kv{s['kv']}")
        dtype = getattr(s.get("dtype"), "name", None)
        if dtype == "bfloat16" or ("dtype" in self.overridden and dtype is not None):
            parts.append(_DTYPE_TAG.get(dtype, str(dtype)))
        return "_".join(parts)


#: short dtype names of case names
_DTYPE_TAG = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


@dataclass
class BenchConfig:
    """Knobs of one run (the CLI fills these; tests shrink them)."""

    backend: str = "cpu"
    shapes: str | None = None  # preset family; None: "cpu" for the cpu backend, else "gpu"
    batch: int | None = None  # rows of the workloads' first dim ("b"), overriding the preset
    dims: Mapping[str, int] | None = None  # sizes overriding the presets' (``--dims``)
    dtype: str | None = None  # dtype overriding the presets' (``--dtype``)
    out: Path = Path("benchmarks/results")
    seed: int = 0
    compile_mode: str | None = COMPILE_MODE  # None: torch.compile is not run (recorded)
    fresh_torch_cache: bool = True  # a fresh TORCHINDUCTOR_CACHE_DIR: compile time is cold
    cpu_rounds: int = 3
    cpu_min_time_s: float = 0.3
    cpu_min_repeats: int = 10
    gpu_repeats: int = 100
    graph_launches: int = 20
    graph_replays: int = 50
    rates: _roofline.DeviceRates | None = None  # given: skip the measurements (tests)
    superoptimize: Callable[..., Any] | None = None  # None: yirage's superoptimize
    plot: bool = True
    time_budget_s: float | None = None  # no new case starts after this many seconds
    # pass each workload's ``search_config`` preset to superoptimize (default: the default
    # search, as a user calls it without options)
    search_presets: bool = False
    append: bool = False  # keep the rows of other workloads from results.json in the folder
    command: str | None = None  # the reproducing command recorded in the report
    extra_notes: list[str] = field(default_factory=list)

    @property
    def family(self) -> str:
        return self.shapes or ("cpu" if self.backend == "cpu" else "gpu")


# -- selecting cases ---------------------------------------------------------------------------


def _presets(workload: Any, family: str) -> list[str]:
    names = list(workload.shapes)
    if family in names and not any(p.startswith(family + "_") for p in names):
        return [family]
    return [p for p in names if p == family or p.startswith(family + "_")]


def select_cases(workloads: str | Sequence[Any], family: str) -> tuple[list[Case], list[str]]:
    """Cases for ``workloads`` ("all", or names of workloads or of cases, or Workload objects)
    at the presets of ``family`` ("cpu" → "cpu" and "cpu_*", "gpu" → "gpu" and "gpu_*", or an
    exact preset name); notes for workloads without such a preset."""
    from yirage import _workloads

    notes: list[str] = []
    if isinstance(workloads, str):
        workloads = [workloads]
    wanted: list[Any] = []
    for w in workloads:
        if isinstance(w, str) and w == "all":
            wanted.extend(_workloads.WORKLOADS.values())
        else:
            wanted.append(w)
    cases: list[Case] = []
    for w in wanted:
        if isinstance(w, str):
            if w in _workloads.WORKLOADS:
                wl = _workloads.WORKLOADS[w]
            else:  # a case name such as rmsnorm_linear_b16
                matches = [
                    c
                    for wl in _workloads.WORKLOADS.values()
                    for p in _presets(wl, family)
                    if (c := Case(wl, p)).name == w
                ]
                if not matches:
                    known = ", ".join(_workloads.WORKLOADS)
                    raise ConfigError(
                        f"no workload or case {w!r} at shapes {family!r}; workloads: {known}"
                    )
                cases.extend(m for m in matches if m not in cases)
                continue
        else:
            wl = w
        presets = _presets(wl, family)
        if not presets:
            notes.append(
                f"{wl.name}: no {family!r} shape preset (presets: {', '.join(wl.shapes)}); not run"
            )
        cases.extend(c for p in presets if (c := Case(wl, p)) not in cases)
    return cases, notes


def with_batch(cases: Sequence[Case], batch: int) -> list[Case]:
    """``cases`` with the batch ``b`` (the rows of each workload's first dim) set to
    ``batch``; presets that then coincide (``gpu`` and ``gpu_b16`` at one batch) run once."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch must be a positive int, got {batch!r}")
    return with_shape(cases, {"b": batch}, flag="--batch")


def with_shape(
    cases: Sequence[Case],
    dims: Mapping[str, int],
    dtype: str | None = None,
    *,
    flag: str = "--dims",
) -> list[Case]:
    """``cases`` with the sizes in ``dims`` (keys of the workloads' presets: b, h, n, r, kv,
    q_len, d, …) and ``dtype`` (float16, bfloat16, float32) set in every preset; presets that
    then coincide run once. Every case must have every key (the error lists the keys it
    has), so a run never silently measures a size it was not asked for."""
    from yirage._dtypes import _BY_NAME
    from yirage._workloads import Workload

    for k, v in dims.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{flag}: {k} must be a positive int, got {v!r}")
    if dtype is not None and dtype not in _BY_NAME:
        raise ConfigError(f"--dtype must be one of {', '.join(_BY_NAME)}, got {dtype!r}")
    out: list[Case] = []
    for c in cases:
        missing = [k for k in dims if k not in c.shape]
        if missing:
            sizes = ", ".join(k for k in c.shape if k != "dtype")
            raise ConfigError(
                f"workload {c.workload.name!r} (preset {c.preset!r}) has no size "
                f"{', '.join(map(repr, missing))}; its sizes: {sizes}. Bench it without {flag}, "
                "or alone with sizes it has"
            )
        if not isinstance(c.workload, Workload):
            raise ConfigError(f"{flag} needs yirage workloads, got {type(c.workload).__name__}")
        shape = {**c.shape, **dims}
        if dtype is not None:
            shape["dtype"] = _BY_NAME[dtype]
        try:  # the workload's own shape checks (GQA: q_heads a multiple of kv_heads …)
            c.workload._build(shape, shape["dtype"])
        except YirageError as exc:
            raise ConfigError(f"{flag}: {c.workload.name} cannot take {dict(dims)}: {exc}") from exc
        named = tuple(k for k in dims if k != "b") + (("dtype",) if dtype is not None else ())
        workload = dataclasses.replace(c.workload, shapes={c.preset: shape})
        case = Case(workload, c.preset, tuple(dict.fromkeys((*c.overridden, *named))))
        if case.name not in {o.name for o in out}:
            out.append(case)
    return out


# -- environment -------------------------------------------------------------------------------


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _slug(text: str) -> str:
    text = re.sub(r"\((r|tm|c)\)", "", text, flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def _cpu_count() -> int:
    with contextlib.suppress(AttributeError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def device_name(device: str) -> tuple[str, str]:
    """(human-readable device, slug for the results folder)."""
    if device == "cuda":
        name = str(_timing._torch().cuda.get_device_name())
        return name, _slug(name)
    name = _cpu_name()
    cores = _cpu_count()
    return f"{name}, {cores} cores", f"{_slug(name)}-{cores}c"


def _dist_version(dist: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions(backend: Any, device: str) -> dict[str, str]:
    """Versions of everything that shapes the numbers."""
    from yirage import _core
    from yirage._version import __version__

    torch = _timing._torch()

    v: dict[str, str] = {
        "yirage": __version__,
        "yirage_core": _core.__version__,
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        "torch": str(torch.__version__),
        "numpy": np.__version__,
    }
    if backend is not None:
        v[f"yirage-{backend.name}"] = backend.package_version
        with contextlib.suppress(Exception):
            for tool, ver in backend.probe().toolchain.items():
                v[f"toolchain:{tool}"] = str(ver)
    for dist in ("triton", "matplotlib"):
        ver = _dist_version(dist)
        if ver is not None:
            v[dist] = ver
    if device == "cuda":
        v["cuda"] = str(torch.version.cuda)
        with contextlib.suppress(Exception):
            v["cudnn"] = str(torch.backends.cudnn.version())
    else:
        v["torch_threads"] = str(torch.get_num_threads())
    return v


# -- correctness -------------------------------------------------------------------------------


def _as_list(out: Any) -> list[Any]:
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


def rel_errors(outputs: Any, reference: Sequence[np.ndarray]) -> float:
    """Worst relative Frobenius error of ``outputs`` against the float64 reference
    (inf when the number or the shapes of the outputs differ, or a value is not finite)."""
    from yirage._check import rel_frobenius

    outs = _as_list(outputs)
    if len(outs) != len(reference):
        return math.inf
    return max(rel_frobenius(o, r) for o, r in zip(outs, reference, strict=True))


def tolerance(case: Case) -> float:
    from yirage._check import TOLERANCES

    dt = case.workload.dtype(case.preset)
    return float(TOLERANCES[dt.name])


# -- contestants -------------------------------------------------------------------------------


@dataclass
class Contestant:
    name: str
    fn: Callable[[], Any] | None = None
    skip: str | None = None  # why it did not run
    rel_err: float | None = None
    correct: bool | None = None
    times: dict[str, _timing.Timing] = field(default_factory=dict)
    capture_error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


def _sync(device: str) -> None:
    if device == "cuda":
        _timing._torch().cuda.synchronize()


def _err_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 600 else text[:600] + " …"


def _run_yirage(
    case: Case, graph: Any, cfg: BenchConfig, tmp_root: Path
) -> tuple[Any, dict[str, Any]]:
    """superoptimize cold (fresh cache dir) then warm; the kernel of the cold call."""
    optimize = cfg.superoptimize
    if optimize is None:
        from yirage._superoptimize import superoptimize

        optimize = superoptimize
    # the default search unless the run asks for the workload's preset (recorded in the row)
    config = getattr(case.workload, "search_config", None) if cfg.search_presets else None
    options: dict[str, Any] = {} if config is None else {"config": config}
    cache = Path(tempfile.mkdtemp(prefix=f"cache-{case.name}-", dir=tmp_root))
    # Triton's own cache too, so kernels the backend builds with Triton are built cold
    with _env("YIRAGE_CACHE_DIR", str(cache)), _env("TRITON_CACHE_DIR", str(cache / "triton")):
        t0 = time.perf_counter()
        kernel = optimize(graph, backend=cfg.backend, cache_noisy=True, **options)
        cold_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        warm_kernel = optimize(graph, backend=cfg.backend, **options)
        warm_s = time.perf_counter() - t0
    rep = kernel.report
    warm_rep = getattr(warm_kernel, "report", None)
    info = {
        "cold_s": cold_s,
        "warm_s": warm_s,
        "warm_from_cache": getattr(warm_rep, "from_cache", None),
        "search_s": float(getattr(rep, "search_s", math.nan)),
        "codegen_compile_s": float(getattr(rep, "codegen_compile_s", math.nan)),
        "check_s": getattr(rep, "check_s", None),
        "profile_s": getattr(rep, "profile_s", None),
        "predicted_us": getattr(rep, "predicted_us", None),
        "measured_us": getattr(rep, "measured_us", None),
        "report_max_rel_err": getattr(rep, "max_rel_err", None),
        "chosen": getattr(rep, "chosen_description", None),
        "chosen_variant": getattr(rep, "chosen_variant", None),
        "chosen_is_library_baseline": getattr(rep, "chosen_is_library_baseline", None),
        "verification_level": getattr(rep, "verification_level", None),
        "search_config": config,
        "notes": [*getattr(rep, "notes", []), *getattr(warm_rep, "notes", [])],
        "candidates": [
            {
                "description": c.description,
                "status": c.status,
                "predicted_us": c.predicted_us,
                "measured_us": c.measured_us,
                "variant": c.variant,
                "variant_us": dict(c.variant_us),
                "dropped_variants": dict(c.dropped_variants),
                "error": c.error,
            }
            for c in getattr(rep, "candidates", [])
        ],
    }
    return kernel, info


def _compile(
    fn: Callable[..., Any], inputs: Sequence[Any], mode: str, device: str
) -> tuple[Callable[..., Any], float]:
    torch = _timing._torch()
    torch._dynamo.reset()
    compiled = torch.compile(fn, mode=mode)
    with _quiet_autotune():
        t0 = time.perf_counter()
        compiled(*inputs)
        _sync(device)
        dt = time.perf_counter() - t0
    return compiled, dt


@contextlib.contextmanager
def _quiet_autotune() -> Iterator[None]:
    """Keep max-autotune's tables of choices off stderr (display settings only; the
    autotuning itself is unchanged)."""
    import importlib

    try:
        config: Any = importlib.import_module("torch._inductor.config")
        quiet = {
            k: v
            for k, v in (
                ("autotune_num_choices_displayed", 0),
                ("max_autotune_report_choices_stats", False),
            )
            if hasattr(config, k)
        }
        ctx = config.patch(quiet)
    except Exception:
        ctx = contextlib.nullcontext()
    with ctx:
        yield


def _bind(fn: Callable[..., Any], inputs: Sequence[Any]) -> Callable[[], Any]:
    args = tuple(inputs)
    return lambda: fn(*args)


def _time_cpu(contestants: Sequence[Contestant], cfg: BenchConfig) -> str:
    """Interleaved rounds of wall-clock medians; the samples of all rounds are pooled."""
    pooled: dict[str, list[float]] = {c.name: [] for c in contestants}
    for _ in range(max(cfg.cpu_rounds, 1)):
        for c in contestants:
            if c.fn is None or c.skip:
                continue
            try:
                t = _timing.wall_median(
                    c.fn, min_repeats=cfg.cpu_min_repeats, min_time_s=cfg.cpu_min_time_s
                )
            except Exception as exc:
                c.skip = f"timing failed: {_err_text(exc)}"
                continue
            pooled[c.name].extend(t.samples_us)
    for c in contestants:
        if not c.skip:
            s = sorted(pooled[c.name])
            c.times["wall"] = _timing.Timing("wall", float(np.median(s)), tuple(s))
    return "wall"


def _time_gpu(contestants: Sequence[Contestant], cfg: BenchConfig) -> str:
    for c in contestants:
        assert c.fn is not None
        try:
            c.times["events"] = _timing.cuda_events_median(c.fn, repeats=cfg.gpu_repeats)
        except Exception as exc:
            c.skip = f"timing failed: {_err_text(exc)}"
            with contextlib.suppress(Exception):
                _sync("cuda")
            continue
        try:
            c.times["cudagraph"] = _timing.cuda_graph_median(
                c.fn, launches=cfg.graph_launches, replays=cfg.graph_replays
            )
        except Exception as exc:
            c.capture_error = _err_text(exc)
            with contextlib.suppress(Exception):
                _sync("cuda")
    if all("cudagraph" in c.times for c in contestants if not c.skip):
        return "cudagraph"
    return "events"


# -- one case ----------------------------------------------------------------------------------


def _set_roofline(row: dict[str, Any], rates: _roofline.DeviceRates) -> None:
    """(Re)compute a row's roofline and each contestant's fraction of it."""
    roof = _roofline.roofline_us(
        row["min_bytes"], row["flops"], rates.copy_bw_Bps, rates.matmul_flops
    )
    row["roofline_us"] = roof
    row["roofline_fraction"] = {
        who: roof / t for who in CONTESTANTS if (t := row.get(f"{who}_us")) is not None and t > 0
    }


def run_case(
    case: Case, cfg: BenchConfig, rates: _roofline.DeviceRates, device: str, tmp_root: Path
) -> tuple[dict[str, Any] | None, list[str]]:
    """The row of one case (None when yirage cannot run it) and notes."""
    notes: list[str] = []
    graph = case.workload.graph(case.preset)
    inputs = case.workload.inputs(case.preset, seed=cfg.seed, device=device)
    _sync(device)
    from yirage._check import to_numpy64

    reference = graph.evaluate([to_numpy64(t) for t in inputs])
    tol = tolerance(case)

    # yirage, cold then warm
    try:
        kernel, yinfo = _run_yirage(case, graph, cfg, tmp_root)
    except Exception as exc:
        notes.append(f"{case.name}: yirage could not run it ({_err_text(exc)}); row left out")
        return None, notes
    contestants = [Contestant("yirage", _bind(kernel, inputs), info=yinfo)]
    contestants.append(Contestant("eager", _bind(case.workload.reference, inputs)))

    comp = Contestant("compile")
    if cfg.compile_mode is None:
        comp.skip = "torch.compile not run (disabled for this run)"
    else:
        try:
            compiled, compile_s = _compile(
                case.workload.reference, inputs, cfg.compile_mode, device
            )
            comp.fn = _bind(compiled, inputs)
            comp.info["torch_compile_s"] = compile_s
        except Exception as exc:
            comp.skip = f"torch.compile failed: {_err_text(exc)}"
    contestants.append(comp)

    expert = Contestant("expert", info={"name": getattr(case.workload, "expert_name", None)})
    if getattr(case.workload, "has_expert", False):
        # An expert may want its inputs in its own layout (e.g. SDPA's [b, h, kv, d] keys):
        # a workload that defines ``expert_inputs`` converts them once, outside the timing.
        prepare = getattr(case.workload, "expert_inputs", None)
        expert_args = list(prepare(*inputs)) if callable(prepare) else inputs
        expert.fn = _bind(case.workload.expert, expert_args)
        expert.info["prepared_inputs"] = callable(prepare)
    else:
        expert.skip = "no expert kernel for this workload"
    contestants.append(expert)

    # correctness of every contestant, before any timing
    for c in contestants:
        if c.fn is None:
            continue
        try:
            out = c.fn()
            _sync(device)
            c.rel_err = rel_errors(out, reference)
        except Exception as exc:
            c.skip = f"run failed: {_err_text(exc)}"
            c.fn = None
            continue
        c.correct = bool(c.rel_err <= tol)
        if not c.correct:
            notes.append(
                f"{case.name}: {c.name} is INCORRECT (relative error {c.rel_err:.3g} > "
                f"tolerance {tol:g}); not timed"
            )

    timed = [c for c in contestants if c.fn is not None and c.correct]
    method = _time_cpu(timed, cfg) if device == "cpu" else _time_gpu(timed, cfg)
    for c in timed:
        if c.skip:
            notes.append(f"{case.name}: {c.name} {c.skip}; not timed")
    for c in timed:
        if c.capture_error:
            notes.append(
                f"{case.name}: {c.name} could not be captured in a CUDA graph "
                f"({c.capture_error}); the row uses event timing"
            )

    flops = _roofline.graph_flops(graph)
    elem = int(inputs[0].element_size())
    nbytes = _roofline.graph_min_bytes(graph, elem)
    roof = _roofline.roofline_us(nbytes, flops, rates.copy_bw_Bps, rates.matmul_flops)
    if device == "cpu":
        row_note = (
            "CPU wall times are warm-cache: the inputs stay in the last-level cache between "
            "calls, so a time below the DRAM roofline is possible"
        )
    else:
        row_note = None

    by = {c.name: c for c in contestants}

    def primary(c: Contestant) -> float | None:
        t = c.times.get(method)
        return None if t is None else t.median_us

    y = by["yirage"]
    row: dict[str, Any] = {
        "workload": case.name,
        "yirage_us": primary(y),
        "eager_us": primary(by["eager"]),
        "compile_us": primary(by["compile"]),
        "expert_us": primary(by["expert"]),
        "roofline_us": roof,
        "search_s": yinfo["search_s"],
        "codegen_compile_s": yinfo["codegen_compile_s"],
        "warm_s": yinfo["warm_s"],
        "max_rel_err": y.rel_err if y.rel_err is not None else math.inf,
        "timing": method,
        # extra keys
        "preset": case.preset,
        "shape": {k: (v.name if hasattr(v, "name") else v) for k, v in case.shape.items()},
        "dtype": case.workload.dtype(case.preset).name,
        "tolerance": tol,
        "rel_err": {c.name: c.rel_err for c in contestants if c.rel_err is not None},
        "correct": {c.name: c.correct for c in contestants if c.correct is not None},
        "skipped": {c.name: c.skip for c in contestants if c.skip},
        "times_us": {
            c.name: {m: t.to_dict() for m, t in c.times.items()} for c in contestants if c.times
        },
        "roofline_fraction": {},
        "min_bytes": nbytes,
        "flops": flops,
        "yirage_cold_s": yinfo["cold_s"],
        "yirage_warm_from_cache": yinfo["warm_from_cache"],
        "yirage_check_s": yinfo["check_s"],
        "yirage_profile_s": yinfo["profile_s"],
        "yirage_predicted_us": yinfo["predicted_us"],
        "yirage_self_measured_us": yinfo["measured_us"],
        "yirage_chosen": yinfo["chosen"],
        "yirage_chosen_variant": yinfo["chosen_variant"],
        "yirage_chosen_is_library_baseline": yinfo["chosen_is_library_baseline"],
        "yirage_search_config": yinfo["search_config"],
        "yirage_verification_level": yinfo["verification_level"],
        "yirage_notes": list(dict.fromkeys(str(n) for n in yinfo["notes"])),
        "yirage_candidates": yinfo["candidates"],
        "torch_compile_s": comp.info.get("torch_compile_s"),
        "expert_name": expert.info.get("name") if expert.fn is not None else None,
        "expert_prepared_inputs": expert.info.get("prepared_inputs"),
    }
    if row_note:
        row["note"] = row_note
    noisy = {
        c.name: round(t.spread, 2)
        for c in contestants
        if (t := c.times.get(method)) is not None and t.spread > NOISY_SPREAD
    }
    if noisy:
        row["noisy"] = noisy
        notes.append(
            f"{case.name}: noisy timings (q3/q1 of the samples: "
            + ", ".join(f"{k} {v:g}" for k, v in noisy.items())
            + "): other load on the machine?"
        )
    _set_roofline(row, rates)
    if any(c.capture_error for c in contestants):
        row["capture_errors"] = {c.name: c.capture_error for c in contestants if c.capture_error}
    return row, notes


# -- the run -----------------------------------------------------------------------------------


def busy_at_start(load_1min: float, cores: int) -> list[str]:
    """A note when other processes kept every core busy as the run started."""
    if load_1min < cores:
        return []
    return [f"load average {load_1min:.2f} on {cores} cores at the start: other processes ran"]


def rates_moved(start: _roofline.DeviceRates, end: _roofline.DeviceRates) -> list[str]:
    """A note when the copy bandwidth or the matmul rate moved by more than NOISY_SPREAD
    between the start and the end of the run (the machine's load changed meanwhile)."""
    moved = {
        "copy bandwidth": (start.copy_bw_Bps, end.copy_bw_Bps),
        "matmul rate": (start.matmul_flops, end.matmul_flops),
    }
    ratios = {k: max(a, b) / min(a, b) for k, (a, b) in moved.items() if min(a, b) > 0}
    changed = {k: r for k, r in ratios.items() if r > NOISY_SPREAD}
    if not changed:
        return []
    what = ", ".join(f"{k} by x{r:.2f}" for k, r in changed.items())
    return [f"the device rates moved between the start and the end of the run ({what})"]


def _unmeasurable(backend: str) -> str:
    return (
        f"yirage bench measures backends whose tensors are torch cpu/cuda tensors "
        f"({', '.join(_TORCH_DEVICE)}); {backend!r} is not supported yet"
    )


def backend_refusal(backend: str) -> str | None:
    """Why ``yirage bench --backend <backend>`` cannot run on this machine (the backend's own
    probe reason, and whether the harness can measure its tensors), or None when it can."""
    from yirage._registry import get_backend_info

    reasons = []
    info = get_backend_info(backend)
    if not info.available:
        reasons.append(f"backend {backend!r} cannot run here: {info.reason}")
    if backend not in _TORCH_DEVICE:
        reasons.append(_unmeasurable(backend))
    return "; and ".join(reasons) or None


def _resolve_backend(name: str) -> Any:
    from yirage._registry import resolve_backend

    return resolve_backend(name)


def _warm_up_torch_compile(device: str, mode: str) -> float:
    """Compile a trivial function once so the one-time start-up of dynamo/inductor is not
    charged to the first workload; its time is reported separately."""
    torch = _timing._torch()
    x = torch.ones(8, device=device)
    t0 = time.perf_counter()
    torch.compile(lambda a: a * 2 + 1, mode=mode)(x)
    _sync(device)
    dt = time.perf_counter() - t0
    torch._dynamo.reset()
    return dt


def default_command(cfg: BenchConfig, workloads: str | Sequence[Any]) -> str:
    names = (
        [workloads]
        if isinstance(workloads, str)
        else [w if isinstance(w, str) else str(getattr(w, "name", w)) for w in workloads]
    )
    return (
        f"yirage bench --backend {cfg.backend} --workloads {' '.join(names)} "
        f"--shapes {cfg.family}"
        + ("" if cfg.batch is None else f" --batch {cfg.batch}")
        + ("" if not cfg.dims else " --dims " + " ".join(f"{k}={v}" for k, v in cfg.dims.items()))
        + ("" if cfg.dtype is None else f" --dtype {cfg.dtype}")
        + (" --search-presets" if cfg.search_presets else "")
        + f" --out {shlex.quote(str(cfg.out))}"
    )


def _load_previous(folder: Path, backend: str, device: str) -> list[dict[str, Any]]:
    """Rows of an earlier results.json in ``folder`` (for ``append``), tagged with their run."""
    path = folder / "results.json"
    if not path.exists():
        return []
    old = json.loads(path.read_text(encoding="utf-8"))
    _report.validate_results(old)
    if old["backend"] != backend or old["device"] != device:
        raise ConfigError(
            f"{path} holds {old['backend']} results on {old['device']}; cannot append "
            f"{backend} results on {device}"
        )
    prev_run: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        prev_run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    rows = []
    for r in old["rows"]:
        row = dict(r)
        row.setdefault("run_date", prev_run.get("date"))
        row.setdefault("run_copy_bw_TBps", old["copy_bw_TBps"])
        row.setdefault("run_matmul_TFLOPs", old["matmul_TFLOPs"])
        rows.append(row)
    return rows


def run_bench(
    workloads: str | Sequence[Any] = "all", cfg: BenchConfig | None = None
) -> tuple[dict[str, Any], Path]:
    """Run the benchmark; write results.json, results.md, run.json and the bar chart under
    ``<cfg.out>/<device-slug>/`` (rewritten after every case, so a run that is stopped early
    leaves what it measured). Returns (results, that folder)."""
    cfg = cfg or BenchConfig()
    torch = _timing._torch()

    if cfg.superoptimize is None:
        refusal = backend_refusal(cfg.backend)
        if refusal is not None:
            raise ConfigError(refusal)
    device = _TORCH_DEVICE.get(cfg.backend)
    if device is None:
        raise ConfigError(_unmeasurable(cfg.backend))
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"backend {cfg.backend!r} needs a GPU and torch sees none")
    backend = _resolve_backend(cfg.backend) if cfg.superoptimize is None else None
    cases, notes = select_cases(workloads, cfg.family)
    if cfg.batch is not None:
        cases = with_batch(cases, cfg.batch)
    if cfg.dims or cfg.dtype is not None:
        cases = with_shape(cases, dict(cfg.dims or {}), cfg.dtype)
    notes = [*cfg.extra_notes, *notes]
    dev_name, slug = device_name(device)
    folder = Path(cfg.out) / slug
    previous = _load_previous(folder, cfg.backend, dev_name) if cfg.append else []
    started = datetime.now(timezone.utc)
    t_start = time.perf_counter()

    run_info: dict[str, Any] = {
        "date": started.isoformat(timespec="seconds"),
        "command": cfg.command or default_command(cfg, workloads),
        "argv": sys.argv,
        "device": dev_name,
        "torch_device": device,
        "shapes": cfg.family,
        "batch": cfg.batch,
        "dims": dict(cfg.dims) if cfg.dims else None,
        "dtype": cfg.dtype,
        "cases": [c.name for c in cases],
        "seed": cfg.seed,
        "compile_mode": cfg.compile_mode,
        "settings": {
            "cpu_rounds": cfg.cpu_rounds,
            "cpu_min_time_s": cfg.cpu_min_time_s,
            "cpu_min_repeats": cfg.cpu_min_repeats,
            "gpu_repeats": cfg.gpu_repeats,
            "graph_launches": cfg.graph_launches,
            "graph_replays": cfg.graph_replays,
            "time_budget_s": cfg.time_budget_s,
            "search_presets": cfg.search_presets,
        },
        # every YIRAGE_* variable that was set (YIRAGE_CUDA_PDL=0 changes the kernels' launch)
        "yirage_env": {v.name: v.raw() for v in all_env_vars() if v.raw() is not None},
    }
    run_info["noise"] = []
    if device == "cpu" and hasattr(os, "getloadavg"):
        run_info["load_average_at_start"] = list(os.getloadavg())
        run_info["noise"] += busy_at_start(run_info["load_average_at_start"][0], _cpu_count())
    print(f"[yirage bench] {cfg.backend} on {dev_name}: measuring the device …", file=sys.stderr)
    rates = cfg.rates if cfg.rates is not None else _roofline.measure_rates(device)
    run_info["rates"] = {"start": rates.detail}
    vers = versions(backend, device)
    rows: list[dict[str, Any]] = []

    def write(final: bool) -> dict[str, Any]:
        names = {r["workload"] for r in rows}
        kept = [r for r in previous if r["workload"] not in names]
        if kept:
            run_info["rows_from_earlier_runs"] = [r["workload"] for r in kept]
        run_info["notes"] = notes
        run_info["finished" if final else "last_update"] = datetime.now(timezone.utc).isoformat(
            timespec="seconds"
        )
        if final and device == "cpu" and hasattr(os, "getloadavg"):
            run_info["load_average_at_end"] = list(os.getloadavg())
        results = _report.build_results(
            device=dev_name,
            backend=cfg.backend,
            versions=vers,
            copy_bw_Bps=rates.copy_bw_Bps,
            matmul_flops=rates.matmul_flops,
            rows=kept + rows,
        )
        _report.write_all(results, run_info, folder, plot=cfg.plot and final)
        return results

    with contextlib.ExitStack() as stack:
        tmp_root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="yirage-bench-")))
        if cfg.compile_mode is not None:
            if cfg.fresh_torch_cache:
                stack.enter_context(_env("TORCHINDUCTOR_CACHE_DIR", str(tmp_root / "inductor")))
            try:
                run_info["torch_compile_warmup_s"] = _warm_up_torch_compile(
                    device, cfg.compile_mode
                )
            except Exception as exc:
                notes.append(f"torch.compile warm-up failed: {_err_text(exc)}")
        for i, case in enumerate(cases):
            elapsed = time.perf_counter() - t_start
            if cfg.time_budget_s is not None and elapsed > cfg.time_budget_s:
                left = ", ".join(c.name for c in cases[i:])
                notes.append(
                    f"time budget of {cfg.time_budget_s:g} s spent after {elapsed:.0f} s; "
                    f"not run: {left}"
                )
                break
            print(f"[yirage bench] {case.name} ({case.preset}) …", file=sys.stderr, flush=True)
            try:
                row, case_notes = run_case(case, cfg, rates, device, tmp_root)
            except Exception as exc:
                traceback.print_exc()
                row, case_notes = None, [f"{case.name}: harness error ({_err_text(exc)})"]
            notes.extend(case_notes)
            for n in case_notes:
                print(f"[yirage bench]   note: {n}", file=sys.stderr, flush=True)
            if row is not None:
                row["case_s"] = time.perf_counter() - t_start - elapsed
                rows.append(row)
                print(f"[yirage bench]   {_report.row_summary(row)}", file=sys.stderr, flush=True)
            write(final=False)
    if cfg.rates is None and cases:
        # The rates again at the end; the roofline uses the better of the two measurements
        # of each (on a shared machine one of them may have been slowed by other work).
        end = _roofline.measure_rates(device)
        run_info["rates"]["end"] = end.detail
        run_info["noise"] += rates_moved(rates, end)
        rates = _roofline.DeviceRates(
            max(rates.copy_bw_Bps, end.copy_bw_Bps),
            max(rates.matmul_flops, end.matmul_flops),
            {},
        )
        for row in rows:
            _set_roofline(row, rates)
    run_info["rates"]["used"] = {
        "copy_bw_Bps": rates.copy_bw_Bps,
        "matmul_flops": rates.matmul_flops,
        "rule": "the better of the measurements at the start and at the end of the run",
    }
    return write(final=True), folder
