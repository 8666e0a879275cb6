"""``OptimizedKernel``: what ``superoptimize`` returns — a callable kernel with its source,
plan, backend, chosen variant and report — plus saving and loading.

A saved kernel is either a directory (``graph.json``, ``plan.json``, ``kernel<suffix>``,
``metadata.json``) or, when the path has a file suffix, one JSON file holding the same
fields. Loading regenerates the source from the plan (the plan is vendor-neutral), compiles
it through the disk cache (a cache hit when nothing changed), takes the saved variant,
checks versions, and by default re-checks the numbers against the reference evaluator.

The kernel is built for the graph's equal-rank form (:class:`~yirage._shapes.Shapes`
reshapes the caller's tensors to it and the outputs back). Multi-device kernels
(``world_size`` > 1) sum over the ranks through ``yirage._collectives``.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from yirage import _capture, _collectives, _core, _env
from yirage._backend import Backend

# Names that lived here before the numeric check, the reports and Shapes got modules of their
# own (``_check``, ``_report``, ``_shapes``), still imported from here by older code.
from yirage._check import TOLERANCES as TOLERANCES
from yirage._check import check_inputs as check_inputs
from yirage._check import check_scale as check_scale
from yirage._check import (
    check_tensors,
    new_check_seed,
    reference_outputs,
    run_check,
    tolerance_for,
)
from yirage._check import rel_frobenius as rel_frobenius
from yirage._check import to_numpy32 as to_numpy32
from yirage._check import to_numpy64 as to_numpy64
from yirage._errors import NumericCheckError, SerializationError, ShapeError
from yirage._graph import KernelGraph
from yirage._logging import get_logger
from yirage._registry import resolve_backend
from yirage._report import CandidateReport as CandidateReport
from yirage._report import SuperoptimizeReport as SuperoptimizeReport
from yirage._shapes import Shapes as Shapes
from yirage._version import __version__

__all__ = [
    "NumericCheckError",
    "OptimizedKernel",
    "load_kernel",
]

SAVE_FORMAT = "yirage.optimized_kernel"
SAVE_VERSION = 1

_log = get_logger("yirage.kernel")


class OptimizedKernel:
    """A superoptimized kernel: call it with the graph's inputs (``k(*tensors)`` or
    ``k(inputs=[...])``) to get the list of outputs.

    On a GPU backend, repeated calls on the same input tensors replay device graphs of the
    call (captured at the second such call, split at collectives, which run from the host
    in between; see ``yirage._capture.RepeatGraphs``) and return fresh outputs;
    ``YIRAGE_DEVICE_GRAPHS=0`` launches every kernel from the host instead.

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
        device = backend.torch_device
        self._graphs = (
            _capture.RepeatGraphs(self._run, device, backend.name, graph.world_size)
            if device not in (None, "cpu") and _env.device_graphs()
            else None
        )

    # -- calling ---------------------------------------------------------------------------
    def __call__(self, *tensors: Any, inputs: Sequence[Any] | None = None) -> list[Any]:
        if inputs is not None:
            if tensors:
                raise TypeError("pass the inputs either positionally or as inputs=[...], not both")
            tensors = tuple(inputs)
        if self._graphs is not None:
            return self._graphs(tensors)
        return self._run(*tensors)

    def _run(self, *tensors: Any) -> list[Any]:
        """One call, every kernel launched from the host."""
        shapes = self._shapes
        if shapes.identity:
            return list(self._launcher(*tensors))
        return shapes.to_user(list(self._launcher(*shapes.to_kernel(tensors))))

    def capture(self, *tensors: Any) -> _capture.CapturedKernel:
        """This kernel's call on ``tensors`` captured into a device graph (GPU backends): the
        returned :class:`~yirage.CapturedKernel` replays every launch of the plan, collectives
        included, with one host call. ``captured()`` replays on ``tensors``;
        ``captured(*others)`` copies ``others`` into them first. The outputs it returns are
        the same tensors at every replay (clone what must outlive the next one). A
        multi-device kernel is captured in every rank, after ``torch.distributed`` is
        initialised (NCCL); release the captured kernel (``captured.release()`` or drop it)
        before ``torch.distributed.destroy_process_group()``, which waits while a graph
        holding a captured all_reduce lives."""
        return _capture.capture(self._run, tensors, self._backend.torch_device, self._backend.name)

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
        """The backend's launcher of the chosen variant (what calling the kernel runs)."""
        return self._launcher

    @property
    def variant(self) -> str | None:
        """The backend's name of the code path this kernel runs (:meth:`Backend.variants`)."""
        return self.report.chosen_variant

    def __repr__(self) -> str:
        r = self.report
        t = f", {r.measured_us:.1f} µs" if r.measured_us is not None else ""
        return f"<OptimizedKernel on {self.backend}: {r.chosen_description}{t}>"

    # -- saving ----------------------------------------------------------------------------
    def _metadata(self) -> dict[str, Any]:
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


def _saved_variant(be: Backend, loaded: Any, report: SuperoptimizeReport) -> tuple[Any, str]:
    """The launcher of the variant the kernel was saved with (``report.chosen_variant``), and
    a note when the backend no longer offers it and its first variant runs instead (the
    numeric check still judges that one)."""
    variants = be.variants(loaded)
    name = report.chosen_variant
    if name is not None and name in variants:
        return variants[name], ""
    first = next(iter(variants))
    if name is None:
        return variants[first], ""
    report.chosen_variant = first
    return variants[first], (
        f"saved with variant {name!r}, which backend {be.name} no longer offers "
        f"({', '.join(variants)}); runs variant {first!r}"
    )


def load_kernel(
    path: str | Path, *, backend: str | Backend | None = None, check: bool = True
) -> OptimizedKernel:
    """Load a kernel saved with :meth:`OptimizedKernel.save`.

    The source is regenerated from the saved plan by the backend's printer and compiled
    through the disk cache. Version differences (yirage, core, backend package) are recorded
    in ``report.notes``; a plan format the backend cannot print raises. With ``check`` the
    numbers are checked against the float64 reference evaluator on fresh random inputs."""
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
    launcher, variant_note = _saved_variant(be, be.load(be.compile(source)), report)
    if variant_note:
        notes.append(variant_note)
    if check:
        seed = new_check_seed()
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
