"""Split-loop printing (split-K, flash-decoding): a kernel printed as a part kernel that runs
a slice of the for-loop per block plus a combine kernel must compute what the unsplit kernel
computes. Runs in the Triton interpreter against float64 references."""

from __future__ import annotations

from typing import Any

import numpy as np
import plans
import pytest
from conftest import needs_triton

pytestmark = needs_triton

TOL = {"float32": 2e-5, "float16": 3e-3}


def _splits(case: plans.Case, want: int) -> tuple[tuple[str, int], ...]:
    """Split every generated kernel whose loop allows it by the largest power of two ≤ want
    that divides the loop and leaves each part ≥ 1 iteration."""
    from yirage.plan import parse_plan

    out = []
    for k in parse_plan(case.plan).generated:
        s = want
        while s > 1 and (k.forloop_range % s or not any(o.op == "accum" for o in k.ops)):
            s //= 2
        if s > 1:
            out.append((k.name, s))
    return tuple(out)


def _backend(splits: tuple[tuple[str, int], ...], last_block: bool = True) -> Any:
    from yirage_cuda import CudaBackend
    from yirage_triton import TritonOptions

    opts = TritonOptions(bf16_dot_as_fp32=True, split_loop=splits, last_block_combine=last_block)
    return CudaBackend(interpret=True, cuda_cpp=False, triton_options=opts)


def _run(
    case: plans.Case,
    splits: tuple[tuple[str, int], ...],
    xs: list[np.ndarray],
    last_block: bool = True,
    calls: int = 1,
) -> Any:
    """Print, compile and run; ``calls`` launches on the same inputs (the outputs of the last
    one are returned)."""
    be = _backend(splits, last_block)
    src = be.codegen(case.plan)
    kernel = be.load(be.compile(src))
    tensors = be.from_numpy([x.astype(np.float32) for x in xs], [d for _, d in case.inputs])
    for _ in range(calls):
        outs = [o.double().numpy() for o in kernel(*tensors)]
    return src.code, outs, [t.double().numpy() for t in tensors]


def _err(a: np.ndarray, b: np.ndarray) -> float:
    assert np.isfinite(a).all()
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


SPLIT_CASES = [
    plans.rmsnorm_linear(),
    plans.gated_mlp(),
    plans.lora(),
    plans.gqa_decode(),
    plans.gqa_decode(qk_norm=True, combine="loop"),
    plans.attention_fused(),
    plans.zoo_reduce_matmul(),
]


@pytest.mark.parametrize("case", SPLIT_CASES, ids=[c.name for c in SPLIT_CASES])
@pytest.mark.parametrize("want", [2, 4])
@pytest.mark.parametrize("last_block", [True, False], ids=["last_block", "combine_kernel"])
def test_split_kernels_match_reference(case: plans.Case, want: int, last_block: bool) -> None:
    """Both combines are right, the last-block one also on a second launch (its arrival
    counters must have been zeroed again by the first)."""
    splits = _splits(case, want)
    if not splits:
        pytest.fail(f"{case.name}: no kernel of the fixture can be split (fixture changed?)")
    calls = 2 if last_block else 1
    code, outs, xs = _run(case, splits, case.random_inputs(1), last_block, calls)
    for name, _ in splits:
        assert (f"def {name}_combine(" in code) is not last_block
    assert ("tl.atomic_add(cnt + blk" in code) is last_block
    for o, r in zip(outs, case.reference(*xs), strict=True):
        assert _err(o, r) <= TOL["float32"], case.name


@pytest.mark.parametrize("last_block", [True, False], ids=["last_block", "combine_kernel"])
def test_combine_rescales_to_the_common_row_max(last_block: bool) -> None:
    """The last split sees scores far larger than the others: its partial sums must dominate
    after the combine rescales every part to the common maximum (an unscaled sum of the
    parts, or one that forgot the per-part maxima, is wrong by orders of magnitude)."""
    case = plans.attention_fused(scale=4.0)
    xs = case.random_inputs(5)
    xs[1][:, :, -64:] *= 8.0
    _, outs, rounded = _run(case, (("attn", 4),), xs, last_block)
    assert _err(outs[0], case.reference(*rounded)[0]) <= 1e-4


#: Loops the split does not divide: part p of S walks iterations ⌊p·F/S⌋ .. ⌊(p+1)·F/S⌋.
UNEVEN = [
    # 10 iterations of 32 keys over 301, the last one masked: shares of 2 and 3 / of 1 and 2
    (plans.attention_fused(kv_len=301, tl=32), "attn", 4),
    (plans.attention_fused(kv_len=301, tl=32), "attn", 8),
    # 7 iterations of 64 over h = 420 (masked) into a rms and a matmul accumulator
    (plans.rmsnorm_linear(h=420, tk=64), "rms_mm", 4),
    # 4 iterations, 3 parts: one part walks two
    (plans.gated_mlp(), "gated_mlp", 3),
]


@pytest.mark.parametrize(
    "case,name,split",
    UNEVEN,
    ids=[f"{c.name}-f{c.plan['kernels'][-1]['forloop_range']}-s{s}" for c, _, s in UNEVEN],
)
@pytest.mark.parametrize("last_block", [True, False], ids=["last_block", "combine_kernel"])
def test_a_split_the_loop_does_not_divide_matches_reference(
    case: plans.Case, name: str, split: int, last_block: bool
) -> None:
    """Uneven shares (one iteration apart), with the masked last tile in the last part: every
    iteration is walked exactly once, so the result is the unsplit kernel's."""
    (k,) = [k for k in case.plan["kernels"] if k["name"] == name]
    assert k["forloop_range"] % split, "fixture must not divide"
    code, outs, xs = _run(case, ((name, split),), case.random_inputs(3), last_block)
    assert f"(sp + 1) * {k['forloop_range']} // {split}" in code
    for o, r in zip(outs, case.reference(*xs), strict=True):
        assert _err(o, r) <= TOL["float32"], case.name


@pytest.mark.parametrize("last_block", [True, False], ids=["last_block", "combine_kernel"])
def test_uneven_split_rescales_a_masked_last_part(last_block: bool) -> None:
    """Scores far larger in the keys of the last, masked tile (iteration 9 of 10, in the
    last of 4 uneven parts): the combine must weigh that part by its own maximum; the
    padded keys past 301 must stay out of its sums."""
    case = plans.attention_fused(kv_len=301, tl=32, scale=4.0)
    xs = case.random_inputs(5)
    xs[1][:, :, -13:] *= 8.0
    _, outs, rounded = _run(case, (("attn", 4),), xs, last_block)
    assert _err(outs[0], case.reference(*rounded)[0]) <= 1e-4


def test_split_rejects_more_parts_than_iterations() -> None:
    from yirage.plan import CodegenError

    case = plans.attention_fused()  # forloop 8
    with pytest.raises(CodegenError, match="between 2 and forloop 8"):
        _backend((("attn", 16),)).codegen(case.plan)


def test_fixture_analyses_are_the_cores() -> None:
    """The fixtures' version-3 analyses (plans.analysed: hoisted phases, accumulate_into,
    rescale degrees, loop_split for 132 SMs) are the core's: re-made on the core's own plans
    of searched candidates, they change nothing."""
    from _search_graphs import H100, attention, gated_mlp, plan_of, rmsnorm_linear, search

    splits = []
    for g in (rmsnorm_linear(), gated_mlp(), attention(b=2, m=16, d=64, n=4096)):
        for c in search(g, device_spec=H100, cache=False, top_k=8).candidates:
            plan = plan_of(c)
            assert plans.analysed(plan) == plan, c.label
            splits += [k["loop_split"] for k in plan["kernels"] if k["kind"] == "generated"]
    assert max(splits) > 1 and min(splits) == 1, splits


def test_the_split_printing_is_the_plans_loop_split() -> None:
    """The backend prints "triton_split" as many ways as the plan's ``loop_split`` says (the
    core decides it, one rule and one cap), and no split printing where it says 1."""
    from yirage_cuda import CudaBackend

    big = plans.rmsnorm_linear(b=8, h=4096, n=6144, tn=128, tk=64, dtype="float16")
    (k,) = [k for k in big.plan["kernels"] if k["kind"] == "generated"]
    assert k["loop_split"] == 8  # 48 blocks: 8 parts give 2 per SM of 132
    be = CudaBackend(interpret=True, cuda_cpp=False)
    for split in (2, 4, 8):
        k["loop_split"] = split
        src = be.codegen(big.plan)
        assert _kernels_table(src.triton_variants["triton_split"].text)["rms_mm"]["split"] == split
    k["loop_split"] = 1
    assert "triton_split" not in be.codegen(big.plan).triton_variants


def _kernels_table(text: str) -> dict[str, dict[str, Any]]:
    import ast

    line = next(x for x in text.splitlines() if x.startswith("KERNELS = "))
    table: dict[str, dict[str, Any]] = ast.literal_eval(line.removeprefix("KERNELS = "))
    return table


def test_split_pipeline_depth() -> None:
    """A split part kernel is never pipelined deeper than its share of the loop, and by
    default shallow enough for two blocks per SM unless that leaves one stage (then two, for
    one block); the deep printing keeps more stages."""
    from yirage.plan import parse_plan
    from yirage_triton import DEEP_STAGES, TritonOptions, generate_triton

    case = plans.attention_fused(batch=16, rows=4, d=128, kv_len=4096, tl=128, dtype="float16")
    (k,) = parse_plan(case.plan).generated
    smem = 227 * 1024
    assert k.smem_bytes * 3 <= smem < k.smem_bytes * 6  # 3 stages fit for one block, not two
    whole = _kernels_table(generate_triton(case.plan, TritonOptions(smem_limit=smem)).text)
    assert whole["attn"]["num_stages"] == 3
    # 32 iterations split 32 ways: one iteration per block, nothing to pipeline
    one = TritonOptions(smem_limit=smem, split_loop=(("attn", 32),))
    assert _kernels_table(generate_triton(case.plan, one).text)["attn"]["num_stages"] == 1
    # 8 ways: 4 iterations per block; two blocks per SM would leave room for one stage
    # each, so the part keeps the two stages that double-buffer one block
    eight = TritonOptions(smem_limit=smem, split_loop=(("attn", 8),))
    table = _kernels_table(generate_triton(case.plan, eight).text)
    assert smem // (2 * k.smem_bytes) == 1
    assert table["attn"]["num_stages"] == 2
    # with 32 KB tiles two blocks of three stages fit
    small = plans.attention_fused(batch=16, rows=4, d=128, kv_len=4096, tl=64, dtype="float16")
    (ks,) = parse_plan(small.plan).generated
    st = _kernels_table(generate_triton(small.plan, eight).text)["attn"]["num_stages"]
    assert st == min(3, smem // (2 * ks.smem_bytes)) == 3
    assert "attn_combine" not in table  # the last part of each block combines
    two = TritonOptions(smem_limit=smem, split_loop=(("attn", 8),), last_block_combine=False)
    assert _kernels_table(generate_triton(case.plan, two).text)["attn_combine"]["num_stages"] == 1
    deep = TritonOptions(smem_limit=smem, split_loop=(("attn", 8),), max_stages=DEEP_STAGES)
    stages = _kernels_table(generate_triton(case.plan, deep).text)["attn"]["num_stages"]
    assert stages == min(DEEP_STAGES, 4, smem // k.smem_bytes) > table["attn"]["num_stages"]


@pytest.mark.parametrize("tl,want", [(64, 3), (256, 2), (512, 1)])
def test_a_forced_depth_is_lowered_where_tritons_buffers_cannot_fit(tl: int, want: int) -> None:
    """A forced ``num_stages`` (the quarter split's default depth) is printed as deep as
    Triton's ``num_stages - 1`` stage buffers fit ``smem_limit``: K and V tiles of ``tl``
    keys (d 128, float16) stream 512·tl bytes per stage, so three stages fit for 64 keys,
    two for 256 and one for 512. Before, the runtime lowered it at the first launch, one
    recompilation per step; without a limit the forced depth stands."""
    from yirage_triton import TritonOptions, generate_triton

    case = plans.attention_fused(batch=4, rows=4, d=128, kv_len=4096, tl=tl, dtype="float16")
    smem = 227 * 1024
    forced = TritonOptions(smem_limit=smem, num_stages=3)
    assert _kernels_table(generate_triton(case.plan, forced).text)["attn"]["num_stages"] == want
    free = TritonOptions(num_stages=3)
    assert _kernels_table(generate_triton(case.plan, free).text)["attn"]["num_stages"] == 3


def test_warmup_compiles_without_running() -> None:
    """The printed ``warmup(inputs)`` queues every generated kernel's compilation (the part
    and combine kernels of a split loop included) and allocates, never runs, library
    kernels' outputs."""
    from yirage_triton import TritonOptions, generate_triton

    case = plans.mixed_library()
    text = generate_triton(case.plan, TritonOptions()).text
    warm = text[text.index("def warmup(inputs):") :]
    launch = text[text.index("def launch(inputs):") : text.index("def warmup(inputs):")]
    assert "torch.matmul" in launch and "torch.matmul" not in warm
    assert warm.count(".warmup(") == launch.count("](") >= 1
    assert "return" not in warm
    split = plans.attention_fused(kv_len=256, tl=32)
    for last_block in (True, False):
        opts = TritonOptions(split_loop=(("attn", 4),), last_block_combine=last_block)
        text = generate_triton(split.plan, opts).text
        warm = text[text.index("def warmup(inputs):") :]
        assert "attn.warmup(" in warm and ("attn_combine.warmup(" in warm) is not last_block


def test_gpu_codegen_prints_split_half_quarter_and_deep_variants() -> None:
    """On a GPU (codegen needs none) an under-filled kernel is printed split as
    ``loop_split`` says, split half as many ways (and a quarter where that still leaves at
    most an eighth of the SMs idle), and with deeper pipelines, the last two except for
    attention (safe-softmax) plans; printings that come out identical are kept once (a plan
    without a normalised dot operand gets no scaled printing). The interpreter prints only
    the split."""
    from yirage_cuda import CudaBackend
    from yirage_triton import DEEP_STAGES, DEFAULT_STAGES

    mlp = plans.gated_mlp(b=8, h=4096, n=4096, tn=512, tk=16, dtype="float16")
    src = CudaBackend(cuda_cpp=False).codegen(mlp.plan)
    tables = {n: _kernels_table(v.text) for n, v in src.triton_variants.items()}
    assert set(tables) == {"triton_split", "triton_split_half", "triton_deep", "triton_split_deep"}
    # 8 blocks: 2 per SM of 132 would take 33 parts; the core's split stops at 16
    assert tables["triton_split"]["gated_mlp"]["split"] == 16
    assert tables["triton_split_half"]["gated_mlp"]["split"] == 8
    assert tables["triton_deep"]["gated_mlp"]["num_stages"] == DEEP_STAGES
    assert len({v.text for v in src.triton_variants.values()} | {src.triton.text}) == 5
    # 64 blocks split 8 ways; a quarter of that, 128 blocks, still fills 128 of the 132 SMs
    wide = plans.gated_mlp(b=8, h=4096, n=4096, tn=64, tk=16, dtype="float16")
    src = CudaBackend(cuda_cpp=False).codegen(wide.plan)
    splits = {
        n: _kernels_table(v.text)["gated_mlp"].get("split") for n, v in src.triton_variants.items()
    }
    assert [splits[n] for n in ("triton_split", "triton_split_half", "triton_split_quarter")] == [
        8,
        4,
        2,
    ]
    # one block per SM: the quarter keeps the default pipeline depth whatever the plan's
    # shared-memory estimate allows, wherever Triton's own buffers for it fit
    quarter = _kernels_table(src.triton_variants["triton_split_quarter"].text)["gated_mlp"]
    assert quarter["num_stages"] == DEFAULT_STAGES
    assert (
        "triton_split_quarter" not in CudaBackend(interpret=True).codegen(wide.plan).triton_variants
    )

    attn = plans.attention_fused(batch=16, rows=4, d=128, kv_len=4096, tl=32, dtype="float16")
    src = CudaBackend(cuda_cpp=False).codegen(attn.plan)
    tables = {n: _kernels_table(v.text) for n, v in src.triton_variants.items()}
    assert set(tables) == {"triton_split"}
    assert tables["triton_split"]["attn"]["split"] == 16  # 16 blocks, capped
    interp = CudaBackend(interpret=True, cuda_cpp=False).codegen(attn.plan)
    assert set(interp.triton_variants) == {"triton_split"}

    # qknorm's normalised K tile: the split printing also multiplies it raw (its own variant)
    qk = plans.gqa_decode(bb=16, group=4, d=128, kv_len=4096, splits=1, tl=64, qk_norm=True)
    src = CudaBackend(cuda_cpp=False).codegen(qk.plan)
    assert set(src.triton_variants) == {"triton_split", "triton_split_scaled"}
    scaled = src.triton_variants["triton_split_scaled"]
    assert scaled.options.scale_after_dot and scaled.options.split_loop
    assert not src.triton_variants["triton_split"].options.scale_after_dot
    assert "t2e = tl.load(" in scaled.text and "t2e = tl.load(" not in src.triton.text


@pytest.mark.parametrize(("h", "want"), [(192, 3), (224, 3), (512, 5)])
def test_a_deep_printing_of_a_short_loop_keeps_the_default_depth(h: int, want: int) -> None:
    """Deeper than the default only where the loop runs at least twice as many iterations:
    on an H200 (Triton 3.6) a LoRA kernel looping 5 + 1 masked times computed wrong values
    or faulted at 4 and 5 stages. 192 and 224 rows of 32 (6 and 7 iterations, the last one
    masked) keep 3; 512 (16) gets the deep 5."""
    from yirage.plan import parse_plan
    from yirage_triton import DEEP_STAGES, TritonOptions, generate_triton

    case = plans.rmsnorm_linear(h=h, tk=32)
    (k,) = parse_plan(case.plan).generated
    deep = TritonOptions(max_stages=DEEP_STAGES)
    assert _kernels_table(generate_triton(case.plan, deep).text)[k.name]["num_stages"] == want
