"""The causal conv1d planner: a normalised :class:`~mate.mamba._contract.conv1d.Conv1dUpdateCall` /
:class:`~mate.mamba._contract.conv1d.Conv1dFnCall` -> one kernel spec and its launch arguments (in the factory's
order, dummies for absent tensors: a kernel flag says they are never read).

The tuning is data (:data:`TUNING`): threads per CTA (one channel each) and the prefill's tokens per CTA. The
prefill's token blocks trade the CTAs' count against the serial tokens per thread; 64 tokens of 128 channels keep
a Nemotron-H conv dim (~10k channels per rank) at 8192 tokens to about 10k CTAs. Not measured on a GPU yet.
"""

from __future__ import annotations

import torch
from mate.mamba._contract.conv1d import Conv1dFnCall, Conv1dUpdateCall
from mate.mamba._contract.dtypes import DTYPE_NAMES
from mate.mamba._tilelang.specs import Conv1dFnSpec, Conv1dUpdateSpec

TUNING = {"threads": 128, "block_t": 64}

_NAMES = {**DTYPE_NAMES, torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _name(dt: torch.dtype) -> str:
    return _NAMES[dt]


def _dummy(device, dtype=torch.int32) -> torch.Tensor:
    return torch.zeros(1, dtype=dtype, device=device)


def _index(t: torch.Tensor | None, device):
    """A table and its dtype name, or a one-entry dummy (never read) and int32."""
    return (t, _name(t.dtype)) if t is not None else (_dummy(device), "int32")


def plan_update(call: Conv1dUpdateCall):
    """``(spec, args)`` of a decode update, or None for a call without sequences."""
    if call.batch == 0:
        return None
    dev = call.x.device
    slots, slot_dt = _index(call.slots, dev)
    acc, acc_dt = _index(call.num_accepted_tokens, dev)
    qsl, qsl_dt = _index(call.query_start_loc, dev)
    bias = call.bias if call.bias is not None else call.weight[:, 0]
    spec = Conv1dUpdateSpec(
        width=call.width, x_dtype=_name(call.x.dtype), state_dtype=_name(call.state.dtype),
        weight_dtype=_name(call.weight.dtype), bias_dtype=_name(bias.dtype), slot_dtype=slot_dt, acc_dtype=acc_dt,
        qsl_dtype=qsl_dt, has_bias=call.bias is not None, silu=call.silu, varlen=call.query_start_loc is not None,
        spec_decode=call.num_accepted_tokens is not None, has_slots=call.slots is not None,
        has_null=call.null_block_id is not None, round_via_state=call.round_via_state, threads=TUNING["threads"],
    )  # fmt: skip
    null = call.null_block_id if call.null_block_id is not None else 0
    args = (call.x, call.out, call.weight, bias, call.state, slots, acc, qsl, call.batch, call.seqlen,
            call.state_len, null)  # fmt: skip
    return spec, args


def plan_fn(call: Conv1dFnCall):
    """``(spec, args)`` of a prefill, or None for a call without tokens or sequences."""
    if call.x.shape[1] == 0 or call.batch == 0:
        return None
    dev = call.x.device
    slots, slot_dt = _index(call.cache_indices, dev)
    init = call.has_initial_state if call.has_initial_state is not None else _dummy(dev, torch.bool)
    bias = call.bias if call.bias is not None else call.weight[:, 0]
    spec = Conv1dFnSpec(
        width=call.width, x_dtype=_name(call.x.dtype), state_dtype=_name(call.state.dtype),
        weight_dtype=_name(call.weight.dtype), bias_dtype=_name(bias.dtype),
        qsl_dtype=_name(call.query_start_loc.dtype), slot_dtype=slot_dt, has_bias=call.bias is not None,
        silu=call.silu, has_slots=call.cache_indices is not None, has_init=call.has_initial_state is not None,
        has_null=call.null_block_id is not None, threads=TUNING["threads"], block_t=TUNING["block_t"],
    )  # fmt: skip
    null = call.null_block_id if call.null_block_id is not None else 0
    args = (call.x, call.out, call.weight, bias, call.state, call.query_start_loc, slots, init, call.pad_slot_id,
            null)  # fmt: skip
    return spec, args


def grid_update(spec: Conv1dUpdateSpec, call: Conv1dUpdateCall) -> tuple[int, int, int]:
    """The launch grid (what the kernel's ``T.Kernel`` derives; the CPU emulator is told it)."""
    return (-(-call.x.shape[1] // spec.threads), call.batch, 1)


def grid_fn(spec: Conv1dFnSpec, call: Conv1dFnCall) -> tuple[int, int, int]:
    return (-(-call.x.shape[1] // spec.block_t), -(-call.x.shape[0] // spec.threads), 1)


__all__ = ["TUNING", "grid_fn", "grid_update", "plan_fn", "plan_update"]
