"""Reference ReplaySSM decode and materialisation: the plain recurrence over a slot's ring of cached tokens.

A slot's true state is its checkpoint ``state[slot]`` advanced through its ``pnat`` live ring tokens (rows
``(ring_start + j) % L``): ``s = exp(A dt_j) s + dt_j x_j B_j^T``, with the cached ``dt`` already
``softplus(dt + dt_bias)``. A decode call replays the live tokens, runs the new ones from there (``y = C s + D x``,
times ``silu(z)``) and appends them to the ring after the live ones; when live and new tokens do not fit the
window (``pnat + T_b > L - T``) it first writes the replayed state back as the new checkpoint (a flush: only the
live tokens are folded in, the new ones stay in the ring). The host then moves ``ring_start`` past the folded
tokens and counts the accepted ones (``mate.mamba.advance_replay_ring``). fp32 throughout; a quantised
checkpoint is read and written with its row scales, as ``selective_state_update`` writes a state, and with
``rand_seed`` an fp16, int8 or fp8-e4m3 one is rounded stochastically (:mod:`mate.mamba._reference.rounding`),
by a flush and by the materialisation alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from mate.mamba._contract.replay import MaterializeCall, ReplayCall, check_materialize_data, check_replay_data
from mate.mamba._reference.ssu import _heads, load_rows, softplus, store_rows


def replay(s: torch.Tensor, A: torch.Tensor, xs: torch.Tensor, Bs: torch.Tensor, dts: torch.Tensor) -> torch.Tensor:
    """``s [H, P, N]`` advanced through tokens ``xs [k, H, P]``, ``Bs [k, H, N]``, ``dts [k, H]`` (fp32)."""
    for j in range(xs.shape[0]):
        dA = torch.exp(A * dts[j])  # [H]
        s = dA.view(-1, 1, 1) * s + (dts[j].view(-1, 1) * xs[j]).unsqueeze(-1) * Bs[j].unsqueeze(1)
    return s


def _ring_tokens(x_cache, B_cache, dt_cache, slot: int, start: int, count: int, heads: int):
    """The ``count`` ring tokens of ``slot`` from row ``start``: x [k, H, P], B [k, H, N], dt [k, H] (fp32)."""
    L = x_cache.shape[2]
    rows = [(start + j) % L for j in range(count)]
    xs = x_cache[slot][:, rows].transpose(0, 1).float()
    Bs = _heads(B_cache[slot][:, rows].transpose(0, 1).float(), heads)
    dts = dt_cache[slot][:, rows].transpose(0, 1).float()
    return xs, Bs, dts


@torch.no_grad()
def replay_state_update(call: ReplayCall) -> torch.Tensor:
    check_replay_data(call)
    H = call.state.shape[1]
    L, W = call.ring_len, call.window
    slots = None if call.slots is None else call.slots.tolist()
    rs_all, pk_all = call.ring_start.tolist(), call.pnat.tolist()
    sr = None if call.rand_seed is None else (int(call.rand_seed.reshape(-1)[0]), call.philox_rounds)
    if call.cu_seqlens is not None:
        cu = call.cu_seqlens.tolist()
        spans = [(0, cu[b], cu[b + 1] - cu[b]) for b in range(call.nseq)]
    else:
        spans = [(b, 0, call.npredicted) for b in range(call.nseq)]
    for b, (row, t0, T) in enumerate(spans):
        slot = b if slots is None else slots[b]
        if slot == call.pad_slot_id or T <= 0:
            continue
        rs, pk = rs_all[slot], pk_all[slot]
        s = load_rows(call.state, call.state_scale, torch.tensor([slot], device=call.state.device))[0]
        s = replay(s, call.A, *_ring_tokens(call.x_cache, call.B_cache, call.dt_cache, slot, rs, pk, H))
        if pk + T > W:  # a flush: the live tokens folded into the checkpoint
            store_rows(call.state, call.state_scale, torch.tensor([slot], device=s.device), s.unsqueeze(0), sr)
        x = call.x[row, t0 : t0 + T].float()  # [T, H, P]
        Bh = _heads(call.B[row, t0 : t0 + T].float(), H)  # [T, H, N]
        Ch = _heads(call.C[row, t0 : t0 + T].float(), H)
        dt = call.dt[row, t0 : t0 + T].float()
        if call.dt_bias is not None:
            dt = dt + call.dt_bias
        if call.dt_softplus:
            dt = softplus(dt)
        for t in range(T):
            s = replay(s, call.A, x[t : t + 1], Bh[t : t + 1], dt[t : t + 1])
            y = torch.einsum("hpn,hn->hp", s, Ch[t])
            if call.D is not None:
                y = y + call.D.view(-1, 1) * x[t]
            if call.z is not None:
                y = y * F.silu(call.z[row, t0 + t].float())
            call.out[row, t0 + t] = y.to(call.out.dtype)
        # the new tokens after the live ones (a flush leaves them there too: the host moves ring_start)
        rows = [(rs + pk + i) % L for i in range(T)]
        call.x_cache[slot][:, rows] = call.x[row, t0 : t0 + T].transpose(0, 1)
        call.B_cache[slot][:, rows] = call.B[row, t0 : t0 + T].transpose(0, 1)
        call.dt_cache[slot][:, rows] = dt.transpose(0, 1)
    return call.out


@torch.no_grad()
def materialize_replayed_state(call: MaterializeCall) -> None:
    """``state[dst[b]]`` = ``state[src[b]]`` advanced through ``prefix[b]`` ring tokens of the source slot from
    row ``ring_start[b]`` (requests whose source or destination is the sentinel are skipped)."""
    check_materialize_data(call)
    H = call.state.shape[1]
    sr = None if call.rand_seed is None else (int(call.rand_seed.reshape(-1)[0]), call.philox_rounds)
    src, dst = call.src.tolist(), call.dst.tolist()
    rs, pre = call.ring_start.tolist(), call.prefix.tolist()
    for b in range(len(src)):
        if call.pad_slot_id in (src[b], dst[b]):
            continue
        if pre[b] == 0:  # nothing to replay: an exact copy of the stored numbers (and scales)
            call.state[dst[b]] = call.state[src[b]]
            if call.state_scale is not None:
                call.state_scale[dst[b]] = call.state_scale[src[b]]
            continue
        s = load_rows(call.state, call.state_scale, torch.tensor([src[b]], device=call.state.device))[0]
        s = replay(s, call.A, *_ring_tokens(call.x_cache, call.B_cache, call.dt_cache, src[b], rs[b], pre[b], H))
        store_rows(call.state, call.state_scale, torch.tensor([dst[b]], device=s.device), s.unsqueeze(0), sr)


__all__ = ["replay", "replay_state_update", "materialize_replayed_state"]
