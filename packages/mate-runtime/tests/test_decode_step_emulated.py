"""The fused decode-step kernel's generated CUDA, run on the CPU (``tests/emulate``), against the reference backend:
the cases of the GPU test ``tests/gpu/test_decode_step_kernels.py``, each through the kernel the planner picks, over
its launch grid, two calls in a row with the same scratch (the hand-over counters must be zero again after each).
Needs TileLang (no nvcc) and g++."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "emulate"), str(HERE / "gpu")]

from cuda_emulator import Emulated, unavailable  # noqa: E402
from mate.mamba import mamba2_decode_step, plan_mamba2_decode_step  # noqa: E402
from mate.mamba._contract.decode_step import normalize_decode_step  # noqa: E402
from mate.mamba._tilelang import decode_step_plan  # noqa: E402
from test_decode_step_kernels import CASES, Case, build, check, clone  # noqa: E402

pytestmark = pytest.mark.emulated
if (why := unavailable()) is not None:
    pytest.skip(why, allow_module_level=True)

_built: dict = {}  # spec -> Emulated, once per process


class Scratch:
    """The launcher's scratch for one call shape: y_ws and partials filled with garbage (the kernel writes them
    before reading), the counters zeroed once."""

    def __init__(self, spec, call):
        sizes = decode_step_plan.workspace_sizes(spec, call)
        self.y_ws = torch.full((call.batch, call.heads * call.dim), float("nan"))
        self.partials = torch.full((sizes["partials"],), float("nan"))
        self.counters = torch.zeros(sizes["counters"] + 5, dtype=torch.int32)  # spare entries stay 0


def emulated(kw, scratch=None):
    """``mamba2_decode_step`` on the TileLang backend, its kernel run on the CPU; returns (out, conv, ssm), the
    spec and the scratch."""
    call = normalize_decode_step(**kw)
    spec = decode_step_plan.call_spec(call, decode_step_plan.vector_ok(call))  # the fused kernel at any batch
    em = _built.get(spec)
    if em is None:
        em = _built[spec] = Emulated(spec.build(), spec.pass_configs())
    scratch = scratch or Scratch(spec, call)
    args = decode_step_plan.launch_args(call, scratch.y_ws, scratch.partials, scratch.counters)
    em(*args, grid=decode_step_plan.grid(spec, call), threads=spec.tiling.threads)
    return (call.out, call.conv_state, call.ssm_state), spec, scratch


@pytest.mark.parametrize("c", CASES)
def test_kernel_matches_reference_twice(c):
    kw = build(c, "cpu")
    a, r = clone(kw), clone(kw)
    scratch = None
    for step in range(2):  # the second call reuses the scratch: the counters were reset by the first
        if step:
            a["dt"] = r["dt"] = kw["dt"] * 0.5
        got, spec, scratch = emulated(a, scratch)
        check(got, (mamba2_decode_step(**r, backend="torch"), r["conv_state"], r["ssm_state"]))
        assert not bool(scratch.counters.any()), "the counters are back at zero"
    assert spec.vector_state == (not c.strided)  # the odd-offset pool: scalar state accesses


def test_planner_refuses_what_the_kernel_does_not_serve():
    kw = build(Case(), "cpu")
    with pytest.raises(NotImplementedError, match="^norm_group_size"):
        plan_mamba2_decode_step(**dict(kw, norm_group_size=32))
    with pytest.raises(NotImplementedError, match="^conv_state"):
        plan_mamba2_decode_step(**dict(kw, conv_state=kw["conv_state"].float()))
    w = kw["conv_weight"]
    with pytest.raises(NotImplementedError, match="^conv_weight"):
        plan_mamba2_decode_step(**dict(kw, conv_weight=torch.cat([w, w[:, :2]], 1),
                                       conv_state=torch.zeros(6, w.shape[0], 5, dtype=w.dtype)))  # fmt: skip
    (spec,) = plan_mamba2_decode_step(**kw)
    assert spec.dim == 64 and spec.width == 4 and spec.heads_per_group == 4 and spec.heads_per_norm == 4


def test_launcher_and_its_fast_path_run_the_planned_kernel(monkeypatch):
    """The TileLang launcher end to end (spec, launch arguments, workspace, zero-once counters), its kernel run by
    the emulator: a first call, then the launcher it leaves for calls of the same metadata, on new tensors."""
    from mate.mamba._ops import DECODE_STEP
    from mate.mamba._tilelang import decode_step as launcher

    def kernel(spec, device):
        em = _built.get(spec) or _built.setdefault(spec, Emulated(spec.build(), spec.pass_configs()))
        nb = spec.dim // spec.tiling.block_p
        return lambda *a: em(*a, grid=(nb, a[6].shape[1], a[0].shape[0]), threads=spec.tiling.threads)

    monkeypatch.setattr(launcher, "kernel", kernel)
    monkeypatch.setattr(launcher, "_kernels", {})
    from mate.mamba import settings

    kw = build(Case(batch=3, pads=(1,)), "cpu")
    a, r = clone(kw), clone(kw)
    names = DECODE_STEP.tensor_names

    def want():
        return mamba2_decode_step(**r, backend="torch"), r["conv_state"], r["ssm_state"]

    with settings.override(MATE_CHECK_INPUTS="1"):  # the slots checked on the host: no launcher left
        out, again = launcher.run(normalize_decode_step(**a), {n: a.get(n) for n in names})
    assert again is None
    check((out, a["conv_state"], a["ssm_state"]), want())
    with settings.override(MATE_CHECK_INPUTS="0"):
        out, again = launcher.run(normalize_decode_step(**a), {n: a.get(n) for n in names})
        check((out, a["conv_state"], a["ssm_state"]), want())
        out2 = again(tuple(a.get(n) for n in names))
    check((out2, a["conv_state"], a["ssm_state"]), want())
    assert out2 is not out and not bool(launcher.counters(1, torch.device("cpu")).any())


def _emulate(spec, args, grid, threads):
    em = _built.get(spec) or _built.setdefault(spec, Emulated(spec.build(), spec.pass_configs()))
    em(*args, grid=grid, threads=threads)


THREE_LAUNCHES = [
    pytest.param(Case(batch=9, pads=(3,)), id="b9"),
    pytest.param(
        Case(
            batch=12, pads=(0, 11), state=torch.float32, strided=True, index=torch.int64, table_2d=True, out_rows=True
        ),
        id="b12-f32-strided-int64-2d-out-rows",
    ),  # fmt: skip
    pytest.param(
        Case(batch=10, io=torch.float16, state=torch.float16, pad_slot_id=0, has_D=False, has_bias=False, width=2),
        id="b10-f16-null-0-w2",
    ),  # fmt: skip
]


@pytest.mark.parametrize("c", THREE_LAUNCHES)
def test_three_launches_above_the_fused_batch(monkeypatch, c):
    """Above ``FUSED_MAX_BATCH`` the launcher runs the conv1d update, the SSU and the norm over its scratch, each
    op's planned kernel emulated on the CPU: equal to the reference step, twice on the same scratch; the plan names
    the three kernels, in launch order."""
    from mate.mamba._contract.norm import finish as norm_finish
    from mate.mamba._contract.ssu import finish as ssu_finish
    from mate.mamba._tilelang import conv1d_plan, norm_plan, ssu_plan
    from mate.mamba._tilelang import decode_step as launcher

    assert c.batch > decode_step_plan.FUSED_MAX_BATCH
    ran = []

    def conv(call):
        spec, args = conv1d_plan.plan_update(call)
        _emulate(spec, args, conv1d_plan.grid_update(spec, call), spec.threads)
        ran.append(spec)

    def ssu(call):
        spec, args = ssu_plan.plan(call)
        t = spec.tiling
        _emulate(spec, args, (-(-call.state.shape[2] // t.block_p), call.state.shape[1], call.nseq), t.threads)
        ran.append(spec)
        return ssu_finish(call)

    def norm(call):
        spec, args = norm_plan.plan(call)
        _emulate(spec, args, (call.rows, call.groups, 1), spec.threads)
        ran.append(spec)
        return norm_finish(call)

    monkeypatch.setattr(launcher.conv1d, "run_update", conv)
    monkeypatch.setattr(launcher.ssu, "run", ssu)
    monkeypatch.setattr(launcher.norm, "run", norm)
    kw = build(c, "cpu")
    a, r = clone(kw), clone(kw)
    if c.out_rows:
        r["out"] = torch.zeros_like(kw["out"])
    for step in range(2):
        if step:
            a["dt"] = r["dt"] = kw["dt"] * 0.5
        out, _ = launcher.run(normalize_decode_step(**a))
        check((out, a["conv_state"], a["ssm_state"]), (mamba2_decode_step(**r, backend="torch"), r["conv_state"],
                                                      r["ssm_state"]))  # fmt: skip
    assert out is a.get("out", out) and tuple(ran[:3]) == plan_mamba2_decode_step(**clone(kw))


def test_prewarm_compiles_what_the_three_launches_plan():
    """``prewarm_mamba2_decode_step``'s specs above the fused batch (``decode_step.sequence_specs``) hold the three
    kernels a call of that configuration plans (dt in the io dtype, fp32 parameters)."""
    from mate.mamba._tilelang import decode_step as launcher

    c = Case(batch=decode_step_plan.FUSED_MAX_BATCH + 8, heads=16, dstate=128, groups=2, norm_groups=2)
    kw = build(c, "cpu")
    kw["norm_weight"] = kw["norm_weight"].float()
    planned = plan_mamba2_decode_step(**kw)
    assert len(planned) == 3
    config = dict(heads=c.heads, dim=c.dim, dstate=c.dstate, ngroups=c.groups, width=c.width,
                  norm_group_size=c.heads * c.dim // c.norm_groups, io_dtype=c.io, state_dtype=c.state,
                  dt_dtype=c.io, param_dtype=torch.float32, weight_dtype=c.io, index_dtype=c.index,
                  has_conv_bias=c.has_bias)  # fmt: skip
    prewarmed = {spec for _, spec in launcher.sequence_specs("cpu", **config)}
    assert set(planned) <= prewarmed, set(planned) - prewarmed
