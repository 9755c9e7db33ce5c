"""A plain token-by-token Mamba2 recurrence: the expectation the reference backends are tested against.

Written from ``contracts.md`` §1/§3/§5 and the seed, independently of ``mate.mamba``: it takes the public
arguments as given (every accepted form), interprets them with Python loops over sequences and tokens
(vectorised only over one token's heads x dim x dstate), computes in float64 and never touches its inputs.
It imports nothing from ``mate``.

SSU rules encoded here (one place, in words):

* sequence ``b`` owns rows ``[cu[b], cu[b+1])`` (packed), ``[b*T, (b+1)*T)`` (dense 4-D) or row ``b``;
* a table entry ``(b, t)`` is ``table[b + t]`` for a flat table and ``table[b, t]`` for a 2-D one;
* the read slot is entry ``(b, max(acc[b] - 1, 0))`` (position 0 without ``num_accepted_tokens``), or ``b``
  without a table; a read slot equal to ``pad_slot_id`` reads zeros and the sequence writes no state at all;
* writes: an intermediate buffer takes the state after token ``t`` at ``buf[idx, t]`` (5-D) or
  ``buf[idx * cache_steps + t]`` (flat 4-D), ``idx`` = ``intermediate_state_indices[b]``, else the read slot,
  and the pool is left alone; otherwise ``disable_state_update`` writes nothing; otherwise a destination
  table or ``num_accepted_tokens`` publishes every token's state to ``dst(b, t)`` (``src(b, t)`` without a
  destination table), skipping sentinel destinations; otherwise the final state goes to the read slot;
* every read sees the pool as it was before the call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

F64 = torch.float64


def softplus(v: torch.Tensor) -> torch.Tensor:
    return F.softplus(v, beta=1.0, threshold=20.0)


def _entry(table: torch.Tensor, b: int, t: int) -> int:
    if table.dim() == 1:
        return int(table[b + t])
    return int(table[b, t])


def _per_head_param(p, H: int, P: int):
    """None / [H] / [H, P] (and [P] when H == 1) -> float64 [H, P] or None."""
    if p is None:
        return None
    p = p.to(F64)
    if p.dim() == 1 and p.shape[0] == H:
        return p.view(H, 1).expand(H, P).clone()
    return p.reshape(H, P).clone()


@dataclass
class SSUExpectation:
    y: torch.Tensor  # like x, in x's dtype
    y64: torch.Tensor  # float64, like x
    state: torch.Tensor  # a copy of the pool with the expected writes (pool dtype)
    written: set = field(default_factory=set)  # pool slots written
    ibuf: torch.Tensor | None = None  # a copy of the intermediate buffer with the expected writes
    ibuf_written: set = field(default_factory=set)  # flat (entry * cache_steps + step) positions written
    rows: list = field(default_factory=list)  # x rows the call computes


def ssu_recurrence(
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
    disable_state_update=False,
    intermediate_states_buffer=None,
    intermediate_state_indices=None,
    cache_steps=0,
    dst_state_batch_indices=None,
    cu_seqlens=None,
    num_accepted_tokens=None,
    retrieve_parent_token=None,
    final_write_to_dst=False,
    accepted_writes_per_token=True,
) -> SSUExpectation:
    """The expected result of ``selective_state_update`` with these arguments.

    The last three are the adapter-only rules of the normaliser: SGLang's EAGLE parents (before token
    ``t > 0`` the state is reloaded from the intermediate buffer at ``[idx, parent[b, t]]`` when
    ``parent[b, t] >= 0``), vLLM's single final write to ``dst(b, 0)``, and FlashInfer's final-only write
    when ``num_accepted_tokens`` comes without a destination table.
    """
    single_head = state.dim() == 3
    S = state.shape[0]
    H, P, N = (1, *state.shape[1:]) if single_head else tuple(state.shape[1:])
    dense = x.dim() == (3 if single_head else 4)

    # Every per-row input as float64 [R, H, P] / [R, G, N].
    def rows_of(t, trailing):
        t = t.to(F64)
        if dense:
            t = t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])
        return t.reshape(t.shape[0], *trailing)

    R = x.shape[0] * x.shape[1] if dense else x.shape[0]
    xr = rows_of(x, (H, P))
    if dt.dim() == x.dim() - 1 and not single_head:  # the per-head [R, H] form
        dtr = rows_of(dt, (H,)).unsqueeze(-1).expand(R, H, P)
    else:
        dtr = rows_of(dt, (H, P))
    G = B.shape[-2] if not single_head else 1
    Br = rows_of(B, (G, N))
    Cr = rows_of(C, (G, N))
    zr = None if z is None else rows_of(z, (H, P))
    if A.dim() == 1:
        A3 = A.to(F64).view(H, 1, 1).expand(H, P, N)
    else:
        A3 = A.to(F64).reshape(H, P, N)
    D2 = _per_head_param(D, H, P)
    bias2 = _per_head_param(dt_bias, H, P)

    if cu_seqlens is not None:
        cu = [int(v) for v in cu_seqlens]
        seqs = [(cu[b], cu[b + 1] - cu[b]) for b in range(len(cu) - 1)]
    elif dense:
        T = x.shape[1]
        seqs = [(b * T, T) for b in range(x.shape[0])]
    else:
        seqs = [(b, 1) for b in range(R)]

    pool0 = state.reshape(S, H, P, N) if single_head else state
    new_state = state.clone()
    new_pool = new_state.view(S, H, P, N) if single_head else new_state
    written = set()
    ibuf = None if intermediate_states_buffer is None else intermediate_states_buffer.clone()
    ibuf_written = set()
    y = torch.zeros(R, H, P, dtype=F64)
    rows = []
    heads_per_group = H // G
    group_of = [h // heads_per_group for h in range(H)]

    if ibuf is not None:
        mode = "intermediate"
    elif disable_state_update:
        mode = "none"
    elif dst_state_batch_indices is not None and final_write_to_dst:
        mode = "final_dst"
    elif dst_state_batch_indices is not None or (num_accepted_tokens is not None and accepted_writes_per_token):
        mode = "per_token"
    else:
        mode = "final"
    steps = 0 if ibuf is None else (ibuf.shape[1] if ibuf.dim() == 5 else cache_steps)

    for b, (bos, length) in enumerate(seqs):
        src = state_batch_indices
        if src is None:
            slot = b
        else:
            pos = 0 if num_accepted_tokens is None else max(int(num_accepted_tokens[b]) - 1, 0)
            slot = _entry(src, b, pos)
        pad = slot == pad_slot_id
        s = torch.zeros(H, P, N, dtype=F64) if pad else pool0[slot].to(F64).clone()
        idx = None
        if mode == "intermediate":
            idx = slot if intermediate_state_indices is None else int(intermediate_state_indices[b])
        for t in range(length):
            r = bos + t
            if retrieve_parent_token is not None and t > 0 and not pad and int(retrieve_parent_token[b, t]) >= 0:
                k = int(retrieve_parent_token[b, t])
                s = (ibuf[idx, k] if ibuf.dim() == 5 else ibuf[idx * steps + k]).to(F64).clone()
            rows.append(r)
            d = dtr[r].clone()
            if bias2 is not None:
                d = d + bias2
            if dt_softplus:
                d = softplus(d)
            for h in range(H):
                g = group_of[h]
                dA = torch.exp(A3[h] * d[h].unsqueeze(-1))  # [P, N]
                s[h] = s[h] * dA + (d[h] * xr[r, h]).unsqueeze(-1) * Br[r, g].unsqueeze(0)
                yh = s[h] @ Cr[r, g]
                if D2 is not None:
                    yh = yh + D2[h] * xr[r, h]
                if zr is not None:
                    yh = yh * zr[r, h] * torch.sigmoid(zr[r, h])
                y[r, h] = yh
            if pad:
                continue
            if mode == "intermediate":
                if ibuf.dim() == 5:
                    ibuf[idx, t] = s.to(ibuf.dtype)
                else:
                    ibuf[idx * steps + t] = s.to(ibuf.dtype)
                ibuf_written.add(idx * steps + t)
            elif mode == "per_token":
                table = dst_state_batch_indices if dst_state_batch_indices is not None else src
                dslot = _entry(table, b, t)
                if dslot != pad_slot_id:
                    new_pool[dslot] = s.to(state.dtype)
                    written.add(dslot)
        if pad or length == 0 or mode not in ("final", "final_dst"):
            continue
        target = slot if mode == "final" else _entry(dst_state_batch_indices, b, 0)
        if target != pad_slot_id:
            new_pool[target] = s.to(state.dtype)
            written.add(target)

    y64 = y.reshape(x.shape)
    return SSUExpectation(
        y=y64.to(x.dtype),
        y64=y64,
        state=new_state,
        written=written,
        ibuf=ibuf,
        ibuf_written=ibuf_written,
        rows=rows,
    )


# ------------------------------------------------------------------------------------------------ SSD


@dataclass
class ChunkMeta:
    cu_seqlens: torch.Tensor
    cu_chunk_seqlens: torch.Tensor
    seq_idx: torch.Tensor
    last_chunk_indices: torch.Tensor


def chunk_metadata(seqlens, chunk_size, history=None, dtype=torch.int32) -> ChunkMeta:
    """vLLM-style chunk metadata: chunk boundaries at multiples of ``chunk_size`` counted from the start of
    each sequence's history, so a sequence continuing after ``history[b]`` tokens may open with a short chunk."""
    cu_seqlens, cu_chunks, seq_idx, last = [0], [0], [], []
    for b, length in enumerate(seqlens):
        h = 0 if history is None else history[b]
        done = 0
        while done < length:
            room = chunk_size - (h + done) % chunk_size
            n = min(room, length - done)
            cu_chunks.append(cu_chunks[-1] + n)
            seq_idx.append(b)
            done += n
        last.append(len(seq_idx) - 1)
        cu_seqlens.append(cu_seqlens[-1] + length)
    mk = lambda v: torch.tensor(v, dtype=dtype)  # noqa: E731
    return ChunkMeta(mk(cu_seqlens), mk(cu_chunks), mk(seq_idx), mk(last))


@dataclass
class SSDExpectation:
    y: torch.Tensor  # float64 [T, H, P]
    final: torch.Tensor  # float64 [batch, H, P, N]
    chunk_end: torch.Tensor | None  # float64 [nchunks, H, P, N] when cu_chunk_seqlens was given


def ssd_recurrence(
    x,
    dt,
    A,
    B,
    C,
    seqlens,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_limit=(0.0, math.inf),
    initial_states=None,
    cu_chunk_seqlens=None,
) -> SSDExpectation:
    """The prefill as the decode recurrence, token by token through each sequence of a packed batch."""
    T, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    hpg = H // G
    lo, hi = dt_limit
    x64, B64, C64 = x.to(F64), B.to(F64), C.to(F64)
    A64 = A.to(F64)
    D2 = _per_head_param(D, H, P)
    y = torch.zeros(T, H, P, dtype=F64)
    after = {}  # token -> state after it (only the tokens that close a chunk)
    closers = set()
    if cu_chunk_seqlens is not None:
        closers = {int(v) - 1 for v in cu_chunk_seqlens[1:]}
    finals = []
    bos = 0
    for b, length in enumerate(seqlens):
        if initial_states is None:
            s = torch.zeros(H, P, N, dtype=F64)
        else:
            s = initial_states[b].to(F64).clone()
        for t in range(bos, bos + length):
            for h in range(H):
                d = dt[t, h].to(F64)
                if dt_bias is not None:
                    d = d + dt_bias[h].to(F64)
                if dt_softplus:
                    d = softplus(d)
                d = min(max(float(d), lo), hi)
                g = h // hpg
                s[h] = s[h] * math.exp(float(A64[h]) * d) + d * torch.outer(x64[t, h], B64[t, g])
                yh = s[h] @ C64[t, g]
                if D2 is not None:
                    yh = yh + D2[h] * x64[t, h]
                if z is not None:
                    zt = z[t, h].to(F64)
                    yh = yh * zt * torch.sigmoid(zt)
                y[t, h] = yh
            if t in closers:
                after[t] = s.clone()
        finals.append(s.clone())
        bos += length
    chunk_end = None
    if cu_chunk_seqlens is not None:
        chunk_end = torch.stack([after[int(v) - 1] for v in cu_chunk_seqlens[1:]])
    return SSDExpectation(y=y, final=torch.stack(finals), chunk_end=chunk_end)
