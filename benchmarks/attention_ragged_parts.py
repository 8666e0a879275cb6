"""Which side of a ragged attention costs time: self-attention of q query rows against kv
keys (32 heads, d 128, float16) superoptimized for the CUDA backend, the chosen kernel timed
as CUDA-graph replays (``triton_kernel_forms.bench``, medians). A diagnostic, not a bench:
`python benchmarks/attention_ragged_parts.py`."""

import torch
from triton_kernel_forms import bench

import yirage as yr
from yirage._workloads import _gqa_graph, _prefill_shapes

#: (q, kv): divisible; ragged rows; ragged keys (rows of Kᵀ off 16-byte alignment); both;
#: ragged keys whose rows stay aligned (4104 = 8·513: a masked loop, no alignment loss)
SHAPES = ((4096, 4096), (4099, 4096), (4096, 4099), (4099, 4099), (4096, 4104))


def main() -> None:
    print(torch.cuda.get_device_name())
    for q, kv in SHAPES:
        g = _gqa_graph(_prefill_shapes(q, yr.float16, kv=kv), yr.float16)
        k = yr.superoptimize(g, backend="cuda")
        xs = [
            torch.randn(32, q, 128, device="cuda", dtype=torch.float16),
            torch.randn(32, 128, kv, device="cuda", dtype=torch.float16) / 11,
            torch.randn(32, kv, 128, device="cuda", dtype=torch.float16),
        ]
        us = bench(lambda: k(*xs))  # noqa: B023 (called at once)
        rep = k.report
        print(f"q {q} kv {kv}: {us:.1f} us  {rep.chosen_description[:60]} {rep.chosen_variant}")


if __name__ == "__main__":
    main()
