"""The command line (``yirage`` / ``python -m yirage``): exit statuses, and YirageErrors
printed as one message instead of a Python traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import yirage as yr
from yirage import cli


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m yirage ARGS`` with ``env`` added to (or, for "", removed from) the
    environment."""
    full = dict(os.environ)
    for key, value in env.items():
        if value:
            full[key] = value
        else:
            full.pop(key, None)
    return subprocess.run(
        [sys.executable, "-m", "yirage", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env=full,
    )


def test_python_dash_m_yirage_is_the_cli() -> None:
    proc = _run("--version")
    assert proc.returncode == 0, proc.stderr
    assert "yirage: " in proc.stdout and "plugin_api: {}.{}".format(*yr.PLUGIN_API) in proc.stdout


def test_doctor_fails_when_a_named_backend_fails(tmp_path: Path) -> None:
    """YIRAGE_BACKENDS=<a backend that is not usable> yirage doctor: the report, the error
    on stderr and exit status 1 (the run relying on that selection would fail)."""
    proc = _run("doctor", YIRAGE_BACKENDS="nosuch", YIRAGE_CACHE_DIR=str(tmp_path))
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Selected backends: error: backend 'nosuch' is not available" in proc.stdout
    assert proc.stderr.startswith("yirage: error: YIRAGE_BACKENDS: backend 'nosuch'")
    proc = _run("doctor", "--json", YIRAGE_BACKENDS="cpu,nosuch", YIRAGE_CACHE_DIR=str(tmp_path))
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    assert "nosuch" in data["selection_error"] and "Traceback" not in proc.stderr


def test_doctor_succeeds_when_the_named_backends_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fresh_registry: None
) -> None:
    monkeypatch.setenv("YIRAGE_BACKENDS", "cpu")
    assert cli.main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["selected_backends"] == ["cpu"] and data["selection_error"] is None


def test_a_yirage_error_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """`yirage demo` on a machine without a C compiler (no $CC, nothing on PATH) and without
    another backend: a BackendUnavailableError, printed as its message."""
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {
        "PATH": str(empty),
        "CC": "",
        "YIRAGE_BACKENDS": "cpu",
        "YIRAGE_CACHE_DIR": str(tmp_path),
    }
    proc = _run("demo", **env)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("yirage: error: backend 'cpu' is not available"), proc.stderr
    assert "BackendUnavailableError" in proc.stderr and "YIRAGE_LOGS=DEBUG" in proc.stderr
    proc = _run("demo", **env, YIRAGE_LOGS="DEBUG")
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_main_returns_1_on_yirage_errors_and_keeps_bugs_loud(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fails(_args: object) -> int:
        raise yr.ConfigError("YIRAGE_THREADS='x' is not a positive integer: set it to e.g. 8")

    monkeypatch.setattr(cli, "_cmd_doctor", fails)
    assert cli.main(["doctor"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("yirage: error: YIRAGE_THREADS='x'") and "set it to e.g. 8" in err
    assert "Traceback" not in err

    def bug(_args: object) -> int:
        raise KeyError("a bug")

    monkeypatch.setattr(cli, "_cmd_doctor", bug)
    with pytest.raises(KeyError):
        cli.main(["doctor"])


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_an_unknown_demo_workload_is_one_line() -> None:
    proc = _run("demo", "--workload", "rmsnorm_lineer")
    assert proc.returncode == cli.EXIT_USAGE == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert line.startswith("yirage: error: unknown workload 'rmsnorm_lineer' for --workload")
    assert "rmsnorm_linear" in line and "all" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo", "--bogus"], "unrecognized arguments: --bogus (see yirage --help)"),
        (["bench", "--seed", "x"], "invalid int value: 'x' (see yirage bench --help)"),
        (["nosuch"], "invalid choice: 'nosuch'"),
    ],
)
def test_usage_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(args)
    assert exit_.value.code == cli.EXIT_USAGE
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("yirage: error: ") and message in line


def test_ctrl_c_is_one_line_and_exit_status_130(tmp_path: Path) -> None:
    """A real SIGINT while a command runs (the command sends it to its own process). Python
    only raises KeyboardInterrupt where SIGINT was not ignored when it started, and a job
    started in the background of a non-interactive shell inherits it ignored (this test then
    slept through it), so the child restores Python's handler as an interactive shell has it."""
    script = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from yirage import cli\n"
        "def doctor(args):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(60)\n"
        "cli._cmd_doctor = doctor\n"
        "sys.exit(cli.main(['doctor']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "YIRAGE_CACHE_DIR": str(tmp_path)},
    )
    assert proc.returncode == cli.EXIT_INTERRUPTED == 130, proc.stderr
    assert _one_line(proc.stderr) == "yirage: error: interrupted (Ctrl-C)"


def test_the_help_names_no_file_outside_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["demo", "--help"], ["bench", "--help"], ["--help"]):
        with pytest.raises(SystemExit):
            cli.main(command)
        out = capsys.readouterr().out
        assert "TARGETS" not in out and "ARCHITECTURE" not in out


def test_bench_help_says_what_it_needs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "pip install torch" in out and "pip install matplotlib" in out
    assert "--no-plot skips the chart" in out


@pytest.mark.parametrize(
    ("hidden", "flags", "install"),
    [
        (("torch",), (), "pip install torch"),
        (("matplotlib",), (), "pip install matplotlib"),
        (("torch", "matplotlib"), (), "pip install torch matplotlib"),
        (("torch", "matplotlib"), ("--no-plot",), "pip install torch"),
    ],
)
def test_bench_checks_its_dependencies_before_measuring(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    hidden: tuple[str, ...],
    flags: tuple[str, ...],
    install: str,
) -> None:
    """A module set to None in sys.modules cannot be imported: as if it were not installed.
    The check fails before anything is measured, in one line with the pip install line."""
    from yirage._bench import _harness

    for name in {"torch", "matplotlib"} - set(hidden):
        pytest.importorskip(name)  # what is not hidden must be there

    def measured(*args: object, **kwargs: object) -> None:
        raise AssertionError("the benchmark ran without its dependencies")

    monkeypatch.setattr(_harness, "run_bench", measured)
    for name in hidden:
        monkeypatch.setitem(sys.modules, name, None)
    assert cli.main(["bench", "--out", str(tmp_path), *flags]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("yirage bench: needs ") and line.endswith(install)
    assert ("--no-plot skips it" in line) == ("matplotlib" in install)
    assert not any(tmp_path.iterdir())


def test_bench_without_matplotlib_runs_with_no_plot(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    from yirage._bench import _harness

    ran: list[bool] = []

    def stop(workloads: object, cfg: _harness.BenchConfig) -> None:
        ran.append(cfg.plot)
        raise yr.ConfigError("stopped by the test")

    monkeypatch.setattr(_harness, "run_bench", stop)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["bench", "--out", str(tmp_path), "--no-plot"]) == 2
    assert ran == [False]
