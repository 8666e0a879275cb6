"""GPU tests of device graphs (``pytest -m cuda tests/cuda``): :meth:`yirage.OptimizedKernel.
capture` gives the direct call's numbers, on the captured and on copied-in inputs; repeated
calls (replayed from a graph captured at the second call) give the host-launched call's
numbers, fresh outputs every time, follow in-place changes of the inputs and run inside a
caller's own capture; and, on a host with two or more GPUs, a tensor-parallel kernel
(``all_reduce`` over NCCL, one process per GPU) called repeatedly and captured, against the
float64 reference evaluator's ranks (repeated calls replay graphs split at the all_reduce,
which runs from the host in between; the explicit capture holds the NCCL all_reduce and is
released before the process group is destroyed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import yirage as yr

pytestmark = pytest.mark.cuda


def _gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _rms_linear(world_size: int = 1) -> yr.KernelGraph:
    g = yr.new_kernel_graph(world_size=world_size)
    x = g.new_input((8, 512), yr.float16)
    w = g.new_input((512, 1024), yr.float16)
    y = g.matmul(x, w)
    if world_size > 1:
        y = g.all_reduce(y)
    g.mark_output(g.rms_norm(y, (1024,)))
    return g


def test_replay_matches_the_direct_call(
    gpu: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path))
    k = yr.superoptimize(_rms_linear(), backend="cuda")
    x = torch.randn(8, 512, device="cuda", dtype=torch.float16)
    w = (torch.randn(512, 1024, device="cuda") / 512**0.5).half()
    captured = k.capture(x, w)
    assert torch.equal(captured()[0], k(x, w)[0])
    x2 = torch.randn_like(x)
    (out,) = captured(x2, w)  # copied into the captured input, then replayed
    assert torch.equal(out, k(x2, w)[0])
    (ref,) = _rms_linear().evaluate([x2.double().cpu().numpy(), w.double().cpu().numpy()])
    got = out.double().cpu().numpy()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2
    with pytest.raises(yr.ShapeError, match="capture it again"):
        captured(x2[:4], w)


def test_repeated_calls_replay_a_graph_with_fresh_outputs(
    gpu: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path))
    k = yr.superoptimize(_rms_linear(), backend="cuda")
    monkeypatch.setenv("YIRAGE_DEVICE_GRAPHS", "0")
    eager = yr.superoptimize(_rms_linear(), backend="cuda")  # the cached decision
    assert eager._graphs is None and k._graphs is not None
    x = torch.randn(8, 512, device="cuda", dtype=torch.float16)
    w = (torch.randn(512, 1024, device="cuda") / 512**0.5).half()
    outs = [k(x, w)[0] for _ in range(4)]  # eager, eager + capture, replay, replay
    assert len(k._graphs._graphs) == 1 and k._graphs.failure is None
    want = eager(x, w)[0]
    for o in outs:
        assert torch.equal(o, want)
    assert len({o.data_ptr() for o in outs}) == 4  # every call's output is its own
    x.mul_(-1.0)  # the replay reads the inputs where they lie
    (flipped,) = k(x, w)
    assert torch.equal(flipped, eager(x, w)[0]) and torch.equal(outs[2], want)
    g = torch.cuda.CUDAGraph()  # a caller's own capture takes the launches
    with torch.cuda.graph(g):
        (inside,) = k(x, w)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(inside, flipped)


def _tp_rank(rank: int, world: int, store: str, cache: str, out: str) -> None:
    """One rank: NCCL group, superoptimize, direct and captured calls, outputs saved."""
    import os

    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    os.environ["YIRAGE_CACHE_DIR"] = f"{cache}/{rank}"
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        g = _rms_linear(world)
        torch.manual_seed(rank)
        x = torch.randn(8, 512, device="cuda").half()
        w = (torch.randn(512, 1024, device="cuda") / 512**0.5).half()
        k = yr.superoptimize(g, backend="cuda")
        direct = k(x, w)[0].clone()
        repeated = [k(x, w)[0] for _ in range(3)][-1]  # replayed: graph, all_reduce, graph
        assert k._graphs is not None and k._graphs.failure is None
        (segments,) = k._graphs._graphs.values()
        assert len(segments.graphs) == 2 and len(segments.reductions) == 1
        step = k.capture(x, w)
        replayed = step()[0].clone()
        step.release()
        np.savez(
            f"{out}/rank{rank}.npz",
            x=x.float().cpu().numpy(),
            w=w.float().cpu().numpy(),
            direct=direct.float().cpu().numpy(),
            repeated=repeated.float().cpu().numpy(),
            replayed=replayed.float().cpu().numpy(),
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(_gpus() < 2, reason="needs two CUDA GPUs (a one-GPU host cannot run it)")
def test_tensor_parallel_kernel_on_nccl(gpu: Any, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    world = 2
    mp.spawn(
        _tp_rank,
        args=(world, str(tmp_path / "store"), str(tmp_path / "cache"), str(tmp_path)),
        nprocs=world,
        join=True,
    )
    ranks: list[Any] = [np.load(tmp_path / f"rank{r}.npz") for r in range(world)]
    (ref,) = _rms_linear(world).evaluate(
        [np.stack([r["x"] for r in ranks]), np.stack([r["w"] for r in ranks])]
    )
    for r, saved in enumerate(ranks):
        for name in ("direct", "repeated", "replayed"):
            err = np.linalg.norm(saved[name] - ref[r]) / np.linalg.norm(ref[r])
            assert err < 1e-2, (r, name, err)
