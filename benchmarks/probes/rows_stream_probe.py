"""How fast does a fused RMSNorm + Linear Triton kernel stream W at tens of rows, against
cuBLAS (``torch.mm``)? CUDA-graph replays with L2 flushed, medians. Forms (``norm``): 0 the
dot alone (no norm: the streaming ceiling of the tiling), 1 the sum of squares in the loop
(``dup=1``: A loaded twice, once for the dot and once for the squares, as the printer did
before codegen triton-21;
``dup=0``: one load shared), 2 the sum of squares in a loop of its own before the dot's,
3 the squares as the diagonal of ``A·Aᵀ`` accumulated by a second ``tl.dot`` on the same
tile (A never leaves the dot pipeline). Run 1 timed norm 1 only (its ``CONFIGS`` had dup 0
and 1 over more tilings), runs 2 and 3 norms 0-2, run 4 this list.
``python benchmarks/probes/rows_stream_probe.py``"""

import statistics
from collections.abc import Callable

import torch
import triton
import triton.language as tl

#: (M, K, N): a ragged shape, the 5120 one the bench wins, a 64-row and a one-row one.
SHAPES = [(24, 3000, 7000), (8, 5120, 5120), (64, 4096, 4096), (1, 4096, 11008)]
#: (BK, BN, stages, warps, dup, norm)
CONFIGS = [
    (128, 64, 3, 4, 1, 1),
    (128, 64, 3, 4, 0, 3),
    (128, 64, 4, 4, 0, 3),
    (64, 64, 6, 4, 0, 3),
    (256, 64, 3, 4, 0, 3),
    (128, 128, 4, 4, 0, 3),
    (128, 64, 3, 4, 0, 0),
    (128, 64, 3, 4, 0, 2),
    (128, 64, 5, 4, 0, 2),
    (64, 64, 6, 4, 0, 2),
    (256, 64, 3, 4, 0, 2),
    (128, 32, 4, 4, 0, 2),
    (128, 128, 4, 4, 0, 2),
    (64, 64, 6, 4, 0, 0),
    (256, 64, 3, 4, 0, 0),
]


@triton.jit
def rms_linear(
    x_ptr, w_ptr, y_ptr,
    M: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
    BM: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
    NUM_STAGES: tl.constexpr, DUP: tl.constexpr, MASKN: tl.constexpr, NORM: tl.constexpr,
):  # fmt: skip
    bx = tl.program_id(0)
    ss = tl.zeros([BM, 1], tl.float32)
    gram = tl.zeros([BM, BM], tl.float32)
    acc = tl.zeros([BM, BN], tl.float32)
    iters: tl.constexpr = K // BK
    rm = tl.arange(0, BM)
    rn = bx * BN + tl.arange(0, BN)
    row = (rm < M)[:, None]
    if NORM == 2:
        for it in tl.range(0, tl.cdiv(K, 256)):
            rk = it * 256 + tl.arange(0, 256)
            xs = tl.load(x_ptr + (rm * K)[:, None] + rk[None, :], row & (rk < K)[None, :], 0.0)
            xs = xs.to(tl.float32)
            ss = ss + tl.sum(xs * xs, axis=1, keep_dims=True)
    for it in tl.range(0, iters, num_stages=NUM_STAGES):
        rk = it * BK + tl.arange(0, BK)
        a = tl.load(x_ptr + (rm * K)[:, None] + rk[None, :], mask=row, other=0.0)
        if DUP:
            whole = (tl.arange(0, BK) < BK)[None, :]
            a2 = tl.load(x_ptr + (rm * K)[:, None] + rk[None, :], mask=row & whole, other=0.0)
        else:
            a2 = a
        if MASKN:
            b = tl.load(w_ptr + (rk * N)[:, None] + rn[None, :], (rn < N)[None, :], 0.0)
        else:
            b = tl.load(w_ptr + (rk * N)[:, None] + rn[None, :])
        if NORM == 1:
            af = a2.to(tl.float32)
            ss = ss + tl.sum(af * af, axis=1, keep_dims=True)
        if NORM == 3:
            gram = tl.dot(a, tl.trans(a), gram)
        acc = tl.dot(a, b, acc)
    if K % BK != 0:
        rk = iters * BK + tl.arange(0, BK)
        a = tl.load(x_ptr + (rm * K)[:, None] + rk[None, :], row & (rk < K)[None, :], 0.0)
        bmask = (rk < K)[:, None] & (rn < N)[None, :]
        b = tl.load(w_ptr + (rk * N)[:, None] + rn[None, :], bmask, 0.0)
        if NORM == 1:
            af = a.to(tl.float32)
            ss = ss + tl.sum(af * af, axis=1, keep_dims=True)
        if NORM == 3:
            gram = tl.dot(a, tl.trans(a), gram)
        acc = tl.dot(a, b, acc)
    if NORM == 3:
        ss = tl.sum(tl.where(rm[:, None] == rm[None, :], gram, 0.0), axis=1, keep_dims=True)
    if NORM == 0:
        ss = ss + K
    y = acc * (1.0 / tl.where(row, tl.sqrt(ss / K + 1e-06), 1.0))
    out = y_ptr + (rm * N)[:, None] + rn[None, :]
    tl.store(out, y.to(y_ptr.dtype.element_ty), mask=row & (rn < N)[None, :])


def graph_time(fn: Callable[[], object], reps: int = 50) -> float:
    """Median µs per call of ``fn`` over 15 replays of a graph of ``reps`` calls, L2 flushed."""
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    flush = torch.empty(512 * 1024 * 1024 // 4, device="cuda")
    ts = []
    for _ in range(15):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / reps)
    return statistics.median(ts)


def main() -> None:
    dt = torch.bfloat16
    for m, k, n in SHAPES:
        x = torch.randn(m, k, device="cuda", dtype=dt)
        w = torch.randn(k, n, device="cuda", dtype=dt) / k**0.5
        normed = torch.nn.functional.rms_norm(x.float(), (k,), eps=1e-6) @ w.float()
        refs = {1: normed, 2: normed, 3: normed, 0: x.float() @ w.float()}
        mb = k * n * 2 / 1e6
        t_mm = graph_time(lambda x=x, w=w: torch.mm(x, w))
        print(f"{m}x{k}x{n}: torch.mm {t_mm:.1f} us ({mb / t_mm:.2f} TB/s)", flush=True)
        for bk, bn, st, warps, dup, norm in CONFIGS:
            bm = max(16, triton.next_power_of_2(m))
            y = torch.empty(m, n, device="cuda", dtype=dt)
            grid = (triton.cdiv(n, bn),)
            args = (x, w, y, m, k, n, bm, bk, bn, st, dup, n % bn != 0, norm)

            def run(
                grid: tuple[int] = grid, args: tuple = args, w: int = warps, s: int = st
            ) -> None:
                rms_linear[grid](*args, num_warps=w, num_stages=s)

            label = f"norm{norm} BK{bk} BN{bn} st{st} w{warps} dup{dup} grid{grid[0]}"
            try:
                run()
                torch.cuda.synchronize()
                err = ((y.float() - refs[norm]).norm() / refs[norm].norm()).item()
                t = graph_time(run)
                print(f"   {label}: {t:.1f} us ({mb / t:.2f} TB/s) err {err:.1e}", flush=True)
            except Exception as e:  # a tiling this Triton cannot compile
                print(f"   {label}: failed {type(e).__name__}: {str(e)[:100]}")


if __name__ == "__main__":
    main()
