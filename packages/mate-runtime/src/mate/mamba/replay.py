"""ReplaySSM decode (FlashInfer 0.7.2's ``checkpointing_ssu`` contract) under MATE's names:
``replay_state_update``, ``materialize_replayed_state`` and the host's ring bookkeeping ``advance_replay_ring``.

A slot keeps a checkpoint state and a ring of its last tokens' x, B and processed dt; a decode step replays the
ring's live tokens instead of reading and writing a whole updated state, and writes the state back only when the
ring's window is full (a flush). ``mate.mamba._reference.replay`` holds the reference (the plain recurrence);
``replay_state_update`` runs MATE's TileLang kernel (``mate_kernels.ssu_replay``) on CUDA/MUSA devices; under
``torch.compile`` it is the ``mate::replay_state_update`` custom op (``mate.mamba._ops``).
``materialize_replayed_state`` runs MATE's ``mate_kernels.ssu_materialize`` there.
"""

from __future__ import annotations

import torch
from mate.mamba._contract.dtypes import INDEX_DTYPES, IO_DTYPES, QUANT_STATE_DTYPES, SR_STATE_DTYPES, STATE_DTYPES
from mate.mamba._contract.errors import bad_arg, check_dtypes, check_ints, check_jobs, check_philox_rounds
from mate.mamba._contract.replay import normalize_materialize, normalize_materialize_layers, normalize_replay
from mate.mamba._dispatch import FastPath, prewarm, run
from mate.mamba._ops import REPLAY, materialize_layers_op, trace_replay


def replay_state_update(
    state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens, x, dt, A, B, C, out, D=None, z=None,
    dt_bias=None, dt_softplus=False, state_batch_indices=None, pad_slot_id=-1, state_scale=None, rand_seed=None,
    philox_rounds=10, d_split=None, cu_seqlens=None, max_seqlen=None, enable_pdl=False, cb_scaled=None,
    cumAdt_vec=None, cb_old=None, precompute_heads_per_cta=0, algorithm="auto", *, backend="auto",
):  # fmt: skip
    """One ReplaySSM decode step over a pool of checkpointed slots; FlashInfer 0.7.2's ``checkpointing_ssu``
    (arguments, order, defaults, semantics). Returns ``out``.

    Shapes (``S`` slots, ``L`` ring rows, ``H`` heads, ``P`` dim, ``N`` dstate, ``G`` groups, ``T`` new tokens):

    - ``state``: ``[S, H, P, N]`` fp32 / bf16 / fp16, or int16 / int8 / fp8-e4m3 with ``state_scale`` fp32
      ``[S, H, P]``: the checkpoint (the state before the live ring tokens), written only by a flush.
    - ``x_cache [S, H, L, P]``, ``B_cache [S, G, L, N]`` (x's dtype), ``dt_cache [S, H, L]`` fp32: each cached
      token's raw x, raw B and ``softplus(dt + dt_bias)`` (without A); the call appends its tokens to them.
    - ``ring_start``, ``prev_num_accepted_tokens``: ``[S]`` int32, read only: the ring row of the oldest live
      token and how many are live (``<= L - T``). The caller moves them after the call
      (:func:`advance_replay_ring`).
    - ``x``, ``z``, ``out``: ``[batch, T, H, P]``, or ``[1, tokens, H, P]`` packed with ``cu_seqlens [batch + 1]``
      int32 and ``max_seqlen`` (then ``T``); ``B``, ``C``: ``[batch, T, G, N]``; ``dt``: ``[batch, T, H]`` or
      ``[batch, T, H, P]`` of stride 0 over P; ``A`` ``[H]`` or ``[H, P, N]`` tied; ``D``, ``dt_bias``: ``[H]`` or
      ``[H, P]`` tied.
    - ``state_batch_indices``: ``[batch]`` (or ``[batch, k]``, its first column) int32 / int64; a sentinel
      ``pad_slot_id`` runs nothing for its sequence (its ``out`` rows are not written).

    Per sequence, with ``W = L - T``: the slot's state is replayed through its live tokens; if the live and new
    tokens do not fit the window (``pnat + T_b > W``) that replayed state is written back (a flush, requantised
    with new scales for a quantised state; with ``rand_seed`` rounded stochastically for an fp16, int8 or fp8-e4m3
    one, deterministic for the seed and unbiased); each new token
    then updates it, ``y = C s + D x`` (``* silu(z)``), and the new tokens go to ring rows ``(ring_start + pnat +
    i) % L``. ``d_split``, ``enable_pdl``, the scratch tensors ``cb_scaled`` / ``cumAdt_vec`` / ``cb_old``,
    ``precompute_heads_per_cta`` and ``algorithm`` are FlashInfer's kernel choices: validated as FlashInfer does,
    otherwise without effect. ``backend``: ``"auto"`` / ``"torch"`` / ``"tilelang"`` (MATE's extension).
    """
    entry = trace_replay if torch.compiler.is_compiling() else eager_replay  # traced: the custom op
    return entry(  # every parameter, in mate.mamba._ops.REPLAY_PARAMS order
        state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens, x, dt, A, B, C, out, D, z, dt_bias,
        dt_softplus, state_batch_indices, pad_slot_id, state_scale, rand_seed, philox_rounds, d_split, cu_seqlens,
        max_seqlen, enable_pdl, cb_scaled, cumAdt_vec, cb_old, precompute_heads_per_cta, algorithm, backend,
    )  # fmt: skip


# The eager call: the dispatcher's fast path (a call whose metadata equals an earlier one's is rebuilt without
# validation), else normalise, dispatch and remember.
FAST = FastPath("replay", REPLAY, normalize_replay)
eager_replay = REPLAY.entry("eager_replay", FAST, split=True)


def materialize_replayed_state(state, x_cache, B_cache, dt_cache, A, ring_start, replay_prefix_len, src_slots,
                               dst_slots, *, state_scale=None, pad_slot_id=-1, rand_seed=None, philox_rounds=10,
                               backend="auto") -> None:  # fmt: skip
    """Write a slot's true state into another slot (e.g. a prefix-cache block): for each request ``b``,
    ``state[dst_slots[b]]`` = ``state[src_slots[b]]`` advanced through ``replay_prefix_len[b]`` tokens of the source
    slot's ring from row ``ring_start[b]`` (FlashInfer's ``replayssm_materialize`` for one layer, with tensors
    instead of its per-layer pointer tables). ``ring_start``, ``replay_prefix_len``, ``src_slots``, ``dst_slots``:
    ``[batch]`` int32 / int64, per request; a sentinel source or destination skips the request. A quantised state's
    destination rows get new scales; a prefix of 0 copies the stored numbers and scales exactly. ``rand_seed`` (a
    one-element int64 tensor, with ``philox_rounds`` > 0) rounds the written rows of an fp16, int8 or fp8-e4m3 state
    stochastically, as :func:`replay_state_update` rounds a flush (FlashInfer's ``replayssm_materialize`` seed);
    without it they round to nearest. The rings and the trackers are not changed. The destinations must differ from
    every request's source. The reference backend checks the tables' values (``ValueError``); the TileLang kernel
    skips a request whose slots are outside the pool, takes ``ring_start`` modulo the ring and clamps the prefix
    into ``[0, L]`` (``MATE_CHECK_INPUTS=1`` checks them first, as the reference does)."""
    call = normalize_materialize(state, x_cache, B_cache, dt_cache, A, ring_start, replay_prefix_len, src_slots,
                                 dst_slots, state_scale, pad_slot_id, rand_seed, philox_rounds)  # fmt: skip
    run("materialize", call, backend)


def materialize_replayed_layers(state_ptrs, state_slot_strides, x_cache_ptrs, x_cache_slot_strides, B_cache_ptrs,
                                B_cache_slot_strides, dt_cache_ptrs, dt_cache_slot_strides, A_ptrs, state_scale_ptrs,
                                state_scale_slot_strides, src_slots, dst_slots, ring_start, replay_prefix_len,
                                active_request_indices, *, state_dtype, input_dtype, matrixA_dtype, dim, dstate,
                                num_heads, heads_per_group, max_window, ring_buffer_len, pad_slot_id=-1,
                                rand_seed=None, philox_rounds=0, dependency_inputs=None, dependency_outputs=None,
                                backend="auto") -> None:  # fmt: skip
    """:func:`materialize_replayed_state` over several layers at once, their pools named by address: FlashInfer
    0.7.2's ``replayssm_materialize`` (arguments, order, defaults, checks, semantics) plus ``backend``.

    Per layer ``l`` (``L`` = ``ring_buffer_len`` rows, ``H`` = ``num_heads``, ``G`` = ``H / heads_per_group``),
    int64 ``[layers]`` tables hold each pool's base address and slot stride in elements; inside a slot everything
    is contiguous: ``state [slot, H, dim, dstate]`` of ``state_dtype``, ``x_cache [slot, H, L, dim]`` and
    ``B_cache [slot, G, L, dstate]`` bf16, ``dt_cache [slot, H, L]`` fp32, ``A [H]`` of ``matrixA_dtype`` (no
    stride), the row scales ``[slot, H, dim]`` fp32 of a block-scaled state (a 0 address elsewhere). ``src_slots``
    / ``dst_slots [layers, batch]``, ``ring_start`` / ``replay_prefix_len`` / ``active_request_indices [batch]``
    int32. For each selected request ``b`` (the entries of ``active_request_indices`` before the first ``-1``)
    and layer ``l`` whose slots are not ``pad_slot_id``, ``state[dst_slots[l, b]]`` = ``state[src_slots[l, b]]``
    advanced through ``replay_prefix_len[b]`` (``<= max_window``) ring tokens from row ``ring_start[b]``; 0 copies
    the stored numbers and scales exactly. ``dependency_inputs`` / ``dependency_outputs``: the pools the tables
    point into, named for ``torch.compile``'s ordering only (the op mutates the latter).

    ``backend="tilelang"`` (auto on a CUDA device) is one kernel over every layer and request that reads the
    tables on the device: nothing is read back, and the call can be captured in a graph (compile its kernel
    first by one eager call). ``"torch"`` (auto elsewhere) reads the tables back (a sync, refused under capture),
    checks the selected requests' metadata and runs the reference layer by layer. ``philox_rounds > 0`` (with
    ``rand_seed``) rounds the written rows of an fp16, int8 or fp8-e4m3 state stochastically, as
    :func:`materialize_replayed_state` rounds them, layer ``l`` keyed as FlashInfer keys it
    (``mate.mamba._reference.rounding.layer_seed``); with another state it raises ``NotImplementedError``."""
    normalize_materialize_layers(
        state_ptrs, state_slot_strides, x_cache_ptrs, x_cache_slot_strides, B_cache_ptrs, B_cache_slot_strides,
        dt_cache_ptrs, dt_cache_slot_strides, A_ptrs, state_scale_ptrs, state_scale_slot_strides, src_slots,
        dst_slots, ring_start, replay_prefix_len, active_request_indices, state_dtype=state_dtype,
        input_dtype=input_dtype, matrixA_dtype=matrixA_dtype, dim=dim, dstate=dstate, num_heads=num_heads,
        heads_per_group=heads_per_group, max_window=max_window, ring_buffer_len=ring_buffer_len,
        pad_slot_id=pad_slot_id, rand_seed=rand_seed, philox_rounds=philox_rounds,
        dependency_inputs=dependency_inputs, dependency_outputs=dependency_outputs,
    )  # fmt: skip
    materialize_layers_op(
        state_ptrs, state_slot_strides, x_cache_ptrs, x_cache_slot_strides, B_cache_ptrs, B_cache_slot_strides,
        dt_cache_ptrs, dt_cache_slot_strides, A_ptrs, state_scale_ptrs, state_scale_slot_strides, src_slots,
        dst_slots, ring_start, replay_prefix_len, active_request_indices, list(dependency_inputs or []),
        list(dependency_outputs or []), state_dtype, input_dtype, matrixA_dtype, dim, dstate, num_heads,
        heads_per_group, max_window, ring_buffer_len, pad_slot_id, rand_seed, philox_rounds, backend,
    )  # fmt: skip


def advance_replay_ring(ring_start: torch.Tensor, prev_num_accepted_tokens: torch.Tensor,
                        state_batch_indices: torch.Tensor, num_new_tokens: torch.Tensor,
                        num_accepted_tokens: torch.Tensor, *, ring_len: int, window: int,
                        pad_slot_id: int = -1) -> None:  # fmt: skip
    """The host's ring bookkeeping after a :func:`replay_state_update` call, in place, as vLLM 0.33's trackers
    keep it (tensor operations only: no sync, capture-safe). For sequence ``b`` on slot ``state_batch_indices[b]``
    (not the sentinel, inside the trackers; the live sequences on distinct slots) that ran ``num_new_tokens[b] >
    0`` tokens and keeps ``num_accepted_tokens[b]`` of them: if the call flushed (``pnat + new > window``),
    ``ring_start`` moves past the folded tokens (``+ pnat``, modulo ``ring_len``) and the accepted tokens are the
    live ones; otherwise they are added to the live ones."""
    for name, t in (("state_batch_indices", state_batch_indices), ("num_new_tokens", num_new_tokens),
                    ("num_accepted_tokens", num_accepted_tokens)):  # fmt: skip
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.shape[0] != state_batch_indices.shape[0]:
            bad_arg(name, t, f"a 1-D tensor of {state_batch_indices.shape[0]} entries (one per sequence)")
    if not isinstance(ring_len, int) or not isinstance(window, int) or not 0 < window < ring_len:
        bad_arg("window", window, f"an int in [1, ring_len) (ring_len={ring_len!r})")
    slots = state_batch_indices.to(torch.int64)
    # a sentinel, a slot outside the trackers or an empty sequence changes nothing (vLLM's trackers skip them)
    live = (slots != pad_slot_id) & (slots >= 0) & (slots < ring_start.shape[0]) & (num_new_tokens > 0)
    slots = torch.where(live, slots, torch.zeros_like(slots))
    rs, pk = ring_start[slots].to(torch.int64), prev_num_accepted_tokens[slots].to(torch.int64)
    new, acc = num_new_tokens.to(torch.int64), num_accepted_tokens.to(torch.int64)
    flush = pk + new > window
    new_rs = torch.where(flush, (rs + pk) % ring_len, rs)
    new_pk = torch.where(flush, acc, pk + acc)
    # written as differences added at every lane's index (0 where not live): no boolean indexing, which would
    # read a count back to the host
    zero = torch.zeros_like(rs)
    ring_start.index_add_(0, slots, torch.where(live, new_rs - rs, zero).to(ring_start.dtype))
    prev_num_accepted_tokens.index_add_(
        0, slots, torch.where(live, new_pk - pk, zero).to(prev_num_accepted_tokens.dtype)
    )


def prewarm_replay_state_update(*, state_dtype: torch.dtype, io_dtype: torch.dtype, heads: int, dim: int,
                                dstate: int, groups: int, slot_dtype: torch.dtype = torch.int32,
                                philox_rounds: int = 0, window: int = 16, tokens: int = 1,
                                jobs: int | None = None) -> None:  # fmt: skip
    """Compile the TileLang kernels :func:`replay_state_update` will use for one serving configuration (dt fp32 and
    in the io dtype) and the :func:`materialize_replayed_state` kernel of its pools (``slot_dtype`` tables),
    without launching them; call before graph capture (a compile during capture raises).
    ``window`` and ``tokens``: the ring's window ``W`` and the tokens per step ``T`` (a ring of ``W + T`` rows;
    vLLM 0.33: ``--replayssm-buffer-len``, 16 by default, and 1 + the speculative tokens); their kernel serves
    every batch and call form, and any ring and token count that stage in as many rows (powers of two: 16, 32,
    64 ring rows; 1, 2, 4, 8, ... tokens). ``philox_rounds`` > 0 (an fp16 state): the kernel that rounds flushes
    stochastically. ``jobs``: as for ``prewarm_selective_state_update``. Without a usable TileLang device the call
    only validates its arguments."""
    check_dtypes((("state_dtype", state_dtype, STATE_DTYPES + QUANT_STATE_DTYPES), ("io_dtype", io_dtype, IO_DTYPES),
                  ("slot_dtype", slot_dtype, INDEX_DTYPES)))  # fmt: skip
    check_ints((("heads", heads), ("dim", dim), ("dstate", dstate), ("groups", groups)))
    check_ints((("window", window),), least=0)
    check_ints((("tokens", tokens),))
    if heads % groups:
        bad_arg("groups", groups, f"a divisor of heads ({heads})")
    check_jobs(jobs)
    check_philox_rounds(philox_rounds, state_dtype, SR_STATE_DTYPES)
    prewarm(
        "replay", state_dtype=state_dtype, io_dtype=io_dtype, heads=heads, dim=dim, dstate=dstate, groups=groups,
        slot_dtype=slot_dtype, philox_rounds=philox_rounds, window=window, tokens=tokens, jobs=jobs,
    )  # fmt: skip


__all__ = ["replay_state_update", "materialize_replayed_state", "materialize_replayed_layers", "advance_replay_ring",
           "prewarm_replay_state_update"]  # fmt: skip
