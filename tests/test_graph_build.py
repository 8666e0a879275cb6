"""Building kernel and thread-block graphs through the public API."""

from __future__ import annotations

import pytest

import yirage as yr


def test_api_example_builds_with_expected_shapes() -> None:
    g = yr.new_kernel_graph()
    x = g.new_input(dims=(8, 4096), dtype=yr.float16)
    w = g.new_input(dims=(4096, 6144), dtype=yr.float16)
    o = g.matmul(g.rms_norm(x, normalized_shape=(4096,)), w)
    g.mark_output(o)
    assert (x.dims, x.dtype, x.num_dims) == ((8, 4096), yr.float16, 2)
    assert o.dims == (8, 6144)
    assert g.inputs == [x, w]
    assert g.outputs == [o]
    assert repr(o) == f"DTensor(id={o.id}, dims=(8, 6144), dtype=float16)"
    text = repr(g)
    assert "rms_norm" in text and "matmul" in text and "[8,6144]" in text

    g2 = yr.new_kernel_graph()
    x2 = g2.new_input(dims=(8, 4096), dtype=yr.float16)
    w2 = g2.new_input(dims=(4096, 6144), dtype=yr.float16)
    tb = yr.new_threadblock_graph(
        grid_dim=(48, 1, 1), block_dim=(128, 1, 1), forloop_range=16, reduction_dimx=64
    )
    bx = tb.new_input(x2, input_map=(-1, -1, -1), forloop_dim=1)
    bw = tb.new_input(w2, input_map=(1, -1, -1), forloop_dim=0)
    assert bx.dims == (8, 256) and bw.dims == (256, 128)
    acc_m = tb.forloop_accum(tb.matmul(bx, bw))
    acc_r = tb.forloop_accum(bx, "rms")
    assert acc_m.dims == (8, 128) and acc_r.dims == (8, 1)
    assert tb.new_output(tb.div(acc_m, acc_r), output_map=(1, -1, -1)) == 0
    assert tb.output_dims() == [(8, 6144)]
    assert (tb.grid_dim, tb.block_dim, tb.forloop_range, tb.reduction_dimx) == (
        (48, 1, 1),
        (128, 1, 1),
        16,
        64,
    )
    assert (tb.num_inputs, tb.num_outputs) == (2, 1)
    (o2,) = g2.customized([x2, w2], tb)
    g2.mark_output(o2)
    assert o2.dims == (8, 6144)
    assert "customized" in repr(g2)


@pytest.mark.parametrize("dtype", [yr.float16, yr.bfloat16, yr.float32])
def test_dtypes_propagate(dtype: yr.DType) -> None:
    g = yr.new_kernel_graph()
    a = g.new_input((2, 3), dtype=dtype)
    assert g.exp(a).dtype is dtype
    assert g.reduction(a, 0).dtype is dtype


def test_dtype_objects() -> None:
    assert (yr.float16.itemsize, yr.bfloat16.itemsize, yr.float32.itemsize) == (2, 2, 4)
    assert yr.float16.numpy_dtype is not None and yr.float16.numpy_dtype.name == "float16"
    assert yr.bfloat16.numpy_dtype is None  # numpy has no bfloat16
    assert repr(yr.float32) == "yirage.float32"


def test_negative_dims_are_normalised() -> None:
    g = yr.new_kernel_graph()
    a = g.new_input((3, 4, 5))
    assert g.reduction(a, -1).dims == g.reduction(a, 2).dims == (3, 4, 1)
    assert g.softmax(a).dims == (3, 4, 5)
    assert [t.dims for t in g.chunk(a, 2, -2)] == [(3, 2, 5), (3, 2, 5)]
    assert g.concat([a, a], -3).dims == (6, 4, 5)
    assert "reduction(t0, dim=2)" in repr(g)  # stored normalised


def test_single_int_dims_and_lists() -> None:
    g = yr.new_kernel_graph()
    assert g.new_input(7).dims == (7,)
    assert g.new_input([2, 3]).dims == (2, 3)


def test_tensor_identity() -> None:
    g = yr.new_kernel_graph()
    a = g.new_input((2, 2))
    assert g.inputs[0] == a and hash(g.inputs[0]) == hash(a)
    other = yr.new_kernel_graph()
    assert other.new_input((2, 2)) != a
    assert a.graph is g


def test_broadcasting_shapes() -> None:
    g = yr.new_kernel_graph()
    a, b = g.new_input((4, 1, 6)), g.new_input((1, 3, 6))
    for op in (g.add, g.sub, g.mul, g.div, g.pow):
        assert op(a, b).dims == (4, 3, 6)


def test_rms_norm_weight_and_softmax_shapes() -> None:
    g = yr.new_kernel_graph()
    x, w = g.new_input((4, 16)), g.new_input((16,))
    assert g.rms_norm(x, 16, weight=w, eps=1e-5).dims == (4, 16)
    assert g.softmax(x, dim=0).dims == (4, 16)


def test_graph_from_json_has_usable_tensors() -> None:
    g = yr.new_kernel_graph()
    a = g.new_input((2, 3))
    g.mark_output(g.exp(a))
    back = yr.KernelGraph.from_json(g.to_json())
    (inp,) = back.inputs
    back.mark_output(back.neg(inp))  # a loaded graph can be extended
    assert len(back.outputs) == 2
