"""Reference selective state update: pure PyTorch over the canonical :class:`SSUCall`.

Readable first: vectorised over sequences, heads, dim and dstate, a Python loop over token positions only
(the recurrence needs it). fp32 math; the state is stored back in its own dtype. This is both the backend
that CPU users get and the oracle the kernels are tested against; the tests check it against a plain
token-by-token recurrence written independently of it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from mate.mamba._contract.dtypes import STATE_FORMATS
from mate.mamba._contract.ssu import SlotTable, SSUCall, check_index_data, finish
from mate.mamba._reference.rounding import round_scaled, round_to_fp16


def softplus(x: torch.Tensor) -> torch.Tensor:
    """``log1p(exp(x))``, identity above 20 (the threshold every peer uses)."""
    return torch.where(x > 20.0, x, torch.log1p(torch.exp(torch.clamp(x, max=20.0))))


def table_lookup(table: SlotTable, b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Entries ``(b, t)`` of a stride-addressed slot table as int64."""
    flat = b.to(torch.int64) * table.stride_b + t.to(torch.int64) * table.stride_t
    if flat.numel() and int(flat.max()) >= table.base.numel():
        raise ValueError(
            f"slot table: position {int(flat.max())} is past the table's last entry ({table.base.numel() - 1}); "
            "a flat table needs one entry per packed row"
        )
    return table.base[flat].to(torch.int64)


def sequence_bounds(call: SSUCall) -> tuple[torch.Tensor, torch.Tensor]:
    """(bos, len) per sequence, int64 on the state's device."""
    dev = call.state.device
    if call.cu_seqlens is not None:
        cu = call.cu_seqlens.to(torch.int64)
        return cu[:-1], cu[1:] - cu[:-1]
    ar = torch.arange(call.nseq, device=dev, dtype=torch.int64)
    return ar * call.seqlen, torch.full_like(ar, call.seqlen)


def read_slots(call: SSUCall) -> torch.Tensor:
    b = torch.arange(call.nseq, device=call.state.device, dtype=torch.int64)
    if call.src is None:
        return b
    pos = torch.zeros_like(b) if call.num_accepted is None else (call.num_accepted.to(torch.int64) - 1).clamp(min=0)
    return table_lookup(call.src, b, pos)


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[n, G, N] -> [n, H, N]: head h uses group h // (H // G)."""
    return t.repeat_interleave(heads // t.shape[1], dim=1)


@torch.no_grad()
def load_rows(tensor: torch.Tensor, scale: torch.Tensor | None, rows: torch.Tensor | slice) -> torch.Tensor:
    """Rows of a state tensor as fp32: dequantised (value x its (row, head, dim) scale) where ``scale`` is given."""
    v = tensor[rows].float()
    return v if scale is None else v * scale[rows].unsqueeze(-1)


def store_rows(tensor: torch.Tensor, scale: torch.Tensor | None, rows: torch.Tensor, values: torch.Tensor,
               sr: tuple[int, int] | None = None) -> None:  # fmt: skip
    """Write fp32 ``values`` into rows of a state tensor; a block-scaled one takes new per-(row, head, dim) scales,
    max|row| / qmax (1 for an all-zero row), and the values divided by them, rounded to nearest (even) and
    clamped to +-qmax (its format's rule and qmax: ``mate_kernels.formats``). ``sr`` (seed, Philox rounds): an
    fp16 tensor's values, or an int8 / fp8 one's scaled values, are rounded stochastically
    (:mod:`mate.mamba._reference.rounding`), each by its element offset in the ``[rows, H, P, N]`` tensor."""
    offsets = None
    if sr is not None:
        inner = math.prod(values.shape[1:])
        offsets = (rows.to(torch.int64).view(-1, 1) * inner + torch.arange(inner, device=rows.device)).reshape(-1)
    if scale is None:
        if offsets is not None and tensor.dtype == torch.float16:
            tensor[rows] = round_to_fp16(values.reshape(-1), sr[0], offsets, sr[1]).view(values.shape)
        else:
            tensor[rows] = values.to(tensor.dtype)
        return
    fmt = STATE_FORMATS[tensor.dtype]
    qmax = fmt.qmax
    amax = values.abs().amax(-1)
    # (a tensor divided, correctly rounded as the kernels divide: torch's scalar / tensor is not)
    encode = torch.where(amax == 0, torch.ones_like(amax), torch.full_like(amax, qmax) / amax)
    scaled = values * encode.unsqueeze(-1)
    if offsets is not None:
        tensor[rows] = round_scaled(scaled.reshape(-1), fmt, sr[0], offsets, sr[1]).view(values.shape)
    else:
        q = scaled.clamp(-qmax, qmax)
        tensor[rows] = (q.round() if fmt.integer else q).to(tensor.dtype)
    scale[rows] = 1.0 / encode


def selective_state_update(call: SSUCall) -> torch.Tensor:
    check_index_data(call)
    state, H = call.state, call.heads
    dev = state.device
    bos, lens = sequence_bounds(call)
    slot = read_slots(call)
    live = slot != call.pad_slot_id  # a sentinel read slot: zero state, no state writes
    s = torch.zeros((call.nseq, H, call.dim, call.dstate), dtype=torch.float32, device=dev)
    s[live] = load_rows(state, call.state_scale, slot[live])
    sr = None if call.rand_seed is None else (int(call.rand_seed.reshape(-1)[0]), call.philox_rounds)

    ibuf_idx = None
    if call.write_mode == "intermediate":
        if call.ibuf_indices is not None:
            ibuf_idx = call.ibuf_indices[: call.nseq].to(torch.int64)
        elif call.src is not None:
            ibuf_idx = slot
        else:
            ibuf_idx = torch.arange(call.nseq, device=dev)

    A = call.A.float()
    D = None if call.D is None else call.D.float()
    dt_bias = None if call.dt_bias is None else call.dt_bias.float()
    max_len = int(lens.max()) if call.nseq else 0
    seq = torch.arange(call.nseq, device=dev)
    for t in range(max_len):
        act = seq[lens > t]
        if act.numel() == 0:
            continue
        if call.parent is not None and t > 0:
            par = call.parent[act, t].to(torch.int64)
            rl = (par >= 0) & live[act]
            if bool(rl.any()):
                s[act[rl]] = load_rows(call.ibuf, call.ibuf_scale, ibuf_idx[act[rl]] * call.cache_steps + par[rl])
        rows = bos[act] + t
        x = call.x[rows].float()
        dt = call.dt[rows].float()
        if dt_bias is not None:
            dt = dt + dt_bias
        if call.dt_softplus:
            dt = softplus(dt)
        dA = torch.exp(A.unsqueeze(0) * dt.unsqueeze(-1))
        Bh = _heads(call.B[rows].float(), H)
        Ch = _heads(call.C[rows].float(), H)
        sa = s[act] * dA + (dt * x).unsqueeze(-1) * Bh.unsqueeze(2)
        s[act] = sa
        y = (sa * Ch.unsqueeze(2)).sum(-1)
        if D is not None:
            y = y + D * x
        if call.z is not None:
            y = y * F.silu(call.z[rows].float())
        call.out[rows] = y.to(call.out.dtype)

        wl = act[live[act]]
        if call.write_mode == "per_token" and wl.numel():
            d = table_lookup(call.dst, wl, torch.full_like(wl, t))
            keep = d != call.pad_slot_id
            store_rows(state, call.state_scale, d[keep], s[wl[keep]], sr)
        elif call.write_mode == "intermediate" and wl.numel():
            store_rows(call.ibuf, call.ibuf_scale, ibuf_idx[wl] * call.cache_steps + t, s[wl], sr)

    if call.write_mode == "final":
        done = seq[live & (lens > 0)]
        if call.dst is not None:
            d = table_lookup(call.dst, done, torch.zeros_like(done))
        else:
            d = slot[done]
        keep = d != call.pad_slot_id
        store_rows(state, call.state_scale, d[keep], s[done[keep]], sr)
    return finish(call)
