"""Finite-field fingerprints: equivalent graphs agree, wrong ones disagree."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from _graphs import rmsnorm_linear, rmsnorm_linear_ugraph

import yirage as yr

Build = Callable[[yr.KernelGraph, yr.DTensor, yr.DTensor, yr.DTensor], yr.DTensor]


def _graph3(build: Build, dims: tuple[int, ...] = (4, 6)) -> yr.KernelGraph:
    g = yr.new_kernel_graph()
    a, b, c = (g.new_input(dims, dtype=yr.float16) for _ in range(3))
    g.mark_output(build(g, a, b, c))
    return g


def test_customized_rmsnorm_linear_is_equivalent() -> None:
    ref = rmsnorm_linear(8, 512, 768)
    fused = rmsnorm_linear_ugraph(8, 512, 768)
    assert yr.equivalent(ref, fused, trials=2)
    assert ref.fingerprint() == fused.fingerprint()


def test_eps_enters_exactly() -> None:
    eps = 1e-3
    ref = rmsnorm_linear(8, 64, 32, eps=eps)
    assert yr.equivalent(ref, rmsnorm_linear_ugraph(8, 64, 32, grid=4, forloop=2, eps=eps))
    assert not yr.equivalent(ref, rmsnorm_linear_ugraph(8, 64, 32, grid=4, forloop=2, eps=2e-3))
    assert not yr.equivalent(ref, rmsnorm_linear_ugraph(8, 64, 32, grid=4, forloop=2))


def test_wrong_imap_is_not_equivalent() -> None:
    # W square and grid == forloop: reading W's blocks transposed keeps every tile shape
    # ([128,128]) but computes something else.
    ref = rmsnorm_linear(8, 512, 512)
    good = rmsnorm_linear_ugraph(8, 512, 512, grid=4, forloop=4)
    wrong = rmsnorm_linear_ugraph(8, 512, 512, grid=4, forloop=4, w_imap=(0, -1, -1), w_fmap=1)
    assert yr.equivalent(ref, good)
    assert not yr.equivalent(ref, wrong)


def test_wrong_fmap_is_not_equivalent() -> None:
    # fmap -1 loads whole tiles in every iteration: the product is accumulated 4 times.
    ref = rmsnorm_linear(8, 64, 64)
    wrong = rmsnorm_linear_ugraph(8, 64, 64, grid=4, forloop=4, x_fmap=-1, w_fmap=-1)
    assert not yr.equivalent(ref, wrong)


def test_missing_accumulator_is_not_equivalent() -> None:
    ref = rmsnorm_linear(8, 64, 64)
    assert not yr.equivalent(ref, rmsnorm_linear_ugraph(8, 64, 64, with_rms=False))


def test_algebraic_identities() -> None:
    assert yr.equivalent(
        _graph3(lambda g, a, b, c: g.add(a, b)), _graph3(lambda g, a, b, c: g.add(b, a))
    )
    assert yr.equivalent(
        _graph3(lambda g, a, b, c: g.exp(g.add(a, b))),
        _graph3(lambda g, a, b, c: g.mul(g.exp(a), g.exp(b))),
    )
    assert not yr.equivalent(
        _graph3(lambda g, a, b, c: g.add(g.mul(a, b), c)),
        _graph3(lambda g, a, b, c: g.mul(a, g.add(b, c))),
    )
    assert yr.equivalent(
        _graph3(lambda g, a, b, c: g.mul(a, g.add(b, c))),
        _graph3(lambda g, a, b, c: g.add(g.mul(a, b), g.mul(a, c))),
    )
    assert yr.equivalent(
        _graph3(lambda g, a, b, c: g.div(g.mul(a, b), b)), _graph3(lambda g, a, b, c: a)
    )


def test_one_op_change_disagrees() -> None:
    base = _graph3(lambda g, a, b, c: g.exp(g.sub(a, b)))
    for other in (
        lambda g, a, b, c: g.exp(g.add(a, b)),
        lambda g, a, b, c: g.square(g.sub(a, b)),
        lambda g, a, b, c: g.exp(g.sub(b, a)),
        lambda g, a, b, c: g.exp(g.sub(a, c)),
    ):
        assert not yr.equivalent(base, _graph3(other))


def _two_attention_layers(first_keys: int) -> yr.KernelGraph:
    """softmax(softmax(Q·Kᵢᵀ)·V·K₂ᵀ)·V: the second softmax exps values computed from exps."""
    g = yr.new_kernel_graph()
    q = g.new_input((4, 8), dtype=yr.float32)
    ks = [g.new_input((8, 6), dtype=yr.float32) for _ in range(2)]
    v = g.new_input((6, 8), dtype=yr.float32)
    h = g.matmul(g.softmax(g.matmul(q, ks[first_keys]), dim=1), v)
    g.mark_output(g.matmul(g.softmax(g.matmul(h, ks[1]), dim=1), v))
    return g


def test_exps_of_exps_tell_their_arguments_apart(rng: np.random.Generator) -> None:
    right, wrong = _two_attention_layers(0), _two_attention_layers(1)
    xs = [rng.standard_normal(d) for d in ((4, 8), (8, 6), (8, 6), (6, 8))]
    assert not np.allclose(right.evaluate(xs)[0], wrong.evaluate(xs)[0])  # different functions
    assert not yr.equivalent(right, wrong)
    assert yr.equivalent(right, _two_attention_layers(0))
    assert not yr.equivalent(
        _graph3(lambda g, a, b, c: g.exp(g.exp(a))), _graph3(lambda g, a, b, c: g.exp(g.exp(b)))
    )
    # equal inner values give equal outer exps
    assert yr.equivalent(
        _graph3(lambda g, a, b, c: g.exp(g.mul(g.exp(a), g.exp(b)))),
        _graph3(lambda g, a, b, c: g.exp(g.exp(g.add(a, b)))),
    )


def test_uninterpreted_ops_are_consistent_functions() -> None:
    silu = _graph3(lambda g, a, b, c: g.silu(g.add(a, b)))
    assert yr.equivalent(silu, _graph3(lambda g, a, b, c: g.silu(g.add(b, a))))
    assert not yr.equivalent(silu, _graph3(lambda g, a, b, c: g.gelu(g.add(a, b))))
    assert not yr.equivalent(_graph3(lambda g, a, b, c: g.relu(a)), _graph3(lambda g, a, b, c: a))
    assert not yr.equivalent(
        _graph3(lambda g, a, b, c: g.clamp(a, -1.0, 1.0)),
        _graph3(lambda g, a, b, c: g.clamp(a, -1.0, 2.0)),
    )


def test_fingerprint_is_deterministic_and_thread_independent(monkeypatch) -> None:
    g = rmsnorm_linear_ugraph(8, 512, 768)
    one = g.fingerprint(trials=3, seed=7, threads=1)
    assert g.fingerprint(trials=3, seed=7, threads=4) == one
    assert rmsnorm_linear_ugraph(8, 512, 768).fingerprint(trials=3, seed=7, threads=2) == one
    monkeypatch.setenv("YIRAGE_THREADS", "3")
    assert g.fingerprint(trials=3, seed=7) == one
    assert g.fingerprint(trials=3, seed=8) != one
    assert len(one) >= 32 and int(one, 16) >= 0
    # a multi-device graph (every rank evaluated, all_reduce summing in rank order) too
    m = yr.new_kernel_graph(world_size=3)
    x, w = m.new_input((8, 512), yr.float16), m.new_input((512, 768), yr.float16)
    m.mark_output(m.rms_norm(m.all_reduce(m.matmul(x, w)), (768,)))
    multi = m.fingerprint(trials=3, seed=7, threads=1)
    assert m.fingerprint(trials=3, seed=7, threads=4) == multi
    assert m.fingerprint(trials=3, seed=7, threads=2) == multi


def test_equivalence_needs_equal_input_signatures() -> None:
    a = _graph3(lambda g, a, b, c: g.add(a, b), dims=(4, 6))
    b = _graph3(lambda g, a, b, c: g.add(a, b), dims=(4, 8))
    with pytest.raises(yr.ShapeError):
        yr.equivalent(a, b)


@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_seeds_do_not_change_the_verdict(seed: int) -> None:
    ref = rmsnorm_linear(8, 64, 64)
    assert yr.equivalent(ref, rmsnorm_linear_ugraph(8, 64, 64, grid=4), seed=seed)
    assert not yr.equivalent(ref, rmsnorm_linear_ugraph(8, 64, 64, with_rms=False), seed=seed)
