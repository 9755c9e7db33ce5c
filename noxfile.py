"""nox sessions of the MATE monorepo: every distribution under packages/ installed together into one environment.

    nox -s tests      CPU tests (-m "not gpu and not engine") of every package; extra arguments go to pytest
    nox -s lint       ruff check + ruff format --check
    nox -s compile    lower and compile every TileLang kernel configuration for sm_90a with nvcc (no GPU, one
                      worker process per CPU), then check the SSD kernels' generated CUDA for warp-specialisation
                      hazards and run the decode kernels' generated CUDA on the CPU
    nox -s build      wheel + sdist of every package into dist/, installed into a fresh venv and imported
    nox -s demo       `mate-mamba demo`: a Mamba2 layer's prefill + decode + MTP, checked against a recurrence
    nox -s engines    the adapters inside the released vLLM, SGLang and FlashInfer (their wheels installed
                      --no-deps with the pure-Python modules they import: tools/engines/requirements.txt)

torch is always pinned and installed first (with numpy, which torch warns without): an unpinned `torch` from
PyPI is a multi-GB CUDA build, and a package installed before it could pull one in as a dependency.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import zipfile

import nox

ROOT = pathlib.Path(__file__).resolve().parent
PYTHON = "3.11"
TORCH = "torch==2.13.0"
TILELANG = "tilelang==0.1.15"
RUFF = "ruff==0.17.6"
PYTEST = "pytest>=8"
XDIST = "pytest-xdist>=3.5"  # the emulated kernel tests in one process per CPU (nox -s compile)
HYPOTHESIS = "hypothesis>=6.100"  # the contract's property tests
NUMPY = "numpy"  # beside torch wherever torch is installed: torch warns at import without it

nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests", "lint"]
nox.options.error_on_missing_interpreters = True


def packages() -> list[pathlib.Path]:
    """Every distribution of the monorepo (adapters included as soon as their pyproject exists)."""
    return sorted(p.parent for p in ROOT.glob("packages/*/pyproject.toml"))


def test_dirs() -> list[pathlib.Path]:
    return [p / "tests" for p in packages() if any((p / "tests").rglob("test_*.py"))]


def constraints(session: nox.Session) -> str:
    """A pip constraints file holding torch at the pinned version, so no later install can replace it."""
    path = pathlib.Path(session.create_tmp()) / "torch-constraint.txt"
    path.write_text(TORCH + "\n")
    return str(path)


def install_torch(session: nox.Session) -> None:
    """The pinned torch, and numpy with it (torch prints a NumPy warning at import without it)."""
    session.install(TORCH, NUMPY)


def install_packages(session: nox.Session) -> None:
    """Every package of the monorepo, editable, in one pip call (they depend on each other by version)."""
    args: list[str] = ["-c", constraints(session)]
    for pkg in packages():
        args += ["-e", str(pkg)]
    session.install(*args)


def cuda_env() -> dict[str, str]:
    """CUDA_HOME/PATH pointing at an nvcc (CUDA 13 at /usr/local/cuda on the CI machines)."""
    env: dict[str, str] = {}
    home = os.environ.get("CUDA_HOME")
    if not home:
        for candidate in ("/usr/local/cuda", "/usr/local/cuda-13.0"):
            if os.path.exists(os.path.join(candidate, "bin", "nvcc")):
                home = candidate
                break
    if home:
        env["CUDA_HOME"] = home
        env["PATH"] = os.path.join(home, "bin") + os.pathsep + os.environ.get("PATH", "")
    return env


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """CPU tests of every package, one pytest run per package (tests sit with the package they test)."""
    install_torch(session)
    session.install("-c", constraints(session), PYTEST, HYPOTHESIS)
    install_packages(session)
    if any(os.path.exists(a) for a in session.posargs):  # explicit test paths: one run over exactly those
        session.run("pytest", "-m", "not gpu and not engine", *session.posargs)
        return
    dirs = test_dirs()
    if not dirs:
        session.error("no test_*.py under packages/*/tests")
    # A -k/-m filter of the caller may leave one package with nothing selected (pytest exit 5); without
    # posargs every package must run at least one test.
    codes = [0, 5] if session.posargs else [0]
    for d in dirs:
        session.run("pytest", "-m", "not gpu and not engine", str(d.relative_to(ROOT)), *session.posargs,
                    success_codes=codes)  # fmt: skip


ENGINES = ROOT / "tools" / "engines"
ADAPTERS = ("mate-vllm", "mate-sglang", "mate-flashinfer-compat")


@nox.session(python=PYTHON)
def engines(session: nox.Session) -> None:
    """The tests marked ``engine``: each adapter inside the real engine release it plugs into, on the CPU with the
    reference backend. The engines' wheels go in ``--no-deps`` (their CUDA dependencies are not needed to import
    their Python, and would replace the pinned CPU torch), with the pure-Python modules their imports need, pinned
    in tools/engines/requirements.txt; tools/engines/cpu_shims stands in for torchvision, which no PyPI build
    imports beside the CPU torch. One pytest run per adapter, each in its own process: an engine is imported and
    patched once per process, as in a deployment. Extra arguments go to pytest."""
    install_torch(session)
    session.install("-c", constraints(session), PYTEST)
    session.install("-c", constraints(session), "--no-deps", "-r", str(ENGINES / "requirements.txt"))
    install_packages(session)
    env = {
        "PYTHONPATH": str(ENGINES / "cpu_shims"),
        # as a deployment enables the adapters (the .pth start-up lines read these)
        "MATE_VLLM_ENABLE": "1",
        "MATE_SGLANG_ENABLE": "1",
    }
    # the engines import whole (a missing pinned module is an error here, not a silently skipped test module)
    imports = "vllm.plugins, vllm.model_executor.layers.mamba.mamba_mixer2, sglang.srt.server_args, "
    imports += "sglang.srt.layers.attention.mamba.mamba, flashinfer.mamba"
    session.run("python", "-c", f"import {imports}", env=env)
    for name in ADAPTERS:
        tests = ROOT / "packages" / name / "tests"
        session.run("pytest", "-m", "engine", "-p", "no:cacheprovider", str(tests.relative_to(ROOT)),
                    *session.posargs, env=env)  # fmt: skip


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install(RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def compile(session: nox.Session) -> None:
    """Every kernel spec of the compile grid lowered and compiled for sm_90a (nvcc, no GPU; in one worker process
    per usable CPU, compile_check's default ``--jobs``), each generating the CUDA recorded in
    tests/data/generated_sources.json; then the generated-code checks of the SSD kernels
    (tests/test_ssd_generated_code.py: hazards of TileLang's warp specialisation that compiling alone does not
    show; they need TileLang and nvcc, so they run here) and the emulated kernel tests (``-m emulated``: a kernel's
    generated CUDA run on the CPU against the reference; they need TileLang and g++; pytest-xdist runs them in one
    process per CPU)."""
    install_torch(session)
    # Only the two packages the compile check uses, through their `cuda` extra (which pins TileLang).
    kernels, runtime = ROOT / "packages" / "mate-kernels", ROOT / "packages" / "mate-runtime"
    session.install("-c", constraints(session), "-e", f"{kernels}[cuda]", "-e", f"{runtime}[cuda]", PYTEST, XDIST)
    session.run("python", "-c", f"import tilelang; assert tilelang.__version__.startswith('{TILELANG[10:]}')")
    env = cuda_env()
    # An empty TileLang disk cache: every configuration really goes through lowering and nvcc on each run.
    cache = pathlib.Path(session.create_tmp()) / "tilelang-cache"
    shutil.rmtree(cache, ignore_errors=True)
    env["TILELANG_CACHE_DIR"] = str(cache)
    if shutil.which("nvcc", path=env.get("PATH")) is None:
        session.error("nvcc not found: set CUDA_HOME or put CUDA 13's bin/ on PATH")
    # every compile-grid spec must generate the recorded CUDA (tests/data/README.md says where the hashes come from)
    sources = runtime / "tests" / "data" / "generated_sources.json"
    session.run(
        "python", "-m", "mate.mamba._tilelang.compile_check", "--sources", str(sources), *session.posargs, env=env
    )
    if not session.posargs:  # (a filtered compile check, e.g. --only ssu, skips them)
        # the SSD kernels' generated-code checks, and the TileLang internals MATE relies on (tl_internals.SURFACE)
        checks = [runtime / "tests" / "test_ssd_generated_code.py", runtime / "tests" / "test_tilelang_internals.py"]
        session.run("pytest", "-q", "-p", "no:cacheprovider", *(str(c.relative_to(ROOT)) for c in checks), env=env)
        # the decode kernels' generated CUDA run on the CPU against the reference (tests/emulate; needs g++); the
        # emulated test modules by name, as the other test modules need what this session does not install; one
        # process per CPU (-n logical): lowering, g++ and the reference leave a core idle in a single process
        emulated = sorted(str(t.relative_to(ROOT)) for t in (runtime / "tests").glob("test_*_emulated.py"))
        session.run("pytest", "-q", "-p", "no:cacheprovider", "-n", "logical", "-m", "emulated", *emulated, env=env)


@nox.session(python=PYTHON, reuse_venv=False)
def build(session: nox.Session) -> None:
    """Wheel + sdist of every package (the wheel built from the sdist), then a fresh venv with only those
    wheels and torch: every package imports and `mate-mamba info` runs."""
    session.install("build>=1.2", "hatchling>=1.25")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    pkgs = packages()
    for pkg in pkgs:
        session.run("python", "-m", "build", "--no-isolation", "--outdir", str(dist), str(pkg))
    wheels = sorted(dist.glob("*.whl"))
    sdists = sorted(dist.glob("*.tar.gz"))
    if len(wheels) != len(pkgs) or len(sdists) != len(pkgs):
        session.error(f"expected {len(pkgs)} wheels and sdists, got {[w.name for w in wheels + sdists]}")

    venv = pathlib.Path(session.create_tmp()) / "fresh"
    shutil.rmtree(venv, ignore_errors=True)
    session.run("python", "-m", "venv", str(venv))
    py = str(venv / "bin" / "python")
    session.run(py, "-m", "pip", "install", "-q", TORCH, NUMPY, external=True)
    session.run(py, "-m", "pip", "install", "-q", "-c", constraints(session), *map(str, wheels), external=True)

    modules = ["mate.mamba", "mate.mamba.cli"]
    for whl in wheels:
        with zipfile.ZipFile(whl) as zf:
            tops = {n.split("/", 1)[0] for n in zf.namelist() if "/" in n}
        # (``mate`` is a namespace package: mate-runtime ships only mate/mamba/, tools/packaging checks that)
        modules += sorted(t for t in tops if not t.endswith((".dist-info", ".data")) and t not in modules + ["mate"])
    # mate-flashinfer-compat: its FlashInfer-shaped package, and (its .pth hook in the default mode) no `flashinfer`
    # module where no real FlashInfer is installed.
    compat = any(w.name.startswith("mate_flashinfer_compat-") for w in wheels)
    shaped = ["mate_flashinfer_compat.mamba"] if compat else []
    session.log(f"importing {modules + shaped}")
    code = (
        "import importlib, importlib.util, sys\n"
        f"for m in {modules!r}:\n"
        "    mod = importlib.import_module(m)\n"
        "    assert mod.__file__ and '/site-packages/' in mod.__file__, (m, mod.__file__)\n"
        "    print('import', m, 'ok')\n"
        f"for m in {shaped!r}:\n"
        "    print('import', m, 'ok:', importlib.import_module(m).selective_state_update)\n"
        "    assert importlib.util.find_spec('flashinfer') is None, 'a flashinfer module without FlashInfer'\n"
        "assert 'tilelang' not in sys.modules, 'importing the packages pulled in TileLang'\n"
    )
    session.run(py, "-c", code, external=True)
    session.run(str(venv / "bin" / "mate-mamba"), "info", external=True)
    # beside Moore Threads' MATE (a stand-in with its layout), never over it; uninstalling either leaves the other
    session.run(py, "-m", "pip", "install", "-q", "hatchling>=1.25", external=True)
    session.run(py, str(ROOT / "tools" / "packaging" / "check_namespace.py"), *map(str, wheels), external=True)


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """`mate-mamba demo` on this machine: the TileLang kernels on an NVIDIA GPU (TileLang is installed through the
    `cuda` extra when `nvidia-smi` sees one), the pure-PyTorch reference otherwise. Extra arguments go to
    `mate-mamba demo`."""
    install_torch(session)
    install_packages(session)
    if has_nvidia_gpu():
        kernels, runtime = ROOT / "packages" / "mate-kernels", ROOT / "packages" / "mate-runtime"
        session.install("-c", constraints(session), "-e", f"{kernels}[cuda]", "-e", f"{runtime}[cuda]")
    session.run("mate-mamba", "demo", *session.posargs, env=cuda_env())


def has_nvidia_gpu() -> bool:
    """Whether an NVIDIA GPU is visible (nvidia-smi lists one); checked without importing torch here."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout
