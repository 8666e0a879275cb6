"""KernelPlan parsing: the fixture plans compute their workloads; malformed plans are refused
with messages that name the kernel and the problem."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import plans
import pytest
from _plan_ref import run_plan

import yirage as yr
from yirage.plan import PlanError, parse_plan

CASES = plans.small_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fixture_plans_compute_their_workload(case: plans.Case) -> None:
    xs = case.random_inputs(7)
    got = run_plan(case.plan, xs)
    for g, r in zip(got, case.reference(*xs), strict=True):
        assert np.linalg.norm(g - r) <= 1e-12 * max(1.0, float(np.linalg.norm(r)))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fixture_plans_parse(case: plans.Case) -> None:
    p = parse_plan(json.dumps(case.plan))
    assert p.graph_hash == case.plan["graph_hash"]
    assert [b.dims for b in p.inputs] == [dims for dims, _ in case.inputs]
    assert parse_plan(p) is p


def _plan() -> dict[str, Any]:
    return copy.deepcopy(plans.rmsnorm_linear().plan)


def _mutate(path: str, value: Any) -> dict[str, Any]:
    p = _plan()
    obj: Any = p
    keys = path.split(".")
    for k in keys[:-1]:
        obj = obj[int(k)] if k.isdigit() else obj[k]
    last = keys[-1]
    if value is _DELETE:
        del obj[last]
    elif last.isdigit():
        obj[int(last)] = value
    else:
        obj[last] = value
    return p


_DELETE = object()

BAD = [
    ("format", "something.else", "format"),
    ("version", 4, "version 4 is not supported"),
    ("version", 2, "version 2 lacks the analyses"),
    ("buffers.0.dtype", "float64", "dtype 'float64'"),
    ("buffers.0.role", "weird", "role 'weird'"),
    ("kernels.0.kind", "magic", "kind 'magic'"),
    ("kernels.0.ops.2.args", [0, 9], "arg 9 is not an earlier op"),
    ("kernels.0.ops.2.dims", [8, 17], "dims [8, 17] but the operands give [8, 16]"),
    ("kernels.0.ops.0.phase", "sometimes", "phase 'sometimes'"),
    ("kernels.0.ops.3.acc", "max", "unknown accumulator 'max'"),
    ("kernels.0.ops.5.binop", "mod", "unknown binary op 'mod'"),
    ("kernels.0.inputs.1.tile", [32, 32], "reaches 784 > buffer 1 dim 768 (offset bx*16)"),
    ("kernels.0.inputs.0.offsets", [[{"var": "q", "stride": 1}], []], "offset var 'q'"),
    ("kernels.0.outputs.0.src", 2, "outputs store values after the loop"),
    ("kernels.0.outputs.0.buffer", 0, "graph input"),
    ("kernels.0.grid", [0, 1, 1], "grid must be ≥ 1"),
    ("kernels.0.ops.4.extent", _DELETE, "missing field 'extent'"),
    ("buffers", [], "no output buffer"),
]


@pytest.mark.parametrize("path,value,message", BAD, ids=[b[0] + ":" + b[2][:20] for b in BAD])
def test_malformed_plans_are_refused(path: str, value: Any, message: str) -> None:
    with pytest.raises(PlanError, match=None) as err:
        parse_plan(_mutate(path, value))
    assert message in str(err.value), str(err.value)
    assert isinstance(err.value, yr.SerializationError)


def test_not_json_and_wrong_types() -> None:
    with pytest.raises(PlanError, match="not JSON"):
        parse_plan("{nope")
    with pytest.raises(PlanError, match="expected a JSON object"):
        parse_plan(42)


def test_mixing_loop_values_into_the_epilogue_is_refused() -> None:
    p = _plan()
    p["kernels"][0]["ops"][5]["args"] = [2, 4]  # the loop-phase matmul in an epilogue op
    with pytest.raises(PlanError, match="epilogue ops cannot use loop values"):
        parse_plan(p)


def test_reading_a_buffer_before_it_is_written_is_refused() -> None:
    p = copy.deepcopy(plans.lora().plan)
    p["kernels"] = p["kernels"][1:]
    with pytest.raises(PlanError, match="before any kernel wrote it"):
        parse_plan(p)
