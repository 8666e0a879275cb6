"""Developer and CI sessions.

nox -s ci            lint, rust, tests, then triton-ascend, in one session that stops at the first
                     failing step (what .ci/run runs; nox -t ci runs them as three sessions)
nox -s lint          ruff, cargo fmt, clippy, mypy, stub check against the native module
nox -s rust          cargo test --workspace --release
nox -s tests         build the wheel, install it and the vendor packages, run pytest
nox -s demo          superoptimize the bundled RMSNorm + Linear example and print the table
nox -s bench         the benchmark harness (yirage bench)
nox -s triton-ascend the Ascend printings on triton-ascend's own Triton (a ci step)
nox -s tests-cuda    hardware tests (also -rocm, -mps, -ascend, -tpu; tags: hardware, <vendor>);
                     they skip without the device unless YIRAGE_REQUIRE_DEVICE=1
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
VENDORS = ("cpu", "cuda", "rocm", "mps", "ascend", "tpu")
#: Layers shared by vendor packages (installed with them; yirage-cuda depends on yirage-triton).
LAYERS = ("triton",)
HARDWARE = ("cuda", "rocm", "mps", "ascend", "tpu")
#: Python sources type-checked (mypy --strict) by the lint session.
TYPED_SOURCES = (
    "packages/yirage/python/yirage",
    *(f"packages/yirage-{v}/yirage_{v}" for v in (*LAYERS, *VENDORS)),
)
# torch (CPU use), triton (its interpreter runs the generated GPU kernels without a GPU; 3.9+
# compiles them for AMD targets without ROCm) and
# matplotlib (benchmark plots) are test dependencies: without them those tests would skip.
# jax[tpu] (jax with libtpu): the TPU tests run the printed Pallas kernels in interpret mode
# and compile them for v5e/v6e with libtpu, no TPU needed (about 40 s to install).
# ray: search(..., executor="ray") on a local 2-CPU cluster (about 15 s to install).
TEST_DEPS = (
    "pytest>=8",
    "hypothesis>=6",
    "torch",
    "triton>=3.9",
    "matplotlib",
    "jax[tpu]>=0.10",
    "ray>=2.9",
)
#: tests-mps runs on a Mac, where triton and jax[tpu] do not install.
MPS_TEST_DEPS = ("pytest>=8", "hypothesis>=6", "torch")

nox.options.sessions = ["lint", "rust", "tests"]
nox.options.reuse_existing_virtualenvs = True

_wheel_dir: Path | None = None


def _wheel(session: nox.Session) -> Path:
    """Build the yirage wheel (release, abi3) once per nox run and return its path."""
    global _wheel_dir
    if _wheel_dir is None or not any(_wheel_dir.glob("yirage-*.whl")):
        out = Path(tempfile.mkdtemp(prefix="yirage-wheel-"))
        session.install("maturin>=1.5,<2")
        with session.chdir(ROOT / "packages" / "yirage"):
            session.run(
                "maturin", "build", "--release", "--interpreter", "python", "--out", str(out)
            )
        _wheel_dir = out
    (wheel,) = sorted(_wheel_dir.glob("yirage-*.whl"))
    return wheel


def _install_yirage(session: nox.Session, *, vendors: bool = True) -> None:
    """Install the freshly built wheel (and the vendor packages) into the session."""
    wheel = _wheel(session)
    session.install("numpy")
    session.install("--force-reinstall", "--no-deps", str(wheel))
    if vendors:
        session.install(
            "--force-reinstall",
            "--no-deps",
            *(f"./packages/yirage-{v}" for v in (*LAYERS, *VENDORS)),
        )


@nox.session(tags=["ci"])
def lint(session: nox.Session) -> None:
    """Static checks of Python and Rust, and the native module against its stub."""
    session.install("ruff==0.17.6", "mypy==2.4.1")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("cargo", "fmt", "--all", "--check", external=True)
    session.run(
        "cargo", "clippy", "--workspace", "--all-targets", "--", "-D", "warnings", external=True
    )
    _install_yirage(session, vendors=False)
    session.run("python", "-m", "mypy.stubtest", "yirage._core")
    session.run("mypy", *TYPED_SOURCES)  # strict, configured in pyproject.toml


@nox.session(python=False, tags=["ci"])
def rust(session: nox.Session) -> None:
    """Rust unit and integration tests."""
    session.run("cargo", "test", "--workspace", "--release", external=True)


@nox.session(tags=["ci"])
def tests(session: nox.Session) -> None:
    """The Python test suite against the built wheel and all vendor packages."""
    _install_yirage(session)
    session.install(*TEST_DEPS)
    session.run("pytest", *session.posargs)


#: The steps of the ci session, in order.
CI_STEPS = ("lint", "rust", "tests", "triton-ascend")


@nox.session
def ci(session: nox.Session) -> None:
    """lint, rust, tests and triton-ascend, in that order, in this one session: a failing step
    fails the session (and nox's exit status) before the next one starts, and the summary's
    `ci` line is the outcome of all of them."""
    for name in CI_STEPS:
        session.log(f"ci step: {name}")
        STEPS[name](session)


@nox.session
def demo(session: nox.Session) -> None:
    """Superoptimize the bundled RMSNorm + Linear example on the best available backend."""
    _install_yirage(session)
    session.install("torch")  # the PyTorch eager column of the table
    session.run("yirage", "doctor")
    session.run("yirage", "demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """yirage vs PyTorch eager, torch.compile and experts: `nox -s bench -- --backend cpu`."""
    _install_yirage(session)
    session.install("torch", "matplotlib")
    session.run("yirage", "bench", *(session.posargs or ["--backend", "cpu", "--workloads", "all"]))


def _hardware_session(vendor: str) -> None:
    @nox.session(name=f"tests-{vendor}", tags=["hardware", vendor])
    def hardware_tests(session: nox.Session) -> None:
        _install_yirage(session)
        if vendor == "mps":  # on a Mac: no triton or jax[tpu] (neither builds for macOS)
            session.install(*MPS_TEST_DEPS)
            session.run("pytest", "-m", vendor, "tests/mps", *session.posargs)
            return
        session.install(*TEST_DEPS)
        if vendor == "ascend":  # torch pulled upstream triton over triton-ascend's `triton`
            session.run("python", "-m", "pip", "uninstall", "-y", "triton")
            session.install("--force-reinstall", "--no-deps", *TRITON_ASCEND)
        session.run("pytest", "-m", vendor, *session.posargs)

    hardware_tests.__doc__ = (
        f"Tests marked `{vendor}`: skip without the device unless YIRAGE_REQUIRE_DEVICE=1."
    )


for _vendor in HARDWARE:
    _hardware_session(_vendor)

#: Triton-Ascend and the module it imports without declaring it. Both it and upstream triton
#: install the ``triton`` module, so it gets an environment of its own.
TRITON_ASCEND = ("triton-ascend==3.2.0", "pybind11")


def _run_on_triton_ascend(session: nox.Session) -> None:
    """tests/ascend/test_triton_ascend.py on triton-ascend's Triton: a venv holding only
    triton-ascend that sees this session's packages (yirage, torch, pytest) behind its own, so
    ``import triton`` finds triton-ascend's and everything else the session's."""
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    env = Path(f"{session.virtualenv.location}-triton-ascend")
    python = str(env / "bin" / "python")
    if not Path(python).exists():
        session.run("python", "-m", "venv", str(env))
    session.run(python, "-m", "pip", "install", "-q", *TRITON_ASCEND, external=True)
    # a silent run returns stdout and stderr together: the path is the last line
    outer = str(session.run("python", "-c", purelib, silent=True)).strip().splitlines()[-1]
    inner = str(session.run(python, "-c", purelib, silent=True, external=True))
    inner = inner.strip().splitlines()[-1]
    Path(inner, "zz_session_packages.pth").write_text(outer + "\n", encoding="utf-8")
    session.run(
        python, "-m", "pytest", "tests/ascend/test_triton_ascend.py", "-p", "no:cacheprovider",
        *session.posargs, external=True,
    )  # fmt: skip


@nox.session(name="triton-ascend", tags=["ascend"])
def triton_ascend(session: nox.Session) -> None:
    """The Ascend printings on triton-ascend's own Triton (interpreter and frontend lowering;
    BiSheng and an NPU are not needed)."""
    if session.name == "triton-ascend":  # alone; as a ci step the tests step installed these
        _install_yirage(session)
        session.install(*TEST_DEPS)
    _run_on_triton_ascend(session)


#: Session functions by name, for ci.
STEPS = {"lint": lint, "rust": rust, "tests": tests, "triton-ascend": triton_ascend}
