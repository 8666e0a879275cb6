"""Ahead-of-time export: search a graph for a named GPU target and write the printed source and
the compiled code objects of the chosen candidates to a directory, without that GPU.

``export_kernels(graph, "gfx942", "out/")`` searches with the target's DeviceSpec (an
MI300X for gfx942; ``device=`` picks another table entry of the same architecture), prints
every candidate as the target's backend prints it (yirage-rocm for gfx942/gfx90a/gfx1100,
yirage-cuda for sm_80/sm_90) and compiles each kernel with ``triton.compile`` for that target
(hsaco / cubin). ``yirage export`` is the command line. The directory gets per candidate
``c<i>.py`` (the Triton module, with its torch launch glue), ``c<i>.plan.json`` (its
KernelPlan), per kernel the code object and its assembly, and ``manifest.json``: target,
device, versions and, per candidate, its label, predicted time, files and each kernel's
registers, LDS, warps, stages and matrix instructions. A candidate that does not fit the
target (LDS, register spills) is listed with the error that names the limit, not written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from yirage._backend import DeviceSpec
from yirage._errors import BackendError, ConfigError, YirageError
from yirage._graph import KernelGraph
from yirage._registry import _get_backend
from yirage._search import DEFAULT_TOP_K, search
from yirage._version import __version__

__all__ = ["ExportResult", "export_kernels"]

#: The manifest's format name and version.
MANIFEST_FORMAT = "yirage-export"
MANIFEST_VERSION = 1


@dataclass
class ExportResult:
    """What :func:`export_kernels` wrote: the directory, the manifest (also in
    ``manifest.json``) and the candidates refused for the target, by label, with the reason."""

    out_dir: Path
    manifest: dict[str, Any]
    rejected: dict[str, str] = field(default_factory=dict)

    @property
    def exported(self) -> list[dict[str, Any]]:
        return [c for c in self.manifest["candidates"] if "error" not in c]


def _triton_layer() -> Any:
    try:
        import yirage_triton
    except ImportError as exc:
        raise ConfigError(
            "ahead-of-time export needs the Triton layer: pip install 'yirage[rocm]' "
            "(AMD targets) or 'yirage[cuda]' (NVIDIA targets)"
        ) from exc
    return yirage_triton


def _resolve_graph(graph: KernelGraph | str, preset: str) -> tuple[KernelGraph, str | None, str]:
    """(graph, search preset, description) of a graph or a bundled workload's name."""
    if isinstance(graph, KernelGraph):
        return graph, None, "graph"
    if not isinstance(graph, str):
        raise TypeError(
            f"export_kernels takes a yirage.KernelGraph or a workload name, "
            f"got {type(graph).__name__}"
        )
    from yirage._workloads import get_workload, workload_names

    if graph not in workload_names():
        raise ConfigError(
            f"unknown workload {graph!r}; choose one of {', '.join(workload_names())}"
        )
    wl = get_workload(graph)
    try:
        g = wl.graph(preset)
    except KeyError as exc:
        raise ConfigError(str(exc.args[0])) from None
    return g, wl.search_config, f"workload {graph} ({preset})"


def _device(backend: Any, arch: str, device: str | None) -> tuple[str, DeviceSpec]:
    """The backend's table entry for ``device``, else its first entry of ``arch``."""
    known: dict[str, DeviceSpec] = dict(backend.known_devices())
    if device is not None:
        spec = known.get(device)
        if spec is None or spec.arch != arch:
            fits = [n for n, s in known.items() if s.arch == arch]
            raise ConfigError(
                f"device {device!r} is not a {arch} device of the {backend.name} backend; "
                f"choose one of {', '.join(fits) or '(none)'}"
            )
        return device, spec
    for name, spec in known.items():
        if spec.arch == arch:
            return name, spec
    raise ConfigError(f"the {backend.name} backend has no DeviceSpec for {arch}")


def export_kernels(
    graph: KernelGraph | str,
    target: str,
    out_dir: str | Path,
    *,
    preset: str = "gpu",
    device: str | None = None,
    top_k: int = DEFAULT_TOP_K,
    time_limit: float | None = 60,
    allow_spills: bool = False,
    cache: bool = True,
) -> ExportResult:
    """Search ``graph`` (a KernelGraph, or a bundled workload's name at ``preset``'s sizes)
    for ``target`` ("gfx942", "gfx90a", "gfx1100", "sm_90", "sm_80"), compile its ``top_k``
    candidates for it and write them to ``out_dir`` (see the module doc). ConfigError for an
    unknown target (listing the known ones), workload or device; ToolchainError when the
    installed Triton is too old for the target (naming the version needed); BackendError
    when no candidate fits the target."""
    yt = _triton_layer()
    t = yt.aot_target(target)
    yt.require_triton(t)
    backend = _get_backend(t.vendor)
    if not hasattr(backend, "export_options"):
        raise ConfigError(
            f"the installed {t.vendor} backend ({backend.package_version}) cannot export; "
            f"upgrade it (pip install -U 'yirage[{t.vendor}]')"
        )
    g, config, what = _resolve_graph(graph, preset)
    device_name, spec = _device(backend, str(t.name), device)
    result = search(
        g,
        backend=t.vendor,
        config=config,
        device_spec=spec,
        time_limit=time_limit,
        top_k=top_k,
        deterministic=True,
        cache=cache,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    options = backend.export_options(spec)
    entries: list[dict[str, Any]] = []
    rejected: dict[str, str] = {}
    for i, cand in enumerate(result.candidates):
        head = {
            "label": cand.label,
            "baseline": cand.baseline,
            "predicted_us": cand.predicted_us,
        }
        try:
            entry = yt.export_plan(
                cand.kernel_plan(),
                t,
                options,
                out,
                candidate=f"c{i}",
                allow_spills=allow_spills,
            )
        except YirageError as exc:  # a candidate the target cannot hold: listed, not written
            rejected[cand.label] = str(exc)
            entries.append({**head, "candidate": f"c{i}", "error": str(exc)})
            continue
        entries.append({**head, **entry})
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "target": {
            "name": t.name,
            "triton_backend": t.backend,
            "arch": t.arch,
            "warp_size": t.warp_size,
            "description": t.description,
            "binary": t.binary,
            "lds_bytes": t.lds_bytes,
        },
        "device": {"table_name": device_name, **spec.to_dict()},
        "source": what,
        "graph_hash": g.hash(),
        "versions": {"yirage": __version__, **yt.triton_versions()},
        "candidates": entries,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    res = ExportResult(out, manifest, rejected)
    if not res.exported:
        raise BackendError(
            f"no candidate of the {what} fits {t.label}: "
            + "; ".join(f"{k}: {v}" for k, v in rejected.items())
        )
    return res
