"""Where ISA detection, compiler flags and the printer meet; Apple clang's OpenMP; the probe
without a compiler."""

from __future__ import annotations

import dataclasses
import json
import stat
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _plan_ref import rel_err, run_plan
from cpu_plan_tools import PLANS

import yirage as yr
from yirage_cpu import _codegen, _device_spec, _probe, _toolchain
from yirage_cpu._backend import CpuBackend

#: What code compiled without -march may assume: SSE2 is part of x86-64, NEON of AArch64.
BASELINE_BITS = 128


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def _rejecting_cc(tmp_path: Path, reject: str) -> str:
    """The host compiler behind a wrapper that fails whenever ``reject`` is an argument."""
    real = _toolchain.find_compiler().path
    return _script(
        tmp_path / "no-native-cc",
        f'for a in "$@"; do if [ "$a" = "{reject}" ]; then '
        f'echo "error: unsupported {reject}" >&2; exit 1; fi; done\n'
        f'exec {real} "$@"\n',
    )


def _detected_as(monkeypatch: pytest.MonkeyPatch, bits: int) -> None:
    """Make ISA detection report ``bits`` (e.g. an AVX-512 host) whatever this host has."""
    real = _device_spec.device_spec

    def fake() -> yr.DeviceSpec:
        return dataclasses.replace(real(), simd_width_bits=bits)

    monkeypatch.setattr(_device_spec, "device_spec", fake)


def _plan() -> dict[str, Any]:
    return dict(json.loads((PLANS / "rmsnorm_matmul.json").read_text()))


def _vector_bytes(code: str) -> int:
    line = next(ln for ln in code.splitlines() if "typedef float yr_vf" in ln)
    return int(line.split("vector_size(")[1].split(")")[0])


# -- the vector width follows the flags of the compile ------------------------------------


def test_portable_fallback_prints_baseline_vectors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a 512-bit host whose compiler rejects -march=native, the code is compiled without
    the ISA flags, so the printer must size its vector types for the portable baseline; the
    DeviceSpec, toolchain() and the compiled library report that width."""
    wide = 4 * BASELINE_BITS
    _detected_as(monkeypatch, wide)
    monkeypatch.setenv("CC", _rejecting_cc(tmp_path, "-march=native"))
    backend = CpuBackend()
    src = backend.codegen(_plan())
    assert src.simd_width_bits == BASELINE_BITS
    assert _vector_bytes(src.code) == BASELINE_BITS // 8
    assert backend.device_spec().simd_width_bits == BASELINE_BITS
    artifact = backend.compile(src)
    lib = artifact.library
    assert "-march=native" not in lib.flags
    tc = backend.toolchain()
    assert tc["simd_width_bits"] == str(BASELINE_BITS)
    assert "-march=native" not in tc["flags"]
    assert _toolchain.PORTABLE_SIMD_BITS == BASELINE_BITS
    assert lib.simd_width_bits == BASELINE_BITS
    assert not any("split" in n for n in lib.notes)
    launcher = backend.load(artifact)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 512), dtype=np.float32)
    w = rng.standard_normal((512, 768), dtype=np.float32)
    (y,) = launcher(x, w)
    (ref,) = run_plan(src.plan, [x.astype(np.float64), w.astype(np.float64)])
    assert rel_err(np.asarray(y, dtype=np.float64), ref) < 1e-5


#: Flags of a compiler that accepts -march=native (the first choice of select_flags).
NATIVE_FLAGS = ("-O3", "-fPIC", "-shared", "-march=native", "-fopenmp")


def test_native_flags_keep_the_detected_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_toolchain, "select_flags", lambda *a, **k: (NATIVE_FLAGS, ()))
    wide = 2 * BASELINE_BITS
    _detected_as(monkeypatch, wide)
    backend = CpuBackend()
    assert backend.device_spec().simd_width_bits == wide
    src = backend.codegen(_plan())
    assert src.simd_width_bits == wide and _vector_bytes(src.code) == wide // 8


def test_width_decision_and_cache_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One decision (simd_width_bits_for) for every consumer; the cpu-so key and the library
    carry the width the flags allow, and a source printed wider than that is noted."""
    monkeypatch.setenv("CC", _rejecting_cc(tmp_path, "-march=native"))
    cc = _toolchain.find_compiler()
    portable_flags, _ = _toolchain.select_flags(cc, 512)
    for bits in (128, 256, 512):
        assert _toolchain.simd_width_bits_for(portable_flags, bits) == BASELINE_BITS
        assert _toolchain.simd_width_bits_for(NATIVE_FLAGS, bits) == bits
    src = _codegen.generate(_plan(), simd_width_bits=512)
    lib = _toolchain.compile_shared(src.code, compiler=cc, simd_width_bits=512)
    assert lib.simd_width_bits == BASELINE_BITS
    assert any("512-bit" in n and "split" in n for n in lib.notes)
    assert lib.toolchain()["simd_width_bits"] == str(BASELINE_BITS)


# -- Apple clang ----------------------------------------------------------------------------


def _apple_clang(tmp_path: Path) -> str:
    """A fake compiler that identifies itself as Xcode's clang (nothing is compiled with it)."""
    return _script(
        tmp_path / "apple-cc",
        'case "$1" in\n'
        '  --version) echo "Apple clang version 15.0.0 (clang-1500.3.9.4)"; '
        'echo "Target: arm64-apple-darwin23.4.0"; exit 0;;\n'
        '  -dumpfullversion) echo "15.0.0"; exit 0;;\n'
        "esac\nexit 1\n",
    )


def _no_libomp_on_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the fake ``brew`` may point at libomp (and forget earlier look-ups)."""
    monkeypatch.setattr(_toolchain, "_LIBOMP_DIRS", (), raising=False)
    memo = getattr(_toolchain, "_libomp_dirs", None)
    if memo is not None:
        memo.cache_clear()


def _record_compiles(monkeypatch: pytest.MonkeyPatch, ok: Any) -> list[tuple[str, ...]]:
    calls: list[tuple[str, ...]] = []

    def fake(compiler: Any, flags: tuple[str, ...], source: str) -> tuple[bool, str]:
        calls.append(flags)
        return (True, "") if ok(flags) else (False, "fatal error: 'omp.h' file not found")

    monkeypatch.setattr(_toolchain, "_try_compile", fake)
    return calls


def test_apple_clang_uses_xpreprocessor_and_brew_libomp(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Apple clang cannot run on this Linux/gcc machine: the compiler identity is faked (a
    script answering --version like Xcode's clang), ``brew`` is a script printing a prefix
    with libomp's layout, and the probe compiles are recorded instead of run. Checks the
    flag selection only."""
    prefix = tmp_path / "libomp"
    (prefix / "include").mkdir(parents=True)
    (prefix / "include" / "omp.h").write_text("/* fake */\n")
    (prefix / "lib").mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _script(bindir / "brew", f'[ "$1 $2" = "--prefix libomp" ] && echo "{prefix}"\n')
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("CC", _apple_clang(tmp_path))
    _no_libomp_on_disk(monkeypatch)
    cc = _toolchain.find_compiler()
    calls = _record_compiles(monkeypatch, lambda flags: True)
    flags, _ = _toolchain.select_flags(cc)
    i = flags.index("-fopenmp")
    assert flags[i - 1] == "-Xpreprocessor"
    assert flags.count("-fopenmp") == 1
    assert f"-I{prefix}/include" in flags and f"-L{prefix}/lib" in flags
    assert f"-Wl,-rpath,{prefix}/lib" in flags and flags[-1] == "-lomp"
    assert calls and calls[0] == flags
    assert cc.kind == "apple-clang" and cc.apple_clang and cc.version == "15.0.0"
    _no_libomp_on_disk(monkeypatch)


def test_apple_clang_without_libomp_names_brew(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Faked Apple clang identity (see above), no brew and no libomp anywhere: the error names
    ``brew install libomp`` and CPATH/LIBRARY_PATH."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("CC", _apple_clang(tmp_path))
    _no_libomp_on_disk(monkeypatch)
    cc = _toolchain.find_compiler()
    # Apple clang rejects a bare -fopenmp and cannot link OpenMP code without libomp
    calls = _record_compiles(
        monkeypatch,
        lambda flags: (
            "-lomp" not in flags and ("-fopenmp" not in flags or "-Xpreprocessor" in flags)
        ),
    )
    with pytest.raises(_toolchain.OpenMPUnavailableError) as info:
        _toolchain.select_flags(cc)
    msg = str(info.value)
    assert "brew install libomp" in msg and "CPATH" in msg and "LIBRARY_PATH" in msg
    assert all("-fopenmp" not in f or "-Xpreprocessor" in f for f in calls)
    assert _toolchain.openmp_flags(cc) == ("-Xpreprocessor", "-fopenmp", "-lomp")
    _no_libomp_on_disk(monkeypatch)


def test_other_compilers_keep_plain_fopenmp() -> None:
    cc = _toolchain.find_compiler()
    assert not cc.apple_clang
    assert _toolchain.openmp_flags(cc) == ("-fopenmp",)
    llvm = dataclasses.replace(cc, kind="clang")
    assert _toolchain.openmp_flags(llvm) == ("-fopenmp",)


# -- the probe without a compiler ---------------------------------------------------------


def _no_subprocess(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        raise AssertionError(f"the probe ran {args!r}")

    monkeypatch.setattr(subprocess, "run", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    return calls


def test_probe_without_a_compiler_is_unavailable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    calls = _no_subprocess(monkeypatch)
    result = CpuBackend().probe()
    assert not result.available
    assert "apt-get install gcc" in result.reason and "CC" in result.reason
    assert result.hardware  # the CPU is still described
    assert calls == []  # nothing compiled, nothing run


def test_probe_with_a_cc_that_does_not_exist(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "missing-cc"))
    calls = _no_subprocess(monkeypatch)
    result = _probe.probe()
    assert not result.available
    assert "missing-cc" in result.reason and "unset CC" in result.reason
    assert "apt-get install gcc" in result.reason and calls == []


def test_probe_with_a_compiler_on_path_is_available(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("CC", raising=False)
    _script(tmp_path / "gcc", 'echo "gcc (fake) 13.2.0"\n')
    monkeypatch.setenv("PATH", str(tmp_path))
    result = _probe.probe()
    assert result.available and str(tmp_path / "gcc") in result.toolchain["cc"]
