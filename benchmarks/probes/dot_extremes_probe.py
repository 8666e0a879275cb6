"""Is it the fp16 tensor-core dot or the exp that turns ±65504 query/key values into NaN?"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _dot(q, k, out, m_out):
    r = tl.arange(0, 16)
    d = tl.arange(0, 128)
    c = tl.arange(0, 64)
    a = tl.load(q + r[:, None] * 128 + d[None, :])
    b = tl.load(k + d[:, None] * 64 + c[None, :])
    s = tl.dot(a, b) * 0.08838834764831843
    tl.store(out + r[:, None] * 64 + c[None, :], s)
    m = tl.max(s, axis=1)
    e = tl.sum(tl.exp(s - m[:, None]), axis=1)
    tl.store(m_out + r, e)


torch.manual_seed(0)
for trial in range(3):
    q = (torch.randn(16, 128) / 11).half()
    k = (torch.randn(128, 64) / 11).half()
    for t in (q, k):
        w = torch.rand(t.shape) < 1 / 64
        t[w] = torch.where(torch.rand(int(w.sum())) < 0.5, 65504.0, -65504.0).half()
    ref = (q.double() @ k.double()) * 0.08838834764831843
    q, k = q.cuda(), k.cuda()
    out = torch.empty(16, 64, device="cuda")
    e = torch.empty(16, device="cuda")
    _dot[(1,)](q, k, out, e)
    got = out.cpu().double()
    print(
        f"trial {trial}: dot non-finite {int((~torch.isfinite(got)).sum())}, "
        f"max |err| {float(((got - ref).abs()).nan_to_num(1e30).max()):.3g} of max |s| "
        f"{float(ref.abs().max()):.3g}; exp-sum non-finite {int((~torch.isfinite(e)).sum())}"
    )
    bad = ~torch.isfinite(got)
    if bad.any():
        i = bad.nonzero()[0].tolist()
        print("   first", i, "got", float(got[i[0], i[1]]), "ref", float(ref[i[0], i[1]]))
