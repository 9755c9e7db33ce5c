"""The one planner of ``mamba2_decode_step`` on the TileLang backend: a normalised :class:`DecodeStepCall` -> its
kernel spec (:class:`~mate.mamba._tilelang.specs.DecodeStepSpec`) and launch arguments.

Two designs, chosen by the batch (:data:`FUSED_MAX_BATCH`): the fused kernel (one launch), or the step as MATE's
three ops in sequence (conv1d update, SSU, gated norm: three launches over two scratch buffers, the contract's
``three_ops``). The fused kernel's choice: the one-token SSU kernel's tiling of (P, N, state dtype)
(:func:`mate_kernels.ssu_common.choose_tiling`), 16-byte state accesses where the pool's slot stride and pointer
allow them. What the fused kernel does not serve raises ``NotImplementedError`` naming the argument at every batch, so a
call's validity does not depend on its batch (``backend='torch'`` serves every valid call). Absent optional tensors
are passed as ones the kernel never reads (conv_bias as a column of conv_weight, D and dt_bias as A).
"""

from __future__ import annotations

import torch
from mate.mamba._contract.decode_step import DecodeStepCall, three_ops
from mate.mamba._contract.dtypes import DTYPE_NAMES
from mate.mamba._tilelang import conv1d_plan, norm_plan, ssu_plan
from mate.mamba._tilelang.specs import DecodeStepSpec
from mate_kernels.ssu_common import choose_tiling

ALIGN = 16  # bytes: a vector access's alignment
MAX_WIDTH = 4  # the kernel's conv widths: 2 to 4 (every served model: 4)

# The largest batch the fused kernel serves; larger ones run as three launches. The fused kernel against the step
# as vLLM's conv1d update + MATE's SSU + vLLM's gated norm, graph-replayed, Nemotron-H 8B (docs/benchmarks/layer.md,
# H100, 2026-12-07 at 54c4100): 1.07-1.19x at batch 1-4, 1.00x at 8, 0.75x at 64, 0.70x at 256. Every CTA of the
# fused kernel ends with a device-wide hand-over (a fence, the counters' atomics) that holds its SM slot with no load
# in flight, so from batch 64 the separate SSU's 80-86 % of the copy ceiling beats the fused kernel's 60 %.
FUSED_MAX_BATCH = 8


def _name(dt: torch.dtype) -> str:
    return DTYPE_NAMES[dt]


def spec_for(*, dim, dstate, heads_per_group, heads_per_norm, width, io_dtype, state_dtype, dt_dtype, weight_dtype,
             bias_dtype, has_bias, d_dtype, has_D, dt_bias_dtype, has_dt_bias, norm_weight_dtype, index_dtype,
             vector_state) -> DecodeStepSpec:  # fmt: skip
    """The spec of one configuration (dtype names as strings); ``NotImplementedError`` for what the kernel does not
    serve."""
    if not 2 <= width <= MAX_WIDTH:
        raise NotImplementedError(f"conv_weight: width {width} is not served by MATE's fused decode-step kernel "
                                  f"(2 to {MAX_WIDTH}; backend='torch' serves any)")  # fmt: skip
    tiling = choose_tiling(dim, dstate, state_dtype)
    if dim % tiling.block_p:
        raise NotImplementedError(f"ssm_state: head_dim {dim} with d_state {dstate} is not tiled whole by MATE's fused "
                                  "decode-step kernel (backend='torch' serves it)")  # fmt: skip
    return DecodeStepSpec(
        dim=dim, dstate=dstate, heads_per_group=heads_per_group, heads_per_norm=heads_per_norm, width=width,
        io_dtype=io_dtype, state_dtype=state_dtype, dt_dtype=dt_dtype, weight_dtype=weight_dtype,
        bias_dtype=bias_dtype, has_bias=has_bias, d_dtype=d_dtype, has_D=has_D, dt_bias_dtype=dt_bias_dtype,
        has_dt_bias=has_dt_bias, norm_weight_dtype=norm_weight_dtype, index_dtype=index_dtype, tiling=tiling,
        vector_state=vector_state,
    )  # fmt: skip


def vector_ok(call: DecodeStepCall) -> bool:
    """Whether the SSM pool allows 16-byte state accesses: its slot stride in whole vectors and its pointer aligned
    (pointers change between calls of equal metadata: the launcher asks on every call)."""
    vec = 16 // call.ssm_state.element_size()
    while call.dstate % vec:
        vec //= 2
    return call.ssm_state.stride(0) % vec == 0 and call.ssm_state.data_ptr() % ALIGN == 0


def call_spec(call: DecodeStepCall, vector: bool) -> DecodeStepSpec:
    if call.conv_state.dtype != call.xBC.dtype:
        raise NotImplementedError(
            f"conv_state: a {_name(call.conv_state.dtype)} pool beside {_name(call.xBC.dtype)} xBC is not served by "
            "MATE's fused decode-step kernel (a pool of xBC's dtype; backend='torch' serves it)"
        )
    if call.norm_group_size % call.dim:
        raise NotImplementedError(
            f"norm_group_size: {call.norm_group_size} is not a whole number of heads ({call.dim} features each): "
            "MATE's fused decode-step kernel normalises whole heads (backend='torch' serves it)"
        )
    w = call.conv_weight
    return spec_for(
        dim=call.dim, dstate=call.dstate, heads_per_group=call.heads // call.ngroups,
        heads_per_norm=call.norm_group_size // call.dim, width=call.width, io_dtype=_name(call.xBC.dtype),
        state_dtype=_name(call.ssm_state.dtype), dt_dtype=_name(call.dt.dtype), weight_dtype=_name(w.dtype),
        bias_dtype=_name((w if call.conv_bias is None else call.conv_bias).dtype), has_bias=call.conv_bias is not None,
        d_dtype=_name((call.A if call.D is None else call.D).dtype), has_D=call.D is not None,
        dt_bias_dtype=_name((call.A if call.dt_bias is None else call.dt_bias).dtype),
        has_dt_bias=call.dt_bias is not None, norm_weight_dtype=_name(call.norm_weight.dtype),
        index_dtype=_name(call.slots.dtype), vector_state=vector,
    )  # fmt: skip


def grid(spec: DecodeStepSpec, call: DecodeStepCall) -> tuple[int, int, int]:
    """The launch grid ``(P / block_p, heads, batch)``."""
    return call.dim // spec.tiling.block_p, call.heads, call.batch


def workspace_sizes(spec: DecodeStepSpec, call: DecodeStepCall) -> dict:
    """Elements of each scratch buffer: ``y_ws`` (fp32, y per feature), ``partials`` (fp32, one per CTA),
    ``counters`` (int32, one per (sequence, norm group) and per (sequence, SSM group))."""
    ctas_per_norm = spec.heads_per_norm * (call.dim // spec.tiling.block_p)
    return {
        "y_ws": call.batch * call.heads * call.dim,
        "partials": call.batch * call.norm_groups * ctas_per_norm,
        "counters": call.batch * (call.norm_groups + call.ngroups),
    }


def launch_args(call: DecodeStepCall, y_ws, partials, counters) -> tuple:
    """The kernel's arguments, in the prim_func's order (``y_ws`` ``[batch, HP]`` fp32, ``partials`` and
    ``counters`` flat, the counters zero)."""
    bias = call.conv_weight[:, 0] if call.conv_bias is None else call.conv_bias
    D = call.A if call.D is None else call.D
    dt_bias = call.A if call.dt_bias is None else call.dt_bias
    return (call.xBC, call.z, call.dt, call.conv_state, call.conv_weight, bias, call.ssm_state, call.A, D, dt_bias,
            call.norm_weight, call.slots, call.out, y_ws, partials, counters, call.pad_slot_id, call.eps)  # fmt: skip


def fused(call: DecodeStepCall) -> bool:
    """Whether a call runs as the fused kernel (else as three launches: the contract's ``three_ops``)."""
    return call.batch <= FUSED_MAX_BATCH


def plan(call: DecodeStepCall) -> tuple:
    """The specs a call launches, in launch order: the fused kernel's, or the conv1d update's, the SSU's and the
    norm's; none for a call without sequences."""
    if call.batch == 0:
        return ()
    spec = call_spec(call, vector_ok(call))  # what the fused kernel does not serve is refused at every batch
    if fused(call):
        return (spec,)
    xbc = torch.empty(call.xBC.shape, dtype=call.xBC.dtype, device=call.xBC.device)
    y = torch.empty((call.batch, call.heads, call.dim), dtype=call.xBC.dtype, device=call.xBC.device)
    conv, ssu, norm = three_ops(call, xbc, y, call.out.contiguous())
    return conv1d_plan.plan_update(conv)[0], ssu_plan.plan(ssu)[0], norm_plan.plan(norm)[0]


__all__ = ["FUSED_MAX_BATCH", "call_spec", "fused", "grid", "launch_args", "plan",
           "spec_for", "vector_ok", "workspace_sizes"]  # fmt: skip
