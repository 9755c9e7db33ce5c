"""The TileLang SSU kernels' generated CUDA, run on the CPU (``tests/emulate``), against the reference backend.

The cases and checks of the GPU tests ``tests/gpu/test_ssu_kernels.py`` (float states),
``test_ssu_quantized_kernels.py`` (int16 / int8 / fp8 block-scaled states) and
``test_ssu_stochastic_rounding_kernels.py`` (fp16 with stochastic rounding), a subset of each: the one-token and
packed kernels, every state format, pads, strided pools, mixed table dtypes, intermediate buffers and trees. Each
call runs the kernel the planner picks for it, executed from the exact source its compiled kernel has, over the
launch grid ``(P blocks, heads, sequences)``. Heads are cut to a size the CPU runs in seconds where a case has
many (the heads per group kept). Needs TileLang (no nvcc) and g++.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "emulate"), str(HERE / "gpu")]

from cuda_emulator import launch_spec, unavailable  # noqa: E402
from mate.mamba._contract.ssu import finish  # noqa: E402
from mate.mamba._tilelang import ssu_plan  # noqa: E402
from test_ssu_kernels import BF16, F16, F32, I64, Case, check, normalized  # noqa: E402
from test_ssu_quantized_kernels import QDTYPES, check_quantised  # noqa: E402
from test_ssu_stochastic_rounding_kernels import check_sr, check_sr_edges  # noqa: E402

pytestmark = pytest.mark.emulated
if (why := unavailable()) is not None:
    pytest.skip(why, allow_module_level=True)


def emulated_kernel(kw, parent):
    """``selective_state_update`` on the TileLang backend, its kernel run on the CPU: the planner's spec and
    arguments for the call; returns ``out``."""
    call = normalized(kw, parent)
    planned = ssu_plan.plan(call)
    if planned is not None:
        launch_spec(*planned, dim=call.state.shape[2], heads=call.state.shape[1], rows=call.nseq)
    return finish(call)


def small(c: Case) -> Case:
    """The case at a size the CPU runs in seconds: at most 32 heads and 16 sequences (heads per group kept)."""
    if c.H > 32:
        c = replace(c, H=32, G=max(1, c.G * 32 // c.H))
    return replace(c, batch=min(c.batch, 16))


FLOAT = [
    pytest.param(Case(), id="one-bf16"),
    pytest.param(Case(state=F32, H=128, G=8, batch=8), id="one-f32-h128g8"),
    pytest.param(Case(state=F16, io=F16, H=16, G=1, N=64, batch=5), id="one-f16io16-n64"),
    pytest.param(Case(state=BF16, H=8, G=8, P=80, batch=5), id="one-bf16-p80"),
    pytest.param(Case(state=F32, tied=False), id="one-f32-untied"),
    pytest.param(Case(table="flat", dst=True, pad=0, idx=I64), id="one-dst-pad0-i64"),
    pytest.param(Case(paged="odd"), id="one-paged-odd"),
    pytest.param(Case(form="packed", T=6, accepted=True, table="2d", dst=True), id="mtp-t6"),
    pytest.param(Case(form="packed", T=4, varlen=True, accepted=True, table="2d", dst=True, batch=9), id="varlen"),
    pytest.param(Case(form="packed", T=3, accepted=True, table="2d", dst=True, tied=False, state=F32), id="mtp-untied"),
    pytest.param(Case(form="dense", T=5, table="flat", ibuf=True, disable=True, parent=True), id="sglang-parent"),
]

QUANTISED = [
    pytest.param(Case(H=128, G=8, batch=8, rows_view=True), id="one-h128g8"),
    pytest.param(Case(H=32, G=4, batch=64, table="2d", idx=I64, pad=0), id="one-b64-2d-i64-pad0"),
    pytest.param(Case(paged="odd"), id="one-paged-odd"),
    pytest.param(Case(dst=True), id="one-dst"),
    pytest.param(Case(tied=False, dt_dtype=BF16), id="one-untied"),
    pytest.param(Case(H=4, G=1, P=80, N=256, io=F16, batch=5), id="one-p80n256-io16"),
    pytest.param(Case(disable=True), id="one-disable"),
    pytest.param(Case(form="packed", T=4, varlen=True, accepted=True, table="2d", dst=True, batch=9), id="varlen"),
    pytest.param(Case(form="dense", T=5, table="flat", ibuf=True, disable=True, parent=True), id="sglang-parent"),
]

ROUNDED = [
    pytest.param(Case(H=128, G=8, batch=16), id="one-h128g8"),
    pytest.param(Case(batch=8, paged="odd", dst=True), id="one-paged-odd-dst"),
    pytest.param(Case(H=4, G=1, P=80, N=256, io=F16, batch=5, tied=False), id="one-p80n256-untied"),
    pytest.param(Case(form="packed", T=6, accepted=True, table="2d", dst=True, H=32, G=4, batch=8), id="mtp-t6"),
    pytest.param(Case(form="dense", T=4, table="flat", ibuf=True, disable=True), id="sglang-ibuf"),
]


@pytest.mark.parametrize("case", FLOAT)
def test_emulated_float_state(case):
    check(small(case), kernel=emulated_kernel, dev="cpu")


@pytest.mark.parametrize("dtype", QDTYPES)
@pytest.mark.parametrize("case", QUANTISED)
def test_emulated_quantised_state(case, dtype):
    check_quantised(small(case), dtype, kernel=emulated_kernel, dev="cpu")


ONE_BYTE = [q for q in QDTYPES if q.values[0].itemsize == 1]


@pytest.mark.parametrize("dtype", ONE_BYTE)
@pytest.mark.parametrize("case", [q for q in QUANTISED if q.id.startswith("one-")])
def test_emulated_staged_design(case, dtype, monkeypatch):
    """int8 / fp8: the staged one-token design (large grids), the small-grid rule off so these grids run it."""
    monkeypatch.setattr(ssu_plan, "SMALL_GRID_CTAS_PER_SM", {})
    check_quantised(small(case), dtype, kernel=emulated_kernel, dev="cpu")


@pytest.mark.parametrize("case", ROUNDED)
def test_emulated_stochastic_rounding(case):
    check_sr(small(case), kernel=emulated_kernel, dev="cpu")


def test_emulated_rounding_rule_at_fp16_range_edges():
    check_sr_edges(kernel=emulated_kernel, dev="cpu")


def test_emulated_rounding_draws_follow_the_seed():
    """Another seed gives other bits: the kernel reads the seed tensor (a mutation that ignores it fails here)."""
    c = Case(batch=4, pads=False)
    a = check_sr(c, rand=1, kernel=emulated_kernel, dev="cpu")
    b = check_sr(c, rand=2, kernel=emulated_kernel, dev="cpu")
    assert not torch.equal(a["pool"], b["pool"])
