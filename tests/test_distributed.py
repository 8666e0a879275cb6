"""search(..., executor="ray"): the search sharded over a local Ray cluster.

The merged candidates of a deterministic sharded search must be exactly the local search's
(hash for hash, in order); a shard whose worker process dies is retried by Ray and the
report says so; a missing Ray names the extra to install.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from _pinned_spec import REFERENCE_CPU

import yirage as yr
from yirage import _core, _distributed, _workloads

ray = pytest.importorskip("ray")

#: The searched bench workloads at their CPU (CI) size, cheapest first.
WORKLOADS = ["rmsnorm_linear", "lora", "gated_mlp", "gqa_decode", "qknorm_gqa"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _search(name: str, **kw: Any) -> yr.SearchResult:
    w = _workloads.get_workload(name)
    return yr.search(
        w.graph("cpu"),
        config=w.search_config,
        device_spec=REFERENCE_CPU,
        deterministic=True,
        time_limit=None,
        cache=False,
        **kw,
    )


@pytest.mark.parametrize("name", WORKLOADS)
def test_sharded_search_equals_the_local_search(cluster: None, name: str) -> None:
    local = _search(name)
    sharded = _search(name, executor="ray")
    assert local.report.stop_reason == "exhausted"
    assert [c.hash for c in sharded.candidates] == [c.hash for c in local.candidates]
    assert [c.predicted_us for c in sharded.candidates] == [
        c.predicted_us for c in local.candidates
    ]
    assert sharded.report.stop_reason == local.report.stop_reason
    dist = sharded.report.distribution
    assert dist is not None and dist["executor"] == "ray"
    assert [s["index"] for s in dist["shards"]] == list(range(4))  # 2 x the cluster's CPUs
    assert dist["retried"] == []
    assert "ray: 4 shards" in str(sharded.report)


def test_superoptimize_accepts_the_ray_executor(cluster: None) -> None:
    w = _workloads.get_workload("rmsnorm_linear")
    g = w.graph("cpu")
    rep = yr.superoptimize(g, device_spec=REFERENCE_CPU, executor="ray", cache=False).report
    assert rep.search["distribution"]["executor"] == "ray"
    assert [s["index"] for s in rep.search["distribution"]["shards"]] == list(range(4))


def test_a_killed_worker_is_retried_and_reported(cluster: None) -> None:
    w = _workloads.get_workload("rmsnorm_linear")
    spec_json, _ = yr._search.device_spec_json(REFERENCE_CPU, None)
    opts = json.dumps({"deterministic": True, "time_limit_s": None, "threads": 1})
    raw, dist = _distributed.run_sharded(
        w.graph("cpu")._g, spec_json, opts, shards=3, _crash_shards=(1,)
    )
    local = _core.search(w.graph("cpu")._g, spec_json, opts)
    assert dist["retried"] == [1]
    runs = dist["shards"]
    assert [r["attempts"] for r in runs] == [1, 2, 1]
    assert all(r["pid"] != os.getpid() for r in runs)
    assert [c.hash for c in raw.candidates] == [c.hash for c in local.candidates]


def test_a_search_never_returns_a_partial_merge() -> None:
    w = _workloads.get_workload("rmsnorm_linear")
    g = w.graph("cpu")._g
    spec_json, _ = yr._search.device_spec_json(REFERENCE_CPU, None)
    opts = json.dumps({"deterministic": True, "time_limit_s": None})
    shards = [_core.search_shard(g, spec_json, opts, i, 3) for i in range(3)]
    with pytest.raises(yr.YirageError, match="every shard exactly once"):
        _core.merge_search_shards(g, spec_json, opts, shards[:2], 0.0)
    with pytest.raises(yr.YirageError, match="shard index 3"):
        _core.search_shard(g, spec_json, opts, 3, 3)


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without Ray imports
    g = _workloads.get_workload("rms_norm").graph("cpu")
    with pytest.raises(yr.ConfigError, match=r"pip install 'yirage\[ray\]'"):
        yr.search(g, device_spec=REFERENCE_CPU, executor="ray", cache=False)


def test_unknown_executor_is_a_config_error() -> None:
    g = _workloads.get_workload("rms_norm").graph("cpu")
    with pytest.raises(yr.ConfigError, match="'local' or 'ray'"):
        yr.search(g, device_spec=REFERENCE_CPU, executor="dask", cache=False)


def test_projected_speedup_assigns_longest_shards_first() -> None:
    # shards 4, 3, 3, 2 on 2 workers: {4, 2} and {3, 3} -> 6; one worker: 12; merge 1 s
    assert _distributed.projected_speedup([3.0, 4.0, 2.0, 3.0], 2, merge_s=1.0) == 13.0 / 7.0
    assert _distributed.projected_speedup([3.0, 4.0, 2.0, 3.0], 8) == 12.0 / 4.0
    with pytest.raises(yr.ConfigError, match="workers must be"):
        _distributed.projected_speedup([1.0], 0)


def test_shard_balance_on_the_unnarrowed_gqa_search(cluster: None) -> None:
    """GQA decode without its preset (up to four kernels: 53 first-level moves) in 16
    shards: the report's longest share and projections follow from the shard times, and the
    merged candidates are still the local search's."""
    w = _workloads.get_workload("gqa_decode")
    g = w.graph("cpu")
    spec_json, _ = yr._search.device_spec_json(REFERENCE_CPU, None)
    opts = json.dumps({"deterministic": True, "time_limit_s": None, "threads": 1})
    raw, dist = _distributed.run_sharded(g._g, spec_json, opts, shards=16)
    local = _core.search(g._g, spec_json, opts)
    assert [c.hash for c in raw.candidates] == [c.hash for c in local.candidates]
    times = [s["elapsed_s"] for s in dist["shards"]]
    assert dist["longest_share"] == max(times) / sum(times)
    for n, speedup in dist["projected_speedup"].items():
        assert speedup == _distributed.projected_speedup(times, int(n), dist["merge_s"])
        assert 1.0 <= speedup <= 1.0 / dist["longest_share"] + 1e-9
    print(json.dumps({k: v for k, v in dist.items() if k != "shards"}, indent=1))


def test_the_search_report_names_a_retried_shard(
    cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _distributed.run_sharded

    def crash_shard_1(*args: Any, **kw: Any) -> Any:
        return real(*args, **kw, _crash_shards=(1,))

    monkeypatch.setattr(_distributed, "run_sharded", crash_shard_1)
    res = _search("rms_norm", executor="ray")
    assert res.report.distribution is not None
    assert res.report.distribution["retried"] == [1]
    assert any("shard 1 was retried by Ray" in n for n in res.report.notes)
    assert "retried [1]" in str(res.report)
    assert [c.hash for c in res.candidates] == [c.hash for c in _search("rms_norm").candidates]
