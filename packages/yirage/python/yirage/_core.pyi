"""Type stubs for the native module ``yirage._core`` (PyO3 bindings of crates/yirage-core).

Tensors are referred to by integer ids local to their graph. The public Python API
(``yirage.KernelGraph`` etc.) wraps these classes; users should not need this module.

Dtype names: "float16", "bfloat16", "float32".
Unary op names: "exp", "square", "sqrt", "rsqrt", "silu", "gelu", "relu", "sigmoid",
"tanh", "neg" (no params), "mul_scalar", "add_scalar" (params=(scalar,)), "clamp"
(params=(lo, hi)).
Binary op names: "add", "sub", "mul", "div", "pow" (size-1 broadcasting).
Accumulator names for ``forloop_accum``: None (sum over iterations), "sum" (sum over the
last dim and iterations, keepdim), "rms" (sqrt(mean of squares over the last dim and all
iterations + eps), keepdim), "sum_todimx" (sum over iterations, last dim summed in
strided groups, out[j] = Σ_g x[g·dimx + j], down to ``reduction_dimx``).
"""

from collections.abc import Callable, Sequence
from typing import Any, final

__version__: str
#: Name of the fingerprint scheme (digests of two schemes are not comparable).
FINGERPRINT_SCHEME: str
__all__ = [
    "FINGERPRINT_SCHEME",
    "BlockGraph",
    "DTypeError",
    "EvaluationError",
    "GraphError",
    "KernelGraph",
    "MappingError",
    "SearchCandidate",
    "SearchResult",
    "SerializationError",
    "ShapeError",
    "YirageError",
    "__version__",
    "cost_terms",
    "device_spec_json",
    "equivalent",
    "field_info",
    "kernel_plan",
    "merge_search_shards",
    "predicted_us",
    "search",
    "search_config_json",
    "search_shard",
]

class YirageError(Exception):
    """Base class of every error yirage raises."""

class ShapeError(YirageError):
    """Dims that do not fit the operator (the message names the expected shape)."""

class DTypeError(YirageError):
    """Unsupported dtype or mixed dtypes."""

class GraphError(YirageError):
    """Malformed graph: unknown tensor id, no outputs, bad op name or parameters."""

class MappingError(YirageError):
    """Thread-block graph mapping problem: imap/fmap/omap that do not divide or collide,
    outputs not after an accumulator, grid/block/forloop out of range."""

class SerializationError(YirageError):
    """Invalid or unsupported JSON."""

class EvaluationError(YirageError):
    """Inputs given to evaluate/fingerprint do not match the graph."""

@final
class BlockGraph:
    def __new__(
        cls,
        grid_dim: tuple[int, int, int],
        block_dim: tuple[int, int, int],
        forloop_range: int,
        reduction_dimx: int,
        forloop_tile: int | None = None,
    ) -> BlockGraph: ...
    @property
    def forloop_tile(self) -> int | None: ...
    @property
    def grid_dim(self) -> tuple[int, int, int]: ...
    @property
    def block_dim(self) -> tuple[int, int, int]: ...
    @property
    def forloop_range(self) -> int: ...
    @property
    def reduction_dimx(self) -> int: ...
    def new_input(
        self,
        dims: Sequence[int],
        dtype: str,
        input_map: tuple[int, int, int],
        forloop_dim: int,
    ) -> int:
        """Declare the next customized-op input (kernel tensor of ``dims``); returns the tile id.

        The tile divides dim ``input_map[a]`` by ``grid_dim[a]`` for each grid axis with
        grid_dim[a] > 1 (-1 = replicated), and dim ``forloop_dim`` by ``forloop_range``
        (-1 = loaded once)."""
    def matmul(self, a: int, b: int) -> int: ...
    def unary(self, op: str, x: int, params: Sequence[float] = ...) -> int: ...
    def binary(self, op: str, a: int, b: int) -> int: ...
    def reduction(self, x: int, dim: int) -> int: ...
    def reduction_to_dimx(self, x: int, dim: int) -> int: ...
    def rms_norm(self, x: int, eps: float) -> int: ...
    def concat(self, xs: Sequence[int], dim: int) -> int: ...
    def forloop_accum(self, x: int, acc: str | None = None, eps: float = 0.0) -> int: ...
    def new_output(self, x: int, output_map: tuple[int, int, int]) -> int:
        """Mark an accumulated tile as output; returns the output's index."""
    def tensor_dims(self, t: int) -> list[int]: ...
    def tensor_dtype(self, t: int) -> str: ...
    def num_inputs(self) -> int: ...
    def num_outputs(self) -> int: ...
    def output_dims(self) -> list[list[int]]:
        """Kernel-level dims of each output (tile dims times grid along the omap)."""

@final
class KernelGraph:
    def __new__(cls, world_size: int = 1) -> KernelGraph: ...
    @property
    def world_size(self) -> int:
        """Number of ranks of the SPMD program (1: single device)."""
    def all_reduce(self, x: int) -> int: ...
    def promote_ranks(self) -> KernelGraph:
        """The equal-rank form the search works on (this graph when nothing is promoted)."""
    def new_input(self, dims: Sequence[int], dtype: str) -> int: ...
    def matmul(self, a: int, b: int) -> int: ...
    def unary(self, op: str, x: int, params: Sequence[float] = ...) -> int: ...
    def binary(self, op: str, a: int, b: int) -> int: ...
    def reduction(self, x: int, dim: int) -> int: ...
    def rms_norm(
        self, x: int, normalized_shape: Sequence[int], weight: int | None, eps: float
    ) -> int: ...
    def softmax(self, x: int, dim: int) -> int: ...
    def concat(self, xs: Sequence[int], dim: int) -> int: ...
    def chunk(self, x: int, chunks: int, dim: int) -> list[int]: ...
    def reduce_max(self, x: int, dim: int) -> int: ...
    def permute(self, x: int, perm: Sequence[int]) -> int: ...
    def reshape(self, x: int, dims: Sequence[int]) -> int: ...
    def customized(self, inputs: Sequence[int], block_graph: BlockGraph) -> list[int]: ...
    def mark_output(self, x: int) -> None: ...
    def tensor_dims(self, t: int) -> list[int]: ...
    def tensor_dtype(self, t: int) -> str: ...
    def num_tensors(self) -> int: ...
    def inputs(self) -> list[int]: ...
    def outputs(self) -> list[int]: ...
    def describe(self) -> str:
        """Human-readable listing of the ops, one per line."""
    def evaluate(
        self, inputs: Sequence[tuple[bytes, Sequence[int]]]
    ) -> list[tuple[bytes, list[int]]]:
        """Reference evaluator in float64. Each input is (little-endian float64 bytes, dims);
        returns one (bytes, dims) per output. For ``world_size`` N the bytes hold the N ranks'
        values one after the other and dims are per rank. Releases the GIL."""
    def fingerprint(self, trials: int = 2, seed: int = 0, threads: int | None = None) -> str:
        """Hex digest of the outputs' finite-field fingerprints over ``trials`` seeded trials.
        Bit-identical for any ``threads``. Releases the GIL."""
    def to_json(self) -> str: ...
    @staticmethod
    def from_json(s: str) -> KernelGraph: ...
    def hash(self) -> str:
        """Stable content hash (hex) of the canonical JSON."""

def equivalent(a: KernelGraph, b: KernelGraph, trials: int = 2, seed: int = 0) -> bool:
    """Fingerprint equivalence checked by a float64 cross-check (docs/fingerprints.md);
    raises ShapeError when the input signatures differ."""

def field_info() -> dict[str, int]:
    """The fingerprint field's parameters: {"p": ..., "q": ..., "g": ...} (g: the base of
    whose seeded powers each trial takes exp's base)."""

@final
class SearchCandidate:
    """One candidate µGraph of a search (returned by ``search``)."""
    @property
    def graph(self) -> KernelGraph:
        """The candidate graph (a new KernelGraph)."""
    @property
    def predicted_us(self) -> float:
        """Predicted time on the device (µs, cost model)."""
    @property
    def hash(self) -> str: ...
    @property
    def label(self) -> str:
        """Human-readable structure, e.g. ``custom[grid=4x1x1 loop=32: matmul,accum_iter]``."""
    @property
    def baseline(self) -> bool:
        """True for the original graph as library kernels."""
    def kernel_plan_json(self) -> str:
        """The KernelPlan (JSON, docs/kernel-plan.md) validated against the search's device."""

@final
class SearchResult:
    """Candidates (verified, best predicted first; the baseline among them) and the report."""
    @property
    def candidates(self) -> list[SearchCandidate]: ...
    @property
    def report_json(self) -> str: ...
    @property
    def report_text(self) -> str: ...

def search(
    graph: KernelGraph,
    device_spec: str,
    options: str = "{}",
    progress: Callable[[dict[str, int | float]], object] | None = None,
) -> SearchResult:
    """Search µGraphs equivalent to ``graph`` on the device ``device_spec`` (JSON) with
    ``options`` (JSON object of search-config fields). Runs with the GIL released; Ctrl-C
    (or an exception from ``progress``, called every 50 ms with counters) cancels."""

def kernel_plan(graph: KernelGraph, device_spec: str) -> str:
    """Lower ``graph`` to a KernelPlan (JSON) validated against ``device_spec`` (JSON)."""

def device_spec_json(device_spec: str) -> str:
    """Validate a DeviceSpec (JSON) and return its canonical JSON."""

def search_shard(graph: KernelGraph, device_spec: str, options: str, index: int, count: int) -> str:
    """Run shard ``index`` of ``count`` of the search (every ``count``-th first-level move);
    returns its candidates as JSON for :func:`merge_search_shards`. GIL released."""

def merge_search_shards(
    graph: KernelGraph, device_spec: str, options: str, shards: list[str], enumerate_s: float
) -> SearchResult:
    """Merge the JSON of every shard of one search, de-duplicate and verify on this side
    (a missing or repeated shard is an error). GIL released."""

def search_config_json(options: str = "{}") -> str:
    """Validate search options (JSON object) and return the complete canonical config."""

def predicted_us(graph: KernelGraph, device_spec: str) -> float:
    """Predicted time (µs) of ``graph`` on ``device_spec`` by the search's cost model."""

def cost_terms(graph: KernelGraph, device_spec: str) -> list[dict[str, Any]]:
    """The cost model's terms of every kernel of ``graph`` on ``device_spec`` (JSON), in
    execution order: ``op``, ``total_us``, ``memory_us``, ``compute_us``, ``launch_us``,
    ``exposed_us``, ``loop_us``, ``combine_us``, ``utilization``, ``loop_split``,
    ``collective_us`` (a collective's time on the device links) and ``terms`` (the parts
    that add up to ``total_us``; the totals sum to ``predicted_us``)."""
