"""Reference SSD varlen prefill: the five chunked stages in PyTorch over the canonical :class:`SSDCall`.

Chunks are gathered into a padded ``[nchunks, chunk_size, ...]`` batch (positions past a chunk's end are
masked to zero), so every stage is one batched tensor expression; only stage 3 (state passing) loops, over
chunks, because each chunk's entering state is the previous chunk's end state. fp32 throughout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from mate.mamba._contract.ssd import SSDCall, check_index_data
from mate.mamba._reference.ssu import load_rows, softplus, store_rows


def processed_dt(call: SSDCall) -> torch.Tensor:
    """``dt' = clamp(softplus(dt + dt_bias), *dt_limit)`` per token and head, fp32 ``[T, H]``."""
    dt = call.dt.float()
    if call.dt_bias is not None:
        dt = dt + call.dt_bias.float()
    if call.dt_softplus:
        dt = softplus(dt)
    lo, hi = call.dt_limit
    return dt.clamp(min=lo, max=hi)


def chunk_entering_states(call: SSDCall, dA_last: torch.Tensor, chunk_states: torch.Tensor):
    """Stage 3. Returns (entering [nchunks, H, P, N], end [nchunks, H, P, N]) fp32; ``seq_idx`` decides
    which chunks open a sequence."""
    nc, H, P, N = chunk_states.shape
    seq_idx = call.seq_idx.tolist()
    init = None
    if call.initial_states is not None:  # (a quantised pool's rows dequantised with their scales)
        init = load_rows(call.initial_states, call.initial_states_scale, slice(None))
    entering = torch.empty_like(chunk_states)
    end = torch.empty_like(chunk_states)
    for c in range(nc):
        if c == 0 or seq_idx[c] != seq_idx[c - 1]:
            prev = init[seq_idx[c]] if init is not None else torch.zeros_like(chunk_states[c])
        else:
            prev = end[c - 1]
        entering[c] = prev
        end[c] = torch.exp(dA_last[c]).view(H, 1, 1) * prev + chunk_states[c]
    return entering, end


@torch.no_grad()
def ssd_combined_fwd_varlen(call: SSDCall) -> torch.Tensor | None:
    check_index_data(call)
    dev = call.x.device
    L, H = call.chunk_size, call.heads
    rep = H // call.groups
    cu = call.cu_chunk_seqlens.to(torch.int64)
    start, end_tok = cu[:-1], cu[1:]
    pos = torch.arange(L, device=dev)
    tok = start.unsqueeze(1) + pos  # [nc, L]
    valid = tok < end_tok.unsqueeze(1)
    tok = torch.where(valid, tok, torch.zeros_like(tok))
    vmask = valid.float()

    dt = processed_dt(call)[tok] * vmask.unsqueeze(-1)  # [nc, L, H]
    x = call.x[tok].float() * vmask[..., None, None]  # [nc, L, H, P]
    Bh = call.B[tok].float().repeat_interleave(rep, dim=2)  # [nc, L, H, N]
    Ch = call.C[tok].float().repeat_interleave(rep, dim=2)

    # Stage 1: within-chunk cumsum of A * dt' (zero past a chunk's end, so the last entry is the total).
    dA_cs = torch.cumsum(dt * call.A.float(), dim=1)  # [nc, L, H]
    dA_last = dA_cs[:, -1]  # [nc, H]
    # Stage 2: chunk-local end states, sum_k x_k (x) B_k * exp(dA_last - dA_k) * dt'_k.
    w = torch.exp(dA_last.unsqueeze(1) - dA_cs) * dt  # [nc, L, H]
    chunk_states = torch.einsum("clhp,clhn,clh->chpn", x, Bh, w)
    # Stage 3: pass states across chunks.
    entering, end_states = chunk_entering_states(call, dA_last, chunk_states)
    # Stage 4: C B^T per chunk (and head; groups are repeated).
    CB = torch.einsum("clhn,cshn->chls", Ch, Bh)  # [nc, H, L, L]
    # Stage 5: y_m = exp(dA_m) C_m . entering + sum_{k<=m} CB[m,k] exp(dA_m - dA_k) dt'_k x_k + D x_m.
    causal = torch.tril(torch.ones(L, L, dtype=torch.bool, device=dev))
    diff = dA_cs.permute(0, 2, 1).unsqueeze(-1) - dA_cs.permute(0, 2, 1).unsqueeze(-2)  # [nc, H, L, L]
    decay = torch.exp(torch.where(causal, diff, torch.full_like(diff, -torch.inf)))
    scores = CB * decay * dt.permute(0, 2, 1).unsqueeze(-2)
    y = torch.einsum("chls,cshp->clhp", scores, x)
    y = y + torch.exp(dA_cs).unsqueeze(-1) * torch.einsum("clhn,chpn->clhp", Ch, entering)
    if call.D is not None:
        y = y + call.D.float() * x
    if call.z is not None:
        y = y * F.silu(call.z[tok].float())
    call.out[tok[valid]] = y[valid].to(call.out.dtype)

    if call.return_intermediate_states:
        return end_states.to(call.state_dtype)
    final = end_states[call.last_chunk_indices.to(torch.int64)]
    if call.final_states_out is not None:
        store_rows(call.final_states_out, call.final_states_scale, call.final_state_indices.to(torch.int64), final)
        return None
    return final.to(call.state_dtype)
