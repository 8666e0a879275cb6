"""The plugin contract between the meta package and the vendor packages.

A vendor package (``yirage-cuda``, ``yirage-cpu`` …) registers an entry point in the group
``yirage.backends`` whose value is a cheap ``register()`` returning a :class:`Backend`.
See docs/backends.md.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.metadata
import re
import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from yirage._device_spec import DeviceSpec
from yirage._errors import BackendError, BackendUnavailableError, NotImplementedBackendError

__all__ = [
    "DEFAULT_VARIANT",
    "PLUGIN_API",
    "Backend",
    "DeviceSpec",
    "ProbeOnlyBackend",
    "ProbeResult",
    "VerificationLevel",
]

#: (major, minor) of the plugin contract. A plugin with another major is refused.
#: 1.2 added :meth:`Backend.variants` (every code path of one plan races in superoptimize).
PLUGIN_API: tuple[int, int] = (1, 2)
#: The name of the one variant of a backend that prints one code path per plan.
DEFAULT_VARIANT = "default"


class VerificationLevel(enum.Enum):
    """How far a backend's generated code has been verified (stated honestly everywhere)."""

    HARDWARE = "ran on hardware"
    EMULATED = "ran emulated"
    COMPILED = "compiled for the target"
    GENERATED = "generated only"
    NONE = "no code generator yet"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of :meth:`Backend.probe`: is the hardware there, and which tools were found."""

    available: bool
    reason: str
    hardware: str | None = None
    toolchain: dict[str, str] = field(default_factory=dict)


class Backend(ABC):
    """Base class of every backend. Subclasses set ``name`` and implement :meth:`probe` and
    :meth:`device_spec`; the code-generation steps raise NotImplementedBackendError until a
    vendor implements them."""

    #: Backend name, equal to the entry-point name (e.g. "cuda").
    name: str = ""
    #: (major, minor) of the plugin contract this backend was written for.
    plugin_api: tuple[int, int] = PLUGIN_API
    #: Distribution that ships this backend (used for ``package_version``).
    distribution: str = ""
    verification_level: VerificationLevel = VerificationLevel.NONE
    #: File suffix of the printed source (a saved kernel's ``kernel<suffix>``).
    source_suffix: str = ".txt"

    @property
    def package_version(self) -> str:
        """Version of the vendor distribution (``0+unknown`` when not installed as one)."""
        if not self.distribution:
            return "0+unknown"
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return "0+unknown"

    @property
    def codegen_versions(self) -> dict[str, str]:
        """The versions of the printers this backend uses (name: version). A cached
        decision was raced among kernels of these printers: bumping one re-races it."""
        return {}

    @property
    def codegen_implemented(self) -> bool:
        return type(self).codegen is not Backend.codegen

    @abstractmethod
    def probe(self) -> ProbeResult:
        """Hardware present? Toolchain present? Versions. Must never raise."""

    @abstractmethod
    def device_spec(self) -> DeviceSpec:
        """The spec of the device this backend would run on (live where the runtime allows).

        Raises BackendUnavailableError when there is no device."""

    def known_devices(self) -> dict[str, DeviceSpec]:
        """The backend's datasheet table of known chips (may be empty)."""
        return {}

    def device_count(self) -> int:
        """How many devices of the driver's model this backend can run on in this process
        (``superoptimize`` spreads compiling and profiling over them, one worker process
        each; see :meth:`use_device`)."""
        return 1

    def use_device(self, index: int) -> None:
        """Make device ``index`` (< :meth:`device_count`) the one this backend runs on in
        this process (called first in each profiling worker process)."""
        if index != 0:
            raise BackendError(f"the {self.name} backend runs on one device; device {index} asked")

    @property
    def torch_device(self) -> str | None:
        """The torch device of this backend's tensors (None: numpy arrays, no torch)."""
        return None

    def toolchain(self) -> dict[str, str]:
        """Names and versions of the toolchain in use (shown in reports and the doctor)."""
        return {}

    def from_numpy(self, arrays: Sequence[Any], dtypes: Sequence[str]) -> list[Any]:
        """float32 numpy arrays as this backend's tensors in ``dtypes``: torch tensors on
        :attr:`torch_device` by default (a backend without torch overrides this)."""
        if self.torch_device is None:
            raise NotImplementedBackendError(self.name, self.package_version, "from_numpy")
        import torch

        return [
            torch.from_numpy(a).to(device=self.torch_device, dtype=getattr(torch, d))
            for a, d in zip(arrays, dtypes, strict=True)
        ]

    # -- steps filled in per vendor by later releases -----------------------------------------
    def codegen(self, plan: Any) -> Any:
        """Print a KernelPlan as source code for this target."""
        raise NotImplementedBackendError(self.name, self.package_version, "codegen")

    def compile(self, source: Any) -> Any:
        """Compile generated source with the vendor toolchain."""
        raise NotImplementedBackendError(self.name, self.package_version, "compile")

    def load(self, artifact: Any) -> Any:
        """Load a compiled artifact and return a launcher."""
        raise NotImplementedBackendError(self.name, self.package_version, "load")

    def variants(self, launcher: Any) -> Mapping[str, Any]:
        """The launchers of every code path this backend printed for one plan, by variant
        name (e.g. "triton", "triton_split", "cuda"); ``launcher`` is what :meth:`load`
        returned for the plan. ``superoptimize`` checks every variant against the float64
        reference and races them with the other candidates' variants, once; the decision
        cache stores the winner's name, and a warm call takes ``variants(...)[name]`` again,
        so a name must print the same code path for the same plan in every call. Each value
        is a launcher like :meth:`load` returns (callable on tensors, ``run_unchecked``,
        ``input_specs``, ``output_specs``). The default: the one launcher, as
        ``DEFAULT_VARIANT``."""
        return {DEFAULT_VARIANT: launcher}

    def profile(self, launcher: Any, inputs: Any) -> Any:
        """Time one launcher (one variant) on the device, nothing more: no choice between
        variants, no check of the outputs (``superoptimize`` races and checks)."""
        raise NotImplementedBackendError(self.name, self.package_version, "profile")

    def precompile(self, launchers: Sequence[Any], inputs: Sequence[Any]) -> None:
        """Optional: finish compiling ``launchers`` (every variant of every candidate of one
        ``superoptimize``) for ``inputs`` before their first runs, e.g. in parallel. The
        default does nothing: a backend whose ``load`` returns ready code needs no more."""
        del launchers, inputs

    def warm_time_us(self, launcher: Any, inputs: Any) -> float | None:
        """Optional: the launcher's time with its inputs already in cache (one input set,
        nothing flushed), for a profiler whose :meth:`profile` times cold caches. It breaks
        ties between contenders (candidate variants) whose cold times are within
        ``COLD_TIE_RATIO`` of each other. The default (None) leaves the cold times alone."""
        del launcher, inputs
        return None

    def profiling_session(self) -> contextlib.AbstractContextManager[Any]:
        """Optional: a context that ``superoptimize``'s profiling rounds run in, for state
        the rounds can share (e.g. captured CUDA graphs). The default shares nothing."""
        return contextlib.nullcontext()

    def check_input_generator(self) -> str | None:
        """Optional: a name for the generator behind :meth:`draw_check_inputs` (the library,
        its version and the device; a reference stored for one generator is not reused with
        another), or None (the default): the numeric check's inputs are drawn with numpy and
        copied to the device."""
        return None

    def draw_check_inputs(self, specs: Sequence[tuple[tuple[int, ...], str, float, int]]) -> Any:
        """Optional, with :meth:`check_input_generator`: one tensor per ``(dims, dtype,
        scale, seed)``, N(0, 1) values times ``scale`` drawn on the device from ``seed``
        (the same values for the same seed, every time), rounded to ``dtype``. Drawing tens
        of millions of values on the device takes milliseconds where numpy plus a copy takes
        a tenth of a second or more."""
        raise NotImplementedBackendError(self.name, self.package_version, "draw_check_inputs")

    # -- helpers for probes (never raise) ----------------------------------------------------
    def _unavailable(self, reason: str) -> BackendUnavailableError:
        return BackendUnavailableError(self.name, reason)

    @staticmethod
    def _distribution_version(dist: str) -> str | None:
        """Installed version of a Python distribution, without importing it."""
        try:
            return importlib.metadata.version(dist)
        except Exception:
            return None

    @staticmethod
    def _match_device(
        live_name: str, candidates: Sequence[tuple[Sequence[str], DeviceSpec]]
    ) -> DeviceSpec | None:
        """The first table spec whose needles all occur in ``live_name`` (case-insensitive;
        a needle starting with "!" must not occur)."""
        key = live_name.lower()
        for needles, spec in candidates:
            if all(
                (n[1:].lower() not in key) if n.startswith("!") else (n.lower() in key)
                for n in needles
            ):
                return spec
        return None

    @staticmethod
    def _command_version(
        command: str, *args: str, match: str | None = None, timeout: float = 10.0
    ) -> str | None:
        """The first output line of ``command args`` (default ``--version``) that is non-empty
        (or matches the regex ``match``); None when the command is missing or fails."""
        path = shutil.which(command)
        if path is None:
            return None
        try:
            proc = subprocess.run(
                [path, *(args or ("--version",))],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except Exception:
            return None
        for line in (proc.stdout + "\n" + proc.stderr).splitlines():
            if line.strip() and (match is None or re.search(match, line)):
                return line.strip()
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.package_version}>"


class ProbeOnlyBackend(Backend):
    """A backend whose package probes its hardware and describes it but has no code
    generator yet: :meth:`device_spec` is the live spec, or BackendUnavailableError with
    the probe's reason; the code-generation steps raise NotImplementedBackendError."""

    @abstractmethod
    def live_spec(self) -> DeviceSpec | None:
        """The spec of the device found on this machine, or None without one."""

    def device_spec(self) -> DeviceSpec:
        spec = self.live_spec()
        if spec is None:
            raise self._unavailable(self.probe().reason)
        return spec
