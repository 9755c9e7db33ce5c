"""Reference causal conv1d (``causal_conv1d_fn`` / ``causal_conv1d_update``): plain PyTorch over the canonical
calls of :mod:`mate.mamba._contract.conv1d`, a Python loop over sequences, vectorised over channels and tokens.

Each sequence is its history (``W - 1`` columns of its conv state, or zeros) followed by its tokens, both in the
pool's dtype; the filter runs over that row and the pool keeps the row's last columns. The rounding is vLLM's
(the contract module's docstring): products rounded to the promoted dtype of pool and weight, summed in fp32 from
the bias in tap order.
"""

from __future__ import annotations

import torch
from mate.mamba._contract.conv1d import Conv1dFnCall, Conv1dUpdateCall, check_fn_data, check_update_data


def product_dtype(state_dtype: torch.dtype, weight_dtype: torch.dtype) -> torch.dtype:
    """The dtype vLLM's kernels round ``x * w`` to: the common one, fp32 when they differ (Triton's promotion)."""
    return state_dtype if state_dtype == weight_dtype else torch.float32


def conv(row: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool) -> torch.Tensor:
    """``row [D, W - 1 + L]`` (history, then the tokens) filtered: ``[D, L]`` fp32."""
    W = weight.shape[1]
    L = row.shape[1] - (W - 1)
    prod = product_dtype(row.dtype, weight.dtype)
    acc = torch.zeros(row.shape[0], L, dtype=torch.float32, device=row.device)
    if bias is not None:
        acc += bias.float()[:, None]
    for j in range(W):
        acc = acc + (row[:, j : j + L].float() * weight[:, j : j + 1].float()).to(prod).float()
    if silu:
        acc = acc / (1.0 + torch.exp(-acc))
    return acc


def _store(y: torch.Tensor, dst: torch.Tensor, state_dtype: torch.dtype, via_state: bool) -> None:
    dst.copy_((y.to(state_dtype) if via_state else y).to(dst.dtype))


@torch.no_grad()
def causal_conv1d_fn(call: Conv1dFnCall) -> torch.Tensor:
    check_fn_data(call)
    W, st = call.width, call.state
    q = call.query_start_loc.tolist()
    slots = list(range(call.batch)) if call.cache_indices is None else call.cache_indices.tolist()
    init = [False] * call.batch if call.has_initial_state is None else call.has_initial_state.tolist()
    xs = call.x.to(st.dtype, copy=True)
    call.out.zero_()  # tokens of skipped sequences and past the last one (vLLM leaves them unwritten)
    for b in range(call.batch):
        s, e, slot = q[b], q[b + 1], slots[b]
        if e == s or slot == call.pad_slot_id or slot == call.null_block_id:
            continue
        hist = st[slot, :, : W - 1] if init[b] else torch.zeros_like(st[slot, :, : W - 1])
        row = torch.cat([hist, xs[:, s:e]], dim=1)
        _store(conv(row, call.weight, call.bias, call.silu), call.out[:, s:e], st.dtype, True)
        st[slot, :, : W - 1] = row[:, -(W - 1) :]
    return call.out


@torch.no_grad()
def causal_conv1d_update(call: Conv1dUpdateCall) -> torch.Tensor:
    check_update_data(call)
    W, st, spec = call.width, call.state, call.num_accepted_tokens is not None
    slots = list(range(call.batch)) if call.slots is None else call.slots.tolist()
    acc = call.num_accepted_tokens.tolist() if spec else None
    q = None if call.query_start_loc is None else call.query_start_loc.tolist()
    xs = call.x.to(st.dtype, copy=True)  # the tokens before out (possibly x itself) is written
    for b in range(call.batch):
        slot = slots[b]
        if call.null_block_id is not None and slot == call.null_block_id:
            continue  # nothing written: out keeps what it held
        if q is None:
            row, s, L, cols = b, 0, call.seqlen, call.state_len
        else:  # vLLM shortens the rewritten columns by the query's shortfall
            row, s, L = 0, q[b], q[b + 1] - q[b]
            cols = call.state_len - (call.seqlen - L)
        if L == 0:
            continue
        off = acc[b] - 1 if spec else 0  # the accepted window starts off columns in
        old = st[slot].clone()
        tokens = xs[row, :, s : s + L]
        shift = 1 if spec else L
        for i in range(max(cols, 0)):  # column i of the new state: a later old column, or a new token
            st[slot, :, i] = old[:, off + i + shift] if i + L < cols else tokens[:, i - (cols - L)]
        y = conv(torch.cat([old[:, off : off + W - 1], tokens], dim=1), call.weight, call.bias, call.silu)
        _store(y, call.out[row, :, s : s + L], st.dtype, call.round_via_state)
    return call.result


__all__ = ["causal_conv1d_fn", "causal_conv1d_update", "conv", "product_dtype"]
