"""The Ascend toolchain: CANN (``ASCEND_HOME_PATH``, or a toolkit whose ``set_env.sh`` was not
sourced), BiSheng (``bisheng`` and the ``bishengir-compile`` that Triton-Ascend calls for its
last step), triton-ascend (and whether its ``triton`` is the one Python imports: upstream
triton installs the same module over it) and torch_npu. Every piece found is reported with its
version; every missing one with the command that fixes it (``yirage doctor`` shows both)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from pathlib import Path

from yirage import Backend

__all__ = ["bishengir_compile", "cann_home", "missing", "toolchain_versions", "triton_flavour"]

#: Where the CANN installer puts the toolkit when ``set_env.sh`` has not been sourced.
DEFAULT_CANN_HOMES = (
    "/usr/local/Ascend/ascend-toolkit/latest",
    "~/Ascend/ascend-toolkit/latest",
    "/usr/local/Ascend/cann",
)
_SET_ENV = "source /usr/local/Ascend/ascend-toolkit/set_env.sh"


def cann_home() -> tuple[Path | None, bool]:
    """(the CANN toolkit directory or None, whether the environment names it): from
    ``ASCEND_HOME_PATH`` / ``ASCEND_TOOLKIT_HOME`` (set by ``set_env.sh``), else the installer's
    default locations (found but not sourced)."""
    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"):
        value = os.environ.get(var)
        if value and Path(value).is_dir():
            return Path(value), True
    for cand in DEFAULT_CANN_HOMES:
        path = Path(cand).expanduser()
        if path.is_dir():
            return path, False
    return None, False


def cann_version(home: Path) -> str | None:
    """The toolkit's version from its install record (``*install.info`` / ``version.cfg``)."""
    files = [*home.glob("*install.info"), *home.glob("*/ascend_toolkit_install.info")]
    files += [home / "version.cfg", home / "compiler" / "version.info"]
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        found = re.search(r"^\s*(?:Version|version)\s*=\s*(\S+)", text, re.M)
        if found:
            return found.group(1)
    return None


def _tool(
    name: str, env_dir: str | None, home: Path | None, subdirs: tuple[str, ...]
) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    roots = [Path(env_dir)] if env_dir else []
    if home is not None:
        roots += [home / sub for sub in subdirs]
    for root in roots:
        path = root / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def bishengir_compile(home: Path | None = None) -> str | None:
    """The BiSheng IR compiler Triton-Ascend runs last (PATH, ``TRITON_NPU_COMPILER_PATH``,
    or the toolkit's compiler directories)."""
    if home is None:
        home = cann_home()[0]
    return _tool(
        "bishengir-compile",
        os.environ.get("TRITON_NPU_COMPILER_PATH"),
        home,
        ("bin", "compiler/bishengir/bin", "tools/bishengir/bin"),
    )


def triton_flavour() -> str:
    """Which ``triton`` Python imports: "triton-ascend", "upstream" or "none" (without
    importing it: triton-ascend ships ``triton/backends/ascend``)."""
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return "none"
    for root in spec.submodule_search_locations:
        if (Path(root) / "backends" / "ascend").is_dir():
            return "triton-ascend"
    return "upstream"


def toolchain_versions() -> dict[str, str]:
    """Versions of every piece found."""
    found: dict[str, str] = {}
    home, named = cann_home()
    if home is not None:
        version = cann_version(home) or "version unknown"
        how = "ASCEND_HOME_PATH" if named else "set_env.sh not sourced"
        found["CANN"] = f"{version} at {home} ({how})"
    bisheng = _tool("bisheng", None, home, ("compiler/ccec_compiler/bin", "bin"))
    if bisheng:
        found["bisheng"] = Backend._command_version(bisheng, "--version") or bisheng
    bir = bishengir_compile(home)
    if bir:
        found["bishengir-compile"] = Backend._command_version(bir, "--version") or bir
    for dist in ("triton-ascend", "triton", "torch", "torch-npu"):
        dist_version = Backend._distribution_version(dist)
        if dist_version:
            found[dist] = dist_version
    flavour = triton_flavour()
    found["import triton"] = {
        "triton-ascend": "is triton-ascend's",
        "upstream": "is upstream triton (not triton-ascend's)",
    }.get(flavour, "finds none")
    return found


def missing() -> dict[str, str]:
    """Each missing piece of the NPU path and the fix."""
    out: dict[str, str] = {}
    home, named = cann_home()
    if home is None:
        out["CANN"] = (
            "install the CANN toolkit (Ascend-cann-toolkit) and run "
            f"`{_SET_ENV}` (sets ASCEND_HOME_PATH)"
        )
    elif not named:
        out["CANN"] = f"found at {home} but ASCEND_HOME_PATH is unset: run `{_SET_ENV}`"
    if bishengir_compile(home) is None:
        out["bishengir-compile"] = (
            "comes with the CANN toolkit: run its set_env.sh or set TRITON_NPU_COMPILER_PATH"
        )
    flavour = triton_flavour()
    if Backend._distribution_version("triton-ascend") is None:
        out["triton-ascend"] = "pip install triton-ascend pybind11"
    elif flavour != "triton-ascend":
        out["triton-ascend"] = (
            "upstream triton shadows it (both install the `triton` module): "
            "pip uninstall -y triton && pip install --force-reinstall --no-deps triton-ascend"
        )
    if importlib.util.find_spec("torch_npu") is None:
        out["torch_npu"] = "pip install torch-npu (the version matching torch and CANN)"
    return out
