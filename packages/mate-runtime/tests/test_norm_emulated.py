"""The TileLang gated RMSNorm kernel's generated CUDA, run on the CPU (``tests/emulate``), against the reference
backend: the cases of the GPU test ``tests/gpu/test_norm_kernels.py``, each through the kernel the planner picks,
over its launch grid ``(rows, groups)``. Needs TileLang (no nvcc) and g++."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "emulate"), str(HERE / "gpu")]

from cuda_emulator import Emulated, unavailable  # noqa: E402
from mate.mamba import rms_norm_gated  # noqa: E402
from mate.mamba._contract.norm import finish, normalize_norm  # noqa: E402
from mate.mamba._tilelang import norm_plan  # noqa: E402
from test_norm_kernels import CASES, build, check  # noqa: E402

pytestmark = pytest.mark.emulated
if (why := unavailable()) is not None:
    pytest.skip(why, allow_module_level=True)

_built: dict = {}  # spec -> Emulated, once per process


def emulated(kw):
    """``rms_norm_gated`` on the TileLang backend, its kernel run on the CPU; also returns the spec."""
    call = normalize_norm(**kw)
    spec, args = norm_plan.plan(call)
    em = _built.get(spec)
    if em is None:
        em = _built[spec] = Emulated(spec.build(), spec.pass_configs())
    em(*args, grid=(call.rows, call.groups, 1), threads=spec.threads)
    return finish(call), spec


@pytest.mark.parametrize("c", CASES)
def test_kernel_matches_reference(c):
    kw = build(c, "cpu")
    got, spec = emulated(kw)
    check(got, rms_norm_gated(**kw, backend="torch"))
    assert (spec.vec == 1) == (c.form == "offset" or c.hidden == 90)  # the scalar kernel exactly where planned
