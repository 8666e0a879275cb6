"""Command-line interface: ``yirage doctor``, ``yirage demo``, ``yirage bench``, ``yirage
export`` (also ``python -m yirage``).

A YirageError ends the command with its message on stderr and exit status 1, without a
Python traceback (``YIRAGE_LOGS=DEBUG`` prints the traceback too): yirage's messages name the
fix, a traceback only buries it. A bad argument value is one line and exit status 2, Ctrl-C
one line and exit status 130 (128 + SIGINT, as shells report it). Any other exception is a
bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from yirage import _env, _registry
from yirage._backend import PLUGIN_API
from yirage._bench import add_bench_parser
from yirage._errors import YirageError
from yirage._logging import get_logger

#: Exit status of a command that ended with a YirageError.
EXIT_ERROR = 1
#: Exit status of a bad argument value (as argparse's usage errors).
EXIT_USAGE = 2
#: Exit status after Ctrl-C: 128 + SIGINT, what a shell reports for an interrupted command.
EXIT_INTERRUPTED = 130


def _versions() -> dict[str, str]:
    from yirage import _core
    from yirage._version import __version__

    return {
        "yirage": __version__,
        "core": _core.__version__,
        "plugin_api": f"{PLUGIN_API[0]}.{PLUGIN_API[1]}",
        "python": platform.python_version(),
        "platform": f"{platform.system()} {platform.machine()}",
    }


def _env_rows() -> list[dict[str, Any]]:
    """Every registered variable (backends register theirs when discovery imports them)."""
    return [
        {"name": v.name, "value": v.raw(), "default": v.default, "description": v.description}
        for v in _env.all_env_vars()
    ]


def _doctor_data() -> dict[str, Any]:
    infos = [_registry.get_backend_info(n).to_dict() for n in _registry._all_names()]
    error: str | None = None
    try:
        selected: Any = _registry.get_available_backends()
    except Exception as exc:  # YIRAGE_BACKENDS names a backend that is not usable
        error = str(exc)
        selected = f"error: {exc}"
    return {
        "versions": _versions(),
        "backends": infos,
        "selected_backends": selected,
        "selection_error": error,
        "cache_dir": str(_env.cache_dir()),
        "environment": _env_rows(),
    }


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _print_doctor(data: dict[str, Any]) -> None:
    v = data["versions"]
    print(f"yirage {v['yirage']} (core {v['core']}, plugin API {v['plugin_api']})")
    print(f"Python {v['python']} on {v['platform']}")
    print()
    print("Backends (best first):")
    for b in data["backends"]:
        print(f"  {b['name']}")
        print(f"    installed: {_yes(b['installed'])}   available: {_yes(b['available'])}")
        if not b["available"]:
            print(f"    why not:   {b['reason']}")
        elif b["reason"]:
            print(f"    probe:     {b['reason']}")
        if b["installed"]:
            api = ".".join(map(str, b["plugin_api"])) if b["plugin_api"] else "?"
            print(f"    package:   {b['package_version']} (plugin API {api})")
            level = b["verification_level"] or "?"
            codegen = "implemented" if b["codegen_implemented"] else "not implemented yet"
            print(f"    verified:  {level}; codegen: {codegen}")
        if b["hardware"]:
            print(f"    hardware:  {b['hardware']}")
        if b["toolchain"]:
            tools = ", ".join(f"{k} {val}" for k, val in sorted(b["toolchain"].items()))
            print(f"    toolchain: {tools}")
        spec = b["device_spec"]
        if spec:
            print(f"    device:    {_spec_summary(spec)}")
        if b["error"] and b["available"]:
            print(f"    error:     {b['error']}")
    print()
    selected = data["selected_backends"]
    shown = ", ".join(selected) if isinstance(selected, list) else selected
    print(f"Selected backends: {shown or '(none)'}")
    print(f"Cache dir: {data['cache_dir']}")
    print()
    print("Environment:")
    for row in data["environment"]:
        if row["value"] is not None:
            value = row["value"]
        elif row["default"] is not None:
            value = f"(unset; default {row['default']})"
        else:
            value = "(unset)"
        print(f"  {row['name']} = {value}")
        print(f"      {row['description']}")


def _spec_summary(spec: dict[str, Any]) -> str:
    from yirage._backend import DeviceSpec

    fields = dict(spec)
    for key in ("matrix_tile", "tiling", "isa_features"):
        if fields.get(key) is not None:
            fields[key] = tuple(fields[key])
    return DeviceSpec(**fields).summary()


def _cmd_doctor(args: argparse.Namespace) -> int:
    """Print the report; exit status 1 when a backend named in YIRAGE_BACKENDS is not
    usable (the run that relies on it would fail), 0 otherwise."""
    data = _doctor_data()
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        _print_doctor(data)
    if data["selection_error"] is not None:
        _error(f"YIRAGE_BACKENDS: {data['selection_error']}")
        return EXIT_ERROR
    return 0


def _error(message: str) -> None:
    print(f"yirage: error: {message}", file=sys.stderr)


def _cmd_demo(args: argparse.Namespace) -> int:
    from yirage._demo import run_demo
    from yirage._workloads import workload_names

    known = [*workload_names(), "all"]
    if args.workload not in known:
        _error(
            f"unknown workload {args.workload!r} for --workload: choose one of {', '.join(known)}"
        )
        return EXIT_USAGE
    run_demo(args.backend, workload=args.workload, json_output=args.json, rounds=args.rounds)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from yirage._graph import KernelGraph
    from yirage.export import export_kernels

    if (args.workload is None) == (args.graph is None):
        _error("give one of --workload NAME or --graph FILE.json (see yirage export --help)")
        return EXIT_USAGE
    graph: KernelGraph | str
    if args.graph is not None:
        try:
            text = Path(args.graph).read_text(encoding="utf-8")
        except OSError as exc:
            _error(f"cannot read --graph {args.graph}: {exc.strerror}")
            return EXIT_USAGE
        graph = KernelGraph.from_json(text)
    else:
        graph = args.workload
    result = export_kernels(
        graph,
        args.target,
        args.out,
        preset=args.preset,
        device=args.device,
        top_k=args.top_k,
        time_limit=args.time_limit,
        allow_spills=args.allow_spills,
    )
    if args.json:
        print(json.dumps(result.manifest, indent=1, sort_keys=True))
        return 0
    target = result.manifest["target"]
    print(f"exported to {result.out_dir} for {target['name']} ({target['description']})")
    for c in result.manifest["candidates"]:
        if "error" in c:
            print(f"  {c['candidate']}: refused: {c['error']}")
            continue
        kernels = ", ".join(
            f"{name} (LDS {k['shared']} B"
            + (f", {k['registers']['vgpr']} VGPRs" if "vgpr" in k["registers"] else "")
            + ")"
            for name, k in c["kernels"].items()
        )
        print(f"  {c['candidate']}: {c['label']}: {kernels or 'library kernels only'}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (the usage itself is one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        _error(f"{message} (see {self.prog} --help)")
        sys.exit(EXIT_USAGE)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="yirage", description="yirage: multi-backend tensor-program superoptimizer"
    )
    parser.add_argument("--version", action="store_true", help="print versions and exit")
    sub = parser.add_subparsers(dest="command")
    doctor = sub.add_parser(
        "doctor",
        help="show backends, probes, toolchains, verification levels, cache dir, environment",
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.set_defaults(func=_cmd_doctor)
    demo = sub.add_parser(
        "demo",
        help="superoptimize the bundled RMSNorm + Linear example on the best available backend "
        "and compare it with PyTorch eager",
    )
    demo.add_argument("--backend", default=None, help="backend name (default: the best available)")
    demo.add_argument(
        "--workload",
        default="rmsnorm_linear",
        help="a bundled workload (rmsnorm_linear, gated_mlp, lora, gqa_decode, qknorm_gqa) "
        "or 'all' (default: rmsnorm_linear)",
    )
    demo.add_argument(
        "--rounds", type=int, default=3, help="alternating timing rounds (default: 3)"
    )
    demo.add_argument("--json", action="store_true", help="machine-readable output")
    demo.set_defaults(func=_cmd_demo)
    export = sub.add_parser(
        "export",
        help="search a graph or bundled workload for a GPU target and write the sources and "
        "compiled code objects of its candidates to a directory (no GPU needed)",
    )
    export.add_argument(
        "--target",
        required=True,
        help="gfx942 (MI300X/MI325X), gfx90a (MI250X/MI210), gfx1100 (RX 7900 XTX), "
        "sm_90 (H100/H200) or sm_80 (A100)",
    )
    export.add_argument("--out", required=True, help="output directory")
    export.add_argument("--workload", default=None, help="a bundled workload (see yirage demo)")
    export.add_argument(
        "--graph", default=None, help="a KernelGraph as JSON (KernelGraph.to_json())"
    )
    export.add_argument("--preset", default="gpu", help="the workload's size preset (default: gpu)")
    export.add_argument(
        "--device", default=None, help="a table device of the target (default: the first)"
    )
    export.add_argument("--top-k", type=int, default=4, help="candidates to export (default: 4)")
    export.add_argument(
        "--time-limit", type=float, default=60, help="search time limit, s (default: 60)"
    )
    export.add_argument(
        "--allow-spills",
        action="store_true",
        help="export kernels that spill registers to scratch instead of refusing them",
    )
    export.add_argument("--json", action="store_true", help="print the manifest as JSON")
    export.set_defaults(func=_cmd_export)
    add_bench_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.version:
            for name, value in _versions().items():
                print(f"{name}: {value}")
            return 0
        if not hasattr(args, "func"):
            parser.print_help()
            return 2
        return int(args.func(args))
    except YirageError as exc:
        if get_logger().isEnabledFor(logging.DEBUG):
            traceback.print_exc()
        _error(f"{exc} ({type(exc).__name__}; YIRAGE_LOGS=DEBUG shows the traceback)")
        return EXIT_ERROR
    except KeyboardInterrupt:
        if get_logger().isEnabledFor(logging.DEBUG):
            traceback.print_exc()
        _error("interrupted (Ctrl-C)")
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
