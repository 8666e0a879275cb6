"""RMSNorm + Linear with yirage: a fused µGraph by hand, then found by the search, then
superoptimized into a kernel.

1. Builds O = rms_norm(X) @ W as two kernel operators and as one customized operator written
   by hand (a thread-block graph that fuses the normalisation into the matmul loop), and
   checks that the two agree: numerically on the float64 reference evaluator and as
   functions through finite-field fingerprints, which also catch two plausible mistakes.
2. ``yr.search`` finds such µGraphs itself for the CPU's DeviceSpec; every candidate it
   returns was verified with fingerprints, which is checked again here.
3. ``yr.superoptimize`` generates C for the candidates, compiles them, checks their numbers
   against the reference evaluator, profiles them and returns the fastest as a kernel, which
   is run here on float16 inputs.

Steps 2 and 3 need the CPU backend (``pip install ./packages/yirage-cpu`` and a C compiler;
``yirage doctor`` says what is missing); without it they are skipped and say so.

Run: ``python docs/examples/rmsnorm_linear.py`` (``nox -s demo`` runs ``yirage demo``, which
superoptimizes the same graph on the best available backend and times it against PyTorch).
"""

from __future__ import annotations

import sys

import numpy as np

import yirage as yr

B, K, N = 8, 1024, 1536  # the CPU shape of the bundled rmsnorm_linear workload


def reference() -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x = g.new_input(dims=(B, K), dtype=yr.float16)
    w = g.new_input(dims=(K, N), dtype=yr.float16)
    g.mark_output(g.matmul(g.rms_norm(x, normalized_shape=(K,)), w))
    return g


def fused(fmaps: tuple[int, int] = (1, 0), eps: float = 1e-6) -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    x = g.new_input(dims=(B, K), dtype=yr.float16)
    w = g.new_input(dims=(K, N), dtype=yr.float16)
    # 16 blocks, each owning N/16 = 96 output columns; 8 loop iterations over K.
    tb = yr.new_threadblock_graph(
        grid_dim=(16, 1, 1), block_dim=(128, 1, 1), forloop_range=8, reduction_dimx=64
    )
    bx = tb.new_input(x, input_map=(-1, -1, -1), forloop_dim=fmaps[0])  # [8, 128] per iteration
    bw = tb.new_input(w, input_map=(1, -1, -1), forloop_dim=fmaps[1])  # [128, 96] per iteration
    acc = tb.forloop_accum(tb.matmul(bx, bw))  # X @ W[:, block] summed over K
    rms = tb.forloop_accum(bx, "rms", eps=eps)  # sqrt(mean(X^2) + eps), alongside
    tb.new_output(tb.div(acc, rms), output_map=(1, -1, -1))
    (o,) = g.customized([x, w], tb)
    g.mark_output(o)
    return g


def search_and_superoptimize(ref: yr.KernelGraph, x: np.ndarray, w: np.ndarray) -> bool:
    """Steps 2 and 3 on the CPU backend; True when every check passes (or they are skipped)."""
    if not yr.is_backend_available("cpu"):
        print(f"search and superoptimize skipped: {yr.get_backend_info('cpu').reason}")
        return True
    result = yr.search(ref, backend="cpu", time_limit=30)
    print(f"\n{result.report}")
    for c in result.candidates:
        print(f"  {c.predicted_us:9.1f} µs predicted  {c.label}")
    verified = all(yr.equivalent(ref, c.graph) for c in result.candidates)
    fused_found = [c for c in result.candidates if not c.baseline]
    print(f"{len(fused_found)} fused candidate(s); all equivalent to the reference: {verified}")

    kernel = yr.superoptimize(ref, backend="cpu", time_limit=30)
    print(f"\n{kernel.report}")
    x16, w16 = x.astype(np.float16), w.astype(np.float16)
    (out,) = kernel(x16, w16)
    (want,) = ref.evaluate([x16, w16])  # the float64 reference on the same float16 inputs
    err = float(np.linalg.norm(out.astype(np.float64) - want) / np.linalg.norm(want))
    print(f"kernel output vs the reference evaluator: relative error {err:.1e} (float16)")
    return verified and err <= 1e-2


def main() -> int:
    ref, fast = reference(), fused()
    print("reference kernel graph:\n" + repr(ref) + "\n")
    print("fused µGraph (one customized operator):\n" + repr(fast) + "\n")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, K))
    w = rng.standard_normal((K, N)) / np.sqrt(K)
    want = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) @ w
    (got_ref,) = ref.evaluate([x, w])
    (got_fast,) = fast.evaluate([x, w])
    err_ref = float(np.max(np.abs(got_ref - want)) / np.max(np.abs(want)))
    err_fast = float(np.max(np.abs(got_fast - want)) / np.max(np.abs(want)))
    print(
        f"float64 reference evaluator vs numpy: rel. error {err_ref:.1e} (reference), "
        f"{err_fast:.1e} (fused)"
    )

    same = yr.equivalent(ref, fast, trials=2)
    print(f"fingerprint equivalence: reference ≡ fused: {same}")
    # Two plausible mistakes with valid shapes; the fingerprints must tell them apart.
    mistakes = {
        "eps 1e-5 instead of 1e-6": fused(eps=1e-5),
        "tiles loaded whole in every iteration (fmap -1)": fused(fmaps=(-1, -1)),
    }
    caught = True
    for what, graph in mistakes.items():
        equal = yr.equivalent(ref, graph, trials=2)
        caught = caught and not equal
        print(f"  reference ≡ fused with {what}: {equal}")
    print(f"fingerprint {fast.fingerprint()}  content hash {fast.hash()}")
    round_trip = yr.KernelGraph.from_json(fast.to_json()).to_json() == fast.to_json()
    print(f"canonical JSON round trip byte-identical: {round_trip}")

    ok = err_ref < 1e-10 and err_fast < 1e-10 and same and caught and round_trip
    ok = search_and_superoptimize(ref, x, w) and ok
    print("demo:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
