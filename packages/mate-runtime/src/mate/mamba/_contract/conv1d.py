"""The one normalisation point of the causal conv1d of a Mamba2 layer: ``causal_conv1d_fn`` (the varlen prefill) and
``causal_conv1d_update`` (the decode update over a pool of conv states), vLLM 0.33's contract
(``vllm/model_executor/layers/mamba/ops/causal_conv1d.py``).

Notation: ``D`` channels (``dim``), ``W`` the filter width, ``S`` pool slots, ``K`` the pool's columns per channel
(``state_len >= W - 1``). A depthwise causal filter: ``y[c, t] = bias[c] + sum_j w[c, j] * x[c, t - (W - 1) + j]``,
the history before a sequence's first token taken from its conv state, then ``silu`` if asked.

Rounding, as vLLM's kernels round: ``x`` is first cast to the pool's dtype (the history and the new tokens are
read in it); each product ``x * w`` is rounded to the promoted dtype of (pool dtype, weight dtype) (the same dtype
when they agree, fp32 otherwise) and summed in fp32 from ``bias`` (fp32) in tap order; the result is stored in the
written tensor's dtype. Where vLLM writes the result into a pool-dtype copy of ``x`` (``causal_conv1d_fn``, and
``causal_conv1d_update`` without ``out``) and casts it back, it is rounded to the pool's dtype first
(``round_via_state``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from mate.mamba._contract.dtypes import INDEX_DTYPES, IO_DTYPES
from mate.mamba._contract.errors import bad_arg, check_tensor, values

MAX_WIDTH = 6  # the widest filter vLLM's update kernel has code for (served models: 4)
ACTIVATIONS = (None, "silu", "swish")  # and True (= "silu") / False (= None), as vLLM takes them


@dataclass(frozen=True)
class Conv1dFnCall:
    """``causal_conv1d_fn``: ``x [D, tokens]`` packed sequences ``[qsl[b], qsl[b+1])``; ``out`` a new tensor of
    x's geometry (``torch.empty_like(x)``, as vLLM allocates it)."""

    x: torch.Tensor  # [D, tokens]
    weight: torch.Tensor  # [D, W]
    bias: torch.Tensor | None  # [D]
    state: torch.Tensor  # [S, D, K]
    query_start_loc: torch.Tensor  # [batch + 1]
    cache_indices: torch.Tensor | None  # [batch]; None: sequence b uses slot b
    has_initial_state: torch.Tensor | None  # [batch] bool; None: no sequence has one
    silu: bool
    pad_slot_id: int
    null_block_id: int | None
    out: torch.Tensor  # [D, tokens], x's dtype

    @property
    def width(self) -> int:
        return self.weight.shape[1]

    @property
    def batch(self) -> int:
        return self.query_start_loc.shape[0] - 1

    @property
    def round_via_state(self) -> bool:
        return True


@dataclass(frozen=True)
class Conv1dUpdateCall:
    """``causal_conv1d_update`` in one form: ``x``/``out`` as ``[rows, D, T]`` (one-token ``[batch, D]`` is ``T =
    1``; the varlen ``[tokens, D]`` with ``query_start_loc`` is one row of ``T = tokens``, sequence ``b`` its tokens
    ``[qsl[b], qsl[b+1])``, ``seqlen`` then ``max_query_len``)."""

    x: torch.Tensor  # [rows, D, T] (a view of the caller's x)
    weight: torch.Tensor
    bias: torch.Tensor | None
    state: torch.Tensor  # [S, D, K]
    slots: torch.Tensor | None  # [batch] (column 0 of a 2-D table); None: sequence b uses slot b
    num_accepted_tokens: torch.Tensor | None  # [batch]
    query_start_loc: torch.Tensor | None  # [>= batch + 1]
    seqlen: int  # tokens per sequence (varlen: max_query_len)
    batch: int
    silu: bool
    null_block_id: int | None
    out: torch.Tensor  # [rows, D, T], the written view
    result: torch.Tensor  # what the call returns (the caller's shape)
    round_via_state: bool  # out is None: vLLM writes into a pool-dtype copy of x and casts back

    @property
    def width(self) -> int:
        return self.weight.shape[1]

    @property
    def state_len(self) -> int:
        """vLLM's ``state_len``: the columns a sequence of ``seqlen`` tokens rewrites (before its varlen shortening
        ``seqlen - len``): ``W - 1``, and ``+ seqlen - 1`` with ``num_accepted_tokens``."""
        extra = self.seqlen - 1 if self.num_accepted_tokens is not None else 0
        return self.width - 1 + extra


_tensor = functools.partial(check_tensor, device_of="x")  # (name, t, ndims, dtypes, device=None)


def _silu(activation) -> bool:
    if isinstance(activation, bool):
        return activation
    if activation not in ACTIVATIONS:
        bad_arg("activation", activation, "None, 'silu', 'swish', True or False")
    return activation is not None


def _weights(x_dim: int, weight, bias, device) -> None:
    _tensor("weight", weight, 2, IO_DTYPES, device)
    if weight.shape[0] != x_dim or not 2 <= weight.shape[1] <= MAX_WIDTH:
        bad_arg("weight", weight, f"shape ({x_dim}, width) with width in [2, {MAX_WIDTH}]")
    if bias is not None:
        _tensor("bias", bias, 1, IO_DTYPES, device)
        if bias.shape[0] != x_dim:
            bad_arg("bias", bias, f"shape ({x_dim},)")


def _pool(name, state, dim: int, columns: int, device) -> None:
    _tensor(name, state, 3, IO_DTYPES, device)
    if state.shape[1] != dim or state.shape[2] < columns:
        bad_arg(name, state, f"shape (slots, {dim}, state_len) with state_len >= {columns}")


def _ints(name, t, ndims, device, rows: int | None = None) -> None:
    _tensor(name, t, ndims, INDEX_DTYPES, device)
    if rows is not None and t.shape[0] != rows:
        bad_arg(name, t, f"{rows} rows (one per sequence)")


def _null(null_block_id) -> int | None:
    if null_block_id is not None and (not isinstance(null_block_id, int) or isinstance(null_block_id, bool)):
        bad_arg("null_block_id", null_block_id, "an int or None")
    return null_block_id


def normalize_conv1d_fn(x, weight, bias, conv_states, query_start_loc, cache_indices=None, has_initial_state=None,
                        activation="silu", pad_slot_id=-1, null_block_id=0) -> Conv1dFnCall:  # fmt: skip
    """Validate a ``causal_conv1d_fn`` call (vLLM 0.33's arguments but ``metadata`` and ``validate_data``, which do
    not change what it computes) into a :class:`Conv1dFnCall`; ``out`` is allocated here."""
    _tensor("x", x, 2, IO_DTYPES)
    dev, dim = x.device, x.shape[0]
    _weights(dim, weight, bias, dev)
    _pool("conv_states", conv_states, dim, weight.shape[1] - 1, dev)
    _ints("query_start_loc", query_start_loc, 1, dev)
    batch = query_start_loc.shape[0] - 1
    if batch < 0:
        bad_arg("query_start_loc", query_start_loc, "at least one entry (batch + 1)")
    if cache_indices is not None:
        _ints("cache_indices", cache_indices, 1, dev, batch)
    if has_initial_state is not None:
        _tensor("has_initial_state", has_initial_state, 1, (torch.bool,), dev)
        if has_initial_state.shape[0] != batch:
            bad_arg("has_initial_state", has_initial_state, f"{batch} rows (one per sequence)")
    silu = _silu(activation)
    if not isinstance(pad_slot_id, int) or isinstance(pad_slot_id, bool):
        bad_arg("pad_slot_id", pad_slot_id, "an int")
    return Conv1dFnCall(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state, silu,
                        pad_slot_id, _null(null_block_id), torch.empty_like(x))  # fmt: skip


def normalize_conv1d_update(x, conv_state, weight, bias=None, activation=None, conv_state_indices=None,
                            num_accepted_tokens=None, query_start_loc=None, max_query_len=-1, null_block_id=0,
                            out=None) -> Conv1dUpdateCall:  # fmt: skip
    """Validate a ``causal_conv1d_update`` call (vLLM 0.33's arguments but ``validate_data``) into a
    :class:`Conv1dUpdateCall`. Without ``out`` the result goes into ``x`` itself when x has the pool's dtype (vLLM
    writes in place), else into a copy of x through the pool's dtype (the rows it skips keep those values)."""
    varlen = query_start_loc is not None
    _tensor("x", x, 2 if varlen else (2, 3), IO_DTYPES)
    dev = x.device
    dim = x.shape[1]
    _weights(dim, weight, bias, dev)
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.shape != x.shape:
            bad_arg("out", out, f"shape {tuple(x.shape)} (x's)")
        if out.dtype != x.dtype or out.device != dev:
            bad_arg("out", out, f"dtype {str(x.dtype).removeprefix('torch.')} on {dev} (x's)")
    if varlen:
        if conv_state_indices is None:
            bad_arg("conv_state_indices", None, "a [batch] or [batch, k] table (query_start_loc is given)")
        _ints("conv_state_indices", conv_state_indices, (1, 2), dev)
        batch = conv_state_indices.shape[0]
        _ints("query_start_loc", query_start_loc, 1, dev)
        if query_start_loc.shape[0] < batch + 1:
            bad_arg("query_start_loc", query_start_loc, f"at least {batch + 1} entries (batch + 1)")
        if not isinstance(max_query_len, int) or isinstance(max_query_len, bool) or max_query_len < 1:
            bad_arg("max_query_len", max_query_len, "a positive int, the longest query (query_start_loc is given)")
        seqlen = max_query_len
        x3 = x.t().unsqueeze(0)  # [1, D, tokens]
        o = out
    else:
        batch = x.shape[0]
        seqlen = 1 if x.dim() == 2 else x.shape[2]
        if conv_state_indices is not None:
            _ints("conv_state_indices", conv_state_indices, (1, 2), dev, batch)
        x3 = x.unsqueeze(-1) if x.dim() == 2 else x
        o = out
    if num_accepted_tokens is not None:
        _ints("num_accepted_tokens", num_accepted_tokens, 1, dev, batch)
    extra = seqlen - 1 if num_accepted_tokens is not None else 0
    _pool("conv_state", conv_state, dim, weight.shape[1] - 1 + extra, dev)
    silu = _silu(activation)
    via_state = out is None
    if out is None:  # vLLM writes into x's pool-dtype copy (x itself when the dtypes agree) and casts it back
        o = x if x.dtype == conv_state.dtype else x.to(conv_state.dtype).to(x.dtype)
    o3 = o.t().unsqueeze(0) if varlen else (o.unsqueeze(-1) if o.dim() == 2 else o)
    slots = None
    if conv_state_indices is not None:
        slots = conv_state_indices if conv_state_indices.dim() == 1 else conv_state_indices[:, 0]
    return Conv1dUpdateCall(x3, weight, bias, conv_state, slots, num_accepted_tokens, query_start_loc, seqlen, batch,
                            silu, _null(null_block_id), o3, o, via_state)  # fmt: skip


# ------------------------------------------------------------------------------------------- index data


def _host(t):
    return None if t is None else t.detach().to("cpu", torch.int64)


def check_fn_data(call: Conv1dFnCall) -> None:
    """The index tables' values (a device-to-host copy): ``query_start_loc`` non-decreasing from 0 within the
    tokens, ``cache_indices`` in ``[0, slots)`` or a sentinel (``pad_slot_id`` / ``null_block_id``)."""
    tokens, slots = call.x.shape[1], call.state.shape[0]
    q = _host(call.query_start_loc)
    if q[0] != 0 or bool((q[1:] < q[:-1]).any()) or q[-1] > tokens:
        bad_arg("query_start_loc", values(q), f"non-decreasing from 0 within [0, {tokens}] (x's tokens)")
    if call.cache_indices is not None:
        idx = _host(call.cache_indices)
        ok = ((idx >= 0) & (idx < slots)) | (idx == call.pad_slot_id)
        if call.null_block_id is not None:
            ok |= idx == call.null_block_id
        if not bool(ok.all()):
            bad_arg("cache_indices", values(idx), f"entries in [0, {slots}) or pad_slot_id / null_block_id")
    elif call.batch > slots:
        bad_arg("conv_states", call.state, f"at least {call.batch} slots (no cache_indices: sequence b uses slot b)")


def check_update_data(call: Conv1dUpdateCall) -> None:
    """The index tables' values: the slots in ``[0, slots)`` or ``null_block_id``; ``query_start_loc``
    non-decreasing within the tokens, no query longer than ``max_query_len``; ``num_accepted_tokens`` of a live
    sequence in ``[1, state_len - width + 2]`` (the accepted window inside the pool's columns)."""
    S, K, W = call.state.shape[0], call.state.shape[2], call.width
    if call.slots is not None:
        idx = _host(call.slots)
        ok = (idx >= 0) & (idx < S)
        if call.null_block_id is not None:
            ok |= idx == call.null_block_id
        if not bool(ok.all()):
            bad_arg("conv_state_indices", values(idx), f"entries in [0, {S}) or null_block_id")
        live = idx != call.null_block_id if call.null_block_id is not None else torch.ones_like(idx, dtype=bool)
    else:
        if call.batch > S:
            bad_arg("conv_state", call.state, f"at least {call.batch} slots (no conv_state_indices)")
        idx = torch.arange(call.batch)
        live = idx != call.null_block_id if call.null_block_id is not None else torch.ones_like(idx, dtype=bool)
    if call.query_start_loc is not None:
        q = _host(call.query_start_loc)[: call.batch + 1]
        n = q[1:] - q[:-1]
        if q[0] < 0 or bool((n < 0).any()) or q[-1] > call.x.shape[2] or bool((n > call.seqlen).any()):
            bad_arg("query_start_loc", values(q), f"non-decreasing within [0, {call.x.shape[2]}] (x's tokens), "
                    f"steps of at most max_query_len ({call.seqlen})")  # fmt: skip
    if call.num_accepted_tokens is not None:
        acc = _host(call.num_accepted_tokens)
        bad = live & ((acc < 1) | (acc > K - W + 2))
        if bool(bad.any()):
            bad_arg("num_accepted_tokens", values(acc), f"entries in [1, {K - W + 2}] (state_len - width + 2) "
                    "for every sequence not on null_block_id")  # fmt: skip


__all__ = [
    "ACTIVATIONS", "Conv1dFnCall", "Conv1dUpdateCall", "MAX_WIDTH", "check_fn_data", "check_update_data",
    "normalize_conv1d_fn", "normalize_conv1d_update",
]  # fmt: skip
