"""The documentation states what the code does: backend levels, the README test command and
the ci session behind it, the runnable example."""

from __future__ import annotations

import contextlib
import re
import runpy
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import yirage as yr

REPO = Path(__file__).resolve().parents[1]


def test_backend_table_matches_the_code() -> None:
    text = (REPO / "docs" / "backends.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\w+) \| yirage-\w+ \| ([^|]+) \|", text, flags=re.MULTILINE)
    documented = {name: level.strip() for name, level in rows}
    assert set(documented) == {"cpu", "cuda", "rocm", "mps", "ascend", "tpu"}
    for name, level in documented.items():
        info = yr.get_backend_info(name)
        assert info.verification_level is not None, name
        assert info.verification_level.value in level, (name, level)


def test_readme_test_command_is_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    ci_lines = [
        line
        for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))
    ]
    assert len(ci_lines) == 1, ci_lines
    assert ci_lines[0].strip() in readme


def test_example_runs_and_passes_its_checks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(REPO / "docs" / "examples" / "rmsnorm_linear.py"), run_name="__main__")
    assert exit_.value.code == 0
    assert "demo: OK" in capsys.readouterr().out


class _FakeNox(types.ModuleType):
    """Just enough of nox to load noxfile.py without it: decorators return the function."""

    def __init__(self) -> None:
        super().__init__("nox")
        self.options = types.SimpleNamespace()
        self.Session = object

    def session(self, *args: Any, **kwargs: Any) -> Any:
        if args and callable(args[0]):
            return args[0]
        return lambda fn: fn


class _FakeSession:
    """Records the commands a session runs; the first one starting with ``fail`` raises."""

    def __init__(self, fail: str | None, venv: Path) -> None:
        self.posargs: list[str] = []
        self.fail = fail
        self.commands: list[str] = []
        self.name = "ci"
        self.virtualenv = types.SimpleNamespace(location=str(venv))

    def log(self, *args: Any) -> None:
        pass

    def install(self, *args: str) -> None:
        pass

    def chdir(self, path: Any) -> Any:
        return contextlib.nullcontext()

    def run(self, *args: str, **kwargs: Any) -> str:
        command = " ".join(args)
        self.commands.append(command)
        if args[:2] == ("maturin", "build"):  # the wheel the later steps install
            out = Path(args[args.index("--out") + 1])
            (out / "yirage-0.0.0-cp310-abi3-any.whl").touch()
        if self.fail is not None and command.startswith(self.fail):
            raise RuntimeError(f"{command} failed")
        # what a silent run prints: here only the site-packages path the ascend step asks for
        return self.virtualenv.location if kwargs.get("silent") else ""


def test_the_ci_session_runs_every_step_in_order_and_stops_at_a_failure(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`nox -s ci` is one session running lint, rust, tests and triton-ascend in order: it
    succeeds only when they all do, and a failing step ends it (nox then reports `ci` failed
    and exits non-zero) before the next step starts."""
    monkeypatch.setitem(sys.modules, "nox", _FakeNox())
    noxfile = runpy.run_path(str(REPO / "noxfile.py"))
    assert noxfile["CI_STEPS"] == ("lint", "rust", "tests", "triton-ascend")

    ok = _FakeSession(fail=None, venv=tmp_path)
    noxfile["ci"](ok)
    ruff = ok.commands.index("ruff check .")
    cargo_test = ok.commands.index("cargo test --workspace --release")
    pytest_run = ok.commands.index("pytest")
    ascend = [i for i, c in enumerate(ok.commands) if "tests/ascend/test_triton_ascend.py" in c]
    assert ruff < cargo_test < pytest_run < ascend[0] == len(ok.commands) - 1

    failing = _FakeSession(fail="cargo clippy", venv=tmp_path)
    with pytest.raises(RuntimeError, match="cargo clippy"):
        noxfile["ci"](failing)
    assert failing.commands[-1].startswith("cargo clippy")
    assert "cargo test --workspace --release" not in failing.commands
    assert "pytest" not in failing.commands


def _version(text: str) -> tuple[int, int, int]:
    """'1.85' -> (1, 85, 0)."""
    major, minor, patch = ([int(p) for p in text.split(".")] + [0, 0])[:3]
    return major, minor, patch


def _rust_version() -> str:
    cargo = (REPO / "Cargo.toml").read_text(encoding="utf-8")
    (version,) = re.findall(r'^rust-version = "([\d.]+)"', cargo, flags=re.MULTILINE)
    return str(version)


def test_the_install_lines_work_from_a_checkout() -> None:
    """The README's pip line installs paths of this repository (the packages are not
    published), each a buildable package; README and install.md state the workspace's
    minimum Rust version."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (line,) = [ln for ln in readme.splitlines() if ln.startswith("python3 -m pip install ./")]
    paths = [a for a in line.split("#")[0].split() if a.startswith("./")]
    assert paths[:2] == ["./packages/yirage", "./packages/yirage-cpu"]
    for path in paths:
        assert (REPO / path / "pyproject.toml").is_file(), path
    assert "maturin" in (REPO / "packages/yirage/pyproject.toml").read_text(encoding="utf-8")
    want = _rust_version()
    install = (REPO / "docs" / "install.md").read_text(encoding="utf-8")
    for text in (readme, install):
        found = re.findall(r"Rust(?: toolchain)? ≥ ([\d.]+)", text)
        assert found and set(found) == {want}, found


def test_the_rust_version_covers_the_locked_dependencies() -> None:
    """Cargo.toml's rust-version is at least what every locked dependency declares."""
    import json
    import shutil
    import subprocess

    if shutil.which("cargo") is None:
        pytest.skip("no cargo on PATH")
    proc = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--offline"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cargo metadata needs the dependencies fetched: {proc.stderr[-200:]}")
    needed = max(
        (_version(pkg["rust_version"]), pkg["name"])
        for pkg in json.loads(proc.stdout)["packages"]
        if pkg.get("rust_version")
    )
    assert _version(_rust_version()) >= needed[0], needed
