"""Diagnostics: how fast can a hand-written Triton kernel stream the weight-bound workloads
(RMSNorm + Linear, gated MLP at b=16) on this GPU? Times hand-written kernels over tile
sizes, pipeline depths, warps and load paths (pointer loads or TMA descriptors), next to a
read-only kernel with the same tiling (the ceiling of that tiling) and torch's copy.

    python benchmarks/probes/gemv_probe.py --bn 32 64 128 --bk 128 256 512 --stages 2 3 4 5

Tells whether a printing the search could reach meets the bench targets. Needs a CUDA
GPU, torch and triton; CUDA-graph replay medians as in the benchmark report.
"""

from __future__ import annotations

import argparse
import itertools

import torch
import triton
import triton.language as tl

from yirage._bench._timing import cuda_graph_median

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older Triton: no host-side descriptors
    TensorDescriptor = None


@triton.jit
def _prefetch_l2(ptrs):
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; // dummy $0",
        "=r,l",
        [ptrs],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _gemv(
    x, w1, w2, o, w1d, w2d,
    M: tl.constexpr, K: tl.constexpr, N: tl.constexpr, BN: tl.constexpr, VALID: tl.constexpr,
    BK: tl.constexpr, STAGES: tl.constexpr, MODE: tl.constexpr, TMA: tl.constexpr,
    PDL: tl.constexpr, PF: tl.constexpr,
):  # fmt: skip
    # MODE 0: rms_norm(x) @ w1; 1: silu(x @ w1) * (x @ w2); 2: read w1 only (sum)
    # PDL (programmatic dependent launch) 0: off; 1: wait, then let the next grid launch;
    # 2: the same, the next grid launched after the loop; PF > 0: first prefetch this block's
    # first PF rows of W into L2 (before the wait: a prefetch returns no data, so it is
    # harmless whatever the grid before writes)
    pid = tl.program_id(0)
    if PF > 0:
        pr = tl.arange(0, PF)
        pc = pid * VALID + tl.arange(0, 2) * (VALID - 1)  # first and last column: both lines
        _prefetch_l2(w1 + pr[:, None] * N + pc[None, :])
        if MODE == 1:
            _prefetch_l2(w2 + pr[:, None] * N + pc[None, :])
    if PDL > 0:
        tl.extra.cuda.gdc_wait()
    if PDL == 1:
        tl.extra.cuda.gdc_launch_dependents()
    cols = pid * VALID + tl.arange(0, BN)
    cmask = (tl.arange(0, BN) < VALID)[None, :]
    rows = tl.arange(0, M)
    acc1 = tl.zeros([M, BN], tl.float32)
    acc2 = tl.zeros([M, BN], tl.float32)
    ss = tl.zeros([M, 1], tl.float32)
    tot = tl.zeros([BN], tl.float32)
    for k in tl.range(0, K, BK, num_stages=STAGES):
        ks = k + tl.arange(0, BK)
        if TMA:
            t1 = w1d.load([k, pid * VALID])
        else:
            t1 = tl.load(w1 + ks[:, None] * N + cols[None, :], mask=cmask, other=0.0)
        if MODE == 2:
            tot += tl.sum(t1.to(tl.float32), axis=0)
        else:
            xt = tl.load(x + rows[:, None] * K + ks[None, :])
            acc1 = tl.dot(xt, t1, acc1)
            if MODE == 0:
                xe = tl.load(
                    x + rows[:, None] * K + ks[None, :],
                    mask=(tl.arange(0, BK) < BK)[None, :],
                    other=0.0,
                ).to(tl.float32)
                ss += tl.sum(xe * xe, axis=1, keep_dims=True)
            if MODE == 1:
                if TMA:
                    t2 = w2d.load([k, pid * VALID])
                else:
                    t2 = tl.load(w2 + ks[:, None] * N + cols[None, :], mask=cmask, other=0.0)
                acc2 = tl.dot(xt, t2, acc2)
    if PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()
    optr = o + rows[:, None] * N + cols[None, :]
    if MODE == 0:
        res = acc1 / tl.sqrt(ss / K + 1e-6)
    elif MODE == 1:
        res = acc1 * tl.sigmoid(acc1) * acc2
    else:
        res = tl.broadcast_to(tot[None, :], [M, BN])
    tl.store(optr, res.to(tl.float16), mask=cmask)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=["rms", "mlp", "read"])
    ap.add_argument("--bn", type=int, nargs="+", default=[32, 48, 64, 128], help="48: 64 masked")
    ap.add_argument("--bk", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3, 4, 5])
    ap.add_argument("--warps", type=int, nargs="+", default=[4])
    ap.add_argument("--tma", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--pdl", type=int, nargs="+", default=[0], help="see the kernel")
    ap.add_argument("--pf", type=int, nargs="+", default=[0], help="rows of W prefetched")
    a = ap.parse_args()
    dev = torch.device("cuda")
    m, kk = 16, 4096
    print(f"gemv probe on {torch.cuda.get_device_name()}", flush=True)
    for nbytes in (50_331_648, 1 << 30):
        src = torch.empty(nbytes // 2, dtype=torch.float16, device=dev)
        dst = torch.empty_like(src)
        us = cuda_graph_median(lambda s=src, d=dst: d.copy_(s), launches=5, replays=20).median_us
        print(f"torch copy {nbytes / 1e6:.0f} MB: {us:.1f} µs, {2 * nbytes / us / 1e6:.2f} TB/s")
        del src, dst
    torch.manual_seed(0)
    for mode in a.modes:
        n = 4096 if mode == "mlp" else 6144
        x = torch.randn(m, kk, device=dev, dtype=torch.float16)
        w1 = torch.randn(kk, n, device=dev, dtype=torch.float16) / 64
        w2 = torch.randn(kk, n, device=dev, dtype=torch.float16) / 64
        o = torch.empty(m, n, device=dev, dtype=torch.float16)
        xf, w1f, w2f = x.double(), w1.double(), w2.double()
        if mode == "rms":
            ref = (xf / torch.sqrt((xf * xf).mean(-1, keepdim=True) + 1e-6)) @ w1f
        elif mode == "mlp":
            ref = torch.nn.functional.silu(xf @ w1f) * (xf @ w2f)
        else:
            ref = w1f.sum(0, keepdim=True).expand(m, n)
        code = {"rms": 0, "mlp": 1, "read": 2}[mode]
        nbytes = w1.numel() * 2 * (2 if mode == "mlp" else 1)
        print(f"== {mode}: {nbytes / 1e6:.1f} MB of weights, roofline at 3.0 TB/s "
              f"{nbytes / 3.0e6:.1f} µs", flush=True)  # fmt: skip
        best: dict[tuple[int, int, int], tuple[float, str]] = {}
        combos = itertools.product(a.bn, a.bk, a.stages, a.warps, a.tma, a.pdl, a.pf)
        for bn, bk, st, wp, tma, pdl, pf in combos:
            if tma and TensorDescriptor is None:
                continue
            pad = triton.next_power_of_2(bn)
            if (tma and pad != bn) or n % bn:
                continue
            label = f"bn={bn:3d} bk={bk:3d} stages={st} warps={wp} tma={tma} pdl={pdl} pf={pf}"
            d1 = d2 = None
            if tma:
                d1 = TensorDescriptor.from_tensor(w1, [bk, bn])
                d2 = TensorDescriptor.from_tensor(w2, [bk, bn])
            grid = (n // bn,)

            args = (x, w1, w2, o, d1, d2)
            meta = dict(M=m, K=kk, N=n, BN=pad, VALID=bn, BK=bk, STAGES=st, MODE=code, TMA=tma)
            meta.update(PDL=pdl, PF=pf)

            def run(args=args, meta=meta, grid=grid, wp=wp, st=st, pdl=pdl):
                kw = {"launch_pdl": True} if pdl else {}
                _gemv[grid](*args, **meta, num_warps=wp, num_stages=st, **kw)

            try:
                run()
                torch.cuda.synchronize()
                err = float((o.double() - ref).norm() / ref.norm())
                us = cuda_graph_median(run).median_us
            except Exception as exc:  # a probe reports and goes on
                print(f"  {label}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                continue
            flag = "" if err < 1e-2 else f" WRONG {err:.1e}"
            print(f"  {label}: {us:6.1f} µs  {nbytes / us / 1e6:.2f} TB/s{flag}", flush=True)
            if not flag and ((tma, pdl, pf) not in best or us < best[tma, pdl, pf][0]):
                best[tma, pdl, pf] = (us, label)
        for (tma, pdl, pf), (us, label) in sorted(best.items()):
            print(f"  -> best {mode} tma={tma} pdl={pdl} pf={pf}: {us:.1f} µs ({label})")


if __name__ == "__main__":
    main()
