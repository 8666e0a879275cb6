"""What the ``torch_sdpa`` printing pays for the graph's Kᵀ layout, on a CUDA GPU.

Times (CUDA-graph replay medians, same process) SDPA with K already in its row layout
(the bench's expert), the transposing copy of Kᵀ that the printing makes, a tiled Triton
transpose, and SDPA handed the transposed view under each backend that accepts it.

    python benchmarks/probes/sdpa_layout_probe.py [--heads 32] [--rows 4096] [--kv 4096]
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.functional import scaled_dot_product_attention as sdpa


@triton.jit
def _transpose(src, dst, R, C, BR: tl.constexpr, BC: tl.constexpr):
    # src [B, R, C] -> dst [B, C, R], one BR x BC tile per program
    b, pr, pc = tl.program_id(2), tl.program_id(0), tl.program_id(1)
    r = pr * BR + tl.arange(0, BR)
    c = pc * BC + tl.arange(0, BC)
    m = (r[:, None] < R) & (c[None, :] < C)
    x = tl.load(src + b * R * C + r[:, None] * C + c[None, :], mask=m)
    tl.store(dst + b * R * C + c[None, :] * R + r[:, None], x, mask=m)


def triton_transpose(kt: torch.Tensor) -> torch.Tensor:
    b, r, c = kt.shape
    out = torch.empty(b, c, r, dtype=kt.dtype, device=kt.device)
    grid = (triton.cdiv(r, 64), triton.cdiv(c, 64), b)
    _transpose[grid](kt, out, r, c, BR=64, BC=64)
    return out


def graph_us(fn, reps: int = 30) -> float:
    fn()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(5):
            g.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(e) * 1000 / 5)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--kv", type=int, default=4096)
    ap.add_argument("--d", type=int, default=128)
    a = ap.parse_args()
    h, m, n, d = a.heads, a.rows, a.kv, a.d
    torch.manual_seed(0)
    q = torch.randn(1, h, m, d, device="cuda", dtype=torch.float16)
    kt = torch.randn(h, d, n, device="cuda", dtype=torch.float16)
    v = torch.randn(1, h, n, d, device="cuda", dtype=torch.float16)
    k_rows = kt.transpose(-1, -2).contiguous().unsqueeze(0)
    k_view = kt.transpose(-1, -2).unsqueeze(0)
    assert torch.equal(triton_transpose(kt), k_rows[0])
    rows = {
        "SDPA, K in rows (expert)": lambda: sdpa(q, k_rows, v),
        "torch transpose copy of Kt": lambda: kt.transpose(-1, -2).contiguous(),
        "Triton tiled transpose of Kt": lambda: triton_transpose(kt),
        "copy + SDPA (the printing)": lambda: sdpa(q, kt.transpose(-1, -2).contiguous()[None], v),
        "Triton transpose + SDPA": lambda: sdpa(q, triton_transpose(kt)[None], v),
    }
    for name, be in (
        ("cudnn", SDPBackend.CUDNN_ATTENTION),
        ("flash", SDPBackend.FLASH_ATTENTION),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION),
    ):

        def view_call(be=be):
            with sdpa_kernel([be]):
                return sdpa(q, k_view, v)

        rows[f"SDPA on the Kt view, {name} only"] = view_call
    dev = torch.cuda.get_device_name()
    print(f"# {dev} torch {torch.__version__} heads {h} rows {m} kv {n} d {d}")
    ref = sdpa(q, k_rows, v)
    for name, fn in rows.items():
        try:
            out = fn()
            note = ""
            if out.shape == ref.shape:
                note = f" max|diff| vs expert {float((out - ref).abs().max()):.1e}"
            print(f"{name:40s} {graph_us(fn):9.1f} µs{note}")
        except Exception as exc:  # a backend that refuses the layout
            print(f"{name:40s}   refused: {str(exc).splitlines()[0][:100]}")


if __name__ == "__main__":
    main()
