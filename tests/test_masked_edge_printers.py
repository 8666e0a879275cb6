"""Every printer of the repository prints plans with masked edge tiles, each guarding its
loads and stores against the extent (their numbers are tested per printer: the Triton
interpreter, the CPU build, the CUDA C++ and Metal emulations, Pallas interpret mode); a
printer outside it that does not mask refuses them through ``yirage.plan.refuse_masked``
(a CodegenError naming the kernel, the access and the fix) instead of printing loads and
stores past the buffer."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
from _search_graphs import H100

import yirage as yr
from yirage.plan import CodegenError, parse_plan, refuse_masked


def _masked_plan() -> dict[str, Any]:
    """A fused gated MLP whose 300 columns are cut into 19 blocks of 16 (the last owns 12)."""
    g = yr.new_kernel_graph()
    x = g.new_input((8, 200), yr.float32)
    w1, w2 = g.new_input((200, 300), yr.float32), g.new_input((200, 300), yr.float32)
    g.mark_output(g.mul(g.silu(g.matmul(x, w1)), g.matmul(x, w2)))
    r = yr.search(g, device_spec=H100, config="mlp", top_k=1, cache=False)
    plan: dict[str, Any] = r.candidates[0].kernel_plan().to_dict()
    assert any(k.masked_accesses for k in parse_plan(plan).generated), r.candidates[0].label
    return plan


def _printer(module: str, name: str) -> Callable[[Any], Any]:
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - the vendor package is not installed
        pytest.skip(f"{module} is not installed: {exc}")
    fn: Callable[[Any], Any] = getattr(mod, name)
    return fn


def test_a_printer_that_does_not_mask_refuses_with_the_fix() -> None:
    with pytest.raises(CodegenError, match="my printer does not print masked edge tiles") as e:
        refuse_masked(parse_plan(_masked_plan()), "my printer")
    assert "tiles of 16 over an extent of 300" in str(e.value)
    assert "search for this backend's device spec" in str(e.value)


@pytest.mark.parametrize(
    ("module", "name", "guard"),
    [
        ("yirage_cuda._cuda_codegen", "generate_cuda", "< 300"),
        ("yirage_mps._msl_codegen", "generate_msl", "< 300"),
        ("yirage_tpu._pallas", "generate_pallas", "jnp.where(mk"),
    ],
)
def test_the_other_printers_print_masked_plans(module: str, name: str, guard: str) -> None:
    generate = _printer(module, name)
    printed = generate(_masked_plan())
    text = str(getattr(printed, "text", None) or getattr(printed, "code", None) or printed)
    assert guard in text  # a compare of the global column with the extent, or its mask


def test_the_triton_layer_masks_them() -> None:
    generate = _printer("yirage_triton", "generate_triton")
    text = generate(_masked_plan()).text
    assert "< 300" in text  # the loads and stores compare the global column with 300


@pytest.mark.parametrize(
    ("module", "backend"), [("yirage_rocm", "RocmBackend"), ("yirage_ascend", "AscendBackend")]
)
def test_the_triton_vendors_print_the_masks(module: str, backend: str) -> None:
    """ROCm and Ascend print through the shared Triton layer: every printing they keep masks
    the edge (the compare against the extent is in each), none drops it."""
    cls = _printer(module, backend)
    printed = cls(interpret=True).codegen(_masked_plan())  # type: ignore[call-arg]
    texts = [printed.code, *(v.text for v in printed.triton_variants.values())]
    assert all("< 300" in t for t in texts), [t.count("< 300") for t in texts]
