"""Test helpers: build KernelPlans (docs/kernel-plan.md) by hand and run them in float64.

``PlanBuilder`` writes version-3 plan JSON with the shape rules of the µGraph IR and the
lowering's decisions where a test does not state them: an op whose phase is not given is
``pre`` when it is loop-invariant (a load without an ``iter`` offset, an op of ``pre`` values)
and ``loop`` otherwise; a loop matmul read only by an ``iter`` accumulator of its dims adds into
it (``accumulate_into``); a safe-softmax group rescales its accumulators with degree 1 unless
the test names the degrees (none when the exp is ``pre``); ``loop_split`` is 1. Tests run what it
builds with the shared float64 plan interpreter (``_plan_ref.run_plan``, exact math without
the safe-softmax shift inside a kernel, so it checks the printer's running-max rewrite too).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

#: Hand-written plan fixtures.
PLANS = Path(__file__).parent / "plans"


def off(*terms: tuple[str, int]) -> list[dict[str, Any]]:
    """Offset terms of one dim, e.g. ``off(("iter", 32), ("bx", 64))``."""
    return [{"var": v, "stride": s} for v, s in terms]


class KernelBuilder:
    def __init__(
        self, plan: PlanBuilder, name: str, grid: tuple[int, int, int], forloop_range: int
    ) -> None:
        self.plan = plan
        self.k: dict[str, Any] = {
            "kind": "generated",
            "name": name,
            "grid": list(grid),
            "block_threads": 128,
            "warps": 4,
            "forloop_range": forloop_range,
            "inputs": [],
            "ops": [],
            "outputs": [],
            "safe_softmax": [],
            "smem_bytes": 0,
            "loop_split": 1,
        }
        self.dims: dict[int, list[int]] = {}
        self.fuse = True  # mark matmuls that add straight into their accumulator

    def _phase(self, op: dict[str, Any]) -> str:
        """The lowering's phase of an op whose test gives none: ``pre`` if loop-invariant."""
        if op["op"] == "input":
            walks = any(
                t["var"] == "iter" for d in self.k["inputs"][op["input"]]["offsets"] for t in d
            )
            return "loop" if walks else "pre"
        pre = all(self.k["ops"][a]["phase"] == "pre" for a in op["args"])
        return "pre" if pre else "loop"

    def _add(self, op: dict[str, Any], dims: list[int], phase: str | None) -> int:
        oid = len(self.k["ops"])
        op = {"id": oid, **op, "dims": list(dims)}
        op["phase"] = phase if phase is not None else self._phase(op)
        self.k["ops"].append(op)
        self.dims[oid] = list(dims)
        return oid

    def input(
        self,
        buffer: int,
        tile: list[int],
        offsets: list[list[dict[str, Any]]],
        phase: str | None = None,
        shift: tuple[int, int] | None = None,
    ) -> int:
        """A tile load; ``shift=(max buffer, width)`` reads a partial stored shifted, whose
        maxima lie at the same offsets of the max buffer, one column per ``width``."""
        bdims = self.plan.buffers[buffer]["dims"]
        entry: dict[str, Any] = {
            "buffer": buffer,
            "dims": list(bdims),
            "tile": list(tile),
            "offsets": offsets,
        }
        if shift is not None:
            m_buf, width = shift
            last = [{"var": t["var"], "stride": t["stride"] // width} for t in offsets[-1]]
            entry["shift_load"] = {
                "buffer": m_buf,
                "tile": [*tile[:-1], tile[-1] // width],
                "offsets": [*offsets[:-1], last],
                "width": width,
            }
        self.k["inputs"].append(entry)
        return self._add({"op": "input", "input": len(self.k["inputs"]) - 1}, tile, phase)

    def matmul(self, a: int, b: int, phase: str | None = None) -> int:
        da, db = self.dims[a], self.dims[b]
        return self._add({"op": "matmul", "args": [a, b]}, [*da[:-1], db[-1]], phase)

    def unary(
        self, name: str, x: int, params: list[float] | None = None, phase: str | None = None
    ) -> int:
        return self._add(
            {"op": "unary", "unop": name, "params": list(params or []), "args": [x]},
            self.dims[x],
            phase,
        )

    def binary(self, name: str, a: int, b: int, phase: str | None = None) -> int:
        dims = [max(p, q) for p, q in zip(self.dims[a], self.dims[b], strict=True)]
        return self._add({"op": "binary", "binop": name, "args": [a, b]}, dims, phase)

    def reduction(self, x: int, dim: int, phase: str | None = None) -> int:
        dims = list(self.dims[x])
        dims[dim] = 1
        return self._add({"op": "reduction", "dim": dim, "args": [x]}, dims, phase)

    def reduction_to_dimx(self, x: int, dim: int, dimx: int, phase: str | None = None) -> int:
        dims = list(self.dims[x])
        dims[dim] = dimx
        return self._add(
            {"op": "reduction_to_dimx", "dim": dim, "dimx": dimx, "args": [x]}, dims, phase
        )

    def rms_norm(self, x: int, eps: float = 1e-6, phase: str | None = None) -> int:
        return self._add({"op": "rms_norm", "eps": eps, "args": [x]}, self.dims[x], phase)

    def concat(self, xs: list[int], dim: int, phase: str | None = None) -> int:
        dims = list(self.dims[xs[0]])
        dims[dim] = sum(self.dims[x][dim] for x in xs)
        return self._add({"op": "concat", "dim": dim, "args": list(xs)}, dims, phase)

    def accum(
        self,
        x: int,
        acc: str = "iter",
        *,
        eps: float = 0.0,
        extent: int | None = None,
        dimx: int | None = None,
    ) -> int:
        dims = list(self.dims[x])
        extra: dict[str, Any] = {}
        if acc in ("sum", "rms"):
            dims[-1] = 1
        if acc == "rms":
            extra["eps"] = eps
            extra["extent"] = (
                extent if extent is not None else self.dims[x][-1] * self.k["forloop_range"]
            )
        if acc == "sum_todimx":
            assert dimx is not None
            dims[-1] = dimx
            extra["dimx"] = dimx
        return self._add({"op": "accum", "acc": acc, "args": [x], **extra}, dims, "accum")

    def epi_unary(self, name: str, x: int, params: list[float] | None = None) -> int:
        return self.unary(name, x, params, phase="epilogue")

    def epi_binary(self, name: str, a: int, b: int) -> int:
        return self.binary(name, a, b, phase="epilogue")

    def output(self, buffer: int, src: int, offsets: list[list[dict[str, Any]]]) -> int:
        self.k["outputs"].append(
            {"buffer": buffer, "src": src, "tile": list(self.dims[src]), "offsets": offsets}
        )
        return len(self.k["outputs"]) - 1

    def safe_softmax(
        self,
        exp: int,
        accums: list[int],
        scale_outputs: list[int] | None = None,
        shift_store: tuple[int, list[list[dict[str, Any]]]] | None = None,
        degrees: dict[int, int] | None = None,
    ) -> None:
        """A group; ``shift_store=(max buffer, offsets)`` stores its running max (tile: the
        rows of the exp's argument), which ``scale_outputs`` need; ``degrees``: the rescale
        degree of each accumulator (default 1 each; 0 leaves one out)."""
        deg = {a: 1 for a in accums} if degrees is None else degrees
        hoisted = self.k["ops"][exp]["phase"] == "pre"
        group: dict[str, Any] = {
            "exp": exp,
            "accums": accums,
            "scale_outputs": list(scale_outputs or []),
            "rescale": [
                {"accum": a, "degree": deg[a]} for a in accums if deg.get(a) and not hoisted
            ],
        }
        if shift_store is not None:
            arg = self.k["ops"][exp]["args"][0]
            group["shift_store"] = {
                "buffer": shift_store[0],
                "tile": [*self.dims[arg][:-1], 1],
                "offsets": shift_store[1],
            }
        self.k["safe_softmax"].append(group)

    def shift_carry(self, inputs: list[int], accums: list[int]) -> None:
        self.k["shift_carry"] = {"inputs": inputs, "accums": accums}

    def finish(self) -> dict[str, Any]:
        """The kernel, its loop matmuls read only by an ``iter`` accumulator of their dims
        marked ``accumulate_into`` (unless ``fuse`` is off)."""
        ops = self.k["ops"]
        stored = {o["src"] for o in self.k["outputs"]}
        for m in ops:
            m.pop("accumulate_into", None)
            if not self.fuse or m["op"] != "matmul" or m["phase"] != "loop" or m["id"] in stored:
                continue
            readers = [o for o in ops if m["id"] in o.get("args", [])]
            if len(readers) == 1:
                acc = readers[0]
                if acc["op"] == "accum" and acc["acc"] == "iter" and acc["dims"] == m["dims"]:
                    m["accumulate_into"] = acc["id"]
        return self.k


class PlanBuilder:
    def __init__(self) -> None:
        self.buffers: list[dict[str, Any]] = []
        self.kernels: list[Any] = []
        self._n_in = 0
        self._n_out = 0

    def input(self, dims: list[int], dtype: str = "float32") -> int:
        self.buffers.append(
            {
                "id": len(self.buffers),
                "dims": list(dims),
                "dtype": dtype,
                "role": "input",
                "index": self._n_in,
            }
        )
        self._n_in += 1
        return len(self.buffers) - 1

    def output(self, dims: list[int], dtype: str = "float32") -> int:
        self.buffers.append(
            {
                "id": len(self.buffers),
                "dims": list(dims),
                "dtype": dtype,
                "role": "output",
                "index": self._n_out,
            }
        )
        self._n_out += 1
        return len(self.buffers) - 1

    def intermediate(self, dims: list[int]) -> int:
        self.buffers.append(
            {
                "id": len(self.buffers),
                "dims": list(dims),
                "dtype": "float32",
                "role": "intermediate",
            }
        )
        return len(self.buffers) - 1

    def kernel(
        self, name: str, grid: tuple[int, int, int] = (1, 1, 1), forloop_range: int = 1
    ) -> KernelBuilder:
        kb = KernelBuilder(self, name, grid, forloop_range)
        self.kernels.append(kb)
        return kb

    def library(
        self, op: str, inputs: list[int], outputs: list[int], params: dict[str, Any] | None = None
    ) -> None:
        self.kernels.append(
            {
                "kind": "library",
                "op": op,
                "inputs": inputs,
                "outputs": outputs,
                "params": params or {},
            }
        )

    def build(self) -> dict[str, Any]:
        return {
            "format": "yirage.kernel_plan",
            "version": 3,
            "graph_hash": "test",
            "buffers": self.buffers,
            "kernels": [k.finish() if isinstance(k, KernelBuilder) else k for k in self.kernels],
        }


def x86_compiler() -> Any:
    """The host C compiler when it targets x86-64 (the test is skipped otherwise)."""
    from yirage_cpu import _toolchain

    try:
        cc = _toolchain.find_compiler()
        machine = subprocess.run(
            [*cc.command, "-dumpmachine"], capture_output=True, text=True, timeout=30
        ).stdout
    except Exception as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"no C compiler: {exc}")
    if not machine.startswith(("x86_64", "amd64")):
        pytest.skip(f"the compiler targets {machine.strip()}, not x86-64")
    return cc


def x86_assembly(tmp_path: Path, code: str, flags: tuple[str, ...]) -> str:
    """``code`` (printed C) compiled to x86-64 assembly with the printer's flags plus
    ``flags`` (an ISA level); skipped where the compiler cannot target that level."""
    cc = x86_compiler()
    src = tmp_path / "k.c"
    src.write_text(code)
    out = tmp_path / "k.s"
    base = ("-O3", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math", "-fopenmp", "-S")
    proc = subprocess.run(
        [*cc.command, *base, *flags, str(src), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        pytest.skip(f"{cc.describe()} cannot target {flags}: {proc.stderr[:200]}")
    return out.read_text()


#: C that counts every ``YR_PREFETCH`` address inside or outside ``[yr_t_lo, yr_t_hi)``
#: instead of issuing it (prepended to a printed kernel by :func:`recording_launcher`).
_PREFETCH_RECORDER = r"""#include <stdint.h>
/* test only: every prefetch address is counted inside or outside [yr_t_lo, yr_t_hi) */
uintptr_t yr_t_lo = 0, yr_t_hi = 0;
long yr_t_in = 0, yr_t_out = 0;
void yr_t_pf(const void *p);
void yr_t_pf(const void *p) {
    const uintptr_t a = (uintptr_t)p;
    __atomic_fetch_add(a >= yr_t_lo && a < yr_t_hi ? &yr_t_in : &yr_t_out, 1, __ATOMIC_RELAXED);
}
#define YR_PREFETCH(p) yr_t_pf(p)
"""


def recording_launcher(src: Any, simd_bits: int, name: str) -> Any:
    """A launcher of printed ``src`` (a ``CpuSource``) whose prefetches are counted instead
    of issued; set the counted range with :func:`count_prefetches_in`."""
    import dataclasses

    from yirage_cpu import _runtime, _toolchain

    src = dataclasses.replace(src, code=_PREFETCH_RECORDER + src.code)
    lib = _toolchain.compile_shared(src.code, simd_width_bits=simd_bits, name=name)
    return _runtime.CpuLauncher(src, lib)


def count_prefetches_in(launcher: Any, buffer: Any) -> None:
    """Count the prefetches of ``launcher`` (from :func:`recording_launcher`) against the
    bytes of torch tensor ``buffer``."""
    import ctypes

    dll = launcher._dll
    ctypes.c_size_t.in_dll(dll, "yr_t_lo").value = buffer.data_ptr()
    ctypes.c_size_t.in_dll(dll, "yr_t_hi").value = (
        buffer.data_ptr() + buffer.numel() * buffer.element_size()
    )


def prefetch_counts(launcher: Any) -> tuple[int, int]:
    """(prefetches inside the counted range, outside it) so far."""
    import ctypes

    dll = launcher._dll
    return ctypes.c_long.in_dll(dll, "yr_t_in").value, ctypes.c_long.in_dll(dll, "yr_t_out").value
