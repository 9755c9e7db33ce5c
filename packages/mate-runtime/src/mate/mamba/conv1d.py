"""The causal conv1d of a Mamba2 layer, vLLM 0.33's two entry points with their signatures and semantics:
``causal_conv1d_fn`` (the packed varlen prefill) and ``causal_conv1d_update`` (the decode update over a pool of
conv states, one token or a speculative / MTP step), and their prewarm.

Eager calls take the dispatcher's fast path, else normalise (``mate.mamba._contract.conv1d``) and run on a
backend; while ``torch.compile`` traces, a call becomes the ``mate::causal_conv1d_fn`` /
``mate::causal_conv1d_update`` custom op (``mate.mamba._ops``, whose parameter tables these signatures match, less
vLLM's ``metadata`` and ``validate_data``, taken and dropped: they change no result).
"""

from __future__ import annotations

import torch
from mate.mamba._contract.conv1d import MAX_WIDTH, normalize_conv1d_fn, normalize_conv1d_update
from mate.mamba._contract.dtypes import INDEX_DTYPES, IO_DTYPES
from mate.mamba._contract.errors import bad_arg, check_dtypes, check_ints
from mate.mamba._dispatch import FastPath, prewarm
from mate.mamba._ops import CONV1D_FN, CONV1D_UPDATE, trace_conv1d_fn, trace_conv1d_update


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    query_start_loc: torch.Tensor,
    cache_indices: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
    activation: str | bool | None = "silu",
    pad_slot_id: int = -1,
    null_block_id: int | None = 0,
    metadata=None,
    validate_data: bool = False,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Depthwise causal conv1d over packed sequences, updating each sequence's conv state (vLLM 0.33).

    - ``x``: ``[dim, tokens]`` (vLLM passes the transpose of its ``[tokens, dim]`` buffer: channel-contiguous);
      sequence ``b`` is tokens ``[query_start_loc[b], query_start_loc[b + 1])`` (``query_start_loc``: ``[batch +
      1]`` int32 / int64, from 0). Tokens after the last sequence are not part of any.
    - ``weight``: ``[dim, width]`` (width 2 to 6; 4 in every served model); ``bias``: ``[dim]`` or None.
    - ``conv_states``: the pool ``[slots, dim, state_len >= width - 1]`` (any strides: vLLM's is a view of its
      cache, dim- or token-contiguous). Sequence ``b`` uses slot ``cache_indices[b]`` (``[batch]``; None: slot
      ``b``); with ``has_initial_state[b]`` (bool ``[batch]``; None: all False) its history is the slot's columns
      ``[0, width - 1)``, else zeros. A non-empty sequence writes its last ``width - 1`` inputs (the history's
      tail first when shorter) to those columns; later columns are left alone.
    - A sequence whose slot is ``pad_slot_id`` or ``null_block_id`` (vLLM's null block 0; None: no such
      sentinel) is skipped: no state read or written, its outputs zero (vLLM leaves them unwritten), as are
      tokens outside every sequence.
    - ``activation``: None, ``"silu"``, ``"swish"`` (= silu) or a bool (True = silu).
    - ``metadata``, ``validate_data``: vLLM's launch-grid cache and debug checks; accepted, no effect (MATE
      validates every call).

    Returns a new ``[dim, tokens]`` tensor of x's dtype and geometry (``torch.empty_like(x)``). As vLLM computes
    it: x is read in the pool's dtype, the products ``x * w`` rounded to the promoted dtype of pool and weight
    and summed in fp32 from the bias, the result rounded to the pool's dtype, then to x's.
    """
    del metadata, validate_data
    entry = trace_conv1d_fn if torch.compiler.is_compiling() else eager_conv1d_fn  # traced: the custom op
    return entry(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state, activation,
                 pad_slot_id, null_block_id, backend)  # fmt: skip


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: bool | str | None = None,
    conv_state_indices: torch.Tensor | None = None,
    num_accepted_tokens: torch.Tensor | None = None,
    query_start_loc: torch.Tensor | None = None,
    max_query_len: int = -1,
    null_block_id: int | None = 0,
    validate_data: bool = False,
    out: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """A decode step of the causal conv1d over a pool of conv states, updated in place (vLLM 0.33).

    - ``x``: ``[batch, dim]`` (one token), ``[batch, dim, seqlen]``, or ``[tokens, dim]`` packed with
      ``query_start_loc [>= batch + 1]`` (then ``conv_state_indices`` is required, ``batch`` is its length and
      ``max_query_len`` the longest query).
    - ``conv_state``: ``[slots, dim, state_len]`` (any strides), ``state_len >= width - 1``, and ``>= width - 2 +
      seqlen`` (``max_query_len``) with ``num_accepted_tokens``.
    - ``conv_state_indices``: ``[batch]`` or ``[batch, k]`` (its first column) int32 / int64; None: slot ``b``.
      A sequence on ``null_block_id`` (vLLM's null block 0; None: no sentinel) runs nothing: no state read or
      written and its outputs not written.
    - Without ``num_accepted_tokens`` sequence ``b``'s history is columns ``[0, width - 1)``; the state shifts left
      by the query's tokens, which fill its last columns. With ``num_accepted_tokens [batch]`` (speculative
      decode) the history starts at column ``a - 1`` (``a`` = accepted tokens of the previous step) and the state
      becomes columns ``[a, a + width - 2)`` followed by every new token. Packed, a query ``len`` tokens short of
      ``max_query_len`` rewrites that many columns fewer (vLLM's rule).
    - ``out``: the result's tensor (x's shape, dtype and device). Without it the result goes into ``x`` when x has
      the pool's dtype (in place; x is returned), else into a copy of x through the pool's dtype (skipped rows
      keep those values), rounded to the pool's dtype on the way: vLLM writes into a pool-dtype copy of x.
    - ``activation``: None, ``"silu"``, ``"swish"``, or a bool; ``validate_data``: accepted, no effect.

    Returns the result (``out``, ``x`` or the new tensor), x's shape.
    """
    del validate_data
    entry = trace_conv1d_update if torch.compiler.is_compiling() else eager_conv1d_update
    return entry(x, conv_state, weight, bias, activation, conv_state_indices, num_accepted_tokens, query_start_loc,
                 max_query_len, null_block_id, out, backend)  # fmt: skip


# The eager calls: the dispatcher's fast path (a call whose metadata equals an earlier one's is rebuilt without
# validation), else normalise, dispatch and remember.
FAST_FN = FastPath("conv1d_fn", CONV1D_FN, normalize_conv1d_fn)
eager_conv1d_fn = CONV1D_FN.entry("eager_conv1d_fn", FAST_FN, split=True)
FAST_UPDATE = FastPath("conv1d_update", CONV1D_UPDATE, normalize_conv1d_update)
eager_conv1d_update = CONV1D_UPDATE.entry("eager_conv1d_update", FAST_UPDATE, split=True)


def prewarm_causal_conv1d(*, dim: int, width: int = 4, io_dtype: torch.dtype = torch.bfloat16,
                          state_dtype: torch.dtype | None = None, weight_dtype: torch.dtype | None = None,
                          index_dtype: torch.dtype = torch.int32, has_bias: bool = True,
                          activation: str | None = "silu") -> None:  # fmt: skip
    """Compile the TileLang kernels of one serving configuration of both entry points (every call form: one
    token, MTP, packed; pool layouts and batch sizes are runtime values) before graph capture; ``state_dtype`` and
    ``weight_dtype`` default to ``io_dtype``. Without a usable TileLang device the call only validates."""
    check_ints((("dim", dim), ("width", width)))
    if not 2 <= width <= MAX_WIDTH:
        bad_arg("width", width, f"an int in [2, {MAX_WIDTH}]")
    state_dtype = io_dtype if state_dtype is None else state_dtype
    weight_dtype = io_dtype if weight_dtype is None else weight_dtype
    check_dtypes((("io_dtype", io_dtype, IO_DTYPES), ("state_dtype", state_dtype, IO_DTYPES),
                  ("weight_dtype", weight_dtype, IO_DTYPES), ("index_dtype", index_dtype, INDEX_DTYPES)))  # fmt: skip
    if activation not in (None, "silu", "swish"):
        bad_arg("activation", activation, "None, 'silu' or 'swish'")
    prewarm("conv1d", dim=dim, width=width, io_dtype=io_dtype, state_dtype=state_dtype,
            weight_dtype=weight_dtype, index_dtype=index_dtype, has_bias=bool(has_bias),
            silu=activation is not None)  # fmt: skip


__all__ = ["causal_conv1d_fn", "causal_conv1d_update", "prewarm_causal_conv1d"]
