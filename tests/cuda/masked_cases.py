"""Masked edge-tile plans for the C-family printers' tests (CUDA C++ and Metal emulation).

The plans come from ``yr.search`` on a pinned DeviceSpec (the H100 one by default, which
offers power-of-two tiles over dims no tile divides: 300 columns in 19 blocks of 16, 47 rows
in 3 blocks of 16); each case has a float64 numpy reference of its workload. Vendor-neutral:
yirage, numpy and (for :func:`fenced_child`) torch only.

:func:`fenced_child` runs a plan's generated kernels with every buffer ending right before a
page the process may not touch (``mprotect(PROT_NONE)``): a load or store past a buffer's
extent kills the process with SIGSEGV, so callers run it in a child process.
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
import mmap
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

EPS = 1e-6
#: relative Frobenius error allowed per input dtype (kernels compute in fp32)
TOL = {"float32": 2e-5, "float16": 3e-3, "bfloat16": 2e-2}
DTYPES = ("float32", "float16", "bfloat16")


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _gated_ref(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    return _silu(x @ w1) * (x @ w2)


def _rms(x: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS)


def _rms_linear_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return _rms(x) @ w


def _attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = q @ k
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def _gated(dims: Sequence[int], dt: Any) -> Any:
    import yirage as yr

    m, k, n = dims
    g = yr.new_kernel_graph()
    x = g.new_input((m, k), dt)
    w1, w2 = g.new_input((k, n), dt), g.new_input((k, n), dt)
    g.mark_output(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2)))
    return g


def _rms_linear(dims: Sequence[int], dt: Any) -> Any:
    import yirage as yr

    m, k, n = dims
    g = yr.new_kernel_graph()
    x, w = g.new_input((m, k), dt), g.new_input((k, n), dt)
    g.mark_output(g.matmul(g.rms_norm(x, (k,), eps=EPS), w))
    return g


def _rms_norm(dims: Sequence[int], dt: Any) -> Any:
    import yirage as yr

    m, n = dims
    g = yr.new_kernel_graph()
    x = g.new_input((m, n), dt)
    g.mark_output(g.rms_norm(x, (n,), eps=EPS))
    return g


def _attention(dims: Sequence[int], dt: Any) -> Any:
    import yirage as yr

    b, m, d, n = dims
    g = yr.new_kernel_graph()
    q, k, v = g.new_input((b, m, d), dt), g.new_input((b, d, n), dt), g.new_input((b, n, d), dt)
    e = g.exp(g.matmul(q, k))
    g.mark_output(g.matmul(g.div(e, g.reduction(e, -1)), v))
    return g


@dataclass(frozen=True)
class MaskedCase:
    """A workload whose searched plans have masked edge tiles (``why`` says where)."""

    name: str
    dims: tuple[int, ...]
    build: Callable[[Sequence[int], Any], Any]
    shapes: Callable[[Sequence[int]], list[tuple[int, ...]]]
    reference: Callable[..., np.ndarray]
    config: str | None
    why: str

    def random_inputs(self, seed: int) -> list[np.ndarray]:
        """float32 inputs ~ N(0, 1/fan_in) for matrix-like inputs, N(0, 1) otherwise."""
        rng = np.random.default_rng(seed)
        out = []
        for dims in self.shapes(self.dims):
            std = 1.0 / math.sqrt(dims[-2]) if len(dims) >= 2 and dims[-2] >= 64 else 1.0
            out.append((rng.standard_normal(dims) * std).astype(np.float32))
        return out


def _mkn(d: Sequence[int]) -> list[tuple[int, ...]]:
    return [(d[0], d[1]), (d[1], d[2]), (d[1], d[2])]


CASES = [
    MaskedCase(
        "gated_mlp_8x200x300",
        (8, 200, 300),
        _gated,
        _mkn,
        _gated_ref,
        "mlp",
        "300 columns in blocks of 16 (the last owns 12); float32 rows take 16-byte loads",
    ),
    MaskedCase(
        "gated_mlp_8x96x257",
        (8, 96, 257),
        _gated,
        _mkn,
        _gated_ref,
        "mlp",
        "257 columns (odd): the last block owns 1 column, element loads only",
    ),
    MaskedCase(
        "gated_mlp_8x96x264",
        (8, 96, 264),
        _gated,
        _mkn,
        _gated_ref,
        "mlp",
        "264 columns: 16-bit rows are 16-byte aligned, so 16-byte loads cross into the edge",
    ),
    MaskedCase(
        "gated_mlp_47x64x96",
        (47, 64, 96),
        _gated,
        _mkn,
        _gated_ref,
        "mlp",
        "47 rows in blocks of 16: whole rows past the extent, 16-byte loads guarded by row",
    ),
    MaskedCase(
        "gated_mlp_200x64x300",
        (200, 64, 300),
        _gated,
        _mkn,
        _gated_ref,
        "mlp",
        "rows and columns both masked (200 in blocks of 16, 300 in blocks of 16)",
    ),
    MaskedCase(
        "rmsnorm_linear_47x64x96",
        (47, 64, 96),
        _rms_linear,
        lambda d: [(d[0], d[1]), (d[1], d[2])],
        _rms_linear_ref,
        None,
        "47 rows: the rms accumulator and its division over zero rows",
    ),
    MaskedCase(
        "rms_norm_300x64",
        (300, 64),
        _rms_norm,
        lambda d: [(d[0], d[1])],
        _rms,
        None,
        "300 rows in blocks of 16, the row statistic stored per row",
    ),
    MaskedCase(
        "attention_1x47x64x512",
        (1, 47, 64, 512),
        _attention,
        lambda d: [(d[0], d[1], d[2]), (d[0], d[2], d[3]), (d[0], d[3], d[2])],
        _attention_ref,
        None,
        "47 query rows: a safe-softmax group (running max) over zero rows",
    ),
]
BY_NAME = {c.name: c for c in CASES}


@functools.cache
def masked_plans(case: str, dtype: str, spec: str | None = None, limit: int = 2) -> list[str]:
    """The first ``limit`` non-baseline candidates with masked edge tiles that
    ``yr.search`` finds for ``case`` in ``dtype`` on ``spec`` (the pinned H100 by default),
    as plan JSON texts."""
    import yirage as yr
    from yirage.plan import parse_plan

    if spec is None:
        from _search_graphs import H100

        spec = H100
    c = BY_NAME[case]
    graph = c.build(c.dims, getattr(yr, dtype))
    r = yr.search(graph, device_spec=spec, config=c.config, top_k=6, cache=False)
    out = []
    for cand in r.candidates:
        if cand.baseline:
            continue
        plan = cand.kernel_plan().to_dict()
        if any(k.masked_accesses for k in parse_plan(plan).generated):
            out.append(json.dumps(plan))
    assert out, f"the search offers no masked candidate for {case} ({dtype})"
    return out[:limit]


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """Relative Frobenius error (inf for another shape or a non-finite value)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or not np.isfinite(a).all():
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def torch_inputs(case: str, dtype: str, seed: int = 4) -> tuple[list[Any], list[np.ndarray]]:
    """CPU torch inputs of ``case`` in ``dtype`` and their exact float64 values."""
    import torch

    xs = BY_NAME[case].random_inputs(seed)
    ts = [torch.from_numpy(x).to(getattr(torch, dtype)) for x in xs]
    return ts, [t.double().numpy() for t in ts]


def single_kernel_plans(case: str, dtype: str, spec: str | None = None) -> list[str]:
    """The masked plans of :func:`masked_plans` made of generated kernels only."""
    return [
        t
        for t in masked_plans(case, dtype, spec)
        if all(k["kind"] == "generated" for k in json.loads(t)["kernels"])
    ]


@dataclass(frozen=True)
class FencedRun:
    """What :func:`fenced_run` saw: the child's exit code (-11: SIGSEGV, a load or store past
    a buffer), its stderr tail and the output's error against the float64 reference."""

    code: int
    stderr: str
    err: float


def fenced_run(
    tmp: Path,
    printer: str,
    text: str,
    case: str,
    dtype: str,
    opt: str,
    mutations: Sequence[tuple[str, str]] = (),
) -> FencedRun:
    """Run plan ``text`` through :func:`fenced_child` in a child process."""
    import subprocess

    ts, xs = torch_inputs(case, dtype)
    plan_path, in_path, out_path = tmp / "plan.json", tmp / "in.npz", tmp / "out.npz"
    plan_path.write_text(text)
    np.savez(in_path, **{f"x{i}": t.float().numpy() for i, t in enumerate(ts)})
    out_path.unlink(missing_ok=True)
    args = [printer, str(plan_path), str(in_path), str(out_path), opt, json.dumps(mutations)]
    proc = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False
    )
    err = float("inf")
    if proc.returncode == 0:
        with np.load(out_path) as outs:
            err = rel_err(outs["y0"], BY_NAME[case].reference(*xs))
    return FencedRun(proc.returncode, proc.stderr[-3000:], err)


# -- fenced buffers (child process) ------------------------------------------------------------
_PROT_NONE = 0


def _fenced(numel: int, dtype: Any, keep: list[Any]) -> Any:
    """A torch tensor of ``numel`` elements whose last byte is followed by an inaccessible
    page (its start stays 16-byte aligned when its byte size is a multiple of 16)."""
    import torch

    esize = torch.empty((), dtype=dtype).element_size()
    nbytes = numel * esize
    pages = -(-nbytes // mmap.PAGESIZE)
    mm = mmap.mmap(-1, (pages + 1) * mmap.PAGESIZE)
    keep.append(mm)
    anchor = ctypes.c_char.from_buffer(mm)
    keep.append(anchor)
    fence = ctypes.addressof(anchor) + pages * mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mprotect(ctypes.c_void_p(fence), ctypes.c_size_t(mmap.PAGESIZE), _PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect of the fence page failed")
    return torch.frombuffer(mm, dtype=dtype, count=numel, offset=pages * mmap.PAGESIZE - nbytes)


def _params(k: Any) -> list[int]:
    """A generated kernel's buffers in the printers' parameter order (inputs, then outputs;
    masked plans have no shifted partials)."""
    assert all(a.shift_load is None for a in k.inputs)
    return list(dict.fromkeys(a.buffer for a in (*k.inputs, *k.outputs)))


def _mutated(src: Any, mutations: str) -> Any:
    """``src`` with each ``[old, new]`` pair of the JSON list ``mutations`` replaced (every
    ``old`` must occur)."""
    from dataclasses import replace

    text = src.text
    for old, new in json.loads(mutations):
        assert old in text, old
        text = text.replace(old, new)
    return replace(src, text=text)


def fenced_child(
    printer: str, plan_path: str, inputs_path: str, out_path: str, opt: str, mutations: str = "[]"
) -> None:
    """Print the plan (``printer``: "cuda" or "msl", ``opt``: "on"/"off" for mma.sync or
    SIMD-group matrices; ``mutations``: text replacements, see :func:`_mutated`), run its
    generated kernels in the emulator on fenced buffers (inputs from ``inputs_path``, outputs
    and intermediates NaN first) and save the outputs."""
    import torch

    from yirage.plan import GeneratedKernel, parse_plan

    plan = json.loads(Path(plan_path).read_text())
    p = parse_plan(plan)
    assert all(isinstance(k, GeneratedKernel) for k in p.kernels), "library kernels"
    keep: list[Any] = []
    tensors = {}
    for b in p.buffers:
        t = _fenced(b.numel, getattr(torch, b.dtype), keep)
        t.fill_(float("nan"))
        tensors[b.id] = t
    with np.load(inputs_path) as data:
        for b in p.inputs:
            tensors[b.id].copy_(torch.from_numpy(data[f"x{b.index}"]).reshape(-1))
    if printer == "cuda":
        from yirage_cuda._cuda_codegen import CudaCppOptions, generate_cuda
        from yirage_cuda._emulate import EmulatedCudaCpp

        csrc = generate_cuda(plan, CudaCppOptions(use_mma=opt == "on"))
        cu = EmulatedCudaCpp(_mutated(csrc, mutations))
        for k in p.generated:
            cu.launch_kernel(k.name, k.grid, *[tensors[b] for b in _params(k)])
    else:
        from yirage_mps._emulate import EmulatedMsl
        from yirage_mps._msl_codegen import MslOptions, generate_msl

        opts = MslOptions(threadgroup_memory=227 * 1024, use_simdgroup_matrix=opt == "on")
        src = generate_msl(plan, opts)
        mtl = EmulatedMsl(_mutated(src, mutations))
        for k in p.generated:
            assert src.params[k.name] == _params(k)
            mtl.launch_kernel(k.name, k.grid, [tensors[b] for b in _params(k)])
    outs = {f"y{b.index}": tensors[b.id].double().reshape(b.dims).numpy() for b in p.outputs}
    np.savez(out_path, **outs)


if __name__ == "__main__":
    fenced_child(*sys.argv[1:7])
