"""Kernel-level ``all_reduce`` on multi-device graphs (SPMD, ``world_size`` ranks): the
reference evaluator, fingerprints, JSON, errors, superoptimize on CPU checked with every rank
in-process, and a real two-process run through torch.distributed (gloo)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _pinned_spec import REFERENCE_CPU

import yirage as yr
from yirage import _collectives, _core, _search

F32 = yr.float32
FAST = {"profile_options": {"rounds": 1, "min_time_s": 0.005, "min_repeats": 3}}

cpu_only = pytest.mark.skipif(
    not yr.is_backend_available("cpu"), reason="the cpu backend is not installed"
)
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed"
)
needs_triton = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="triton is not installed (pip install triton runs this test)",
)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def _graph(world_size: int, build: Any, dims: tuple[int, int] = (4, 8)) -> yr.KernelGraph:
    """Inputs a, b of ``dims`` and w of (dims[1], dims[1]); output ``build(g, a, b, w)``."""
    g = yr.new_kernel_graph(world_size=world_size)
    a, b = g.new_input(dims, F32), g.new_input(dims, F32)
    w = g.new_input((dims[1], dims[1]), F32)
    g.mark_output(build(g, a, b, w))
    return g


def _tensor_parallel(world_size: int = 2) -> yr.KernelGraph:
    """Row-parallel linear: rank r holds X[:, r-th K slice] and W[r-th K slice, :]; the
    partial products are all-reduced and an RMSNorm epilogue (rank-1 weight) follows."""
    g = yr.new_kernel_graph(world_size=world_size)
    x = g.new_input((8, 256), F32)
    w = g.new_input((256, 128), F32)
    gamma = g.new_input((128,), F32)
    y = g.all_reduce(g.matmul(x, w))
    g.mark_output(g.rms_norm(y, (128,), weight=gamma))
    return g


def _rank_inputs(
    g: yr.KernelGraph, rng: np.random.Generator
) -> tuple[list[list[np.ndarray]], list[np.ndarray]]:
    """Per-rank float32 inputs and the same stacked along a leading rank axis."""
    per_rank = [
        [
            (rng.standard_normal(t.dims) / np.sqrt(t.dims[0] if len(t.dims) > 1 else 1)).astype(
                np.float32
            )
            for t in g.inputs
        ]
        for _ in range(g.world_size)
    ]
    stacked = [np.stack([r[i] for r in per_rank]) for i in range(len(g.inputs))]
    return per_rank, stacked


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# -- semantics ----------------------------------------------------------------------------------


def test_evaluator_sums_over_ranks(rng: np.random.Generator) -> None:
    ws = 3
    g = yr.new_kernel_graph(world_size=ws)
    x, w, b = g.new_input((4, 16), F32), g.new_input((16, 8), F32), g.new_input((8,), F32)
    y = g.all_reduce(g.matmul(x, w))
    g.mark_output(g.exp(g.mul_scalar(g.add(y, b), 0.1)))
    g.mark_output(y)
    X, W, B = (
        rng.standard_normal((ws, 4, 16)),
        rng.standard_normal((ws, 16, 8)),
        rng.standard_normal((ws, 8)),
    )
    out, y_out = g.evaluate([X, W, B])
    assert out.shape == (ws, 4, 8) and y_out.shape == (ws, 4, 8)
    want_y = np.einsum("rij,rjk->ik", X, W)  # Σ_r X_r @ W_r, on every rank
    for r in range(ws):
        np.testing.assert_allclose(y_out[r], want_y, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(out[r], np.exp(0.1 * (want_y + B[r])), rtol=1e-12)


def test_world_size_one_is_the_single_device_case(rng: np.random.Generator) -> None:
    g = yr.new_kernel_graph()
    assert g.world_size == 1
    x = g.new_input((4, 8), F32)
    g.mark_output(g.all_reduce(x))
    X = rng.standard_normal((4, 8))
    np.testing.assert_array_equal(g.evaluate([X])[0], X)
    assert "world_size" not in g.to_json()
    plain = yr.new_kernel_graph()
    plain.mark_output(plain.new_input((4, 8), F32))
    # unchanged hashes for graphs without world_size: same document as before
    assert '"format":"yirage.kernel_graph","version":1,"ops"' in plain.to_json()


def test_json_round_trip_keeps_world_size() -> None:
    g = _tensor_parallel(4)
    s = g.to_json()
    assert '"world_size":4' in s and '{"op":"all_reduce","x":3}' in s
    back = yr.KernelGraph.from_json(s)
    assert back.world_size == 4 and back.to_json() == s and back.hash() == g.hash()
    one = json.loads(s)
    del one["world_size"]
    assert yr.KernelGraph.from_json(json.dumps(one, separators=(",", ":"))).hash() != g.hash()
    assert "world_size: 4" in repr(back)
    with pytest.raises(yr.GraphError, match="world_size 0"):
        yr.KernelGraph.from_json(s.replace('"world_size":4', '"world_size":0'))


def test_fingerprints_agree_on_identities() -> None:
    ws = 3

    def same(f1: Any, f2: Any) -> bool:
        return yr.equivalent(_graph(ws, f1), _graph(ws, f2), trials=2, seed=3)

    # linear: the sum of sums, scalars commute with the sum
    assert same(
        lambda g, a, b, w: g.add(g.all_reduce(a), g.all_reduce(b)),
        lambda g, a, b, w: g.all_reduce(g.add(a, b)),
    )
    assert same(
        lambda g, a, b, w: g.mul_scalar(g.all_reduce(a), 0.25),
        lambda g, a, b, w: g.all_reduce(g.mul_scalar(a, 0.25)),
    )
    # a matmul commutes with the sum only against a replicated operand (itself all-reduced)
    assert same(
        lambda g, a, b, w: g.matmul(g.all_reduce(a), g.all_reduce(w)),
        lambda g, a, b, w: g.all_reduce(g.matmul(a, g.all_reduce(w))),
    )
    # the sum of an already-replicated value is world_size times it
    assert same(
        lambda g, a, b, w: g.all_reduce(g.all_reduce(a)),
        lambda g, a, b, w: g.mul_scalar(g.all_reduce(a), float(ws)),
    )


def test_fingerprints_disagree_on_non_identities() -> None:
    ws = 3

    def same(f1: Any, f2: Any) -> bool:
        return yr.equivalent(_graph(ws, f1), _graph(ws, f2), trials=2, seed=3)

    assert not same(
        lambda g, a, b, w: g.all_reduce(g.mul(a, b)),
        lambda g, a, b, w: g.mul(g.all_reduce(a), g.all_reduce(b)),
    )
    # per-rank W: Σ_r x_r · W_s ≠ Σ_r x_r · W_r
    assert not same(
        lambda g, a, b, w: g.matmul(g.all_reduce(a), w),
        lambda g, a, b, w: g.all_reduce(g.matmul(a, w)),
    )
    assert not same(
        lambda g, a, b, w: g.exp(g.all_reduce(a)),
        lambda g, a, b, w: g.all_reduce(g.exp(a)),
    )
    # a graph missing the all_reduce
    assert not same(
        lambda g, a, b, w: g.add(a, b),
        lambda g, a, b, w: g.all_reduce(g.add(a, b)),
    )
    # different world sizes cannot be compared
    with pytest.raises(yr.ShapeError, match="world_size 2 and 3"):
        yr.equivalent(
            _graph(2, lambda g, a, b, w: g.all_reduce(a)),
            _graph(3, lambda g, a, b, w: g.all_reduce(a)),
        )


def test_fingerprint_depends_on_every_rank() -> None:
    # rank 1's inputs matter: a graph that only looks at its own rank differs from one that
    # sums, even though rank 0 sees the same inputs in both
    g1 = _graph(2, lambda g, a, b, w: g.add(a, b))
    g2 = _graph(2, lambda g, a, b, w: g.add(g.all_reduce(a), b))
    assert g1.fingerprint() != g2.fingerprint()
    # world_size enters the digest: the per-rank program alone is not the function
    assert _graph(1, lambda g, a, b, w: g.add(a, b)).fingerprint() != g1.fingerprint()


# -- errors ---------------------------------------------------------------------------------------


def test_errors_name_the_fix() -> None:
    for bad in (0, -1, 1025):
        with pytest.raises(yr.GraphError, match="expected 1 to 1024 ranks"):
            yr.new_kernel_graph(world_size=bad)
    with pytest.raises(yr.GraphError, match="world_size must be an int"):
        yr.new_kernel_graph(world_size="2")  # type: ignore[arg-type]
    g = _graph(2, lambda g, a, b, w: g.all_reduce(a))
    with pytest.raises(yr.ShapeError, match=r"expected shape \(2, 4, 8\)") as e:
        g.evaluate([np.zeros((4, 8)), np.zeros((2, 4, 8)), np.zeros((2, 8, 8))])
    assert "leading rank axis" in str(e.value)
    with pytest.raises(yr.ShapeError, match=r"\(2, 8, 8\)"):
        g.evaluate([np.zeros((2, 4, 8)), np.zeros((2, 4, 8)), np.zeros((3, 8, 8))])
    other = yr.new_kernel_graph(world_size=2)
    with pytest.raises(yr.GraphError, match="different KernelGraph"):
        other.all_reduce(g.inputs[0])


@needs_torch
def test_collective_errors_name_the_fix() -> None:
    x = np.ones(3, dtype=np.float32)
    with pytest.raises(yr.BackendError, match="init_process_group") as e:
        _collectives.all_reduce(x, 2)
    assert "torchrun --nproc-per-node 2" in str(e.value)
    assert "run_ranks" in str(e.value)
    assert _collectives.all_reduce(x, 1) is x  # world_size 1: no collective at all
    with _collectives.bound(_collectives.StandIn(3)), pytest.raises(yr.BackendError, match="3"):
        _collectives.all_reduce(x, 2)


@needs_torch
def test_a_process_group_of_another_size_is_refused(tmp_path: Path) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        with pytest.raises(yr.BackendError, match="initialised with world size 1") as e:
            _collectives.all_reduce(np.ones(3, dtype=np.float32), 2)
        assert "--nproc-per-node 2" in str(e.value)
    finally:
        dist.destroy_process_group()


def test_simulated_collective_sums_in_rank_order() -> None:
    vals = [np.full(4, 0.1 * (r + 1), dtype=np.float32) for r in range(4)]
    outs = _collectives.run_ranks(lambda r: _collectives.all_reduce(vals[r].copy(), 4), 4)
    want = ((vals[0] + vals[1]) + vals[2]) + vals[3]
    for o in outs:
        np.testing.assert_array_equal(o, want)  # bit-identical on every rank

    def boom(r: int) -> Any:
        if r == 1:
            raise ValueError("rank 1 broke")
        return _collectives.all_reduce(vals[r].copy(), 2)

    with pytest.raises(ValueError, match="rank 1 broke"):  # rank 0 is released, not hung
        _collectives.run_ranks(boom, 2)


# -- superoptimize --------------------------------------------------------------------------------


@cpu_only
def test_superoptimize_tensor_parallel_on_cpu(rng: np.random.Generator, tmp_path: Path) -> None:
    g = _tensor_parallel(2)
    k = yr.superoptimize(g, backend="cpu", time_limit=30, device_spec=REFERENCE_CPU, **FAST)
    assert k.world_size == 2
    rep = k.report
    assert rep.max_rel_err is not None and rep.max_rel_err <= 1e-4
    assert any("checked by running all ranks" in n for n in rep.notes)
    assert any("all_reduce" in n for n in rep.search["notes"])
    # the search fused the collective-free parts; all_reduce stays a library kernel
    assert any("custom[" in c.description for c in rep.candidates if c.status == "ok"), rep
    assert all(
        k2["op"] == "all_reduce" and k2["params"] == {"world_size": 2}
        for k2 in k.plan["kernels"]
        if k2["kind"] == "library" and k2["op"] == "all_reduce"
    )
    assert sum(1 for k2 in k.plan["kernels"] if k2.get("op") == "all_reduce") == 1
    per_rank, stacked = _rank_inputs(g, rng)
    outs = k.run_ranks(per_rank)
    (ref,) = g.evaluate(stacked)
    for r in range(2):
        assert outs[r][0].shape == (8, 128)
        assert _rel(outs[r][0], ref[r]) < 1e-4
    # called normally it is one rank of a torch.distributed group
    with pytest.raises(yr.BackendError, match="init_process_group"):
        k(*per_rank[0])
    with pytest.raises(yr.ShapeError, match="one list of inputs per rank"):
        k.run_ranks(per_rank[:1])
    # saved and loaded (the load re-checks every rank in-process): world_size kept
    path = k.save(tmp_path / "tp")
    assert json.loads((path / "metadata.json").read_text())["world_size"] == 2
    k2 = yr.load_kernel(path)
    assert k2.world_size == 2 and k2.graph.world_size == 2
    outs2 = k2.run_ranks(per_rank)
    for r in range(2):
        np.testing.assert_array_equal(outs2[r][0], outs[r][0])


def test_search_splits_at_all_reduce() -> None:
    g = _tensor_parallel(2)
    res = yr.search(g, backend="cpu", time_limit=30, cache=False, device_spec=REFERENCE_CPU)
    assert any(c.baseline for c in res.candidates)
    assert "split into 2 collective-free part(s)" in res.report.notes[0]
    for c in res.candidates:
        assert c.graph.world_size == 2
        assert "all_reduce" in c.graph.describe()
        assert yr.equivalent(c.graph, yr.KernelGraph._wrap(g._g.promote_ranks()))
    # a multi-device graph without collectives: its per-rank program is searched
    m = yr.new_kernel_graph(world_size=2)
    x, w = m.new_input((8, 256), F32), m.new_input((256, 128), F32)
    m.mark_output(m.matmul(x, w))
    rm = yr.search(m, backend="cpu", time_limit=30, cache=False, device_spec=REFERENCE_CPU)
    assert any(not c.baseline for c in rm.candidates), rm.report
    assert all(c.graph.world_size == 2 for c in rm.candidates)
    assert all(yr.equivalent(c.graph, m) for c in rm.candidates)
    # a graph that is only a collective has nothing to fuse and says so
    h = yr.new_kernel_graph(world_size=2)
    h.mark_output(h.all_reduce(h.new_input((4, 8), F32)))
    r2 = yr.search(h, backend="cpu", time_limit=5, cache=False, device_spec=REFERENCE_CPU)
    assert [c.baseline for c in r2.candidates] == [True]
    assert r2.report.stop_reason.startswith("no_candidates: the target contains all_reduce")


@needs_torch
@needs_triton
def test_cuda_host_code_runs_all_reduce_in_the_interpreter(rng: np.random.Generator) -> None:
    import torch

    from yirage_cuda import CudaBackend

    be = CudaBackend(interpret=True)
    g = yr.new_kernel_graph(world_size=2)
    x, w = g.new_input((4, 16), F32), g.new_input((16,), F32)
    g.mark_output(g.rms_norm(g.all_reduce(x), (16,), weight=w))
    spec = _search.device_spec_json(be.device_spec(), "cuda")[0]
    plan = json.loads(_core.kernel_plan(g._g.promote_ranks(), spec))
    assert [k["op"] for k in plan["kernels"]] == ["all_reduce", "rms_norm"]
    launcher = be.load(be.compile(be.codegen(plan)))
    per_rank = [
        [torch.randn(4, 16, dtype=torch.float32), torch.randn(1, 16, dtype=torch.float32)]
        for _ in range(2)
    ]
    # the printed host code (library kernels only: plain torch) runs every rank at once; an
    # interpreted Triton launch holds the interpreter's lock, so it is called directly here
    outs = _collectives.run_ranks(lambda r: launcher.active.module.launch(per_rank[r]), 2)
    (ref,) = g.evaluate(
        [np.stack([p[0].numpy() for p in per_rank]), np.stack([p[1].numpy()[0] for p in per_rank])]
    )
    for r in range(2):
        assert _rel(outs[r][0].double().numpy(), ref[r]) < 1e-5
        # the inputs were not reduced in place
        assert not torch.equal(per_rank[0][0], per_rank[1][0])


# -- a real process group -------------------------------------------------------------------------


def _dist_worker(rank: int, world_size: int, init: str, kernel_dir: str, out_dir: str) -> None:
    """One rank: join the gloo group, run the saved kernel on this rank's inputs."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
    try:
        k = yr.load_kernel(kernel_dir, check=False)
        ins = list(np.load(Path(out_dir) / "inputs.npz").values())
        mine = [a[rank] for a in ins]
        (out,) = k(*mine)
        np.save(Path(out_dir) / f"out{rank}.npy", out)
        # a torch tensor is summed by the process group directly (no per-call checks)
        import torch

        assert _collectives._torch_distributed(world_size)._direct is not None
        summed = _collectives.all_reduce(torch.full((3,), rank + 1.0), world_size)
        np.save(Path(out_dir) / f"sum{rank}.npy", summed.numpy())
        dist.barrier()
    finally:
        dist.destroy_process_group()


@cpu_only
@needs_torch
def test_torch_distributed_gloo_two_processes(rng: np.random.Generator, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    g = _tensor_parallel(2)
    k = yr.superoptimize(g, backend="cpu", time_limit=30, **FAST)
    kernel_dir = k.save(tmp_path / "kernel")
    _, stacked = _rank_inputs(g, rng)
    np.savez(tmp_path / "inputs.npz", *stacked)
    init = f"file://{tmp_path / 'store'}"
    mp.spawn(_dist_worker, args=(2, init, str(kernel_dir), str(tmp_path)), nprocs=2, join=True)
    (ref,) = g.evaluate(stacked)
    for r in range(2):
        out = np.load(tmp_path / f"out{r}.npy")
        assert out.shape == (8, 128)
        assert _rel(out, ref[r]) < 1e-4
        np.testing.assert_array_equal(np.load(tmp_path / f"sum{r}.npy"), np.full(3, 3.0))


def _interpreted_plan(g: yr.KernelGraph) -> tuple[Any, dict[str, Any]]:
    """The CUDA backend's interpreted launcher of ``g``'s library baseline, and its plan."""
    from yirage_cuda import CudaBackend

    be = CudaBackend(interpret=True)
    spec = _search.device_spec_json(be.device_spec(), "cuda")[0]
    plan = json.loads(_core.kernel_plan(g._g.promote_ranks(), spec))
    return be.load(be.compile(be.codegen(plan))), plan


@needs_torch
@needs_triton
def test_all_reduce_sums_a_fresh_intermediate_in_place(rng: np.random.Generator) -> None:
    import torch

    g = yr.new_kernel_graph(world_size=2)
    x, w = g.new_input((4, 16), F32), g.new_input((16, 8), F32)
    g.mark_output(g.rms_norm(g.all_reduce(g.matmul(x, w)), (8,)))
    launcher, plan = _interpreted_plan(g)
    assert [k["op"] for k in plan["kernels"]] == ["matmul", "all_reduce", "rms_norm"]
    source = launcher.active.module.__loader__.get_source(launcher.active.module.__name__) or ""
    # the matmul's output is read by the all_reduce alone: summed where it lies, no copy
    assert "_yr_all_reduce(buf" in source and ".clone()" not in source
    per_rank = [[torch.randn(4, 16), torch.randn(16, 8)] for _ in range(2)]
    kept = [[t.clone() for t in r] for r in per_rank]
    outs = _collectives.run_ranks(lambda r: launcher.active.module.launch(per_rank[r]), 2)
    (ref,) = g.evaluate([np.stack([p[i].numpy() for p in per_rank]) for i in range(2)])
    for r in range(2):
        assert _rel(outs[r][0].double().numpy(), ref[r]) < 1e-5
        assert all(torch.equal(a, b) for a, b in zip(per_rank[r], kept[r], strict=True))


@needs_torch
@needs_triton
def test_all_reduce_of_a_view_of_an_input_copies_it(rng: np.random.Generator) -> None:
    import torch

    g = yr.new_kernel_graph(world_size=2)
    x = g.new_input((4, 16), F32)
    g.mark_output(g.all_reduce(g.reshape(x, (8, 8))))
    launcher, plan = _interpreted_plan(g)
    assert [k["op"] for k in plan["kernels"]] == ["reshape", "all_reduce"]
    per_rank = [[torch.randn(4, 16)] for _ in range(2)]
    kept = [r[0].clone() for r in per_rank]
    outs = _collectives.run_ranks(lambda r: launcher.active.module.launch(per_rank[r]), 2)
    want = (kept[0] + kept[1]).reshape(8, 8)
    for r in range(2):
        assert torch.allclose(outs[r][0], want)
        assert torch.equal(per_rank[r][0], kept[r])  # the reshape's view was not summed into
