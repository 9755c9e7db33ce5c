"""``ssd_combined_fwd_varlen``: packed variable-length SSD prefill (public signature), and its prewarm.

Eager calls take the dispatcher's fast path, else normalise (``mate.mamba._contract.ssd``) and run on a backend;
while ``torch.compile`` traces, the call becomes
the ``mate::ssd_combined_fwd_varlen`` custom op (``mate.mamba._ops``, whose parameter table this signature matches).
"""

from __future__ import annotations

import math

import torch
from mate.mamba._contract.dtypes import IO_DTYPES, PARAM_DTYPES, QUANT_STATE_DTYPES, STATE_DTYPES
from mate.mamba._contract.errors import bad_arg, check_dtypes, check_ints, check_jobs
from mate.mamba._contract.ssd import check_chunk_size, normalize_ssd
from mate.mamba._dispatch import FastPath, prewarm
from mate.mamba._ops import SSD, trace_ssd


def ssd_combined_fwd_varlen(
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
    out: torch.Tensor | None = None,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    *,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, math.inf),
    initial_states: torch.Tensor | None = None,
    return_intermediate_states: bool = False,
    state_dtype: torch.dtype | None = None,
    checkpoint_token_indices: torch.Tensor | None = None,
    checkpoint_state_slots: torch.Tensor | None = None,
    checkpoint_states: torch.Tensor | None = None,
    final_states_out: torch.Tensor | None = None,
    final_state_indices: torch.Tensor | None = None,
    initial_states_scale: torch.Tensor | None = None,
    final_states_scale: torch.Tensor | None = None,
    backend: str = "auto",
) -> torch.Tensor | None:
    """Packed variable-length SSD prefill (the five chunked stages) over a flattened batch.

    Shapes (T tokens, H heads, P dim, N dstate, G groups dividing H):

    - ``x``: ``[T, H, P]``; ``dt``: ``[T, H]`` raw; ``A``: ``[H]`` fp32; ``B``, ``C``: ``[T, G, N]`` in x's dtype.
    - ``cu_seqlens``: ``[batch + 1]``; ``cu_chunk_seqlens``: ``[nchunks + 1]``, chunk ``c`` covers tokens
      ``[cu_chunk_seqlens[c], cu_chunk_seqlens[c+1])``, never two sequences, at most ``chunk_size`` tokens;
      ``seq_idx``: ``[nchunks]``, the sequence owning each chunk (the authority on where a chunk's
      entering state comes from); ``last_chunk_indices``: ``[batch]``.
    - ``out``: ``[T, H, P]`` written in place (allocated when None); ``D``: ``[H]`` or ``[H, P]``;
      ``z``: ``[T, H, P]`` (``y *= silu(z)``); ``dt_bias``: ``[H]``.
    - ``dt_limit``: ``(min, max)`` clamp of ``softplus(dt + dt_bias)``; the default floors at zero.
    - ``initial_states``: ``[batch, H, P, N]``.

    Returns the final states ``[batch, H, P, N]`` (``states[last_chunk_indices]``) or, with
    ``return_intermediate_states``, every chunk-end state ``[nchunks, H, P, N]``, in ``state_dtype``
    (default: initial_states' dtype, else C's). Extension (vLLM 0.33): with ``final_states_out [slots, H, P,
    N]`` and ``final_state_indices [batch]`` the final states are written into the pool and None is
    returned. ``checkpoint_*`` raise ``NotImplementedError``.

    Quantised pools (both backends): an int16, int8 or fp8-e4m3 ``initial_states`` comes with
    ``initial_states_scale`` fp32 ``[batch, H, P]`` (a value is its stored number times its row's scale); such a
    ``final_states_out`` with ``final_states_scale`` fp32 ``[slots, H, P]``, which receives each written row's new
    scale (``max|row| / qmax``, the numbers rounded to nearest even), as ``selective_state_update`` reads and
    writes ``state_scale``. The states are carried in fp32 in between.
    """
    return table_entry()(  # every parameter, in mate.mamba._ops.SSD_PARAMS order
        x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens, last_chunk_indices, seq_idx, out, D, z, dt_bias,
        dt_softplus, dt_limit, initial_states, return_intermediate_states, state_dtype, checkpoint_token_indices,
        checkpoint_state_slots, checkpoint_states, final_states_out, final_state_indices, initial_states_scale,
        final_states_scale, backend,
    )  # fmt: skip


def table_entry():
    """The implementation of :func:`ssd_combined_fwd_varlen` taking every parameter positionally, in
    ``mate.mamba._ops.SSD_PARAMS`` order: the custom op's traced entry while ``torch.compile`` traces, else the
    eager one. The adapters call it (binding the keyword-only options costs ~0.7 us a call on a 2-core CPU)."""
    return trace_ssd if torch.compiler.is_compiling() else eager_ssd


# The eager call: the dispatcher's fast path (a call whose metadata equals an earlier one's is rebuilt without
# validation and launched under the plan that call made), else normalise, dispatch and remember.
FAST = FastPath("ssd", SSD, normalize_ssd)
eager_ssd = SSD.entry("eager_ssd", FAST, split=True)


def prewarm_ssd_combined_fwd_varlen(
    heads: int,
    groups: int,
    dim: int,
    dstate: int,
    chunk_size: int,
    io_dtype: torch.dtype = torch.bfloat16,
    state_dtype: torch.dtype = torch.bfloat16,
    dt_dtype: torch.dtype = torch.float32,
    block_M: int = 32,
    *,
    jobs: int | None = None,
) -> None:
    """Compile every SSD stage for one configuration, outside any captured graph. A quantised ``state_dtype``
    (int16, int8, float8_e4m3fn: a block-scaled pool) compiles the fp32-state stages and the pool's conversions.

    Token and chunk counts are runtime dimensions. ``block_M`` is the seed's tiling hint, validated and otherwise
    unused: the planner picks the tile from (dim, dstate, chunk_size). Without a usable TileLang device there is
    nothing to compile and the call only validates its arguments.

    ``jobs``: worker processes for the kernels not yet in MATE's kernel cache (default: the cores available; 1
    compiles in this process). The workers start with the ``spawn`` method, which imports the main script
    again: call this under ``if __name__ == "__main__":`` or pass ``jobs=1``.
    """
    check_ints((("heads", heads), ("groups", groups), ("dim", dim), ("dstate", dstate), ("block_M", block_M)))
    if heads % groups:
        bad_arg("groups", groups, f"a divisor of heads ({heads})")
    check_chunk_size(chunk_size)
    check_jobs(jobs)
    check_dtypes((
        ("io_dtype", io_dtype, IO_DTYPES),
        ("state_dtype", state_dtype, STATE_DTYPES + QUANT_STATE_DTYPES),
        ("dt_dtype", dt_dtype, PARAM_DTYPES),
    ))  # fmt: skip

    prewarm(
        "ssd", heads=heads, groups=groups, dim=dim, dstate=dstate, chunk_size=chunk_size, io_dtype=io_dtype,
        state_dtype=state_dtype, dt_dtype=dt_dtype, jobs=jobs,
    )  # fmt: skip


__all__ = ["prewarm_ssd_combined_fwd_varlen", "ssd_combined_fwd_varlen"]
