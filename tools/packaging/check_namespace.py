"""MATE installs beside Moore Threads' MATE, never over it (the build session runs this in a fresh venv).

Moore Threads' ``mate`` distribution owns ``mate/__init__.py``, ``mate/__main__.py``, ``mate/testing/`` and a
``mate`` command; ``mate-runtime`` ships only ``mate/mamba/``. This script builds a stand-in distribution with
that layout (``mt-mate``), installs it and then the MATE wheels given on the command line into the running
interpreter's environment, and checks that:

1. no MATE wheel ships a file outside ``mate/mamba/`` under ``mate/``;
2. with both installed, ``import mate`` is Moore Threads' package, its own modules work, and ``mate.mamba``
   is MATE's (``mate.mamba.selective_state_update`` runs on the reference backend);
3. uninstalling ``mate-runtime`` leaves Moore Threads' ``mate`` whole; reinstalling and then uninstalling the
   stand-in leaves ``mate.mamba`` whole (``mate`` then a namespace package) and the ``mate-mamba`` command
   working.

Usage: python check_namespace.py WHEEL [WHEEL ...]   (needs torch in the environment; pip must work offline
for the local wheels: ``--no-index --no-deps``).
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

STANDIN = {
    "mate/__init__.py": '"""Stand-in for Moore Threads\' MATE."""\n__version__ = "9.9.9"\n\n\ndef attention():\n'
    '    return "mt-attention"\n',
    "mate/__main__.py": 'print("mt-mate main")\n',
    "mate/testing/__init__.py": 'def allclose():\n    return "mt-testing"\n',
    "mate/gemm.py": 'def gemm():\n    return "mt-gemm"\n',
}
PYPROJECT = """[build-system]
requires = ["hatchling>=1.25"]
build-backend = "hatchling.build"
[project]
name = "mt-mate"
version = "9.9.9"
[project.scripts]
mate = "mate.__main__:__name__"
[tool.hatch.build.targets.wheel]
packages = ["mate"]
"""

CHECK_BOTH = """
import mate, mate.testing, mate.gemm, mate.mamba, torch
assert mate.attention() == "mt-attention" and mate.testing.allclose() == "mt-testing", mate.__file__
assert mate.__version__ == "9.9.9", "mate/__init__.py is not Moore Threads' any more"
assert mate.mamba.__file__.endswith("mate/mamba/__init__.py"), mate.mamba.__file__
st = torch.zeros(2, 4, 8, 16); x = torch.randn(2, 4, 8); dt = torch.rand(2, 4, 8); A = -torch.rand(4)
B = torch.randn(2, 1, 16); y = mate.mamba.selective_state_update(st, x, dt, A, B, B.clone(), None)
assert y.shape == x.shape and bool(st.abs().sum() > 0)
print("both installed: ok")
"""
CHECK_MT_ONLY = """
import importlib.util, mate, mate.testing
assert mate.attention() == "mt-attention" and mate.testing.allclose() == "mt-testing"
assert importlib.util.find_spec("mate.mamba") is None, "mate.mamba left behind"
print("Moore Threads' mate alone: ok")
"""
CHECK_MAMBA_ONLY = """
import mate, mate.mamba
assert getattr(mate, "__file__", None) is None, f"mate is not a namespace package: {mate.__file__}"
assert not hasattr(mate, "attention"), "Moore Threads' mate left behind"
print("mate.mamba alone (mate a namespace package): ok")
"""


def run(*args: str) -> None:
    print("+", " ".join(args), flush=True)
    subprocess.run(args, check=True)


def pip(*args: str) -> None:
    run(sys.executable, "-m", "pip", "-q", *args)


def check(code: str) -> None:
    run(sys.executable, "-c", code)


def main(wheels: list[str]) -> int:
    for whl in wheels:
        with zipfile.ZipFile(whl) as zf:
            stray = [n for n in zf.namelist() if n.startswith("mate/") and not n.startswith("mate/mamba/")]
        if stray:
            print(f"{whl}: files outside mate/mamba/: {stray}", file=sys.stderr)
            return 1
    runtime = [w for w in wheels if pathlib.Path(w).name.startswith("mate_runtime-")]
    if len(runtime) != 1:
        print(f"expected one mate_runtime wheel among {wheels}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "mt-mate"
        for rel, text in STANDIN.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_text(text)
        (src / "pyproject.toml").write_text(PYPROJECT)
        out = pathlib.Path(tmp) / "dist"
        run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src))
        standin = str(next(out.glob("mt_mate-*.whl")))
        pip("install", "--no-deps", "--no-index", standin)
        pip("install", "--no-deps", "--no-index", "--force-reinstall", *wheels)
        check(CHECK_BOTH)
        pip("uninstall", "-y", "mate-runtime")
        check(CHECK_MT_ONLY)
        pip("install", "--no-deps", "--no-index", *runtime)
        check(CHECK_BOTH)
        pip("uninstall", "-y", "mt-mate")
        check(CHECK_MAMBA_ONLY)
        cli = shutil.which("mate-mamba", path=str(pathlib.Path(sys.executable).parent))
        if cli is None:
            print("no mate-mamba command after uninstalling the stand-in", file=sys.stderr)
            return 1
        run(cli, "--version")
        run(sys.executable, "-m", "mate.mamba", "--version")
    print("namespace check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
