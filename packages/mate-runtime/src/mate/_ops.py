"""``torch.library`` custom ops for the two entry points, so ``torch.compile(fullgraph=True)`` traces MATE.

* ``mate::selective_state_update`` mutates ``state``, ``out`` and ``intermediate_states_buffer`` and returns
  nothing (an op may not return an alias of an input: the caller allocates ``out`` and returns it).
* ``mate::ssd_combined_fwd_varlen`` mutates ``out`` and ``final_states_out`` and returns the state tensor
  (a new tensor; an empty one when the final states went into ``final_states_out``).

Each op's real implementation is the eager path (normalise once, dispatch to a backend); its fake
implementation runs the same normaliser on fake tensors, so a bad call is rejected while tracing with the
same ``ValueError`` / ``NotImplementedError`` as in eager mode, and allocates the returned state tensor.

Eager calls do not go through the op: the dispatcher's argument boxing costs far more than the SSU's host
budget. The public functions (and the adapters, through :func:`selective_state_update` /
:func:`ssd_combined_fwd_varlen` here) call the implementation directly unless
``torch.compiler.is_compiling()``, and only then emit the op.
"""

from __future__ import annotations

import inspect
import math

import torch

from .mamba._ssd_call import normalize_ssd
from .mamba._ssu_call import normalize_ssu

# ------------------------------------------------------------------------------------------------ SSU


def _ssu_normalize(
    state,
    x,
    dt,
    A,
    B,
    C,
    D,
    z,
    dt_bias,
    dt_softplus,
    state_batch_indices,
    pad_slot_id,
    state_scale,
    out,
    disable_state_update,
    intermediate_states_buffer,
    intermediate_state_indices,
    intermediate_state_scales,
    rand_seed,
    philox_rounds,
    cache_steps,
    algorithm,
    dst_state_batch_indices,
    cu_seqlens,
    num_accepted_tokens,
    retrieve_parent_token,
    final_write_to_dst,
    accepted_writes_per_token,
):
    return normalize_ssu(
        state,
        x,
        dt,
        A,
        B,
        C,
        D,
        z=z,
        dt_bias=dt_bias,
        dt_softplus=dt_softplus,
        state_batch_indices=state_batch_indices,
        pad_slot_id=pad_slot_id,
        state_scale=state_scale,
        out=out,
        disable_state_update=disable_state_update,
        intermediate_states_buffer=intermediate_states_buffer,
        intermediate_state_indices=intermediate_state_indices,
        intermediate_state_scales=intermediate_state_scales,
        rand_seed=rand_seed,
        philox_rounds=philox_rounds,
        cache_steps=cache_steps,
        algorithm=algorithm,
        dst_state_batch_indices=dst_state_batch_indices,
        cu_seqlens=cu_seqlens,
        num_accepted_tokens=num_accepted_tokens,
        retrieve_parent_token=retrieve_parent_token,
        final_write_to_dst=final_write_to_dst,
        accepted_writes_per_token=accepted_writes_per_token,
    )


def _ssu_impl(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    state_batch_indices: torch.Tensor | None,
    pad_slot_id: int,
    state_scale: torch.Tensor | None,
    out: torch.Tensor,
    disable_state_update: bool,
    intermediate_states_buffer: torch.Tensor | None,
    intermediate_state_indices: torch.Tensor | None,
    intermediate_state_scales: torch.Tensor | None,
    rand_seed: torch.Tensor | None,
    philox_rounds: int,
    cache_steps: int,
    algorithm: str,
    dst_state_batch_indices: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    num_accepted_tokens: torch.Tensor | None,
    retrieve_parent_token: torch.Tensor | None,
    final_write_to_dst: bool,
    accepted_writes_per_token: bool,
    backend: str,
) -> None:
    from .mamba.ssu import run_ssu

    call = _ssu_normalize(
        state,
        x,
        dt,
        A,
        B,
        C,
        D,
        z,
        dt_bias,
        dt_softplus,
        state_batch_indices,
        pad_slot_id,
        state_scale,
        out,
        disable_state_update,
        intermediate_states_buffer,
        intermediate_state_indices,
        intermediate_state_scales,
        rand_seed,
        philox_rounds,
        cache_steps,
        algorithm,
        dst_state_batch_indices,
        cu_seqlens,
        num_accepted_tokens,
        retrieve_parent_token,
        final_write_to_dst,
        accepted_writes_per_token,
    )
    run_ssu(call, backend)


_ssu_op = torch.library.custom_op(
    "mate::selective_state_update", _ssu_impl, mutates_args=("state", "out", "intermediate_states_buffer")
)


def _ordered(op_fn, args, kwargs):
    """The op's arguments in schema order, however the dispatcher passed them."""
    if not kwargs:
        return args
    bound = inspect.signature(op_fn).bind(*args, **kwargs)
    return tuple(bound.arguments.values())


@_ssu_op.register_fake
def _ssu_fake(*args, **kwargs) -> None:
    # Validation only (shapes, dtypes, forms, unsupported capabilities); nothing is allocated.
    _ssu_normalize(*_ordered(_ssu_impl, args, kwargs)[:-1])


def selective_state_update(
    state,
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    state_batch_indices=None,
    pad_slot_id=-1,
    state_scale=None,
    out=None,
    disable_state_update=False,
    intermediate_states_buffer=None,
    intermediate_state_indices=None,
    intermediate_state_scales=None,
    rand_seed=None,
    philox_rounds=10,
    cache_steps=0,
    algorithm="auto",
    dst_state_batch_indices=None,
    cu_seqlens=None,
    num_accepted_tokens=None,
    retrieve_parent_token=None,
    final_write_to_dst=False,
    accepted_writes_per_token=True,
    backend="auto",
) -> torch.Tensor:
    """The SSU entry shared by ``mate.mamba`` and the adapters (which pass the adapter-only keywords).

    Eager: normalise and run (no dispatcher). While ``torch.compile`` traces: allocate ``out`` when absent,
    emit ``mate::selective_state_update`` and return ``out``.
    """
    if torch.compiler.is_compiling():
        return ssu_compiled(
            state,
            x,
            dt,
            A,
            B,
            C,
            D,
            z,
            dt_bias,
            dt_softplus,
            state_batch_indices,
            pad_slot_id,
            state_scale,
            out,
            disable_state_update,
            intermediate_states_buffer,
            intermediate_state_indices,
            intermediate_state_scales,
            rand_seed,
            philox_rounds,
            cache_steps,
            algorithm,
            dst_state_batch_indices,
            cu_seqlens,
            num_accepted_tokens,
            retrieve_parent_token,
            final_write_to_dst,
            accepted_writes_per_token,
            backend,
        )
    from .mamba.ssu import eager_ssu  # normalise + dispatch, or replay a remembered call's launch

    return eager_ssu(
        state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, state_scale, out,
        disable_state_update, intermediate_states_buffer, intermediate_state_indices, intermediate_state_scales,
        rand_seed, philox_rounds, cache_steps, algorithm, dst_state_batch_indices, cu_seqlens, num_accepted_tokens,
        retrieve_parent_token, final_write_to_dst, accepted_writes_per_token, backend,
    )  # fmt: skip


def ssu_compiled(
    state,
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    state_batch_indices=None,
    pad_slot_id=-1,
    state_scale=None,
    out=None,
    disable_state_update=False,
    intermediate_states_buffer=None,
    intermediate_state_indices=None,
    intermediate_state_scales=None,
    rand_seed=None,
    philox_rounds=10,
    cache_steps=0,
    algorithm="auto",
    dst_state_batch_indices=None,
    cu_seqlens=None,
    num_accepted_tokens=None,
    retrieve_parent_token=None,
    final_write_to_dst=False,
    accepted_writes_per_token=True,
    backend="auto",
) -> torch.Tensor:
    """Emit ``mate::selective_state_update`` (the traced path); returns ``out``, allocated here when None."""
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.ops.mate.selective_state_update(
        state,
        x,
        dt,
        A,
        B,
        C,
        D,
        z,
        dt_bias,
        bool(dt_softplus),
        state_batch_indices,
        pad_slot_id,
        state_scale,
        out,
        bool(disable_state_update),
        intermediate_states_buffer,
        intermediate_state_indices,
        intermediate_state_scales,
        rand_seed,
        philox_rounds,
        cache_steps,
        algorithm,
        dst_state_batch_indices,
        cu_seqlens,
        num_accepted_tokens,
        retrieve_parent_token,
        bool(final_write_to_dst),
        bool(accepted_writes_per_token),
        backend,
    )
    return out


# ------------------------------------------------------------------------------------------------ SSD


def _ssd_normalize(
    x,
    dt,
    A,
    B,
    C,
    chunk_size,
    cu_seqlens,
    cu_chunk_seqlens,
    last_chunk_indices,
    seq_idx,
    out,
    D,
    z,
    dt_bias,
    dt_softplus,
    dt_limit_min,
    dt_limit_max,
    initial_states,
    return_intermediate_states,
    state_dtype,
    checkpoint_token_indices,
    checkpoint_state_slots,
    checkpoint_states,
    final_states_out,
    final_state_indices,
):
    return normalize_ssd(
        x,
        dt,
        A,
        B,
        C,
        chunk_size,
        cu_seqlens,
        cu_chunk_seqlens,
        last_chunk_indices,
        seq_idx,
        out,
        D,
        z,
        dt_bias,
        dt_softplus=dt_softplus,
        dt_limit=(dt_limit_min, dt_limit_max),
        initial_states=initial_states,
        return_intermediate_states=return_intermediate_states,
        state_dtype=state_dtype,
        checkpoint_token_indices=checkpoint_token_indices,
        checkpoint_state_slots=checkpoint_state_slots,
        checkpoint_states=checkpoint_states,
        final_states_out=final_states_out,
        final_state_indices=final_state_indices,
    )


def _ssd_impl(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    cu_seqlens: torch.Tensor,
    cu_chunk_seqlens: torch.Tensor,
    last_chunk_indices: torch.Tensor,
    seq_idx: torch.Tensor,
    out: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    dt_limit_min: float,
    dt_limit_max: float,
    initial_states: torch.Tensor | None,
    return_intermediate_states: bool,
    state_dtype: torch.dtype | None,
    checkpoint_token_indices: torch.Tensor | None,
    checkpoint_state_slots: torch.Tensor | None,
    checkpoint_states: torch.Tensor | None,
    final_states_out: torch.Tensor | None,
    final_state_indices: torch.Tensor | None,
    backend: str,
) -> torch.Tensor:
    from .mamba.ssd import run_ssd

    call = _ssd_normalize(
        x,
        dt,
        A,
        B,
        C,
        chunk_size,
        cu_seqlens,
        cu_chunk_seqlens,
        last_chunk_indices,
        seq_idx,
        out,
        D,
        z,
        dt_bias,
        dt_softplus,
        dt_limit_min,
        dt_limit_max,
        initial_states,
        return_intermediate_states,
        state_dtype,
        checkpoint_token_indices,
        checkpoint_state_slots,
        checkpoint_states,
        final_states_out,
        final_state_indices,
    )
    states = run_ssd(call, backend)
    if states is None:  # written into final_states_out
        return torch.empty((0,), dtype=call.state_dtype, device=x.device)
    return states


_ssd_op = torch.library.custom_op("mate::ssd_combined_fwd_varlen", _ssd_impl, mutates_args=("out", "final_states_out"))


@_ssd_op.register_fake
def _ssd_fake(*args, **kwargs) -> torch.Tensor:
    call = _ssd_normalize(*_ordered(_ssd_impl, args, kwargs)[:-1])
    if call.final_states_out is not None:
        shape = (0,)
    else:
        first = call.nchunks if call.return_intermediate_states else call.batch
        shape = (first, call.heads, call.dim, call.dstate)
    return call.x.new_empty(shape, dtype=call.state_dtype)


def ssd_combined_fwd_varlen(
    x,
    dt,
    A,
    B,
    C,
    chunk_size,
    cu_seqlens,
    cu_chunk_seqlens,
    last_chunk_indices,
    seq_idx,
    out=None,
    D=None,
    z=None,
    dt_bias=None,
    *,
    dt_softplus=False,
    dt_limit=(0.0, math.inf),
    initial_states=None,
    return_intermediate_states=False,
    state_dtype=None,
    checkpoint_token_indices=None,
    checkpoint_state_slots=None,
    checkpoint_states=None,
    final_states_out=None,
    final_state_indices=None,
    backend="auto",
):
    """The SSD entry shared by ``mate.mamba`` and the adapters: eager runs directly, tracing emits the op."""
    if torch.compiler.is_compiling():
        return ssd_compiled(
            x,
            dt,
            A,
            B,
            C,
            chunk_size,
            cu_seqlens,
            cu_chunk_seqlens,
            last_chunk_indices,
            seq_idx,
            out,
            D,
            z,
            dt_bias,
            dt_softplus=dt_softplus,
            dt_limit=dt_limit,
            initial_states=initial_states,
            return_intermediate_states=return_intermediate_states,
            state_dtype=state_dtype,
            checkpoint_token_indices=checkpoint_token_indices,
            checkpoint_state_slots=checkpoint_state_slots,
            checkpoint_states=checkpoint_states,
            final_states_out=final_states_out,
            final_state_indices=final_state_indices,
            backend=backend,
        )
    from .mamba.ssd import run_ssd

    call = normalize_ssd(
        x,
        dt,
        A,
        B,
        C,
        chunk_size,
        cu_seqlens,
        cu_chunk_seqlens,
        last_chunk_indices,
        seq_idx,
        out,
        D,
        z,
        dt_bias,
        dt_softplus=dt_softplus,
        dt_limit=dt_limit,
        initial_states=initial_states,
        return_intermediate_states=return_intermediate_states,
        state_dtype=state_dtype,
        checkpoint_token_indices=checkpoint_token_indices,
        checkpoint_state_slots=checkpoint_state_slots,
        checkpoint_states=checkpoint_states,
        final_states_out=final_states_out,
        final_state_indices=final_state_indices,
    )
    return run_ssd(call, backend)


def ssd_compiled(
    x,
    dt,
    A,
    B,
    C,
    chunk_size,
    cu_seqlens,
    cu_chunk_seqlens,
    last_chunk_indices,
    seq_idx,
    out=None,
    D=None,
    z=None,
    dt_bias=None,
    *,
    dt_softplus=False,
    dt_limit=(0.0, math.inf),
    initial_states=None,
    return_intermediate_states=False,
    state_dtype=None,
    checkpoint_token_indices=None,
    checkpoint_state_slots=None,
    checkpoint_states=None,
    final_states_out=None,
    final_state_indices=None,
    backend="auto",
):
    """Emit ``mate::ssd_combined_fwd_varlen`` (the traced path); returns the states, or None when they were
    written into ``final_states_out``."""
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    lo, hi = dt_limit
    states = torch.ops.mate.ssd_combined_fwd_varlen(
        x,
        dt,
        A,
        B,
        C,
        chunk_size,
        cu_seqlens,
        cu_chunk_seqlens,
        last_chunk_indices,
        seq_idx,
        out,
        D,
        z,
        dt_bias,
        bool(dt_softplus),
        float(lo),
        float(hi),
        initial_states,
        bool(return_intermediate_states),
        state_dtype,
        checkpoint_token_indices,
        checkpoint_state_slots,
        checkpoint_states,
        final_states_out,
        final_state_indices,
        backend,
    )
    return None if final_states_out is not None else states


__all__ = ["selective_state_update", "ssd_combined_fwd_varlen", "ssu_compiled", "ssd_compiled"]
