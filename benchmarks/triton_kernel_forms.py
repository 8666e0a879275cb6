"""Forms of the fused attention and dual-dot (gated MLP) Triton kernels, timed side by side on
one GPU (CUDA-graph replays, medians): tile shapes, warps, stages, natural against base-2
exponentials, rounded against unrounded weight sums, warp specialisation. A diagnostic for
what the printer should emit, not a bench: `python benchmarks/triton_kernel_forms.py`."""

# l and O are the kernels' math names
# ruff: noqa: E741
import functools
import math
import sys
import traceback
from collections.abc import Callable

import torch
import triton
import triton.language as tl

dev = "cuda"


def bench(fn, reps=20, inner=10):
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000 / inner)
    ts.sort()
    return ts[len(ts) // 2]


def dense_rate() -> float:
    """TFLOP/s of torch.mm on 8192² fp16 operands (the rate the forms are compared with)."""
    a = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.float16)
    t = bench(lambda: torch.mm(a, b), reps=10, inner=5)
    print(f"dense fp16 8192^3: {t:.1f} us = {2 * 8192**3 / t / 1e6:.0f} TFLOP/s", flush=True)
    return 2 * 8192**3 / t / 1e6


def time_form(
    tag: str, launch: Callable[[], object], err: Callable[[], float], flops: int, dense: float
) -> None:
    """Run ``launch`` once, print its error and its CUDA-graph median (a compile failure is
    printed, not raised: some forms do not compile on every Triton)."""
    try:
        launch()
        torch.cuda.synchronize()
        e = err()
        us = bench(launch)
        rate = flops / us / 1e6
        print(f"{tag}: {us:.1f} us {rate:.0f} TF/s ({rate / dense:.0%}) err {e:.2e}", flush=True)
    except Exception as exc:
        print(f"{tag}: FAILED {type(exc).__name__}: {str(exc)[-600:]}", flush=True)


# ---- attention
@triton.jit
def attn2d(
    Q,
    KT,
    V,
    O,
    sm_scale,
    S: tl.constexpr,
    D: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    EXP2: tl.constexpr,
    WS: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    ROUND_SUM: tl.constexpr,
):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, BN)
    q = tl.load(Q + h * S * D + offs_m[:, None] * D + offs_d[None, :])
    m = tl.full([BM], float("-inf"), tl.float32)
    l = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    if EXP2:
        qk_scale = sm_scale * 1.4426950408889634
    else:
        qk_scale = sm_scale
    for it in tl.range(0, S // BN, num_stages=NUM_STAGES, warp_specialize=WS):
        kt = tl.load(KT + h * D * S + offs_d[:, None] * S + (it * BN + offs_n)[None, :])
        v = tl.load(V + h * S * D + (it * BN + offs_n)[:, None] * D + offs_d[None, :])
        s = tl.dot(q, kt)
        if EXP2:
            mn = tl.maximum(m, tl.max(s, 1) * qk_scale)
            alpha = tl.math.exp2(m - mn)
            p = tl.math.exp2(s * qk_scale - mn[:, None])
        else:
            s = s * qk_scale
            mn = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - mn)
            p = tl.exp(tl.minimum(s - mn[:, None], 0.0))
        p16 = p.to(tl.float16)
        if ROUND_SUM:
            l = l * alpha + tl.sum(p16.to(tl.float32), 1)
        else:
            l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p16, v, acc)
        m = mn
    out = acc / l[:, None]
    tl.store(O + h * S * D + offs_m[:, None] * D + offs_d[None, :], out.to(tl.float16))


def attn_case(S, dense, H=32, D=128):
    q = torch.randn(H, S, D, device=dev, dtype=torch.float16)
    kt = torch.randn(H, D, S, device=dev, dtype=torch.float16)
    v = torch.randn(H, S, D, device=dev, dtype=torch.float16)
    scale = 1 / math.sqrt(D)
    ref = torch.softmax((q.float() @ kt.float()) * scale, -1) @ v.float()
    flops = 4 * H * S * S * D
    print(
        f"\n== attention S={S} H={H} D={D}: roofline at dense rate {flops / dense / 1e6:.1f} us",
        flush=True,
    )
    o = torch.empty_like(q)
    for BM, BN, warps, stages, exp2, ws, rs in [
        (128, 128, 8, 3, False, False, True),
        (128, 128, 8, 3, True, False, True),
        (128, 128, 8, 3, True, False, False),
        (128, 64, 8, 3, True, False, True),
        (128, 64, 4, 3, True, False, True),
        (128, 128, 8, 2, True, False, True),
        (128, 64, 8, 4, True, False, True),
        (64, 64, 4, 3, True, False, True),
        (64, 128, 4, 3, True, False, True),
        (128, 128, 8, 3, True, True, True),
        (128, 64, 8, 3, True, True, True),
        (128, 128, 4, 3, True, True, True),
    ]:
        tag = f"BM{BM} BN{BN} w{warps} st{stages} exp2={int(exp2)} ws={int(ws)} roundsum={int(rs)}"
        launch = functools.partial(
            attn2d[(S // BM, H)],
            *(q, kt, v, o, scale),
            S=S,
            D=D,
            BM=BM,
            BN=BN,
            EXP2=exp2,
            WS=ws,
            NUM_STAGES=stages,
            ROUND_SUM=rs,
            num_warps=warps,
            num_stages=stages,
        )
        time_form(tag, launch, lambda: (o.float() - ref).abs().max().item(), flops, dense)
    try:
        qq, kk, vv = q.unsqueeze(0), kt.transpose(1, 2).contiguous().unsqueeze(0), v.unsqueeze(0)
        us = bench(lambda: torch.nn.functional.scaled_dot_product_attention(qq, kk, vv))
        print(f"torch SDPA (natural K): {us:.1f} us  {flops / us / 1e6:.0f} TF/s", flush=True)
    except Exception as e:
        print("sdpa failed", e)


# ---- dual dot (gated MLP)
@triton.jit
def dual(
    A,
    W1,
    W3,
    O,
    M: tl.constexpr,
    N: tl.constexpr,
    K: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
    GROUP: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    n_m = M // BM
    n_n = N // BN
    width = GROUP * n_n
    g = pid // width
    first = g * GROUP
    size = tl.minimum(n_m - first, GROUP)
    pm = first + (pid % width) % size
    pn = (pid % width) // size
    offs_m = pm * BM + tl.arange(0, BM)
    offs_n = pn * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    acc1 = tl.zeros([BM, BN], tl.float32)
    acc3 = tl.zeros([BM, BN], tl.float32)
    for it in tl.range(0, K // BK, num_stages=NUM_STAGES):
        a = tl.load(A + offs_m[:, None] * K + (it * BK + offs_k)[None, :])
        w1 = tl.load(W1 + (it * BK + offs_k)[:, None] * N + offs_n[None, :])
        w3 = tl.load(W3 + (it * BK + offs_k)[:, None] * N + offs_n[None, :])
        acc1 = tl.dot(a, w1, acc1)
        acc3 = tl.dot(a, w3, acc3)
    out = acc1 * tl.sigmoid(acc1) * acc3
    tl.store(O + offs_m[:, None] * N + offs_n[None, :], out.to(tl.float16))


def gated_case(M, dense, K=4096, N=4096):
    x = torch.randn(M, K, device=dev, dtype=torch.float16)
    w1 = torch.randn(K, N, device=dev, dtype=torch.float16) / 64
    w3 = torch.randn(K, N, device=dev, dtype=torch.float16) / 64
    ref = torch.nn.functional.silu(x.float() @ w1.float()) * (x.float() @ w3.float())
    flops = 4 * M * N * K
    print(f"\n== gated MLP {M}x{K}x{N}: roofline {flops / dense / 1e6:.1f} us", flush=True)

    def lib():
        return torch.nn.functional.silu(x @ w1) * (x @ w3)

    us = bench(lib)
    print(f"eager library: {us:.1f} us {flops / us / 1e6:.0f} TF/s", flush=True)
    o = torch.empty(M, N, device=dev, dtype=torch.float16)
    for BM, BN, BK, warps, stages, group in [
        (128, 64, 64, 8, 3, 8),
        (128, 64, 64, 4, 4, 8),
        (128, 128, 64, 8, 3, 8),
        (128, 128, 64, 8, 4, 8),
        (128, 128, 32, 8, 4, 8),
        (128, 128, 64, 4, 3, 8),
        (64, 128, 64, 4, 4, 8),
        (128, 64, 64, 8, 4, 8),
        (256, 64, 64, 8, 3, 8),
        (128, 128, 64, 8, 3, 16),
        (128, 64, 128, 8, 3, 8),
    ]:
        if M % BM:
            continue
        tag = f"BM{BM} BN{BN} BK{BK} w{warps} st{stages} g{group}"
        launch = functools.partial(
            dual[((M // BM) * (N // BN),)],
            *(x, w1, w3, o),
            M=M,
            N=N,
            K=K,
            BM=BM,
            BN=BN,
            BK=BK,
            GROUP=group,
            NUM_STAGES=stages,
            num_warps=warps,
            num_stages=stages,
        )
        time_form(
            tag,
            launch,
            lambda: ((o.float() - ref).abs().max() / ref.abs().max()).item(),
            flops,
            dense,
        )


def main() -> None:
    torch.manual_seed(0)
    print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__)
    dense = dense_rate()
    for case, arg in [(attn_case, 4096), (attn_case, 1024), (gated_case, 4096), (gated_case, 1024)]:
        try:
            case(arg, dense)
        except Exception:
            traceback.print_exc()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
