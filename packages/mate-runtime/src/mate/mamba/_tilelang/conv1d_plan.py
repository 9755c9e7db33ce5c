"""The causal conv1d planner: a normalised :class:`~mate.mamba._contract.conv1d.Conv1dUpdateCall` /
:class:`~mate.mamba._contract.conv1d.Conv1dFnCall` -> one kernel spec and its launch arguments (in the factory's
order, dummies for absent tensors: a kernel flag says they are never read). The spec depends on the call's
metadata only, so a fast-path launcher decides it once (:func:`spec_update` / :func:`spec_fn`) and builds only the
arguments per call (:func:`args_update` / :func:`args_fn`).

The spec also depends on the pointers' 16-byte alignment (:func:`pointers`: the vector form needs it), which a
fast-path launcher re-checks per call.

The tuning is data (:data:`TUNING`): threads per CTA, the prefill's tokens per CTA and the update's tokens per
step; a thread's channels are 16 bytes (the update: TUNING's) of the widest dtype where the layout allows
(:func:`vector_width`), else one. The prefill's token blocks trade the CTAs' count against the per-CTA start
(weights, the sequence search, the window): 32 tokens make 2560 CTAs at 1 x 8192 and dim 10240, 2.4 rounds of the
8 CTAs an SM holds at the kernel's 64 registers (64 tokens: 1.2 rounds, the second mostly empty). Not yet measured
against 64 and 128 (docs/benchmarks/conv1d.md).
"""

from __future__ import annotations

import torch
from mate.mamba._contract.conv1d import Conv1dFnCall, Conv1dUpdateCall
from mate.mamba._contract.dtypes import DTYPE_NAMES
from mate.mamba._tilelang.specs import Conv1dFnSpec, Conv1dUpdateSpec
from mate_kernels.conv1d import vector_width as _vec_of

TUNING = {
    "threads": 128,  # the prefill's
    "block_t": 32,
    # the update: 64 threads a CTA (512 channels in the vector form) spread batch 1 at dim 10240 over 20 SMs, halving
    # each SM's share of the loads and of the MTP math; at large batches the registers, not the CTAs, bound an SM's
    # threads either way. Not yet measured against 128 (docs/benchmarks/conv1d.md)
    "update_threads": 64,
    # the update's bytes per access of a thread (its channels: these bytes of the widest dtype); 8 halves a thread's
    # math (not yet measured)
    "update_vec_bytes": 16,
    # the MTP forms (num_accepted_tokens, query_start_loc) load up to 8 tokens of a sequence before computing them:
    # vLLM's drafts are 1 + k tokens, k <= 7; the one-token form 1 (later tokens run one at a time)
    "mtp_group": 8,
}

_NAMES = {**DTYPE_NAMES, torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def _name(dt: torch.dtype) -> str:
    return _NAMES[dt]


_dummies: dict = {}


def _dummy(device, dtype=torch.int32) -> torch.Tensor:
    """A one-entry stand-in for an absent tensor (never read: a kernel flag says so), one per (device, dtype):
    no allocation per call, and a stable address under graph capture."""
    key = (device, dtype)
    t = _dummies.get(key)
    if t is None:
        t = _dummies[key] = torch.zeros(1, dtype=dtype, device=device)
    return t


def dummies() -> tuple:
    """The stand-ins made so far (fixed buffers: the eager fast path passes them on as constants)."""
    return tuple(_dummies.values())


def _index_dtype(t: torch.Tensor | None) -> str:
    return _name(t.dtype) if t is not None else "int32"


def _vec_ok(v: int, dim: int, dense: tuple, strided: tuple, others: tuple = ()) -> bool:
    """The vector form's layout: channel stride 1 (``dense``: (tensor, channel axis)), every other stride of those
    a multiple of ``v``, ``others`` dense; every pointer 16-byte aligned; ``dim % v == 0``."""
    if dim % v:
        return False
    for t, axis in dense:
        if t.stride(axis) != 1 or any(st % v for i, st in enumerate(t.stride()) if i != axis and t.shape[i] > 1):
            return False
    return all(t.is_contiguous() for t in others) and all(t.data_ptr() % 16 == 0 for t in strided)


def vector_width(call) -> int:
    """Channels per thread for this call: 16 bytes (the update: :data:`TUNING`'s) of the widest dtype where the
    layout allows, else 1."""
    w = call.weight
    bias = () if call.bias is None else (call.bias,)
    update = isinstance(call, Conv1dUpdateCall)
    v = _vec_of(*(_name(t.dtype) for t in (call.x, call.state, w, *bias)),
                nbytes=TUNING["update_vec_bytes"] if update else 16)  # fmt: skip
    axis = 1 if update else 0
    tensors = (call.x, call.out, call.state, w, *bias)
    ok = _vec_ok(v, call.x.shape[axis], ((call.x, axis), (call.out, axis), (call.state, 1)), tensors, (w, *bias))
    return v if ok else 1


def pointers(call) -> tuple:
    """What a spec depends on beyond the call's metadata: the 16-byte alignment of the tensors the vector form
    reads or writes."""
    bias = call.bias
    return (call.x.data_ptr() % 16, call.out.data_ptr() % 16, call.state.data_ptr() % 16, call.weight.data_ptr() % 16,
            0 if bias is None else bias.data_ptr() % 16)  # fmt: skip


def spec_update(call: Conv1dUpdateCall) -> Conv1dUpdateSpec | None:
    """The decode update's kernel, or None for a call without sequences, tokens or pool slots (nothing to launch:
    without slots every sequence is on the null block). The kernel reads at indices clamped into x and the pool,
    so it needs both non-empty."""
    if call.batch == 0 or call.x.shape[2] == 0 or call.state.shape[0] == 0:
        return None
    bias = call.bias if call.bias is not None else call.weight
    return Conv1dUpdateSpec(
        width=call.width, x_dtype=_name(call.x.dtype), state_dtype=_name(call.state.dtype),
        weight_dtype=_name(call.weight.dtype), bias_dtype=_name(bias.dtype), slot_dtype=_index_dtype(call.slots),
        acc_dtype=_index_dtype(call.num_accepted_tokens), qsl_dtype=_index_dtype(call.query_start_loc),
        has_bias=call.bias is not None, silu=call.silu, varlen=call.query_start_loc is not None,
        spec_decode=call.num_accepted_tokens is not None, has_slots=call.slots is not None,
        has_null=call.null_block_id is not None, round_via_state=call.round_via_state,
        threads=TUNING["update_threads"], vec=vector_width(call),
        group=update_group(call.query_start_loc is not None, call.num_accepted_tokens is not None),
    )  # fmt: skip


def update_group(varlen: bool, spec_decode: bool) -> int:
    """The update's tokens per step by call form (not by ``seqlen``, so prewarm knows the kernel): the MTP forms'
    :data:`TUNING` value, else 1."""
    return TUNING["mtp_group"] if varlen or spec_decode else 1


def args_update(call: Conv1dUpdateCall) -> tuple:
    """The decode update's launch arguments (the factory's order; cached dummies for absent tensors)."""
    dev = call.x.device
    idx = _dummy(dev)
    bias = call.bias if call.bias is not None else _dummy(dev, call.weight.dtype)
    null = call.null_block_id if call.null_block_id is not None else 0
    return (call.x, call.out, call.weight, bias, call.state, idx if call.slots is None else call.slots,
            idx if call.num_accepted_tokens is None else call.num_accepted_tokens,
            idx if call.query_start_loc is None else call.query_start_loc, call.batch, call.seqlen, null)  # fmt: skip


def plan_update(call: Conv1dUpdateCall):
    """``(spec, args)`` of a decode update, or None for a call without sequences."""
    spec = spec_update(call)
    return None if spec is None else (spec, args_update(call))


def spec_fn(call: Conv1dFnCall) -> Conv1dFnSpec | None:
    """The prefill's kernel, or None for a call without tokens or sequences."""
    if call.x.shape[1] == 0 or call.batch == 0:
        return None
    bias = call.bias if call.bias is not None else call.weight
    return Conv1dFnSpec(
        width=call.width, x_dtype=_name(call.x.dtype), state_dtype=_name(call.state.dtype),
        weight_dtype=_name(call.weight.dtype), bias_dtype=_name(bias.dtype),
        qsl_dtype=_name(call.query_start_loc.dtype), slot_dtype=_index_dtype(call.cache_indices),
        has_bias=call.bias is not None, silu=call.silu, has_slots=call.cache_indices is not None,
        has_init=call.has_initial_state is not None, has_null=call.null_block_id is not None,
        threads=TUNING["threads"], block_t=TUNING["block_t"], vec=vector_width(call),
    )  # fmt: skip


def args_fn(call: Conv1dFnCall) -> tuple:
    """The prefill's launch arguments (the factory's order; cached dummies for absent tensors)."""
    dev = call.x.device
    bias = call.bias if call.bias is not None else _dummy(dev, call.weight.dtype)
    slots = call.cache_indices if call.cache_indices is not None else _dummy(dev)
    init = call.has_initial_state if call.has_initial_state is not None else _dummy(dev, torch.bool)
    null = call.null_block_id if call.null_block_id is not None else 0
    return (call.x, call.out, call.weight, bias, call.state, call.query_start_loc, slots, init, call.pad_slot_id,
            null)  # fmt: skip


def plan_fn(call: Conv1dFnCall):
    """``(spec, args)`` of a prefill, or None for a call without tokens or sequences."""
    spec = spec_fn(call)
    return None if spec is None else (spec, args_fn(call))


def grid_update(spec: Conv1dUpdateSpec, call: Conv1dUpdateCall) -> tuple[int, int, int]:
    """The launch grid (what the kernel's ``T.Kernel`` derives; the CPU emulator is told it)."""
    return (-(-call.x.shape[1] // (spec.threads * spec.vec)), call.batch, 1)


def grid_fn(spec: Conv1dFnSpec, call: Conv1dFnCall) -> tuple[int, int, int]:
    return (-(-call.x.shape[1] // spec.block_t), -(-call.x.shape[0] // (spec.threads * spec.vec)), 1)


__all__ = ["TUNING", "args_fn", "args_update", "dummies", "grid_fn", "grid_update", "plan_fn", "plan_update",
           "pointers", "spec_fn", "spec_update", "update_group", "vector_width"]  # fmt: skip
