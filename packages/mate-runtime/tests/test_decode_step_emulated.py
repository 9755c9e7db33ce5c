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


# ------------------------------------------------------------------------------------- the three launches' recipe


def _ops_kernels(monkeypatch, ran: list, emulate: bool = True):
    """The three ops' kernel lookups (conv1d update, SSU, gated norm) as the emulated kernels (``emulate=False``:
    no-ops), each launch recorded in ``ran`` as ``(spec, args)``; the launcher modules' memos emptied."""
    from mate.mamba._tilelang import conv1d, norm, ssu, ssu_plan

    def grid_conv(spec, a):
        return (-(-a[2].shape[0] // (spec.threads * spec.vec)), a[8], 1), spec.threads  # weight [CD, W], batch

    def grid_ssu(spec, a):
        nseq = a[ssu_plan.arg_names(spec).index("nseq")]
        t = spec.tiling
        return (-(-a[0].shape[2] // t.block_p), a[0].shape[1], nseq), t.threads

    def grid_norm(spec, a):
        return (a[0].shape[0], a[0].shape[1] // spec.group_size, 1), spec.threads

    def lookup(grid):
        def kernel(spec, device):
            def launch(*a):
                ran.append((spec, a))
                if emulate:
                    _emulate(spec, a, *grid(spec, a))

            return launch

        return kernel

    for mod, grid in ((conv1d, grid_conv), (ssu, grid_ssu), (norm, grid_norm)):
        monkeypatch.setattr(mod, "kernel", lookup(grid))
        monkeypatch.setattr(mod, "_kernels", {})


def _same_args(x, y) -> bool:
    if isinstance(x, torch.Tensor):
        return (isinstance(y, torch.Tensor) and x.data_ptr() == y.data_ptr() and x.shape == y.shape
                and x.stride() == y.stride() and x.dtype == y.dtype)  # fmt: skip
    return type(x) is type(y) and x == y


def _tensors(kw):
    from mate.mamba._ops import DECODE_STEP

    return tuple(kw.get(n) for n in DECODE_STEP.tensor_names)


RECIPE_CASES = [
    pytest.param(Case(batch=12, pads=(0, 7), pad_slot_id=0, strided=True), id="b12-null-0-strided"),
    pytest.param(Case(batch=40, pads=(1, 20, 39), heads=4, groups=1, norm_groups=1), id="b40-pads"),
    pytest.param(
        Case(batch=12, pads=(3,), state=torch.float32, index=torch.int64, table_2d=True, out_rows=True),
        id="b12-f32-int64-2d-out-rows",
    ),  # fmt: skip
]


@pytest.mark.parametrize("fresh_out", [False, True], ids=["out", "no-out"])
@pytest.mark.parametrize("c", RECIPE_CASES)
def test_three_launch_recipe_matches_the_slow_path_and_the_reference(monkeypatch, c, fresh_out):
    """Above ``FUSED_MAX_BATCH`` the launcher leaves a recipe of the three launches (no call rebuilt, no sub-call
    normalised): a hit on new data equals the slow path (bit for bit) and the reference step, three calls in a row."""
    from mate.mamba import settings
    from mate.mamba._tilelang import decode_step as launcher

    ran: list = []
    _ops_kernels(monkeypatch, ran)
    kw = build(c, "cpu")
    if fresh_out:
        kw.pop("out", None)
    elif "out" not in kw:
        kw["out"] = torch.zeros_like(kw["z"])
    a, s, r = clone(kw), clone(kw), clone(kw)
    if "out" in kw:  # each run its own, of the same strides
        o = kw["out"]
        s["out"], r["out"] = (torch.empty_strided(o.shape, o.stride(), dtype=o.dtype).zero_() for _ in range(2))
    with settings.override(MATE_CHECK_INPUTS="0"):
        for step in range(3):
            if step:
                kw["dt"].mul_(0.5)  # (one dt tensor in the three: new data, the same metadata)
            if step == 0:
                got, recipe = launcher.run(normalize_decode_step(**a), dict(zip(_names(), _tensors(a), strict=True)))
                assert recipe is not None and len(recipe.launches) == 3, "a recipe of the three launches"
            else:
                got = recipe(_tensors(a))
            slow, _ = launcher.run(normalize_decode_step(**s))
            for x, y in ((got, slow), (a["conv_state"], s["conv_state"]), (a["ssm_state"], s["ssm_state"])):
                assert torch.equal(x, y)
            check((got, a["conv_state"], a["ssm_state"]),
                  (mamba2_decode_step(**r, backend="torch"), r["conv_state"], r["ssm_state"]))  # fmt: skip
            assert fresh_out or got is a["out"]


def _names():
    from mate.mamba._ops import DECODE_STEP

    return DECODE_STEP.tensor_names


def test_three_launch_recipe_launches_what_the_three_ops_launch(monkeypatch):
    """The recipe's kernels and arguments are the three ops' launchers' (the same specs, the same arguments in the
    same order, the same workspace buffers), on the same tensors."""
    from mate.mamba import settings
    from mate.mamba._tilelang import decode_step as launcher

    ran: list = []
    _ops_kernels(monkeypatch, ran, emulate=False)
    kw = build(Case(batch=12, pads=(2,), strided=True, table_2d=True, index=torch.int64, out_rows=True), "cpu")
    with settings.override(MATE_CHECK_INPUTS="0"):
        _, recipe = launcher.run(normalize_decode_step(**kw), dict(zip(_names(), _tensors(kw), strict=True)))
        slow = ran[:]
        ran.clear()
        recipe(_tensors(kw))
    assert len(slow) == len(ran) == 3
    for (spec, args), (rspec, rargs) in zip(slow, ran, strict=True):
        assert spec == rspec and len(args) == len(rargs)
        assert all(_same_args(x, y) for x, y in zip(args, rargs, strict=True)), spec


def test_three_launch_recipe_through_the_fast_path(monkeypatch):
    """Through ``mamba2_decode_step``'s eager fast path: a changed stride, dtype or shape misses the remembered
    recipe (the call normalises again), the first form hits its recipe after those misses, and a call of equal
    metadata at another pointer alignment takes the general launcher; every result equals the reference."""
    from mate.mamba import _dispatch, settings
    from mate.mamba import decode_step as api
    from mate.mamba._tilelang import decode_step as launcher

    ran: list = []
    _ops_kernels(monkeypatch, ran)
    monkeypatch.setattr(_dispatch, "resolve_backend", lambda requested, device: requested.replace("auto", "tilelang"))
    slow_calls = []
    real = launcher._launch
    monkeypatch.setattr(launcher, "_launch", lambda call, specs: (slow_calls.append(call.batch), real(call, specs))[1])
    api.FAST.clear()

    def variant(c, **over):
        kw = build(c, "cpu")
        kw.update(over)
        return kw

    base = Case(batch=12, pads=(4,))
    misaligned = build(base, "cpu")
    proj = torch.cat([misaligned["z"], misaligned["xBC"], misaligned["dt"]], 1)
    shifted = torch.empty(proj.numel() + 1, dtype=proj.dtype)[1:].view(proj.shape)  # every row 2 bytes off
    shifted.copy_(proj)
    hp, cd = misaligned["z"].shape[1], misaligned["xBC"].shape[1]
    misaligned.update(z=shifted[:, :hp], xBC=shifted[:, hp : hp + cd], dt=shifted[:, hp + cd :])
    calls = [  # (arguments, whether the call normalises)
        (variant(base), True),
        (build(base, "cpu", seed=1), False),  # new data: a hit
        (variant(Case(batch=12, pads=(4,), strided=True)), True),  # the pools' strides
        (variant(Case(batch=12, pads=(4,), index=torch.int64)), True),  # the slots' dtype
        (variant(Case(batch=40, pads=(4,))), True),  # the batch
        (variant(base), False),  # the first form again: its recipe
        (misaligned, True),  # equal metadata, z / xBC / dt 2 bytes off: the general launcher
    ]
    try:
        with settings.override(MATE_CHECK_INPUTS="0"):
            for i, (kw, normalises) in enumerate(calls):
                a, r = clone(kw), clone(kw)
                before = len(slow_calls)
                got = mamba2_decode_step(**a)
                assert (len(slow_calls) > before) == normalises, i
                check((got, a["conv_state"], a["ssm_state"]),
                      (mamba2_decode_step(**r, backend="torch"), r["conv_state"], r["ssm_state"]))  # fmt: skip
        recipes = [v for v in api.FAST.cache.values() if v is not api.FAST.SLOW]  # (SLOW: the reference's calls)
        assert len(recipes) == 4 and all(hasattr(v, "launches") for v in recipes)
    finally:
        api.FAST.clear()
