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

import ctypes

import torch
import torch.nn.functional as F
from mate.mamba._contract.dtypes import QUANT_STATE_DTYPES
from mate.mamba._contract.errors import unsupported
from mate.mamba._contract.replay import (
    LAYER_TABLES,
    MaterializeCall,
    MaterializeLayersCall,
    ReplayCall,
    check_materialize_data,
    check_replay_data,
    normalize_materialize,
)
from mate.mamba._platform.device import is_capturing
from mate.mamba._reference.rounding import layer_seed
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


class _DeviceMemory:
    """``nbytes`` bytes of device memory at ``addr``, as ``torch.as_tensor`` reads it (CUDA array interface)."""

    def __init__(self, addr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (addr, False), "version": 3}


def _memory(addr: int, dtype: torch.dtype, shape: tuple, strides: tuple, device: torch.device) -> torch.Tensor:
    """A tensor of ``shape`` / ``strides`` (elements) over the caller's memory at ``addr`` (no copy)."""
    nbytes = (1 + sum((n - 1) * st for n, st in zip(shape, strides, strict=True))) * dtype.itemsize
    if device.type == "cpu":
        raw = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(addr), dtype=torch.uint8)
    elif device.type == "cuda":
        raw = torch.as_tensor(_DeviceMemory(addr, nbytes), device=device)
    else:
        unsupported(f"materialize_replayed_layers (torch) on {device.type}", "it reads CPU or CUDA memory")
    return raw.view(dtype).as_strided(shape, strides)


@torch.no_grad()
def materialize_replayed_layers(call: MaterializeLayersCall) -> None:
    """The multi-layer materialisation on the host: it reads the tables back (a sync; refused while a graph is
    captured, where the reads would not be replayed), checks the selected requests' metadata (``ValueError``),
    rebuilds each layer's pools as tensors over the addresses and runs :func:`materialize_replayed_state` on them,
    layer by layer (with ``philox_rounds`` > 0, each with its seed :func:`~mate.mamba._reference.rounding.layer_seed`
    of ``rand_seed`` and the layer)."""
    dev = call.state.device
    if is_capturing(dev):
        unsupported("materialize_replayed_layers (torch) under graph capture",
                    "it reads the pointer tables on the host; capture the TileLang kernel instead")  # fmt: skip
    ptrs = {name: t.tolist() for name, t in zip(LAYER_TABLES, call.tables, strict=True)}
    src, dst = call.src.tolist(), call.dst.tolist()
    rs, pre, active = call.ring_start.tolist(), call.prefix.tolist(), call.active.tolist()
    batch = len(rs)
    chosen = []
    for v, b in enumerate(active):  # the selected requests: the entries before the first -1
        if b == -1:
            break
        if not 0 <= b < batch or b in chosen:
            raise ValueError(f"active_request_indices: got {b} at entry {v}; expected distinct requests in "
                             f"[0, {batch}), then -1")  # fmt: skip
        if not 0 <= rs[b] < call.ring_len:
            raise ValueError(f"ring_start: got {rs[b]} at request {b}; expected a value in [0, {call.ring_len})")
        if not 0 <= pre[b] <= call.max_window:
            raise ValueError(f"replay_prefix_len: got {pre[b]} at request {b}; expected a value in "
                             f"[0, {call.max_window}] (max_window)")  # fmt: skip
        chosen.append(b)
    H, P, N, L, G = call.heads, call.dim, call.dstate, call.ring_len, call.heads // call.heads_per_group
    scaled = call.state_dtype in QUANT_STATE_DTYPES
    seed = None if call.rand_seed is None else int(call.rand_seed[0])
    for layer in range(len(src)):
        live = [b for b in chosen if call.pad_slot_id not in (src[layer][b], dst[layer][b])]
        if not live:
            continue
        slots = [src[layer][b] for b in live] + [dst[layer][b] for b in live]
        if min(slots) < 0:
            raise ValueError(f"src_slots / dst_slots: got slot {min(slots)} in layer {layer}; expected slots >= 0 "
                             f"or pad_slot_id ({call.pad_slot_id})")  # fmt: skip
        S = max(slots) + 1  # the pools' slots this call touches

        def pool(name, dtype, inner, layer=layer, S=S):
            stride = ptrs[name.replace("_ptrs", "_slot_strides")][layer]
            strides = [1]
            for n in reversed(inner[1:]):
                strides.insert(0, strides[0] * n)
            return _memory(ptrs[name][layer], dtype, (S, *inner), (stride, *strides), dev)

        if scaled and ptrs["state_scale_ptrs"][layer] == 0:
            raise ValueError(f"state_scale_ptrs: got 0 for layer {layer}; expected the address of its scales "
                             f"(a {call.state_dtype} state is block-scaled)")  # fmt: skip
        state = pool("state_ptrs", call.state_dtype, (H, P, N))
        x_cache = pool("x_cache_ptrs", call.io_dtype, (H, L, P))
        B_cache = pool("B_cache_ptrs", call.io_dtype, (G, L, N))
        dt_cache = pool("dt_cache_ptrs", torch.float32, (H, L))
        A = _memory(ptrs["A_ptrs"][layer], call.a_dtype, (H,), (1,), dev)
        scale = pool("state_scale_ptrs", torch.float32, (H, P)) if scaled else None
        index = torch.tensor(live, dtype=torch.int64)
        key = None if seed is None else torch.tensor([layer_seed(seed, layer)], dtype=torch.int64, device=dev)
        one = normalize_materialize(state, x_cache, B_cache, dt_cache, A, call.ring_start.cpu()[index].to(dev),
                                    call.prefix.cpu()[index].to(dev), call.src[layer].cpu()[index].to(dev),
                                    call.dst[layer].cpu()[index].to(dev), scale, call.pad_slot_id, key,
                                    call.philox_rounds)  # fmt: skip
        materialize_replayed_state(one)


__all__ = ["replay", "replay_state_update", "materialize_replayed_state", "materialize_replayed_layers"]
