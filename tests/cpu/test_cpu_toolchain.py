"""The compiler wrapper: discovery, errors that name the fix, flag fallbacks, the disk cache."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cpu_plan_tools import PLANS

import yirage
import yirage as yr
import yirage_cpu
from yirage_cpu import _codegen, _toolchain
from yirage_cpu._backend import CpuBackend


def _fake_cc(tmp_path: Path, name: str, reject: str) -> str:
    """A compiler wrapper that fails whenever ``reject`` is among its arguments."""
    real = _toolchain.find_compiler().path
    script = tmp_path / name
    script.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do if [ "$a" = "{reject}" ]; then '
        f'echo "error: unsupported {reject}" >&2; exit 1; fi; done\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_missing_compiler_names_cc_and_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(_toolchain.CompilerNotFoundError) as info:
        _toolchain.find_compiler()
    msg = str(info.value)
    assert "CC=" in msg and "/nonexistent/cc" in msg and "apt-get install gcc" in msg
    assert isinstance(info.value, yr.BackendUnavailableError) and info.value.name == "cpu"
    backend = CpuBackend()
    src = backend.codegen(json.loads((PLANS / "rmsnorm_matmul.json").read_text()))
    with pytest.raises(yr.BackendUnavailableError, match="apt-get install gcc"):
        backend.compile(src)


def test_no_compiler_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        _toolchain.CompilerNotFoundError, match=r"no C compiler found.*apt-get install gcc.*CC"
    ):
        _toolchain.find_compiler()


def test_cc_with_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _toolchain.find_compiler().path
    monkeypatch.setenv("CC", f"{real} -g0")
    cc = _toolchain.find_compiler()
    assert cc.from_env and cc.command == (real, "-g0") and "(from CC)" in cc.describe()


def test_march_native_rejected_falls_back_to_portable_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CC", _fake_cc(tmp_path, "no-native-cc", "-march=native"))
    cc = _toolchain.find_compiler()
    flags, notes = _toolchain.select_flags(cc)
    assert "-march=native" not in flags and "-fopenmp" in flags and "-Werror" in flags
    assert notes and "portable" in notes[0]
    src = _codegen.generate(json.loads((PLANS / "rmsnorm_matmul.json").read_text()))
    lib = _toolchain.compile_shared(src.code, compiler=cc)
    assert lib.path.exists() and "-march=native" not in lib.flags


def test_no_openmp_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CC", _fake_cc(tmp_path, "no-omp-cc", "-fopenmp"))
    with pytest.raises(
        _toolchain.OpenMPUnavailableError, match=r"apt-get install libgomp1.*libomp-dev"
    ):
        _toolchain.select_flags(_toolchain.find_compiler())


def test_compile_errors_keep_the_source(tmp_path: Path) -> None:
    with pytest.raises(_toolchain.CompileError) as info:
        _toolchain.compile_shared("int broken(void) { return undeclared; }\n", name="broken")
    err = info.value
    assert err.source_path is not None and err.source_path.exists()
    assert "undeclared" in err.stderr and "source kept at" in str(err)


_CHILD = r"""
import json, sys
from yirage_cpu import _codegen, _toolchain
src = _codegen.generate(json.loads(open(sys.argv[1]).read()))
lib = _toolchain.compile_shared(src.code)
out = {"cache_hit": lib.cache_hit, "path": str(lib.path), "seconds": lib.compile_seconds}
print(json.dumps(out))
"""


def test_compile_cache_is_reused_across_processes(tmp_path: Path) -> None:
    roots = {str(Path(m.__file__).resolve().parent.parent) for m in (yirage, yirage_cpu)}
    env = dict(os.environ)
    env["YIRAGE_CACHE_DIR"] = str(tmp_path / "cache")
    env["PYTHONPATH"] = os.pathsep.join([*sorted(roots), env.get("PYTHONPATH", "")])
    plan = str(PLANS / "rmsnorm_matmul.json")
    runs = []
    for _ in range(2):
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, plan],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert runs[0]["cache_hit"] is False and runs[1]["cache_hit"] is True
    assert runs[0]["path"] == runs[1]["path"] and Path(runs[0]["path"]).exists()
    assert runs[1]["seconds"] < runs[0]["seconds"]


def test_corrupt_cache_entry_is_rebuilt(build: Any) -> None:
    backend = CpuBackend()
    plan = json.loads((PLANS / "rmsnorm_matmul.json").read_text())
    plan["graph_hash"] = "corrupt-entry-test"  # a source of its own
    artifact = backend.compile(backend.codegen(plan))
    artifact.library.path.write_bytes(b"not an ELF file")
    launcher = backend.load(artifact)
    rng = np.random.default_rng(0)
    (y,) = launcher(
        rng.standard_normal((8, 512), dtype=np.float32),
        rng.standard_normal((512, 768), dtype=np.float32),
    )
    assert np.isfinite(y).all()


def test_backend_reports_hardware_verification_and_toolchain() -> None:
    backend = CpuBackend()
    assert backend.verification_level is yr.VerificationLevel.HARDWARE
    assert backend.codegen_implemented
    tc = backend.toolchain()
    assert "-fopenmp" in tc["flags"] and tc["compiler"]
