"""Kernel graphs and thread-block graphs: the Python face of the native µGraph IR.

The native core (``yirage._core``) owns every semantic decision (shape rules, evaluation,
fingerprints, serialization). This module wraps integer tensor ids into ``DTensor`` /
``STensor`` objects, checks Python-level arguments (tensor ownership, types, dim
normalisation) and converts numpy arrays for the reference evaluator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from yirage import _compound, _core, _env
from yirage._checks import check_float, check_int, check_ints, check_positive, check_triple
from yirage._dtypes import DType, _check_dtype, _from_name, float16
from yirage._errors import EvaluationError, GraphError, MappingError, SerializationError, ShapeError

__all__ = [
    "DTensor",
    "KernelGraph",
    "STensor",
    "ThreadBlockGraph",
    "equivalent",
    "new_kernel_graph",
    "new_threadblock_graph",
]

_ACCUMULATORS = (None, "sum", "rms", "sum_todimx")
_DEFAULT_EPS = 1e-6

if TYPE_CHECKING:
    from yirage._backend import Backend
    from yirage._kernel import OptimizedKernel

T = TypeVar("T")

#: ``yirage.superoptimize``, registered by ``yirage._superoptimize`` when it is imported (the
#: package's ``__init__`` imports it, so it is there before any graph exists). The graph
#: module does not import the pipeline that takes graphs as input: no import circle.
_superoptimizer: Callable[..., OptimizedKernel] | None = None


def _register_superoptimizer(fn: Callable[..., OptimizedKernel]) -> None:
    """Called once by ``yirage._superoptimize``: what :meth:`KernelGraph.superoptimize` runs."""
    global _superoptimizer
    _superoptimizer = fn


class DTensor:
    """A tensor of a :class:`KernelGraph` (device memory level). Create it with the graph."""

    __slots__ = ("_graph", "_id")

    def __init__(self, graph: KernelGraph, id: int) -> None:
        self._graph = graph
        self._id = id

    @property
    def graph(self) -> KernelGraph:
        return self._graph

    @property
    def id(self) -> int:
        """The tensor's id, local to its graph."""
        return self._id

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(self._graph._g.tensor_dims(self._id))

    @property
    def dtype(self) -> DType:
        return _from_name(self._graph._g.tensor_dtype(self._id))

    @property
    def num_dims(self) -> int:
        return len(self.dims)

    def __repr__(self) -> str:
        return f"DTensor(id={self._id}, dims={self.dims}, dtype={self.dtype.name})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DTensor):
            return NotImplemented
        return self._graph is other._graph and self._id == other._id

    def __hash__(self) -> int:
        return hash((id(self._graph), self._id))


class STensor:
    """A tile of a :class:`ThreadBlockGraph` (shared memory level)."""

    __slots__ = ("_graph", "_id")

    def __init__(self, graph: ThreadBlockGraph, id: int) -> None:
        self._graph = graph
        self._id = id

    @property
    def graph(self) -> ThreadBlockGraph:
        return self._graph

    @property
    def id(self) -> int:
        return self._id

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(self._graph._g.tensor_dims(self._id))

    @property
    def dtype(self) -> DType:
        return _from_name(self._graph._g.tensor_dtype(self._id))

    @property
    def num_dims(self) -> int:
        return len(self.dims)

    def __repr__(self) -> str:
        return f"STensor(id={self._id}, dims={self.dims}, dtype={self.dtype.name})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, STensor):
            return NotImplemented
        return self._graph is other._graph and self._id == other._id

    def __hash__(self) -> int:
        return hash((id(self._graph), self._id))


class _ElementwiseOps(ABC, Generic[T]):
    """Element-wise operators shared by kernel and thread-block graphs."""

    @abstractmethod
    def _unary(self, op: str, x: T, params: Sequence[float] = ()) -> T: ...

    @abstractmethod
    def _binary(self, op: str, a: T, b: T) -> T: ...

    def exp(self, x: T) -> T:
        return self._unary("exp", x)

    def square(self, x: T) -> T:
        return self._unary("square", x)

    def sqrt(self, x: T) -> T:
        return self._unary("sqrt", x)

    def rsqrt(self, x: T) -> T:
        return self._unary("rsqrt", x)

    def silu(self, x: T) -> T:
        return self._unary("silu", x)

    def gelu(self, x: T) -> T:
        return self._unary("gelu", x)

    def relu(self, x: T) -> T:
        return self._unary("relu", x)

    def sigmoid(self, x: T) -> T:
        return self._unary("sigmoid", x)

    def tanh(self, x: T) -> T:
        return self._unary("tanh", x)

    def neg(self, x: T) -> T:
        return self._unary("neg", x)

    def clamp(self, x: T, min: float, max: float) -> T:
        """Clamp to ``[min, max]`` (finite bounds, min <= max)."""
        lo = check_float(min, "clamp min", GraphError)
        hi = check_float(max, "clamp max", GraphError)
        return self._unary("clamp", x, (lo, hi))

    def mul_scalar(self, x: T, scalar: float) -> T:
        return self._unary("mul_scalar", x, (check_float(scalar, "scalar", GraphError),))

    def add_scalar(self, x: T, scalar: float) -> T:
        """``x + scalar`` elementwise (subtract ``c`` with ``add_scalar(x, -c)``)."""
        return self._unary("add_scalar", x, (check_float(scalar, "scalar", GraphError),))

    def add(self, a: T, b: T) -> T:
        return self._binary("add", a, b)

    def sub(self, a: T, b: T) -> T:
        return self._binary("sub", a, b)

    def mul(self, a: T, b: T) -> T:
        return self._binary("mul", a, b)

    def div(self, a: T, b: T) -> T:
        return self._binary("div", a, b)

    def pow(self, a: T, b: T) -> T:
        return self._binary("pow", a, b)


class KernelGraph(_ElementwiseOps[DTensor]):
    """A kernel-level graph: device tensors connected by operators.

    Build one with :func:`new_kernel_graph`, add inputs with :meth:`new_input`, chain
    operators, and mark results with :meth:`mark_output`.

    With ``world_size`` N > 1 the graph is the program of one of N ranks (SPMD): inputs hold
    each rank's own data, every operator runs per rank, and :meth:`all_reduce` sums over the
    ranks.
    """

    def __init__(self, world_size: int = 1) -> None:
        self._g = _core.KernelGraph(check_int(world_size, "world_size", GraphError))

    @classmethod
    def _wrap(cls, core: _core.KernelGraph) -> KernelGraph:
        graph = cls.__new__(cls)
        graph._g = core
        return graph

    # -- helpers ---------------------------------------------------------------------------
    def _id(self, x: object, what: str = "tensor") -> int:
        if not isinstance(x, DTensor):
            raise GraphError(
                f"{what} must be a DTensor created by this graph, got {type(x).__name__}"
            )
        if x._graph is not self:
            raise GraphError(
                f"{what} {x!r} belongs to a different KernelGraph: use tensors created by this "
                "graph (its new_input() or its operators), or build the op in the tensor's own "
                "graph"
            )
        return x._id

    def _ids(self, xs: object, what: str) -> list[int]:
        if isinstance(xs, DTensor) or not isinstance(xs, Sequence):
            raise GraphError(f"{what} must be a list of DTensors, got {type(xs).__name__}")
        return [self._id(x, f"{what}[{i}]") for i, x in enumerate(xs)]

    def _t(self, tensor_id: int) -> DTensor:
        return DTensor(self, tensor_id)

    def _unary(self, op: str, x: DTensor, params: Sequence[float] = ()) -> DTensor:
        return self._t(self._g.unary(op, self._id(x), list(params)))

    def _binary(self, op: str, a: DTensor, b: DTensor) -> DTensor:
        return self._t(self._g.binary(op, self._id(a, "a"), self._id(b, "b")))

    # -- building --------------------------------------------------------------------------
    def new_input(self, dims: Sequence[int], dtype: DType = float16) -> DTensor:
        """Declare an input tensor of shape ``dims`` (1 to 4 positive ints)."""
        shape = check_ints(dims, "dims", ShapeError)
        dt = _check_dtype(dtype)
        return self._t(self._g.new_input(shape, dt.name))

    @property
    def world_size(self) -> int:
        """Number of ranks the graph's program runs on (1: a single device)."""
        return self._g.world_size

    def all_reduce(self, x: DTensor) -> DTensor:
        """The sum of ``x`` over the graph's ``world_size`` ranks, on every rank (a
        collective; the identity when ``world_size`` is 1)."""
        return self._t(self._g.all_reduce(self._id(x)))

    def matmul(self, a: DTensor, b: DTensor) -> DTensor:
        """Matrix product over the last two dims, batched over equal leading dims."""
        return self._t(self._g.matmul(self._id(a, "a"), self._id(b, "b")))

    def reduction(self, x: DTensor, dim: int) -> DTensor:
        """Sum over ``dim`` (kept with size 1); negative dims count from the end."""
        return self._t(self._g.reduction(self._id(x), check_int(dim, "dim", ShapeError)))

    def reduce_max(self, x: DTensor, dim: int) -> DTensor:
        """Max over ``dim`` (kept with size 1); NaN propagates, as in torch.amax."""
        return self._t(self._g.reduce_max(self._id(x), check_int(dim, "dim", ShapeError)))

    def rms_norm(
        self,
        x: DTensor,
        normalized_shape: int | Sequence[int],
        weight: DTensor | None = None,
        eps: float = _DEFAULT_EPS,
    ) -> DTensor:
        """``x / sqrt(mean(x**2 over normalized_shape) + eps)``, times ``weight`` if given
        (shape ``normalized_shape``, optionally with leading size-1 dims)."""
        xid = self._id(x)
        shape = check_ints(normalized_shape, "normalized_shape", ShapeError)
        wid = None if weight is None else self._id(weight, "weight")
        return self._t(self._g.rms_norm(xid, shape, wid, check_float(eps, "eps", GraphError)))

    def softmax(self, x: DTensor, dim: int = -1) -> DTensor:
        return self._t(self._g.softmax(self._id(x), check_int(dim, "dim", ShapeError)))

    def concat(self, xs: Sequence[DTensor], dim: int) -> DTensor:
        ids = self._ids(xs, "xs")
        return self._t(self._g.concat(ids, check_int(dim, "dim", ShapeError)))

    def chunk(self, x: DTensor, chunks: int, dim: int) -> list[DTensor]:
        """Split ``x`` into ``chunks`` equal parts along ``dim``."""
        xid = self._id(x)
        n = check_int(chunks, "chunks", ShapeError)
        return [self._t(t) for t in self._g.chunk(xid, n, check_int(dim, "dim", ShapeError))]

    def permute(self, x: DTensor, perm: Sequence[int]) -> DTensor:
        """Reorder the dims: output dim ``i`` is ``x``'s dim ``perm[i]`` (elements move)."""
        xid = self._id(x)
        return self._t(self._g.permute(xid, check_ints(perm, "perm", ShapeError)))

    def transpose(self, x: DTensor, dim0: int, dim1: int) -> DTensor:
        """Swap two dims (a :meth:`permute`)."""
        d0, d1 = check_int(dim0, "dim0", ShapeError), check_int(dim1, "dim1", ShapeError)
        n = x.num_dims if isinstance(x, DTensor) else 0
        perm = list(range(n))
        if n and -n <= d0 < n and -n <= d1 < n:
            perm[d0], perm[d1] = perm[d1], perm[d0]
        else:
            perm = [d0, d1]  # the core names the out-of-range dim
        return self.permute(x, perm)

    def reshape(self, x: DTensor, dims: Sequence[int]) -> DTensor:
        """The same elements in row-major order under ``dims`` (equal element count)."""
        xid = self._id(x)
        return self._t(self._g.reshape(xid, check_ints(dims, "dims", ShapeError)))

    def customized(self, inputs: Sequence[DTensor], tb: ThreadBlockGraph) -> list[DTensor]:
        """A graph-defined operator running the thread-block graph ``tb`` on ``inputs``."""
        if not isinstance(tb, ThreadBlockGraph):
            raise GraphError(
                f"customized() needs a ThreadBlockGraph (yirage.new_threadblock_graph), "
                f"got {type(tb).__name__}"
            )
        ids = self._ids(inputs, "inputs")
        return [self._t(t) for t in self._g.customized(ids, tb._g)]

    # -- compound builders (yirage._compound): model blocks as the primitives above ---------
    def layer_norm(
        self,
        x: DTensor,
        normalized_shape: int | Sequence[int],
        weight: DTensor | None = None,
        bias: DTensor | None = None,
        eps: float = 1e-5,
    ) -> DTensor:
        """``(x - mean) / sqrt(var + eps) * weight + bias`` over the trailing
        ``normalized_shape`` dims (biased variance, as torch's layer_norm)."""
        return _compound.layer_norm(self, x, normalized_shape, weight, bias, eps)

    def gemm_layernorm(
        self,
        x: DTensor,
        w: DTensor,
        weight: DTensor | None = None,
        bias: DTensor | None = None,
        eps: float = 1e-5,
    ) -> DTensor:
        """``layer_norm(x @ w)`` over the last dim (``weight``, ``bias`` [n] if given)."""
        return _compound.gemm_layernorm(self, x, w, weight, bias, eps)

    def rms_norm_linear(
        self, x: DTensor, w: DTensor, weight: DTensor | None = None, eps: float = _DEFAULT_EPS
    ) -> DTensor:
        """``rms_norm(x) @ w`` (``weight`` [h] scales the normalised ``x`` if given)."""
        return _compound.rms_norm_linear(self, x, w, weight, eps)

    def gated_mlp(
        self, x: DTensor, w_gate: DTensor, w_up: DTensor, activation: str = "silu"
    ) -> DTensor:
        """``act(x @ w_gate) * (x @ w_up)``; ``activation``: "silu", "gelu" or "relu"."""
        return _compound.gated_mlp(self, x, w_gate, w_up, activation)

    def lora_linear(
        self, x: DTensor, w: DTensor, a: DTensor, b: DTensor, scale: float = 1.0
    ) -> DTensor:
        """``x @ w + scale * (x @ a) @ b`` (a rank-r adapter on a frozen weight)."""
        return _compound.lora_linear(self, x, w, a, b, scale)

    def gemm_softmax(self, a: DTensor, b: DTensor, scale: float | None = None) -> DTensor:
        """``softmax(scale * (a @ b))`` over the last dim."""
        return _compound.gemm_softmax(self, a, b, scale)

    def self_attention(
        self,
        q: DTensor,
        kt: DTensor,
        v: DTensor,
        scale: float | None = None,
        qk_norm: bool = False,
        eps: float = _DEFAULT_EPS,
    ) -> DTensor:
        """``softmax(scale * q @ kt) @ v`` (keys transposed; GQA with the query heads of one
        key/value head along q's rows; optional QK-norm). See ``yirage._compound``."""
        return _compound.self_attention(self, q, kt, v, scale, qk_norm, eps)

    def mark_output(self, x: DTensor) -> None:
        """Mark ``x`` as an output of the graph."""
        self._g.mark_output(self._id(x, "output"))

    # -- inspection ------------------------------------------------------------------------
    @property
    def inputs(self) -> list[DTensor]:
        return [self._t(t) for t in self._g.inputs()]

    @property
    def outputs(self) -> list[DTensor]:
        return [self._t(t) for t in self._g.outputs()]

    def describe(self) -> str:
        """One line per operator."""
        return self._g.describe()

    def __repr__(self) -> str:
        return self._g.describe().rstrip("\n")

    # -- semantics -------------------------------------------------------------------------
    def evaluate(self, inputs: Sequence[npt.ArrayLike]) -> list[npt.NDArray[np.float64]]:
        """Run the float64 reference evaluator; one array per input, in declaration order.

        Arrays of any real dtype are accepted (converted to float64); returns one float64
        array per output. For ``world_size`` N > 1 every array has a leading rank axis,
        ``(N, *dims)`` (entry r is rank r's input), and so has every output."""
        in_ids = self._g.inputs()
        if not isinstance(inputs, (list, tuple)):
            raise EvaluationError(
                f"evaluate() takes a list of {len(in_ids)} arrays, got {type(inputs).__name__}"
            )
        ws = self._g.world_size
        expected = [tuple(self._g.tensor_dims(t)) for t in in_ids]
        if len(inputs) != len(in_ids):
            raise EvaluationError(
                f"the graph has {len(in_ids)} inputs with dims {expected}, "
                f"but {len(inputs)} arrays were given"
            )
        payload: list[tuple[bytes, list[int]]] = []
        for i, (array, dims) in enumerate(zip(inputs, expected, strict=True)):
            arr = _as_float64(array, i, (ws, *dims) if ws > 1 else dims)
            if ws > 1 and arr.shape != (ws, *dims):
                raise ShapeError(
                    f"input {i} has shape {arr.shape}; this graph runs on {ws} ranks, so "
                    f"evaluate() takes each input with a leading rank axis: expected shape "
                    f"{(ws, *dims)} (one {dims} array per rank)"
                )
            if ws == 1 and arr.shape != dims:
                raise EvaluationError(f"input {i} has shape {arr.shape}; expected dims {dims}")
            payload.append((np.ascontiguousarray(arr, dtype="<f8").tobytes(), list(dims)))
        results = self._g.evaluate(payload)
        lead = (ws,) if ws > 1 else ()
        return [
            np.frombuffer(data, dtype="<f8").reshape(*lead, *dims).astype(np.float64, copy=True)
            for data, dims in results
        ]

    def fingerprint(self, trials: int = 2, seed: int = 0, threads: int | None = None) -> str:
        """Hex digest of the outputs' finite-field fingerprints over ``trials`` seeded trials.

        Identical for any ``threads`` (default: ``YIRAGE_THREADS`` or all cores)."""
        t = check_positive(trials, "trials", EvaluationError)
        s = _check_seed(seed)
        n = (
            _env.threads()
            if threads is None
            else check_positive(threads, "threads", EvaluationError)
        )
        return self._g.fingerprint(t, s, n)

    def to_json(self) -> str:
        """The canonical JSON serialization."""
        return self._g.to_json()

    @classmethod
    def from_json(cls, s: str) -> KernelGraph:
        if not isinstance(s, str):
            raise SerializationError(f"from_json() takes a str, got {type(s).__name__}")
        return cls._wrap(_core.KernelGraph.from_json(s))

    def hash(self) -> str:
        """Stable content hash (hex) of the canonical JSON; equal on every platform."""
        return self._g.hash()

    def superoptimize(
        self,
        backend: str | Backend | None = None,
        config: object = None,
        top_k: int = 5,  # yirage._search.DEFAULT_TOP_K (which imports this module)
        check: bool = True,
        **search_options: Any,
    ) -> OptimizedKernel:
        """Search, compile, check and profile this graph on ``backend``; see
        :func:`yirage.superoptimize`."""
        if _superoptimizer is None:  # only when yirage._graph is loaded without yirage
            raise RuntimeError("import yirage before calling KernelGraph.superoptimize")
        return _superoptimizer(self, backend, config, top_k, check, **search_options)


class ThreadBlockGraph(_ElementwiseOps[STensor]):
    """A thread-block graph: what one block of a customized operator computes.

    ``grid_dim`` blocks run it; each iterates ``forloop_range`` times over slices of its
    inputs; accumulators (:meth:`forloop_accum`) collect across iterations and outputs are
    written once after the loop.
    """

    def __init__(
        self,
        grid_dim: Sequence[int],
        block_dim: Sequence[int],
        forloop_range: int,
        reduction_dimx: int,
        forloop_tile: int | None = None,
    ) -> None:
        grid = check_triple(grid_dim, "grid_dim", MappingError)
        block = check_triple(block_dim, "block_dim", MappingError)
        loop = check_int(forloop_range, "forloop_range", MappingError)
        dimx = check_int(reduction_dimx, "reduction_dimx", MappingError)
        tile = forloop_tile
        if tile is not None:
            tile = check_int(tile, "forloop_tile", MappingError)
        self._g = _core.BlockGraph(grid, block, loop, dimx, tile)

    @property
    def grid_dim(self) -> tuple[int, int, int]:
        return self._g.grid_dim

    @property
    def block_dim(self) -> tuple[int, int, int]:
        return self._g.block_dim

    @property
    def forloop_range(self) -> int:
        return self._g.forloop_range

    @property
    def forloop_tile(self) -> int | None:
        """The loop's tile along walked dims when it differs from ``ceil(extent /
        forloop_range)`` (set by ``forloop_tile=``: a power of two walks a dim no range
        divides in aligned tiles), else None."""
        return self._g.forloop_tile

    @property
    def reduction_dimx(self) -> int:
        return self._g.reduction_dimx

    @property
    def num_inputs(self) -> int:
        return self._g.num_inputs()

    @property
    def num_outputs(self) -> int:
        return self._g.num_outputs()

    def output_dims(self) -> list[tuple[int, ...]]:
        """Kernel-level dims of each output (tile dims times grid along the output map)."""
        return [tuple(d) for d in self._g.output_dims()]

    def __repr__(self) -> str:
        return (
            f"ThreadBlockGraph(grid_dim={self.grid_dim}, block_dim={self.block_dim}, "
            f"forloop_range={self.forloop_range}, reduction_dimx={self.reduction_dimx}, "
            f"inputs={self.num_inputs}, outputs={self.num_outputs})"
        )

    # -- helpers ---------------------------------------------------------------------------
    def _id(self, x: object, what: str = "tile") -> int:
        if not isinstance(x, STensor):
            raise GraphError(
                f"{what} must be an STensor created by this thread-block graph, "
                f"got {type(x).__name__}"
            )
        if x._graph is not self:
            raise GraphError(
                f"{what} {x!r} belongs to a different ThreadBlockGraph: use tiles created by "
                "this thread-block graph (its new_input() or its operators)"
            )
        return x._id

    def _t(self, tile_id: int) -> STensor:
        return STensor(self, tile_id)

    def _unary(self, op: str, x: STensor, params: Sequence[float] = ()) -> STensor:
        return self._t(self._g.unary(op, self._id(x), list(params)))

    def _binary(self, op: str, a: STensor, b: STensor) -> STensor:
        return self._t(self._g.binary(op, self._id(a, "a"), self._id(b, "b")))

    # -- building --------------------------------------------------------------------------
    def new_input(
        self, dtensor: DTensor, input_map: Sequence[int] = (-1, -1, -1), forloop_dim: int = -1
    ) -> STensor:
        """Declare the next input of the customized operator (only ``dtensor``'s dims and
        dtype are used).

        ``input_map[a]`` is the tensor dim that grid axis ``a`` splits (-1: replicated);
        ``forloop_dim`` is the dim split over the for-loop iterations (-1: loaded once)."""
        if not isinstance(dtensor, DTensor):
            raise GraphError(
                f"new_input() takes a DTensor of a kernel graph, got {type(dtensor).__name__}"
            )
        imap = check_triple(input_map, "input_map", MappingError)
        fdim = check_int(forloop_dim, "forloop_dim", MappingError)
        dims = list(dtensor.dims)
        return self._t(self._g.new_input(dims, dtensor.dtype.name, imap, fdim))

    def matmul(self, a: STensor, b: STensor) -> STensor:
        return self._t(self._g.matmul(self._id(a, "a"), self._id(b, "b")))

    def reduction(self, x: STensor, dim: int) -> STensor:
        """Sum over ``dim`` (kept with size 1)."""
        return self._t(self._g.reduction(self._id(x), check_int(dim, "dim", ShapeError)))

    def reduction_to_dimx(self, x: STensor, dim: int) -> STensor:
        """Reduce ``dim`` to ``reduction_dimx`` elements: ``out[j] = Σ_g x[g·dimx + j]``."""
        return self._t(self._g.reduction_to_dimx(self._id(x), check_int(dim, "dim", ShapeError)))

    def rms_norm(self, x: STensor, eps: float = _DEFAULT_EPS) -> STensor:
        """RMS normalisation over the tile's last dim."""
        return self._t(self._g.rms_norm(self._id(x), check_float(eps, "eps", GraphError)))

    def concat(self, xs: Sequence[STensor], dim: int) -> STensor:
        if isinstance(xs, STensor) or not isinstance(xs, Sequence):
            raise GraphError(f"xs must be a list of STensors, got {type(xs).__name__}")
        ids = [self._id(x, f"xs[{i}]") for i, x in enumerate(xs)]
        return self._t(self._g.concat(ids, check_int(dim, "dim", ShapeError)))

    def forloop_accum(
        self, x: STensor, acc: str | None = None, eps: float | None = None
    ) -> STensor:
        """Accumulate ``x`` over the for-loop iterations.

        ``acc``: None (sum over iterations), "sum" (sum over the last dim and iterations),
        "rms" (sqrt(mean of squares over the last dim and iterations + eps); ``eps``
        defaults to 1e-6 like ``KernelGraph.rms_norm``), "sum_todimx" (sum over iterations,
        last dim summed down to ``reduction_dimx``). ``eps`` only applies to "rms"."""
        xid = self._id(x)
        if acc not in _ACCUMULATORS:
            raise GraphError(f"unknown accumulator {acc!r}: expected one of {list(_ACCUMULATORS)}")
        if acc != "rms":
            if eps is not None:
                raise GraphError(f"eps only applies to acc='rms', not acc={acc!r}")
            return self._t(self._g.forloop_accum(xid, acc, 0.0))
        e = _DEFAULT_EPS if eps is None else check_float(eps, "eps", GraphError)
        return self._t(self._g.forloop_accum(xid, acc, e))

    def new_output(self, x: STensor, output_map: Sequence[int]) -> int:
        """Write the accumulated tile ``x`` as the next output of the customized operator.

        ``output_map[a]`` is the output dim along which grid axis ``a``'s blocks write
        disjoint regions (-1 only for axes of size 1). Returns the output's index."""
        xid = self._id(x)
        omap = check_triple(output_map, "output_map", MappingError)
        return self._g.new_output(xid, omap)


def _as_float64(array: object, i: int, dims: tuple[int, ...]) -> npt.NDArray[np.float64]:
    """Input ``i`` of ``evaluate`` as a float64 array; anything numpy cannot turn into one
    (ragged nested lists, strings, complex numbers, ints beyond float64) is an
    EvaluationError naming what was expected."""
    try:
        raw = np.asarray(array)
    except ValueError as exc:  # nested lists of unequal lengths
        raise EvaluationError(
            f"input {i} is not a rectangular array ({exc}): expected an array (or nested "
            f"lists of equal lengths) of real numbers with dims {dims}"
        ) from None
    except (TypeError, OverflowError) as exc:
        raise EvaluationError(
            f"input {i} is not a numeric array ({exc}): expected real numbers with dims {dims}"
        ) from None
    if np.iscomplexobj(raw):
        raise EvaluationError(f"input {i} is complex: expected real numbers")
    try:
        return raw.astype(np.float64, copy=False)
    except OverflowError as exc:  # e.g. a Python int such as 10**400 in an object array
        raise EvaluationError(
            f"input {i} holds a number too large for float64 ({exc}): expected finite real "
            "numbers with magnitude below 1.8e308"
        ) from None
    except (TypeError, ValueError) as exc:
        raise EvaluationError(
            f"input {i} is not a numeric array ({exc}): expected real numbers with dims {dims}"
        ) from None


def _check_seed(seed: object) -> int:
    s = check_int(seed, "seed", EvaluationError)
    if not 0 <= s < 2**64:
        raise EvaluationError(f"seed must be in 0..2**64-1, got {s}")
    return s


def new_kernel_graph(world_size: int = 1) -> KernelGraph:
    """A new, empty kernel graph; ``world_size`` N > 1 makes it the program of one of N
    ranks (SPMD, see :meth:`KernelGraph.all_reduce`)."""
    return KernelGraph(world_size)


def new_threadblock_graph(
    grid_dim: Sequence[int],
    block_dim: Sequence[int],
    forloop_range: int,
    reduction_dimx: int,
    forloop_tile: int | None = None,
) -> ThreadBlockGraph:
    """A new thread-block graph for a customized operator."""
    return ThreadBlockGraph(grid_dim, block_dim, forloop_range, reduction_dimx, forloop_tile)


def equivalent(g1: KernelGraph, g2: KernelGraph, trials: int = 2, seed: int = 0) -> bool:
    """True when the two graphs compute the same function, judged by their finite-field
    fingerprints on ``trials`` seeded random inputs and a float64 cross-check on random
    inputs (docs/fingerprints.md). Different functions are told apart except with
    probability about 1/p per trial (p ≈ 6.7e7); False also where neither check can confirm
    equality (e.g. graphs that divide by a value that is zero for every input and are NaN
    there).

    Raises ShapeError when the graphs' input signatures or world sizes differ."""
    for name, g in (("g1", g1), ("g2", g2)):
        if not isinstance(g, KernelGraph):
            raise GraphError(f"{name} must be a KernelGraph, got {type(g).__name__}")
    t = check_positive(trials, "trials", EvaluationError)
    return _core.equivalent(g1._g, g2._g, t, _check_seed(seed))
