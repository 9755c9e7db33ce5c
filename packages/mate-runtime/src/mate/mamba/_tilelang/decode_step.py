"""TileLang launcher for ``mamba2_decode_step``: one normalised :class:`DecodeStepCall` -> the fused kernel's launch
or the three ops' launches on the current stream (:mod:`.decode_step_plan` decides), no host<->device
synchronisation.

Scratch of the fused kernel: ``y_ws`` and ``partials`` from the workspace cache (written before they are read in
every launch) and the hand-over counters, zeroed once when allocated: each launch leaves them zero (the kernel's
docstring), so a steady-state call and a CUDA-graph replay touch nothing else. Scratch of the three launches: xBC's
copy that the conv1d update overwrites, and y (and the norm's output where ``out`` is not contiguous), written
before they are read. As for every workspace, two launches must not run concurrently on different streams of one
device.
"""

from __future__ import annotations

import torch
from mate.mamba._contract.decode_step import DecodeStepCall, check_index_data, three_ops
from mate.mamba._contract.dtypes import DTYPE_NAMES
from mate.mamba._contract.template import CallTemplate
from mate.mamba._platform import settings
from mate.mamba._platform.device import hardware, is_capturing, pdl_for_capability, tilelang_target
from mate.mamba._tilelang import conv1d, conv1d_plan, norm, norm_plan, ssu, ssu_plan
from mate.mamba._tilelang.cache import compile_missing, kernel_lookup
from mate.mamba._tilelang.decode_step_plan import (
    call_spec,
    fused,
    launch_args,
    spec_for,
    vector_ok,
    workspace_sizes,
)
from mate.mamba._tilelang.decode_step_recipe import make_recipe
from mate.mamba._tilelang.specs import Conv1dUpdateSpec
from mate.mamba._tilelang.workspace import WORKSPACE

PREWARM_HINT = "mate.mamba.prewarm_mamba2_decode_step(heads=..., dim=..., dstate=..., ngroups=..., ...)"
kernel, _kernels = kernel_lookup(PREWARM_HINT)  # kernel(spec, device), and its memo (spec -> kernel)

MIN_COUNTERS = 1 << 16  # int32 counters first allocated (256 KB): 4096 sequences at 8 + 8 groups


def counters(n: int, device: torch.device) -> torch.Tensor:
    """The hand-over counters (at least ``n``), zeroed when allocated; the kernel leaves them zero."""
    return WORKSPACE.get("decode_step", "counters", (max(n, MIN_COUNTERS),), torch.int32, device, zeroed=True)


def run(call: DecodeStepCall, sources: dict | None = None):
    """``(out, launcher)``; the launcher (None without ``sources``, with ``MATE_CHECK_INPUTS=1`` (the slots read back
    and checked first, outside graph capture) or for a call whose fields are not the caller's tensors or views of
    them) runs a call of the same metadata from the caller's tensors: above the fused kernel's batch the three
    launches' recipe (:mod:`.decode_step_recipe`), falling back to the call rebuilt and run as here for a pointer
    alignment it was not made for."""
    if settings.get("MATE_CHECK_INPUTS") and not is_capturing(call.state.device):
        check_index_data(call)
        sources = None
    specs: dict = {}  # vector state accesses allowed? -> spec
    out = _launch(call, specs)
    general = CallTemplate.launcher(call, sources, lambda c: _launch(c, specs), fresh=("out",))
    if general is not None and call.batch and not fused(call):
        xbc, y, norm_out = _scratch(call)
        recipe = make_recipe(call, sources, general, xbc, norm_out, sequence_plan(call, xbc, y, norm_out),
                             constants=(xbc, y, norm_out, *ssu_plan.dummies(), *conv1d_plan.dummies()))  # fmt: skip
        if recipe is not None:
            return out, recipe
    return out, general


def _launch(call: DecodeStepCall, specs: dict) -> torch.Tensor:
    if call.batch:
        vector = vector_ok(call)
        spec = specs.get(vector)
        if spec is None:
            spec = specs[vector] = call_spec(call, vector)
        if not fused(call):
            _sequence(call)
            return call.out
        kern = _kernels.get(spec)
        dev = call.xBC.device
        if kern is None:
            kern = kernel(spec, dev)
        sizes = workspace_sizes(spec, call)
        y_ws = WORKSPACE.get(spec, "y_ws", (call.batch, call.heads * call.dim), torch.float32, dev)
        partials = WORKSPACE.get(spec, "partials", (sizes["partials"],), torch.float32, dev)
        kern(*launch_args(call, y_ws, partials, counters(sizes["counters"], dev)))
    return call.out


def _sequence(call: DecodeStepCall) -> None:
    """The step as three launches (the contract's ``three_ops``) after a copy of xBC, each op's own launcher
    deciding its kernel."""
    xbc, y, out = _scratch(call)
    xbc.copy_(call.xBC)
    conv_call, ssu_call, norm_call = three_ops(call, xbc, y, out)
    conv1d.run_update(conv_call)
    ssu.run(ssu_call)
    norm.run(norm_call)
    if out is not call.out:
        call.out.copy_(out)


def _scratch(call: DecodeStepCall) -> tuple:
    """The three launches' scratch: xBC's copy, y, and the norm's output (``out`` itself when contiguous)."""
    dev, io = call.xBC.device, call.xBC.dtype
    xbc = WORKSPACE.get("decode_step_sequence", "xBC", tuple(call.xBC.shape), io, dev)
    y = WORKSPACE.get("decode_step_sequence", "y", (call.batch, call.heads, call.dim), io, dev)
    dense = call.out.is_contiguous()
    out = call.out if dense else WORKSPACE.get("decode_step_sequence", "out", tuple(call.out.shape), io, dev)
    return xbc, y, out


def sequence_plan(call: DecodeStepCall, xbc, y, out) -> tuple:
    """``(kernel lookup, planned)`` of the three launches over this scratch, in launch order: what the three ops'
    launchers run on the contract's sub-calls, by their own planners (``planned``: ``(spec, args)``, or None for
    nothing to launch). The SSU's out is y, dense: it never copies back after its launch (a scratch out would be
    a per-call tensor, which leaves the call form without a recipe)."""
    conv_call, ssu_call, norm_call = three_ops(call, xbc, y, out)
    return ((conv1d.kernel, conv1d_plan.plan_update(conv_call)), (ssu.kernel, ssu_plan.plan(ssu_call)),
            (norm.kernel, norm_plan.plan(norm_call)))  # fmt: skip


def serving_specs(*, heads, dim, dstate, ngroups, width, norm_group_size, io_dtype, state_dtype, dt_dtype,
                  param_dtype, weight_dtype, index_dtype, has_conv_bias) -> list:  # fmt: skip
    """The kernel a configuration's aligned calls use (pools of whole 16-byte state rows)."""
    name = DTYPE_NAMES.get
    return [spec_for(
        dim=dim, dstate=dstate, heads_per_group=heads // ngroups, heads_per_norm=norm_group_size // dim, width=width,
        io_dtype=name(io_dtype), state_dtype=name(state_dtype), dt_dtype=name(dt_dtype),
        weight_dtype=name(weight_dtype), bias_dtype=name(weight_dtype), has_bias=has_conv_bias,
        d_dtype=name(param_dtype), has_D=True, dt_bias_dtype=name(param_dtype), has_dt_bias=True,
        norm_weight_dtype=name(param_dtype), index_dtype=name(index_dtype), vector_state=True,
    )]  # fmt: skip


def sequence_specs(device, *, heads, dim, dstate, ngroups, width, norm_group_size, io_dtype, state_dtype, dt_dtype,
                   param_dtype, weight_dtype, index_dtype, has_conv_bias) -> list:  # fmt: skip
    """``(kernel lookup, spec)`` of the three launches a configuration's batches above the fused kernel's run: the
    one-token conv1d update in place (vector and scalar form), the SSU's one-token forms with tied
    parameters (dt fp32 and in the io dtype), the gated norm."""
    del dt_dtype  # the SSU's serving forms take both
    hw = hardware(torch.device(device))
    convs = [
        s
        for s in conv1d.serving_specs(
            dim=0,
            width=width,
            io_dtype=io_dtype,
            state_dtype=io_dtype,
            weight_dtype=weight_dtype,
            index_dtype=index_dtype,
            has_bias=has_conv_bias,
            silu=True,
        )  # fmt: skip
        if isinstance(s, Conv1dUpdateSpec) and s.round_via_state and not (s.varlen or s.spec_decode)
    ]
    ssus = ssu.serving_specs(state_dtype=state_dtype, io_dtype=io_dtype, heads=heads, dim=dim, dstate=dstate,
                             groups=ngroups, slot_dtype=index_dtype, packed=False, meta_dtype=torch.int32,
                             tie_hdim=True, pdl=pdl_for_capability(hw.kind, hw.major))  # fmt: skip
    norms = norm.serving_specs(
        hidden=heads * dim,
        group_size=norm_group_size,
        io_dtype=io_dtype,
        weight_dtype=param_dtype,
        z_dtype=io_dtype,
        has_bias=False,
        norm_before_gate=False,
    )
    return [(conv1d.kernel, s) for s in convs] + [(ssu.kernel, s) for s in ssus] + [(norm.kernel, s) for s in norms]


def prewarm(device, *, jobs=1, **config) -> None:
    """Compile (without launching) every kernel of one configuration on ``device``: the fused kernel
    (:func:`serving_specs`) and the three launches of larger batches (:func:`sequence_specs`)."""
    specs = serving_specs(**config)
    parts = sequence_specs(device, **config)
    compile_missing(specs + [s for _, s in parts], target=tilelang_target(device), jobs=jobs)
    for spec in specs:
        kernel(spec, device)
    for lookup, spec in parts:
        lookup(spec, device)
    device = torch.device(device)
    if device.index is None:  # the launches' tensors name their index: key the counters alike
        device = torch.device(device.type, torch.get_device_module(device.type).current_device())
    counters(MIN_COUNTERS, device)  # allocated (and zeroed) outside any graph capture


def compile_grid() -> list:
    """A representative grid: Nemotron-H 8B's per-rank layer (bf16 pools, fp32 params), an fp32 pool, width 2 with
    fp16 io, two norm groups per SSM group."""
    return [
        spec_for(
            dim=64,
            dstate=n,
            heads_per_group=hpg,
            heads_per_norm=hpn,
            width=w,
            io_dtype=io,
            state_dtype=st,
            dt_dtype=io,
            weight_dtype=io,
            bias_dtype=io,
            has_bias=True,
            d_dtype="float32",
            has_D=True,
            dt_bias_dtype="float32",
            has_dt_bias=True,
            norm_weight_dtype=io,
            index_dtype="int32",
            vector_state=True,
        )  # fmt: skip
        for n, hpg, hpn, w, io, st in (
            (128, 16, 16, 4, "bfloat16", "bfloat16"),
            (128, 16, 16, 4, "bfloat16", "float32"),
            (64, 4, 2, 2, "float16", "float16"),
        )
    ]


__all__ = ["PREWARM_HINT", "compile_grid", "counters", "kernel", "prewarm", "run", "sequence_plan", "sequence_specs",
           "serving_specs"]  # fmt: skip
