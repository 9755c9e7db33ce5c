"""TileLang launcher for ``selective_state_update``: one normalised :class:`SSUCall` -> one kernel launch.

:mod:`.ssu_plan` decides the kernel (a :class:`~mate.mamba._tilelang.specs.SSUSpec`) and its arguments; this module
compiles it on first use through the kernel cache and launches it on the current stream. No host<->device
synchronisation happens here: nothing is read back from the device (TileLang's ``tvm_ffi`` backend).
:mod:`.ssu_recipe` holds the eager fast path's replay of a launch.
"""

from __future__ import annotations

import torch
from mate.mamba._contract.ssu import SSUCall, check_index_data, finish
from mate.mamba._platform import settings
from mate.mamba._platform.device import hardware, is_capturing, pdl_for_arch, pdl_for_capability, tilelang_target
from mate.mamba._tilelang.cache import compile_missing, kernel_lookup
from mate.mamba._tilelang.specs import SSUSpec
from mate.mamba._tilelang.ssu_plan import plan, serving_specs, spec_dtypes, spec_for
from mate.mamba._tilelang.ssu_recipe import make_recipe

PREWARM_HINT = (
    "mate.mamba.prewarm_selective_state_update(state_dtype=..., io_dtype=..., batch=..., heads=..., dim=..., "
    "dstate=..., groups=..., slot_dtype=..., packed=..., meta_dtype=..., dt_dim=...)"
)
kernel, _kernels = kernel_lookup(PREWARM_HINT)  # kernel(spec, device), and its memo (spec -> kernel)


def run(call: SSUCall, sources: dict | None = None):
    """Run one normalised call: a single kernel launch on the current stream, no host<->device sync (with
    ``MATE_CHECK_INPUTS=1`` the index tables are first read back and checked, except during graph capture).
    Returns ``(y, launcher)``: the launcher (None without ``sources`` or with ``MATE_CHECK_INPUTS=1``) replays
    this launch for the caller's tensors of a call with the same metadata (:mod:`.ssu_recipe`, built from the
    plan made here)."""
    checked = settings.get("MATE_CHECK_INPUTS")
    if checked and not is_capturing(call.state.device):
        check_index_data(call)
    planned = plan(call)
    if planned is not None:
        spec, args = planned
        kern = _kernels.get(spec)
        if kern is None:
            kern = kernel(spec, call.state.device)
        kern(*args)
    result = finish(call)
    if sources is None or checked:  # checking the index data needs the full path on every call
        return result, None
    recipe = make_recipe(call, planned, sources, kernel)
    return result, None if recipe is None else recipe.launch


def prewarm(device, *, state_dtype, io_dtype, heads, dim, dstate, groups, slot_dtype, packed, meta_dtype, tie_hdim,
            jobs=1, philox_rounds=0):  # fmt: skip
    """Compile (without launching) every kernel the configuration will call on ``device``, those not cached in
    ``jobs`` worker processes (:func:`.cache.compile_missing`)."""
    hw = hardware(torch.device(device))
    specs = serving_specs(
        state_dtype=state_dtype, io_dtype=io_dtype, heads=heads, dim=dim, dstate=dstate, groups=groups,
        slot_dtype=slot_dtype, packed=packed, meta_dtype=meta_dtype, tie_hdim=tie_hdim,
        pdl=pdl_for_capability(hw.kind, hw.major), philox_rounds=philox_rounds,
    )  # fmt: skip
    compile_missing(specs, target=tilelang_target(device), jobs=jobs)
    for spec in specs:
        kernel(spec, device)


def compile_grid() -> list[SSUSpec]:
    """A representative grid: one-token + packed, bf16/fp32/fp16 state, P 64/80/128, N 128/256, tied/untied, the
    small-grid one-token forms, the block-scaled int16/int8/fp8 states (int8 / fp8 one-token: staged and not),
    fp16 states with stochastic rounding, and both PDL builds (the one ``MATE_SSU_PDL`` selects for sm_90a, and
    the other for two of them)."""
    f32, bf16, f16, i32, i64 = torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64
    grid = [
        # (one_token, P, N, ratio, state, io, dt, tied, small grid)
        (True, 64, 128, 16, bf16, bf16, f32, True, False),
        (True, 64, 128, 16, f32, bf16, bf16, True, False),
        (False, 64, 128, 16, bf16, bf16, f32, True, False),
        (False, 64, 128, 16, f32, bf16, f32, True, False),
        (True, 128, 256, 24, bf16, bf16, f32, False, False),
        (False, 80, 128, 1, f16, f16, f16, False, False),
        (True, 64, 128, 16, bf16, bf16, f32, True, True),
    ]
    # block-scaled states: every dtype in both kernels at the Nemotron-H shape, int8 at P 80 / N 256 untied
    i16, i8, f8 = torch.int16, torch.int8, torch.float8_e4m3fn
    grid += [
        (True, 64, 128, 16, i16, bf16, f32, True, False),
        (True, 64, 128, 16, i8, bf16, f32, True, False),
        (True, 64, 128, 16, f8, bf16, f32, True, False),
        (False, 64, 128, 16, i16, bf16, f32, True, False),
        (False, 64, 128, 16, i8, bf16, f32, True, False),
        (False, 64, 128, 16, f8, bf16, f32, True, False),
        (True, 80, 256, 1, i8, f16, f16, False, False),
        (True, 64, 128, 16, i8, bf16, f32, True, True),  # int8 / fp8 one-token: the register design of small grids
        (True, 64, 128, 16, f8, bf16, f32, True, True),
    ]
    pdl = pdl_for_arch("sm_90a")

    def spec(one_token, P, N, ratio, sdt, iodt, dtdt, tied, small=False, pdl=pdl, rounds=0):
        dtypes = spec_dtypes(state=sdt, io=iodt, dt=dtdt, src=i32, dst=i32 if one_token else i64, meta=i32)
        return spec_for(one_token=one_token, dim=P, dstate=N, heads_per_group=ratio, dtypes=dtypes, tied=tied,
                        vector_state=True, vector_io=True, small_grid=small, pdl=pdl, philox_rounds=rounds)  # fmt: skip

    specs = [spec(*row) for row in grid]
    specs += [
        spec(one_token, 64, 128, 16, sdt, bf16, f32, True, pdl=not pdl)
        for one_token, sdt in ((True, f32), (False, bf16))
    ]
    # fp16 stochastic rounding: both kernels (the packed one with an fp16 buffer), and 7 rounds at P 80 / N 256
    for one_token, P, N, rounds in ((True, 64, 128, 10), (False, 64, 128, 10), (True, 80, 256, 7)):
        specs.append(spec(one_token, P, N, 16, f16, bf16, f32, True, rounds=rounds))
    return specs


__all__ = ["run", "kernel", "prewarm", "compile_grid", "PREWARM_HINT"]
