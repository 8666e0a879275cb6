"""The default search: what it finds for the bench workloads, and the verification budget
that bounds the work of large fingerprint checks (docs/api.md, "Verification budget")."""

from __future__ import annotations

import pytest
from _search_graphs import H100, rmsnorm_linear

import yirage as yr
from yirage import _workloads

#: Bench workloads whose default search the test below runs at their CI size ("cpu" preset).
#: Left out: qknorm_gqa and attention_prefill, whose unrestricted enumerations (up to four
#: kernel ops; 37 s for attention_prefill's CI size with the pinned H100 spec) come near or
#: run into the enumeration's share of the time limit on a 2-core host, so what they find
#: there depends on the clock (benchmarks/README.md, "Default search time per bench case").
DEFAULT_SEARCH_WORKLOADS = (
    "rmsnorm_linear",
    "rms_norm",
    "norm_transformer",
    "gated_mlp",
    "lora",
    "gqa_decode",
)


@pytest.mark.parametrize("name", DEFAULT_SEARCH_WORKLOADS)
def test_default_options_find_a_fused_kernel_for_each_bench_workload(name: str) -> None:
    """No preset, no options: the search still finds a generated (fused) kernel for each
    decode-sized workload, with the pinned H100 spec, as the bench (no presets) relies on."""
    wl = _workloads.get_workload(name)
    res = yr.search(wl.graph("cpu"), device_spec=H100, cache=False)
    fused = [c for c in res.candidates if not c.baseline and "custom[" in c.label]
    assert fused, (res.report.stop_reason, [c.label for c in res.candidates])
    assert res.report.stop_reason in ("exhausted", "time_limit")


def _search_rmsnorm_linear(**options: object) -> yr.SearchResult:
    # 8 x 4096 x 1536 at full size: 50 M multiply-adds per check, above the size the budget
    # always lets through
    return yr.search(
        rmsnorm_linear(8, 4096, 1536),
        device_spec=H100,
        cache=False,
        verify_full_size=True,
        **options,
    )


def test_the_verification_budget_leaves_large_checks_out_and_says_so() -> None:
    """With no work left for large checks none is started: only the baseline comes back, the
    stop reason says the verification's limit cut the search short and a note says how many
    were left out; without the limit the same search verifies fused candidates to the end."""
    cut = _search_rmsnorm_linear(verify_work_limit=0)
    assert [c.baseline for c in cut.candidates] == [True]
    assert cut.report.stop_reason == "verify_limit"
    assert cut.report.fingerprint_tests == 0
    assert any("left unverified" in n and "verify_work_limit" in n for n in cut.report.notes)

    free = _search_rmsnorm_linear(verify_work_limit=None)
    assert free.report.stop_reason == "exhausted"
    assert any(not c.baseline for c in free.candidates)
    assert not any("left unverified" in n for n in free.report.notes)


def test_small_checks_are_never_held_back() -> None:
    """At test sizes every check is small: a zero limit changes nothing."""
    g = rmsnorm_linear(8, 256, 384)
    a = yr.search(g, device_spec=H100, cache=False, verify_work_limit=0)
    b = yr.search(g, device_spec=H100, cache=False, verify_work_limit=None)
    assert a.report.stop_reason == b.report.stop_reason == "exhausted"
    assert [c.hash for c in a.candidates] == [c.hash for c in b.candidates]


def test_the_verification_limit_is_the_stop_reason_when_it_cut_the_search() -> None:
    """max_verify fingerprint tests with fewer than top_k verified and candidates left: the
    stop reason says so (it read "exhausted", or "no_candidates" when none had passed)."""
    g = rmsnorm_linear(8, 256, 384)
    cut = yr.search(g, device_spec=H100, cache=False, max_verify=1)
    assert cut.report.stop_reason == "verify_limit"
    assert cut.report.fingerprint_tests == 1
    assert any("max_verify = 1" in n for n in cut.report.notes)
    whole = yr.search(g, device_spec=H100, cache=False)
    assert whole.report.stop_reason == "exhausted" and whole.report.fingerprint_tests > 1


def test_a_negative_verification_budget_is_refused_with_the_option_named() -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(yr.ConfigError, match="verify_work_limit"):
            yr.search(rmsnorm_linear(), device_spec=H100, cache=False, verify_work_limit=bad)


def test_every_entry_point_has_the_same_default_top_k() -> None:
    import inspect

    from yirage import _search, export

    entry_points = (
        yr.search,
        yr.superoptimize,
        yr.KernelGraph.superoptimize,
        export.export_kernels,
    )
    defaults = {
        f.__qualname__: inspect.signature(f).parameters["top_k"].default for f in entry_points
    }
    assert set(defaults.values()) == {_search.DEFAULT_TOP_K}, defaults


def test_the_last_slot_goes_to_another_close_family() -> None:
    """LoRA at 16 rows on the pinned H200: the leading family (B multiplied after the loop,
    its tilings and split-K forms) would fill every slot; the form multiplying by B inside the
    loop, estimated 11 % slower, gets the last one."""
    from yirage.devices import get_device_spec

    g = _workloads.get_workload("lora").graph("gpu")
    res = yr.search(g, device_spec=get_device_spec("H200"), cache=False)
    fused = [c.label for c in res.candidates if not c.baseline]
    assert len(fused) == 5, fused
    assert any("matmul,matmul,matmul,add,accum_iter" in lab for lab in fused), fused
    assert sum("matmul,matmul,accum_iter,accum_iter,matmul,add" in lab for lab in fused) == 4


def test_a_masked_single_kernel_gets_the_slot_owed_to_the_fewest_kernels() -> None:
    """GQA decode (32 KV groups of 4 query rows, d 128) over 6000 keys, which no power-of-two
    loop range divides, on the pinned H200: every candidate has masked tiles. The single
    kernel walking the keys in masked power-of-two tiles must be among the default top-k: on
    an H200 it ran 28.8-31.8 µs, the two-kernel forms 37-48 µs. It was once left out, when
    the slot owed to unmasked candidates went to another two-kernel tiling (the slot rules
    themselves have the core's tests)."""
    from yirage.devices import get_device_spec

    s = {"b": 4, "q_heads": 32, "kv_heads": 8, "d": 128, "kv": 6000}
    g = _workloads.get_workload("gqa_decode")._build(s, yr.bfloat16)
    res = yr.search(g, device_spec=get_device_spec("H200"), cache=False)
    fused = [c.label for c in res.candidates if not c.baseline]
    assert len(fused) == 5, fused
    single = [lab for lab in fused if lab.count("custom[") == 1 and " ; " not in lab]
    assert single and all("exp,matmul" in lab for lab in single), fused
    # 94 tiles of 64 or 47 of 128, the last one masked
    assert any("loop=94:" in lab or "loop=47:" in lab for lab in single), fused
