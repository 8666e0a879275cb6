"""The documentation states what the code does: backend levels, the README test command."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

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
