"""``selective_state_update``: the Mamba2 decode step (public signature, eager fast path), and its prewarm.

Eager calls take the dispatcher's fast path (``mate.mamba._dispatch.FastPath``), else normalise
(``mate.mamba._contract.ssu``) and run on a backend. While
``torch.compile`` traces, the call becomes the ``mate::selective_state_update`` custom op (``mate.mamba._ops``,
whose parameter table this signature matches).
"""

from __future__ import annotations

import torch
from mate.mamba._contract.dtypes import INDEX_DTYPES, IO_DTYPES, QUANT_STATE_DTYPES, SSU_SR_STATE_DTYPES, STATE_DTYPES
from mate.mamba._contract.errors import bad_arg, check_dtypes, check_ints, check_jobs, check_philox_rounds
from mate.mamba._contract.ssu import normalize_ssu
from mate.mamba._dispatch import FastPath, prewarm
from mate.mamba._ops import SSU, trace_ssu


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
    state_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    disable_state_update: bool = False,
    intermediate_states_buffer: torch.Tensor | None = None,
    intermediate_state_indices: torch.Tensor | None = None,
    intermediate_state_scales: torch.Tensor | None = None,
    rand_seed: torch.Tensor | None = None,
    philox_rounds: int = 10,
    cache_steps: int = 0,
    algorithm: str = "auto",
    dst_state_batch_indices: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    backend: str = "auto",
    *,
    retrieve_parent_token: torch.Tensor | None = None,
    final_write_to_dst: bool = False,
    accepted_writes_per_token: bool = True,
) -> torch.Tensor:
    """Apply decode steps of the Mamba2 recurrence to a slot pool and return ``y``.

    Shapes (H heads, P dim, N dstate, G groups dividing H, S slots, R packed rows):

    - ``state``: ``[S, H, P, N]`` (or ``[S, P, N]`` for H = 1), fp32/bf16/fp16, inner three dims dense,
      ``stride(0)`` and storage offset free; updated in place.
    - ``x``: ``[R, H, P]`` (one token per sequence, or packed rows with ``cu_seqlens``) or the dense
      ``[batch, T, H, P]``; bf16/fp16/fp32; strided row views are fine.
    - ``dt``: like ``x`` (``[R, H, P]``, a stride-0 last dim is the tied per-head form) or ``[R, H]``.
    - ``A``: ``[H]`` or ``[H, P, N]`` fp32 (a ``(1, 0, 0)``-strided A is the tied form).
    - ``B``, ``C``: ``[R, G, N]`` (or ``[batch, T, G, N]``) in x's dtype.
    - ``D``, ``dt_bias``: None, ``[H]`` or ``[H, P]``; ``z``: like ``x``; ``out``: like ``x``.
    - ``state_batch_indices`` / ``dst_state_batch_indices``: int32/int64, flat ``[R]`` (entry ``b + t``) or
      2-D ``[batch, T]`` (entry ``b, t``), addressed by strides.
    - ``cu_seqlens``: ``[batch + 1]`` row offsets; ``num_accepted_tokens``: ``[batch]``, read slot at
      ``max(count - 1, 0)``.
    - ``intermediate_states_buffer``: ``[entries, cache_steps, H, P, N]`` (or flattened), written at
      ``[idx, t]`` with ``idx = intermediate_state_indices[b]`` (else the read slot); the pool is then not
      written. Exclusive with ``dst_state_batch_indices``.

    Writes: a destination table or ``num_accepted_tokens`` publishes every token's state (to the read table
    when no destination is given); otherwise the final state goes back to the read slot. ``pad_slot_id``
    read slots read as zero and write nothing; sentinel destinations are skipped; ``disable_state_update``
    leaves the pool bit-identical. ``algorithm`` is accepted for FlashInfer compatibility (MATE chooses its
    own tiling). ``backend``: ``"auto"`` (TileLang on a CUDA/MUSA device where it is installed, else the
    reference), ``"tilelang"`` or ``"torch"``.

    Quantised and stochastically rounded states (both backends serve both; the TileLang kernels take a
    block-scaled state with an intermediate buffer of the state's dtype, and stochastic rounding with a
    ``dstate`` that is a multiple of 8):

    - ``state`` int16 (FlashInfer's), int8 or fp8-e4m3 with ``state_scale`` fp32 ``[slots, H, P]``: a value is
      its stored number times its row's scale; each row written gets the scale ``max|row| / qmax`` and the
      numbers rounded to nearest even, both in place. ``intermediate_states_buffer`` of those dtypes likewise
      with ``intermediate_state_scales`` ``[entries, cache_steps, H, P]``.
    - ``rand_seed``: a one-element int64 tensor on the state's device, with an fp16 state: every fp16 value
      written (pool and intermediate buffer) is rounded stochastically from Philox-4x32 with ``philox_rounds``
      rounds keyed by the seed (``mate.mamba._reference.rounding``); deterministic for a seed, unbiased; the caller
      changes the seed between steps.

    Keyword-only extensions (what the serving engines' own ops mean, for their adapters):

    - ``retrieve_parent_token``: ``[batch, T]`` int, with the dense 4-D ``x`` and an
      ``intermediate_states_buffer`` (SGLang's EAGLE trees): the state before token ``t > 0`` is reloaded
      from ``buffer[idx, parent[b, t]]`` when ``parent[b, t] >= 0``.
    - ``final_write_to_dst``: with a destination table, write only the final state, to ``dst[b, 0]``
      (vLLM's rule without ``num_accepted_tokens``), instead of every token's state.
    - ``accepted_writes_per_token=False``: ``num_accepted_tokens`` without a destination table writes only
      the final state back to the read slot (FlashInfer's rule) instead of every token's state.

    Returns ``out`` (or a new tensor shaped like ``x``).
    """
    entry = trace_ssu if torch.compiler.is_compiling() else eager_ssu  # traced: the custom op
    return entry(  # every parameter, in mate.mamba._ops.SSU_PARAMS order
        state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, state_scale, out,
        disable_state_update, intermediate_states_buffer, intermediate_state_indices, intermediate_state_scales,
        rand_seed, philox_rounds, cache_steps, algorithm, dst_state_batch_indices, cu_seqlens, num_accepted_tokens,
        retrieve_parent_token, final_write_to_dst, accepted_writes_per_token, backend,
    )  # fmt: skip


# The eager call: a call whose metadata equals an earlier one's replays the launch that call left (the TileLang
# backend's recipe, built from its own plan), anything else is normalised, dispatched and remembered
# (mate.mamba._dispatch.FastPath). ``FAST.enabled = False`` makes every call normalise (benchmarks compare both).
FAST = FastPath("ssu", SSU, normalize_ssu)
eager_ssu = SSU.entry("eager_ssu", FAST, split=True)


def clear_fast_path_cache() -> None:
    """Forget every remembered call metadata (the next call of each form takes the slow path again)."""
    FAST.clear()


def prewarm_selective_state_update(
    *,
    state_dtype: torch.dtype,
    io_dtype: torch.dtype,
    batch: int,
    heads: int,
    dim: int,
    dstate: int,
    groups: int,
    slot_dtype: torch.dtype,
    rows_per_cta: int = 4,
    lanes_per_row: int = 32,
    packed: bool = False,
    meta_dtype: torch.dtype = torch.int32,
    dt_dim: int | None = None,
    jobs: int | None = None,
    philox_rounds: int = 0,
) -> None:
    """Compile the TileLang kernel one serving configuration will use, without launching it.

    Call during warmup, before any graph capture: a first call that would compile while the stream is
    capturing raises instead of stalling the worker. ``packed`` selects the packed/MTP kernel (a different
    compilation from the one-token kernel). ``dt_dim=1`` is the tied per-head dt (one value per head,
    broadcast over dim; the tied A/dt_bias fast path); ``None`` a full ``[rows, heads, dim]`` dt. ``state_dtype``
    int16 / int8 / float8_e4m3fn: the block-scaled kernels (their scales are fp32). ``philox_rounds`` > 0 (an
    fp16 state): the kernels that round it stochastically with that many Philox rounds (calls with ``rand_seed``).
    ``meta_dtype`` is the dtype of ``cu_seqlens`` / ``num_accepted_tokens``. ``batch`` is accepted for the
    seed's signature but is a runtime dimension (one kernel serves every batch). ``rows_per_cta`` and
    ``lanes_per_row`` are the seed's tiling hints: MATE's kernels pick their tiling from (dim, dstate, state
    dtype); the hints are validated and otherwise unused.

    Without a usable TileLang device (no CUDA/MUSA device or TileLang missing), there is nothing to compile
    and the call only validates its arguments: the reference backend needs no warmup.

    ``jobs``: worker processes for the kernels not yet in MATE's kernel cache (default: the cores available; 1
    compiles in this process). The workers start with the ``spawn`` method, which imports the main script
    again: call this under ``if __name__ == "__main__":`` or pass ``jobs=1``.
    """
    check_dtypes((
        ("state_dtype", state_dtype, STATE_DTYPES + QUANT_STATE_DTYPES),
        ("io_dtype", io_dtype, IO_DTYPES),
        ("slot_dtype", slot_dtype, INDEX_DTYPES),
        ("meta_dtype", meta_dtype, INDEX_DTYPES),
    ))  # fmt: skip
    check_ints((("batch", batch), ("heads", heads), ("dim", dim), ("dstate", dstate), ("groups", groups)))
    if heads % groups:
        bad_arg("groups", groups, f"a divisor of heads ({heads})")
    for name, v in (("rows_per_cta", rows_per_cta), ("lanes_per_row", lanes_per_row)):
        if not isinstance(v, int) or v < 1:
            bad_arg(name, v, "a positive int")
    if dt_dim not in (None, 1):
        bad_arg("dt_dim", dt_dim, "None (full [rows, heads, dim] dt) or 1 (one dt per head)")
    check_jobs(jobs)
    check_philox_rounds(philox_rounds, state_dtype, SSU_SR_STATE_DTYPES)

    prewarm(
        "ssu", state_dtype=state_dtype, io_dtype=io_dtype, heads=heads, dim=dim, dstate=dstate, groups=groups,
        slot_dtype=slot_dtype, packed=packed, meta_dtype=meta_dtype, tie_hdim=dt_dim == 1, jobs=jobs,
        philox_rounds=philox_rounds,
    )  # fmt: skip


__all__ = ["clear_fast_path_cache", "prewarm_selective_state_update", "selective_state_update"]
