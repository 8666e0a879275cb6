"""``OptimizedKernel``: what ``superoptimize`` returns — a callable kernel with its source,
plan, backend and report — plus saving and loading.

A saved kernel is either a directory (``graph.json``, ``plan.json``, ``kernel<suffix>``,
``metadata.json``) or, when the path has a file suffix, one JSON file holding the same
fields. Loading regenerates the source from the plan (the plan is vendor-neutral), compiles
it through the disk cache (a cache hit when nothing changed), checks versions, and by
default re-checks the numbers against the reference evaluator.

The kernel is built for the graph's equal-rank form (``KernelGraph`` broadcasting promotes
ranks numpy style; the search works on graphs where lower-rank tensors carry explicit
leading size-1 dims): :class:`Shapes` reshapes the caller's tensors to that form and the
outputs back (views, no copies). Multi-device kernels (``world_size`` > 1) sum over the ranks
through ``yirage._collectives``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from yirage import _collectives
from yirage._backend import Backend
from yirage._errors import SerializationError, ShapeError, YirageError
from yirage._graph import KernelGraph
from yirage._logging import get_logger

__all__ = [
    "CandidateReport",
    "NumericCheckError",
    "OptimizedKernel",
    "Shapes",
    "SuperoptimizeReport",
    "load_kernel",
]

SAVE_FORMAT = "yirage.optimized_kernel"
SAVE_VERSION = 1
#: Relative Frobenius-norm error allowed by the numeric check, by output dtype.
TOLERANCES: dict[str, float] = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}

_log = get_logger("yirage.kernel")


class NumericCheckError(YirageError):
    """A kernel's outputs disagree with the float64 reference evaluator (or are not finite)."""


@dataclass
class CandidateReport:
    """What happened to one search candidate in ``superoptimize``."""

    index: int
    hash: str | None
    description: str
    predicted_us: float | None = None
    status: str = "pending"
    max_rel_err: float | None = None
    measured_us: float | None = None
    codegen_compile_s: float | None = None
    cache_hit: bool | None = None
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.status == "ok"


@dataclass
class SuperoptimizeReport:
    """The end report of ``superoptimize`` (also saved with the kernel)."""

    backend: str
    backend_version: str
    verification_level: str
    device: str
    toolchain: dict[str, str] = field(default_factory=dict)
    search: dict[str, Any] = field(default_factory=dict)
    candidates: list[CandidateReport] = field(default_factory=list)
    chosen_index: int | None = None
    chosen_hash: str | None = None
    chosen_description: str = ""
    chosen_is_library_baseline: bool = False
    max_rel_err: float | None = None
    tolerance: float | None = None
    measured_us: float | None = None
    predicted_us: float | None = None
    search_s: float = 0.0
    codegen_compile_s: float = 0.0
    check_s: float = 0.0
    profile_s: float = 0.0
    total_s: float = 0.0
    from_cache: bool = False
    check_seed: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["candidates"] = [asdict(c) for c in self.candidates]
        out: dict[str, Any] = _jsonable(d)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SuperoptimizeReport:
        data = dict(d)
        cands = [CandidateReport(**c) for c in data.pop("candidates", [])]
        known = {f for f in cls.__dataclass_fields__}
        rep = cls(**{k: v for k, v in data.items() if k in known})
        rep.candidates = cands
        return rep

    def __str__(self) -> str:
        lines = [
            f"yirage superoptimize on {self.backend} ({self.device}; {self.verification_level})",
            f"  toolchain: {', '.join(f'{k}: {v}' for k, v in self.toolchain.items()) or '-'}",
            f"  search {self.search_s:.2f} s, codegen+compile {self.codegen_compile_s:.2f} s, "
            f"check {self.check_s:.2f} s, profile {self.profile_s:.2f} s, "
            f"total {self.total_s:.2f} s"
            + (" (decision from the disk cache)" if self.from_cache else ""),
            "  #  status              predicted µs  measured µs  max rel err  candidate",
        ]
        for c in self.candidates:
            mark = "*" if c.index == self.chosen_index else " "
            lines.append(
                f" {mark}{c.index:<2} {c.status[:19]:<19} {_fmt(c.predicted_us):>12} "
                f"{_fmt(c.measured_us):>12} "
                f"{_fmt(c.max_rel_err, '.1e'):>12}  {c.description}"
                + (f"  [{c.error[:80]}]" if c.error else "")
            )
        if self.chosen_index is not None:
            lines.append(
                f"  chosen: #{self.chosen_index} {self.chosen_description} "
                f"({self.chosen_hash or '?'}), "
                f"max rel err {_fmt(self.max_rel_err, '.1e')} (tolerance {self.tolerance:g})"
            )
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if x is None or isinstance(x, (str, int, float, bool)):
        return x
    return str(x)


# -- tensors, vendor-neutral -------------------------------------------------------------------


def to_numpy32(x: Any) -> np.ndarray:
    """A float32 numpy array of a numpy array or a torch tensor on any device (a copy only
    where the dtype or device needs one)."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float32, copy=False)
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        arr: np.ndarray = x.detach().float().cpu().numpy()
        return arr
    return np.asarray(x, dtype=np.float32)


def to_numpy64(x: Any) -> np.ndarray:
    """A float64 numpy copy of a numpy array or a torch tensor on any device."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        arr: np.ndarray = x.detach().float().cpu().double().numpy()
        return arr
    return np.asarray(x, dtype=np.float64)


#: Version of :func:`check_inputs`' generator: stored references are only reused with it.
CHECK_INPUTS_VERSION = 2


#: Check inputs are drawn in chunks of this many elements, each from its own child seed, on a
#: thread pool (numpy's generators release the GIL): 2 x 33.5M values (GQA decode's K and V at
#: kv 16384) take a fraction of the 1-2 s one generator needs, and the values do not depend on
#: the number of threads.
_CHECK_CHUNK = 1 << 20


def check_scale(dims: Sequence[int]) -> float:
    """Factor on a check input's N(0, 1) values: 1/√(dims[-2]) for matrix-like inputs
    (dims[-2] ≥ 64), so matmul outputs stay O(1) even in float16."""
    return 1.0 / math.sqrt(dims[-2]) if len(dims) >= 2 and dims[-2] >= 64 else 1.0


def check_inputs(graph: KernelGraph, seed: int) -> list[np.ndarray]:
    """Fresh float32 inputs for the numeric check: N(0, 1) times :func:`check_scale`."""
    out = []
    jobs: list[tuple[np.ndarray, np.random.SeedSequence]] = []
    for i, t in enumerate(graph.inputs):
        dims = t.dims
        x = np.empty(dims, dtype=np.float32)
        flat = x.reshape(-1)
        starts = range(0, flat.size, _CHECK_CHUNK)
        seeds = np.random.SeedSequence([seed, i]).spawn(len(starts))
        jobs += [(flat[a : a + _CHECK_CHUNK], sq) for a, sq in zip(starts, seeds, strict=True)]
        out.append(x)

    def fill(job: tuple[np.ndarray, np.random.SeedSequence]) -> None:
        np.random.default_rng(job[1]).standard_normal(out=job[0], dtype=np.float32)

    if sum(job[0].size for job in jobs) > _CHECK_CHUNK:
        with ThreadPoolExecutor(min(len(jobs), os.cpu_count() or 1, 32)) as pool:
            list(pool.map(fill, jobs))
    else:
        for job in jobs:
            fill(job)
    for x in out:
        scale = check_scale(x.shape)
        if scale != 1.0:
            x *= np.float32(scale)
    return out


def check_input_generator(backend: Backend) -> str:
    """Names the generator of the check inputs on ``backend``: the backend's own device
    generator where it has one (:meth:`Backend.check_input_generator`), else numpy's. A stored
    reference is only reused with the same generator."""
    return backend.check_input_generator() or f"numpy-{CHECK_INPUTS_VERSION}"


def _drawn_on_device(backend: Backend, graph: KernelGraph, seed: int) -> list[Any]:
    """The check inputs drawn by the backend on its device: input i from its own seed (a
    function of ``seed`` and i), in the graph's shapes and dtypes."""
    specs = []
    for i, t in enumerate(graph.inputs):
        child = int(np.random.SeedSequence([seed, i]).generate_state(1, np.uint64)[0] >> 1)
        specs.append((tuple(t.dims), t.dtype.name, check_scale(t.dims), child))
    return list(backend.draw_check_inputs(specs))


def to_backend_tensors(
    backend: Backend, arrays: Sequence[np.ndarray], dtypes: Sequence[str]
) -> list[Any]:
    """Put float32 numpy arrays on the backend's device in the graph's dtypes."""
    return list(backend.from_numpy(arrays, dtypes))


def rel_frobenius(actual: np.ndarray, expected: np.ndarray) -> float:
    """‖actual - expected‖ / ‖expected‖ (absolute when the reference is 0); NaN/inf → inf."""
    if actual.shape != expected.shape:
        return math.inf
    if not np.isfinite(actual).all() or not np.isfinite(expected).all():
        return math.inf
    denom = float(np.linalg.norm(expected))
    err = float(np.linalg.norm(actual - expected))
    return err / denom if denom > 0 else err


def tolerance_for(graph: KernelGraph) -> float:
    return max(TOLERANCES[t.dtype.name] for t in graph.outputs)


def _worst_error(outs: Sequence[Any], reference: Sequence[np.ndarray]) -> float:
    if len(outs) != len(reference):
        raise NumericCheckError(
            f"the kernel returned {len(outs)} outputs, the graph has {len(reference)}"
        )
    return max(rel_frobenius(to_numpy64(o), r) for o, r in zip(outs, reference, strict=True))


class Shapes:
    """How a graph's inputs and outputs map onto the equal-rank graph its kernels are built
    for (``KernelGraph.promote_ranks``): the two differ only by leading size-1 dims, so the
    caller's tensors are reshaped (views, never copies) on the way in and the outputs on the
    way out."""

    def __init__(self, graph: KernelGraph) -> None:
        self.world_size = graph.world_size
        self.kernel_graph = KernelGraph._wrap(graph._g.promote_ranks())
        self.user_in = [t.dims for t in graph.inputs]
        self.kernel_in = [t.dims for t in self.kernel_graph.inputs]
        self.user_out = [t.dims for t in graph.outputs]
        self.kernel_out = [t.dims for t in self.kernel_graph.outputs]
        self.identity = self.user_in == self.kernel_in and self.user_out == self.kernel_out

    def to_kernel(self, tensors: Sequence[Any]) -> list[Any]:
        """The caller's inputs (the graph's shapes, or already the kernel's) as the kernel's."""
        if self.identity or len(tensors) != len(self.user_in):
            return list(tensors)  # a wrong count: the launcher names what it takes
        out = []
        for i, (x, user, kernel) in enumerate(
            zip(tensors, self.user_in, self.kernel_in, strict=True)
        ):
            shape = tuple(getattr(x, "shape", ()))
            if user == kernel or shape == kernel:
                out.append(x)
            elif shape == user:
                out.append(x.reshape(kernel))  # leading 1s only: a view
            else:
                raise ShapeError(f"input {i} has shape {shape}; expected {user}")
        return out

    def to_user(self, outputs: Sequence[Any]) -> list[Any]:
        """The kernel's outputs in the graph's shapes."""
        if self.identity:
            return list(outputs)
        return [
            o if user == kernel else o.reshape(user)
            for o, user, kernel in zip(outputs, self.user_out, self.kernel_out, strict=True)
        ]


def check_arrays(graph: KernelGraph, shapes: Shapes, seed: int) -> list[Any]:
    """Fresh check inputs (:func:`check_inputs`) as numpy arrays in the kernel's shapes; for
    ``world_size`` N > 1 one such list per rank (rank r drawn from ``seed + r``)."""
    if shapes.world_size == 1:
        return shapes.to_kernel(check_inputs(graph, seed))
    return [shapes.to_kernel(check_inputs(graph, seed + r)) for r in range(shapes.world_size)]


def arrays_to_backend(
    backend: Backend, graph: KernelGraph, shapes: Shapes, arrays: list[Any]
) -> list[Any]:
    """:func:`check_arrays`' result as the backend's tensors (on the calling thread's
    device)."""
    dtypes = [t.dtype.name for t in graph.inputs]
    if shapes.world_size == 1:
        return to_backend_tensors(backend, arrays, dtypes)
    return [to_backend_tensors(backend, rank, dtypes) for rank in arrays]


def check_tensors(backend: Backend, graph: KernelGraph, shapes: Shapes, seed: int) -> list[Any]:
    """Fresh check inputs on the backend, in the kernel's shapes (per rank when
    ``world_size`` > 1, rank r from ``seed + r``): drawn on the device where the backend can
    (:meth:`Backend.draw_check_inputs`), else :func:`check_arrays` copied over."""
    if backend.check_input_generator() is None:
        return arrays_to_backend(backend, graph, shapes, check_arrays(graph, shapes, seed))
    ranks = [
        shapes.to_kernel(_drawn_on_device(backend, graph, seed + r))
        for r in range(shapes.world_size)
    ]
    return ranks[0] if shapes.world_size == 1 else ranks


def reference_outputs(graph: KernelGraph, shapes: Shapes, tensors: Sequence[Any]) -> list[Any]:
    """The float64 reference evaluator's outputs, in the kernel's shapes, for ``tensors``
    (as :func:`check_tensors` returns them: per rank when ``world_size`` > 1)."""
    ws = shapes.world_size
    if ws == 1:
        arrays = [to_numpy64(t).reshape(u) for t, u in zip(tensors, shapes.user_in, strict=True)]
        return [
            r.reshape(k) for r, k in zip(graph.evaluate(arrays), shapes.kernel_out, strict=True)
        ]
    stacked = [
        np.stack([to_numpy64(rank[i]).reshape(u) for rank in tensors])
        for i, u in enumerate(shapes.user_in)
    ]
    outs = graph.evaluate(stacked)
    return [
        [o[r].reshape(k) for o, k in zip(outs, shapes.kernel_out, strict=True)] for r in range(ws)
    ]


def run_check(
    shapes: Shapes,
    run: Callable[..., Sequence[Any]],
    tensors: Sequence[Any],
    reference: Sequence[Any],
) -> float:
    """Worst relative error of ``run`` (a launcher of the kernel's shapes) against the
    reference; a multi-device kernel runs every rank in this process (one thread per rank,
    all_reduce through ``yirage._collectives.SimulatedGroup``)."""
    if shapes.world_size == 1:
        return _worst_error(run(*tensors), reference)
    outs = _collectives.run_ranks(lambda r: list(run(*tensors[r])), shapes.world_size)
    return max(_worst_error(o, ref) for o, ref in zip(outs, reference, strict=True))


# -- the kernel --------------------------------------------------------------------------------


class OptimizedKernel:
    """A superoptimized kernel: call it with the graph's inputs (``k(*tensors)`` or
    ``k(inputs=[...])``) to get the list of outputs.

    A kernel of a multi-device graph (``world_size`` N > 1) is one rank's program: called
    normally, its all_reduce sums over the ranks of ``torch.distributed``'s default process
    group (initialised with world size N); :meth:`run_ranks` runs all N ranks in this
    process instead."""

    def __init__(
        self,
        *,
        graph: KernelGraph,
        backend: Backend,
        plan: Mapping[str, Any],
        source: Any,
        launcher: Any,
        report: SuperoptimizeReport,
    ) -> None:
        self._graph = graph
        self._backend = backend
        self._plan = dict(plan)
        self._source_obj = source
        self._launcher = launcher
        self._shapes = Shapes(graph)
        self.report = report

    # -- calling ---------------------------------------------------------------------------
    def __call__(self, *tensors: Any, inputs: Sequence[Any] | None = None) -> list[Any]:
        if inputs is not None:
            if tensors:
                raise TypeError("pass the inputs either positionally or as inputs=[...], not both")
            tensors = tuple(inputs)
        shapes = self._shapes
        if shapes.identity:
            return list(self._launcher(*tensors))
        return shapes.to_user(list(self._launcher(*shapes.to_kernel(tensors))))

    @property
    def world_size(self) -> int:
        """Number of ranks of the kernel's graph (1: a single device)."""
        return self._shapes.world_size

    def run_ranks(self, per_rank_inputs: Sequence[Sequence[Any]]) -> list[list[Any]]:
        """Run every rank of the kernel in this process: ``per_rank_inputs[r]`` are rank r's
        inputs (``world_size`` lists); returns each rank's outputs. The ranks run on one
        thread each and all_reduce sums their values at a barrier, in rank order (no
        ``torch.distributed`` needed)."""
        ws = self.world_size
        if isinstance(per_rank_inputs, (str, bytes)) or not isinstance(per_rank_inputs, Sequence):
            raise ShapeError(
                f"run_ranks() takes one list of inputs per rank ({ws} lists), got "
                f"{type(per_rank_inputs).__name__}"
            )
        if len(per_rank_inputs) != ws:
            raise ShapeError(
                f"run_ranks() takes one list of inputs per rank: the kernel runs on {ws} ranks, "
                f"got {len(per_rank_inputs)} lists"
            )
        return _collectives.run_ranks(lambda r: self(*per_rank_inputs[r]), ws)

    # -- inspection ------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self._backend.name

    @property
    def backend_object(self) -> Backend:
        return self._backend

    @property
    def source(self) -> str:
        """The generated source code (C for the CPU backend)."""
        code = getattr(self._source_obj, "code", None)
        return code if isinstance(code, str) else str(self._source_obj)

    @property
    def plan(self) -> dict[str, Any]:
        """The KernelPlan (docs/kernel-plan.md) of the chosen candidate."""
        return self._plan

    @property
    def graph(self) -> KernelGraph:
        return self._graph

    @property
    def launcher(self) -> Any:
        return self._launcher

    def __repr__(self) -> str:
        r = self.report
        t = f", {r.measured_us:.1f} µs" if r.measured_us is not None else ""
        return f"<OptimizedKernel on {self.backend}: {r.chosen_description}{t}>"

    # -- saving ----------------------------------------------------------------------------
    def _metadata(self) -> dict[str, Any]:
        from yirage import __version__, _core

        return {
            "format": SAVE_FORMAT,
            "version": SAVE_VERSION,
            "yirage_version": __version__,
            "core_version": _core.__version__,
            "backend": self.backend,
            "backend_version": self._backend.package_version,
            "plugin_api": list(self._backend.plugin_api),
            "plan_format": self._plan.get("format"),
            "plan_version": self._plan.get("version"),
            "graph_hash": self._graph.hash(),
            "world_size": self._graph.world_size,
            "source_sha256": hashlib.sha256(self.source.encode()).hexdigest(),
            "source_suffix": self._backend.source_suffix,
            "report": self.report.to_dict(),
        }

    def save(self, path: str | Path) -> Path:
        """Save to a directory, or to one JSON file when ``path`` has a file suffix."""
        p = Path(path)
        meta = self._metadata()
        if p.suffix:
            bundle = {
                **meta,
                "graph": json.loads(self._graph.to_json()),
                "plan": self._plan,
                "source": self.source,
            }
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(bundle, indent=1, sort_keys=True), encoding="utf-8")
            return p
        p.mkdir(parents=True, exist_ok=True)
        (p / "graph.json").write_text(self._graph.to_json(), encoding="utf-8")
        (p / "plan.json").write_text(
            json.dumps(self._plan, indent=1, sort_keys=True), encoding="utf-8"
        )
        (p / f"kernel{meta['source_suffix']}").write_text(self.source, encoding="utf-8")
        (p / "metadata.json").write_text(
            json.dumps(meta, indent=1, sort_keys=True), encoding="utf-8"
        )
        return p


def _read_saved(p: Path) -> tuple[dict[str, Any], str, dict[str, Any], str]:
    """(metadata, graph JSON, plan, source) of a saved kernel."""
    try:
        if p.is_dir():
            meta = json.loads((p / "metadata.json").read_text(encoding="utf-8"))
            graph_json = (p / "graph.json").read_text(encoding="utf-8")
            plan = json.loads((p / "plan.json").read_text(encoding="utf-8"))
            src_file = p / f"kernel{meta.get('source_suffix', '.txt')}"
            source = src_file.read_text(encoding="utf-8") if src_file.exists() else ""
        else:
            bundle = json.loads(p.read_text(encoding="utf-8"))
            graph_json = json.dumps(bundle.pop("graph"))
            plan = bundle.pop("plan")
            source = bundle.pop("source", "")
            meta = bundle
    except FileNotFoundError as exc:
        raise SerializationError(f"no saved yirage kernel at {p}: {exc}") from None
    except (OSError, KeyError, json.JSONDecodeError) as exc:
        raise SerializationError(f"{p} is not a readable saved yirage kernel: {exc}") from None
    if meta.get("format") != SAVE_FORMAT:
        raise SerializationError(f"{p}: format {meta.get('format')!r} is not {SAVE_FORMAT!r}")
    if meta.get("version") != SAVE_VERSION:
        raise SerializationError(
            f"{p}: saved-kernel version {meta.get('version')!r}; "
            f"this yirage reads version {SAVE_VERSION}"
        )
    return meta, graph_json, plan, source


def load_kernel(
    path: str | Path, *, backend: str | Backend | None = None, check: bool = True
) -> OptimizedKernel:
    """Load a kernel saved with :meth:`OptimizedKernel.save`.

    The source is regenerated from the saved plan by the backend's printer and compiled
    through the disk cache. Version differences (yirage, core, backend package) are recorded
    in ``report.notes``; a plan format the backend cannot print raises. With ``check`` the
    numbers are checked against the float64 reference evaluator on fresh random inputs."""
    import time

    from yirage import __version__, _core
    from yirage._superoptimize import resolve_backend

    t0 = time.perf_counter()
    p = Path(path)
    meta, graph_json, plan, saved_source = _read_saved(p)
    graph = KernelGraph.from_json(graph_json)
    if graph.hash() != meta.get("graph_hash"):
        raise SerializationError(
            f"{p}: the graph does not match its recorded hash (corrupt or edited file)"
        )
    be = resolve_backend(backend if backend is not None else str(meta["backend"]))
    report = SuperoptimizeReport.from_dict(meta.get("report", {}))
    notes = []
    for what, saved, now in (
        ("yirage", meta.get("yirage_version"), __version__),
        ("core", meta.get("core_version"), _core.__version__),
        (f"backend {be.name}", meta.get("backend_version"), be.package_version),
    ):
        if saved != now:
            notes.append(f"saved with {what} {saved}, loaded with {now}")
    if be.name != meta.get("backend"):
        notes.append(f"saved for backend {meta.get('backend')}, loaded on {be.name}")
    source = be.codegen(plan)
    code = getattr(source, "code", None)
    text = code if isinstance(code, str) else str(source)
    if saved_source and hashlib.sha256(text.encode()).hexdigest() != meta.get("source_sha256"):
        notes.append("the backend's printer regenerated different source from the saved plan")
    artifact = be.compile(source)
    launcher = be.load(artifact)
    if check:
        seed = int(np.random.SeedSequence().entropy % (2**63))  # type: ignore[operator]
        shapes = Shapes(graph)
        tensors = check_tensors(be, graph, shapes, seed)
        ref = reference_outputs(graph, shapes, tensors)
        err = run_check(shapes, launcher, tensors, ref)
        tol = tolerance_for(graph)
        if not err <= tol:
            raise NumericCheckError(
                f"the kernel loaded from {p} fails the numeric check on {be.name}: max relative "
                f"error {err:.3g} > {tol:g}"
            )
        report.max_rel_err = err
    for n in notes:
        _log.info("load_kernel(%s): %s", p, n)
    report.notes = [*report.notes, *notes, f"loaded from {p} in {time.perf_counter() - t0:.2f} s"]
    return OptimizedKernel(
        graph=graph, backend=be, plan=plan, source=source, launcher=launcher, report=report
    )
