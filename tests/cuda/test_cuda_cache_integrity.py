"""Damaged CUDA-backend cache entries are reported once and rebuilt, never used.

On a GPU (``pytest -m cuda``): the cubin and PTX of the CUDA C++ variant and the Triton module
are damaged and both variants run again in a fresh process against float64 references.

Without a GPU: the printed Triton module (``triton``, imported by the Triton interpreter)
and the host build of the printed CUDA C++ (``cuda-emulation``, a shared object loaded with
ctypes, where a truncated file would die with SIGBUS) are damaged and the plan run again in a
fresh process against float64 references. The cubin/PTX entries (``cuda-cubin``) are checked
with a stand-in compiler: NVRTC and nvcc may be absent here, and the cache layer does not
depend on what the bytes are.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import plans
import pytest
from _cache_damage import DAMAGES, corrupt_warnings, damage, run_child
from conftest import needs_triton

import yirage_triton
from yirage import _cache
from yirage_cuda import _toolchain
from yirage_cuda._emulate import host_compiler

_CHILD = """
import numpy as np
from yirage_cuda import CudaBackend
plan_file, inputs_file, out_file, *modes = sys.argv[1:]
plan = json.loads(open(plan_file).read())
backend = CudaBackend(interpret=True)
stored = np.load(inputs_file)
xs = [stored[f"x{i}"] for i in range(len(stored.files))]
dtypes = [b["dtype"] for b in plan["buffers"] if b["role"] == "input"]
outs = {}
for mode in modes:
    if mode == "triton":
        kernel = backend.load(backend.compile(backend.codegen(plan)))
    else:
        from yirage_cuda._cuda_codegen import generate_cuda
        from yirage_cuda._emulate import EmulatedCudaCpp
        kernel = EmulatedCudaCpp(generate_cuda(plan)).launcher()
    outs[mode] = kernel(*backend.from_numpy(xs, dtypes))[0].double().numpy()
np.savez(out_file, **outs)
print(json.dumps({"warnings": WARNINGS}))
"""


def _modes() -> list[str]:
    """The Triton interpreter, and the host build of the CUDA C++ where a C++ compiler is."""
    return ["triton", *(["emulation"] if host_compiler() else [])]


def _run(cache: Path, work: Path) -> dict[str, Any]:
    """Build and run the rmsnorm_linear fixture both ways in a fresh process; check both in
    float64."""
    case = plans.rmsnorm_linear()
    (work / "plan.json").write_text(json.dumps(case.plan))
    xs = [x.astype(np.float32) for x in case.random_inputs(0)]
    np.savez(work / "inputs.npz", **{f"x{i}": x for i, x in enumerate(xs)})
    files = [str(work / name) for name in ("plan.json", "inputs.npz", "y.npz")]
    report = run_child(_CHILD, cache, *files, *_modes())
    (want,) = case.reference(*[x.astype(np.float64) for x in xs])
    got = np.load(work / "y.npz")
    assert sorted(got.files) == sorted(_modes())
    for mode in got.files:
        assert np.linalg.norm(got[mode] - want) <= 2e-5 * np.linalg.norm(want), mode
    return report


def _triton_module(cache: Path, interpret: bool = True) -> Path:
    """The fixture's main Triton module in ``cache`` (printed for the interpreter or the GPU)."""
    from yirage_cuda import CudaBackend

    triton = CudaBackend(interpret=interpret).codegen(plans.rmsnorm_linear().plan).triton
    key = yirage_triton.triton_key(triton.text, triton.codegen_version)
    kind = yirage_triton.MODULE_CACHE
    return cache / "v1" / kind / _cache.entry_path(kind, key, ".py").name


def _entries(cache: Path) -> list[Path]:
    """The fixture's main Triton module and its host-emulation library."""
    emulation = sorted((cache / "v1" / "cuda-emulation").glob("*.so"))
    assert len(emulation) == len(_modes()) - 1
    return [_triton_module(cache), *emulation]


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding the fixture's Triton modules and its host-emulation library."""
    root = tmp_path_factory.mktemp("warm")
    assert not _run(root / "cache", root)["warnings"]
    return root / "cache"


@needs_triton
@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_entries_are_reported_once_and_rebuilt_in_a_fresh_process(
    warm_cache: Path, tmp_path: Path, how: str
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(warm_cache, cache)
    paths = _entries(cache)
    module = paths[0].read_bytes()
    for path in paths:
        damage(path, how)
    rebuilt = _run(cache, tmp_path)
    assert len(corrupt_warnings(rebuilt["warnings"])) == len(paths), rebuilt["warnings"]
    for path in paths:
        assert len(corrupt_warnings(rebuilt["warnings"], path)) == 1, (path, rebuilt["warnings"])
        assert _cache.verified_path(path) == path  # rebuilt: the next run uses it silently
    assert paths[0].read_bytes() == module


@needs_triton
def test_a_module_damaged_after_writing_is_not_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path))
    text = "import triton\nKERNELS = {}\n"
    path = yirage_triton.write_triton_module(text, "cache-integrity-test")
    damage(path, "truncated")
    with caplog.at_level(logging.WARNING, logger="yirage"):
        with pytest.raises(_toolchain.ToolchainError, match="compile the source again"):
            yirage_triton.load_triton_module(path, interpret=True)
        assert yirage_triton.write_triton_module(text, "cache-integrity-test") == path
    assert len(corrupt_warnings([r.getMessage() for r in caplog.records], path)) == 1
    assert yirage_triton.load_triton_module(path, interpret=True).KERNELS == {}


_GPU_CHILD = """
import numpy as np
from yirage_cuda import CudaBackend, _toolchain
from yirage_cuda._cuda_codegen import CudaCppOptions
plan_file, inputs_file, out_file = sys.argv[1:4]
plan = json.loads(open(plan_file).read())
stored = np.load(inputs_file)
xs = [stored[f"x{i}"] for i in range(len(stored.files))]
dtypes = [b["dtype"] for b in plan["buffers"] if b["role"] == "input"]
info = _toolchain.device_info()
options = CudaCppOptions(arch=info.arch, smem_limit=info.smem_per_block_optin, use_mma=True)
outs = {}
for variant in ("triton", "cuda"):
    cpp = variant == "cuda"
    backend = CudaBackend(cuda_cpp=cpp, cuda_options=options if cpp else None)
    artifact = backend.compile(backend.codegen(plan))
    kernel = backend.load(artifact)
    if cpp:
        assert "cuda" in kernel.variants, artifact.cuda_error or kernel.notes
        kernel.variant = "cuda"
    outs[variant] = kernel(*backend.from_numpy(xs, dtypes))[0].double().cpu().numpy()
np.savez(out_file, **outs)
print(json.dumps({"warnings": WARNINGS}))
"""


def _run_gpu(cache: Path, work: Path) -> dict[str, Any]:
    case = plans.rmsnorm_linear()
    (work / "plan.json").write_text(json.dumps(case.plan))
    xs = [x.astype(np.float32) for x in case.random_inputs(0)]
    np.savez(work / "inputs.npz", **{f"x{i}": x for i, x in enumerate(xs)})
    files = [str(work / name) for name in ("plan.json", "inputs.npz", "y.npz")]
    report = run_child(_GPU_CHILD, cache, *files)
    (want,) = case.reference(*[x.astype(np.float64) for x in xs])
    got = np.load(work / "y.npz")
    assert sorted(got.files) == ["cuda", "triton"]
    for variant in got.files:
        assert np.linalg.norm(got[variant] - want) <= 1e-4 * np.linalg.norm(want), variant
    return report


@pytest.mark.cuda
@pytest.mark.parametrize("how", DAMAGES)
def test_damaged_gpu_entries_are_reported_once_and_rebuilt_in_a_fresh_process(
    gpu: Any, tmp_path: Path, how: str
) -> None:
    """The real cubin (NVRTC or nvcc), its PTX and the Triton module, damaged, then both
    variants run on the GPU in a fresh process."""
    cache = tmp_path / "cache"
    assert not _run_gpu(cache, tmp_path)["warnings"]
    (cubin,) = (cache / "v1" / "cuda-cubin").glob("*.cubin")
    paths = [_triton_module(cache, interpret=False), cubin, cubin.with_suffix(".ptx")]
    for path in paths:
        damage(path, how)
    rebuilt = _run_gpu(cache, tmp_path)
    assert len(corrupt_warnings(rebuilt["warnings"])) == len(paths), rebuilt["warnings"]
    for path in paths:
        assert len(corrupt_warnings(rebuilt["warnings"], path)) == 1, (path, rebuilt["warnings"])
        assert _cache.verified_path(path) == path


# -- cubin and PTX (a stand-in compiler) ---------------------------------------------------------

_CUBIN = b"\x7fELF fake cubin " + bytes(range(256)) * 4
_PTX = "//\n// fake PTX\n.version 8.0\n.target sm_90\n" * 8


@pytest.fixture
def fake_nvrtc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """NVRTC that 'compiles' to fixed bytes and counts its calls."""
    monkeypatch.setenv("YIRAGE_CACHE_DIR", str(tmp_path))
    calls: list[str] = []

    def compile_(text: str, arch: str, name: str) -> tuple[bytes, str, str]:
        calls.append(text)
        return _CUBIN, _PTX, "fake log"

    monkeypatch.setattr(_toolchain, "nvrtc_version", lambda: "99.0")
    monkeypatch.setattr(_toolchain, "driver_version", lambda: None)
    monkeypatch.setattr(_toolchain, "_nvrtc_compile", compile_)
    return calls


def _parts(compiled: _toolchain.CompiledCuda) -> dict[str, Path]:
    assert compiled.path is not None
    return {
        "cubin": compiled.path,
        "ptx": compiled.path.with_suffix(".ptx"),
        "meta": compiled.path.with_suffix(".json"),
    }


@pytest.mark.parametrize("how", DAMAGES)
@pytest.mark.parametrize("part", ["cubin", "ptx", "meta"])
def test_damaged_cubin_entry_is_reported_once_and_compiled_again(
    fake_nvrtc: list[str], caplog: pytest.LogCaptureFixture, part: str, how: str
) -> None:
    first = _toolchain.compile_cuda("__global__ void k() {}", "sm_90")
    assert len(fake_nvrtc) == 1 and first.cubin == _CUBIN
    hit = _toolchain.compile_cuda("__global__ void k() {}", "sm_90")
    assert len(fake_nvrtc) == 1 and hit.cubin == _CUBIN and hit.ptx == _PTX
    path = _parts(first)[part]
    damage(path, how)
    with caplog.at_level(logging.WARNING, logger="yirage"):
        again = _toolchain.compile_cuda("__global__ void k() {}", "sm_90")
    assert len(fake_nvrtc) == 2, "the damaged entry was used instead of compiling again"
    assert again.cubin == _CUBIN and again.ptx == _PTX and again.log == "fake log"
    messages = [r.getMessage() for r in caplog.records]
    assert len(corrupt_warnings(messages)) == 1 and corrupt_warnings(messages, path), messages
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="yirage"):
        warm = _toolchain.compile_cuda("__global__ void k() {}", "sm_90")
    assert len(fake_nvrtc) == 2 and warm.cubin == _CUBIN and not caplog.records
    assert all(_cache.verified_path(p) == p for p in _parts(warm).values())
