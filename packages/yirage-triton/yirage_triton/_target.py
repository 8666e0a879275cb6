"""What differs between the vendors that run the shared Triton printer: one frozen record per
vendor, read by :class:`~yirage_triton.TritonBackend` (see docs/backends.md, "The Triton
layer")."""

from __future__ import annotations

from dataclasses import dataclass

from yirage.plugin import ConfigError
from yirage_triton._codegen import DEEP_STAGES, DEFAULT_STAGES

__all__ = ["VARIANT_FAMILIES", "TritonTarget"]

#: The printings a TritonBackend can add beside the plain one ("triton"):
#: ``split`` the for-loops of kernels that leave compute units idle split across extra
#: blocks ("triton_split"), ``split_half`` / ``split_quarter`` that split half / a quarter
#: as many ways, ``deep`` deeper pipelines ("triton_deep", "triton_split_deep"), ``fine``
#: finer loop chunks under deeper pipelines ("triton_fine", "triton_fine_deep"), ``scaled``
#: a normalised dot operand multiplied raw and the product scaled ("triton_scaled" /
#: "triton_split_scaled"), ``aligned`` misaligned input rows staged into padded copies
#: ("triton_aligned"), ``sdpa`` attention written as library kernels run as one call of
#: PyTorch's fused attention ("torch_sdpa"; for targets whose torch build has it).
VARIANT_FAMILIES = frozenset(
    {"split", "split_half", "split_quarter", "deep", "fine", "scaled", "aligned", "sdpa"}
)


@dataclass(frozen=True)
class TritonTarget:
    """One vendor's Triton target.

    ``name``: the backend's name (Triton modules are imported as ``yirage_<name>_gen_*``).
    ``torch_device``: torch's device type and namespace of the tensors ("cuda" for NVIDIA and
    ROCm builds of torch, "npu" for torch_npu): ``torch.<torch_device>`` supplies streams,
    events and graph capture to the runtime. ``warp_size``: threads of a warp / wavefront
    (32 on NVIDIA, 64 on AMD CDNA), the ahead-of-time target's thread-group width.
    ``fp32_dot_precisions``: the ``input_precision`` values ``tl.dot`` accepts on float32
    operands here, the first being the default. ``pdl``: whether the target has
    programmatic dependent launch at all (the backend still decides per device).
    ``default_stages`` / ``deep_stages``: software-pipelining depth of a streaming loop
    and of the "deep" printings. ``variant_families``: which printings of
    :data:`VARIANT_FAMILIES` the backend tries. ``aot_backend``: the Triton backend name of
    ahead-of-time targets (``GPUTarget(aot_backend, arch, warp_size)``: "cuda", "hip"), None
    where Triton cannot compile for a named target. ``compile_options``: (name, value) options
    of the vendor's Triton backend printed into every launch and passed to ahead-of-time
    compiles (AMD: ``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack``); the names must be
    fields of that backend's options in the installed Triton
    (:func:`~yirage_triton.check_compile_options`)."""

    name: str
    torch_device: str
    warp_size: int = 32
    fp32_dot_precisions: tuple[str, ...] = ("ieee", "tf32", "tf32x3")
    pdl: bool = False
    default_stages: int = DEFAULT_STAGES
    deep_stages: int = DEEP_STAGES
    variant_families: frozenset[str] = VARIANT_FAMILIES
    aot_backend: str | None = None
    compile_options: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.variant_families) - VARIANT_FAMILIES
        if unknown:
            raise ConfigError(
                f"TritonTarget {self.name!r}: unknown variant families {sorted(unknown)}; "
                f"choose from {sorted(VARIANT_FAMILIES)}"
            )
        if not 1 <= self.default_stages <= self.deep_stages:
            raise ConfigError(
                f"TritonTarget {self.name!r}: need 1 <= default_stages <= deep_stages, got "
                f"{self.default_stages} and {self.deep_stages}"
            )
        if self.warp_size < 1 or not self.fp32_dot_precisions:
            raise ConfigError(
                f"TritonTarget {self.name!r}: give a positive warp_size and at least one "
                "fp32 dot precision"
            )

    @property
    def dot_sum_precision(self) -> str:
        """``input_precision`` of the dot that sums squares: tf32 where offered (the NVIDIA
        tensor cores' measured choice), else the target's default fp32 precision."""
        return "tf32" if "tf32" in self.fp32_dot_precisions else self.fp32_dot_precisions[0]

    def tries(self, family: str) -> bool:
        """Whether printings of ``family`` (one of :data:`VARIANT_FAMILIES`) are tried."""
        return family in self.variant_families
