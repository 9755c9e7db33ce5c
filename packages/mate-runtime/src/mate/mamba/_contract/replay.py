"""The one normalisation point of the ReplaySSM decode (``replay_state_update``, FlashInfer 0.7.2's
``checkpointing_ssu`` contract) and of ``materialize_replayed_state``.

Canonical form (``S`` pool slots, ``L`` ring rows, ``H`` heads, ``P`` head dim, ``N`` state size, ``G`` groups,
``T`` new tokens per sequence, or the longest with ``cu_seqlens``): ``state [S, H, P, N]`` (the checkpoint: the
state before the ring's live tokens), ``x_cache [S, H, L, P]`` and ``B_cache [S, G, L, N]`` in x's dtype (the
raw x and B of each cached token), ``dt_cache [S, H, L]`` fp32 (``softplus(dt + dt_bias)``, without A),
``ring_start`` / ``prev_num_accepted_tokens [S]`` int32 (the ring row of the oldest live token, and how many are
live), ``x, z, out [batch, T, H, P]`` (or ``[1, tokens, H, P]`` packed with ``cu_seqlens``), ``B, C [batch, T, G,
N]``, ``dt [batch, T, H]`` and ``A, D, dt_bias [H]`` per head (a ring caches one dt per head and token, so dt, A
and dt_bias are tied over the head dim; D is read per head, as FlashInfer's kernel reads ``D[head]``).

The window is ``W = L - T``: a call whose live tokens and new tokens do not fit it (``pnat + T_b > W``) flushes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from mate.mamba._contract.dtypes import (
    INDEX_DTYPES,
    IO_DTYPES,
    PARAM_DTYPES,
    QUANT_STATE_DTYPES,
    SR_STATE_DTYPES,
    SR_STATES,
    STATE_DTYPES,
)
from mate.mamba._contract.errors import bad_arg, check_tensor, unsupported, values
from mate.mamba._contract.ssu import host_ints

REPLAY_ALGORITHMS = ("auto", "monolith", "two-kernel")  # FlashInfer's (its kernel choice; MATE plans its own)


@dataclass(frozen=True)
class ReplayCall:
    state: torch.Tensor
    x_cache: torch.Tensor
    B_cache: torch.Tensor
    dt_cache: torch.Tensor
    ring_start: torch.Tensor
    pnat: torch.Tensor
    x: torch.Tensor  # [batch, T, H, P] (packed: [1, tokens, H, P])
    dt: torch.Tensor  # [batch, T, H]
    A: torch.Tensor  # [H] fp32
    B: torch.Tensor
    C: torch.Tensor
    out: torch.Tensor
    D: torch.Tensor | None  # [H]
    z: torch.Tensor | None
    dt_bias: torch.Tensor | None  # [H]
    dt_softplus: bool
    slots: torch.Tensor | None  # [batch]
    pad_slot_id: int
    state_scale: torch.Tensor | None
    rand_seed: torch.Tensor | None
    philox_rounds: int
    cu_seqlens: torch.Tensor | None
    npredicted: int  # T, or max_seqlen with cu_seqlens

    @property
    def ring_len(self) -> int:
        return self.x_cache.shape[2]

    @property
    def window(self) -> int:
        return self.ring_len - self.npredicted

    @property
    def nseq(self) -> int:
        return self.x.shape[0] if self.cu_seqlens is None else self.cu_seqlens.shape[0] - 1


_tensor = functools.partial(check_tensor, device_of="state")  # (name, t, ndims, dtypes, device)


def _shape(name, t, shape, what=""):
    if tuple(t.shape) != tuple(shape):
        bad_arg(name, t, f"shape {tuple(shape)}{what}")


def _per_head(name, t, H, device, *, tied_dims: int):
    """``t`` as ``[H]`` fp32: given ``[H]``, or ``[H, ...]`` whose trailing ``tied_dims`` dims have stride 0
    (one value per head broadcast over them: the form engines pass)."""
    _tensor(name, t, (1, 1 + tied_dims), PARAM_DTYPES, device)
    if t.shape[0] != H:
        bad_arg(name, t, f"[{H}] or [{H}, ...] per head")
    if t.dim() > 1:
        if any(t.stride(d) != 0 and t.shape[d] != 1 for d in range(1, t.dim())):
            bad_arg(name, t, "one value per head (its trailing dims of stride 0): a ring caches dt per head")
        t = t[(slice(None),) + (0,) * (t.dim() - 1)]
    return t.float()


def _check_scale(state_scale, state) -> None:
    """A quantised checkpoint's fp32 ``[S, H, P]`` row scales (only beside one)."""
    S, H, P, _ = state.shape
    quantised = state.dtype in QUANT_STATE_DTYPES
    if state_scale is not None:
        if not quantised:
            bad_arg("state_scale", state_scale, "None unless state is int16, int8 or float8_e4m3fn")
        _tensor("state_scale", state_scale, 3, (torch.float32,), state.device)
        _shape("state_scale", state_scale, (S, H, P))
    elif quantised:
        bad_arg("state_scale", None, f"a float32 [{S}, {H}, {P}] tensor of the state's block scales")


def _check_seed(rand_seed, philox_rounds, state) -> None:
    """``rand_seed`` (stochastic rounding of the states written: fp16, or int8 / fp8-e4m3 with their scales) and
    ``philox_rounds``."""
    if not isinstance(philox_rounds, int) or isinstance(philox_rounds, bool):
        bad_arg("philox_rounds", philox_rounds, "an int")
    if rand_seed is not None:
        _tensor("rand_seed", rand_seed, (0, 1, 2), (torch.int64,), state.device)
        if rand_seed.numel() != 1:
            bad_arg("rand_seed", rand_seed, "a one-element int64 tensor (the step's seed)")
        if philox_rounds <= 0:
            bad_arg("philox_rounds", philox_rounds, "> 0 with rand_seed")
        if state.dtype not in SR_STATE_DTYPES:
            unsupported(f"rand_seed (stochastic rounding) of a {str(state.dtype).removeprefix('torch.')} state",
                        f"stochastic rounding serves {SR_STATES} states; pass rand_seed=None")  # fmt: skip


def normalize_replay(state, x_cache, B_cache, dt_cache, ring_start, prev_num_accepted_tokens, x, dt, A, B, C, out,
                     D=None, z=None, dt_bias=None, dt_softplus=False, state_batch_indices=None, pad_slot_id=-1,
                     state_scale=None, rand_seed=None, philox_rounds=10, d_split=None, cu_seqlens=None,
                     max_seqlen=None, enable_pdl=False, cb_scaled=None, cumAdt_vec=None, cb_old=None,
                     precompute_heads_per_cta=0, algorithm="auto") -> ReplayCall:  # fmt: skip
    """Validate ``replay_state_update``'s arguments (FlashInfer's ``checkpointing_ssu`` order) and return the
    canonical :class:`ReplayCall`."""
    _tensor("state", state, 4, STATE_DTYPES + QUANT_STATE_DTYPES, None)
    dev = state.device
    S, H, P, N = state.shape
    _tensor("x", x, 4, IO_DTYPES, dev)
    io = x.dtype
    _tensor("x_cache", x_cache, 4, (io,), dev)
    L = x_cache.shape[2]
    _shape("x_cache", x_cache, (S, H, L, P), " (slots, heads, ring rows, dim), x's dtype")
    _tensor("B", B, 4, (io,), dev)
    G = B.shape[2]
    if G < 1 or H % G:
        bad_arg("B", B, f"[..., groups, {N}] with heads ({H}) divisible by groups")
    _tensor("B_cache", B_cache, 4, (io,), dev)
    _shape("B_cache", B_cache, (S, G, L, N), " (slots, groups, ring rows, dstate)")
    _tensor("dt_cache", dt_cache, 3, (torch.float32,), dev)
    _shape("dt_cache", dt_cache, (S, H, L), " (slots, heads, ring rows), fp32")
    for name, t in (("ring_start", ring_start), ("prev_num_accepted_tokens", prev_num_accepted_tokens)):
        _tensor(name, t, 1, (torch.int32,), dev)
        _shape(name, t, (S,), " int32, one per slot")
    if cu_seqlens is not None:
        _tensor("cu_seqlens", cu_seqlens, 1, (torch.int32,), dev)
        if x.shape[0] != 1:
            bad_arg("x", x, "[1, tokens, heads, dim] with cu_seqlens (packed)")
        if not isinstance(max_seqlen, int) or isinstance(max_seqlen, bool) or max_seqlen < 1:
            bad_arg("max_seqlen", max_seqlen, "the longest sequence (a positive int) with cu_seqlens")
        npred, nseq = max_seqlen, cu_seqlens.shape[0] - 1
    else:
        if max_seqlen is not None:
            bad_arg("max_seqlen", max_seqlen, "None without cu_seqlens")
        npred, nseq = x.shape[1], x.shape[0]
    if x.shape[2:] != (H, P):
        bad_arg("x", x, f"[..., {H}, {P}] (state's heads and dim)")
    if npred < 1 or L - npred < npred:
        bad_arg("x_cache", x_cache, f"ring rows L with L - T >= T (T = {npred} new tokens per call: the window "
                "must hold a call's tokens)")  # fmt: skip
    lead = tuple(x.shape[:2])
    _shape("B", B, (*lead, G, N))
    _tensor("C", C, 4, (io,), dev)
    _shape("C", C, (*lead, G, N))
    _tensor("out", out, 4, (io,), dev)
    _shape("out", out, x.shape)
    if z is not None:
        _tensor("z", z, 4, (io,), dev)
        _shape("z", z, x.shape)
    _tensor("dt", dt, (3, 4), PARAM_DTYPES, dev)
    if tuple(dt.shape[:3]) != (*lead, H) or (dt.dim() == 4 and dt.shape[3] != P):
        bad_arg("dt", dt, f"[{lead[0]}, {lead[1]}, {H}] or [{lead[0]}, {lead[1]}, {H}, {P}] (tied over dim)")
    if dt.dim() == 4:
        if dt.stride(3) != 0 and P != 1:
            bad_arg("dt", dt, "one value per head and token (stride 0 over dim): a ring caches dt per head")
        dt = dt[..., 0]
    A = _per_head("A", A, H, dev, tied_dims=2)
    Dh = None if D is None else _per_head("D", D, H, dev, tied_dims=1)
    dtb = None if dt_bias is None else _per_head("dt_bias", dt_bias, H, dev, tied_dims=1)
    slots = None
    if state_batch_indices is not None:
        _tensor("state_batch_indices", state_batch_indices, (1, 2), INDEX_DTYPES, dev)
        if state_batch_indices.shape[0] != nseq:
            bad_arg("state_batch_indices", state_batch_indices, f"[{nseq}] (one slot per sequence)")
        slots = state_batch_indices if state_batch_indices.dim() == 1 else state_batch_indices[:, 0]
    elif nseq > S:
        bad_arg("state_batch_indices", None, f"a [{nseq}] slot table: {nseq} sequences, {S} slots (without a table "
                "sequence b runs on slot b)")  # fmt: skip
    if not isinstance(pad_slot_id, int) or isinstance(pad_slot_id, bool):
        bad_arg("pad_slot_id", pad_slot_id, "an int")
    _check_scale(state_scale, state)
    _check_seed(rand_seed, philox_rounds, state)
    # FlashInfer's kernel knobs: validated as FlashInfer does, otherwise without effect (MATE plans its own)
    if d_split not in (None, 1, 2):
        bad_arg("d_split", d_split, "None, 1 or 2")
    if d_split == 2 and state.element_size() == 1:
        bad_arg("d_split", d_split, "None or 1 with an 8-bit state (FlashInfer's rule)")
    if algorithm not in REPLAY_ALGORITHMS:
        bad_arg("algorithm", algorithm, f"one of {REPLAY_ALGORITHMS}")
    scratch = (cb_scaled, cumAdt_vec, cb_old)
    if any(t is not None for t in scratch) and any(t is None for t in scratch):
        bad_arg("cb_scaled", cb_scaled, "cb_scaled, cumAdt_vec and cb_old all given or all None")
    if algorithm == "two-kernel" and cb_scaled is None:
        bad_arg("algorithm", algorithm, "'two-kernel' with the scratch tensors (cb_scaled, cumAdt_vec, cb_old)")
    if not isinstance(precompute_heads_per_cta, int) or precompute_heads_per_cta < 0:
        bad_arg("precompute_heads_per_cta", precompute_heads_per_cta, "a non-negative int")
    return ReplayCall(
        state=state, x_cache=x_cache, B_cache=B_cache, dt_cache=dt_cache, ring_start=ring_start,
        pnat=prev_num_accepted_tokens, x=x, dt=dt, A=A, B=B, C=C, out=out, D=Dh, z=z, dt_bias=dtb,
        dt_softplus=bool(dt_softplus), slots=slots, pad_slot_id=pad_slot_id, state_scale=state_scale,
        rand_seed=rand_seed, philox_rounds=philox_rounds, cu_seqlens=cu_seqlens, npredicted=npred,
    )  # fmt: skip


def check_replay_data(call: ReplayCall) -> None:
    """The checks on the tables' values (a device sync each): the slots in the pool or the sentinel, each slot's
    ``ring_start`` in ``[0, L)`` and live count in ``[0, W]``, ``cu_seqlens`` non-decreasing from 0 to the
    tokens with no sequence longer than ``max_seqlen``."""
    S, L, W = call.state.shape[0], call.ring_len, call.window
    if call.slots is not None:
        s = host_ints(call.slots)
        bad = (s != call.pad_slot_id) & ((s < 0) | (s >= S))
        if bool(bad.any()):
            bad_arg("state_batch_indices", values(s), f"slots in [0, {S}) or pad_slot_id ({call.pad_slot_id})")
    rs, pk = host_ints(call.ring_start), host_ints(call.pnat)
    if bool(((rs < 0) | (rs >= L)).any()):
        bad_arg("ring_start", values(rs), f"ring rows in [0, {L})")
    if bool(((pk < 0) | (pk > W)).any()):
        bad_arg("prev_num_accepted_tokens", values(pk), f"live token counts in [0, {W}] (the window L - T)")
    if call.cu_seqlens is not None:
        cu = host_ints(call.cu_seqlens)
        lens = cu[1:] - cu[:-1]
        if int(cu[0]) != 0 or bool((lens < 0).any()) or int(cu[-1]) != call.x.shape[1]:
            bad_arg("cu_seqlens", values(cu), f"non-decreasing token offsets from 0 to {call.x.shape[1]}")
        if lens.numel() and int(lens.max()) > call.npredicted:
            bad_arg("max_seqlen", call.npredicted, f">= the longest sequence ({int(lens.max())})")


@dataclass(frozen=True)
class MaterializeCall:
    state: torch.Tensor
    x_cache: torch.Tensor
    B_cache: torch.Tensor
    dt_cache: torch.Tensor
    A: torch.Tensor  # [H] fp32
    ring_start: torch.Tensor  # [batch], per request
    prefix: torch.Tensor  # [batch]
    src: torch.Tensor
    dst: torch.Tensor
    state_scale: torch.Tensor | None
    pad_slot_id: int
    rand_seed: torch.Tensor | None
    philox_rounds: int  # 0 without rand_seed


def normalize_materialize(state, x_cache, B_cache, dt_cache, A, ring_start, replay_prefix_len, src_slots, dst_slots,
                          state_scale=None, pad_slot_id=-1, rand_seed=None,
                          philox_rounds=10) -> MaterializeCall:  # fmt: skip
    _tensor("state", state, 4, STATE_DTYPES + QUANT_STATE_DTYPES, None)
    dev = state.device
    S, H, P, N = state.shape
    _tensor("x_cache", x_cache, 4, IO_DTYPES, dev)
    L = x_cache.shape[2]
    _shape("x_cache", x_cache, (S, H, L, P), " (slots, heads, ring rows, dim)")
    _tensor("B_cache", B_cache, 4, (x_cache.dtype,), dev)
    G = B_cache.shape[1]
    if G < 1 or H % G:
        bad_arg("B_cache", B_cache, f"[{S}, groups, {L}, {N}] with heads ({H}) divisible by groups")
    _shape("B_cache", B_cache, (S, G, L, N), " (slots, groups, ring rows, dstate)")
    _tensor("dt_cache", dt_cache, 3, (torch.float32,), dev)
    _shape("dt_cache", dt_cache, (S, H, L), " (slots, heads, ring rows), fp32")
    A = _per_head("A", A, H, dev, tied_dims=2)
    _tensor("src_slots", src_slots, 1, INDEX_DTYPES, dev)
    batch = src_slots.shape[0]
    _tensor("dst_slots", dst_slots, 1, INDEX_DTYPES, dev)
    _shape("dst_slots", dst_slots, (batch,))
    for name, t in (("ring_start", ring_start), ("replay_prefix_len", replay_prefix_len)):
        _tensor(name, t, 1, INDEX_DTYPES, dev)
        _shape(name, t, (batch,), " (one per request, as src_slots)")
    _check_scale(state_scale, state)
    if not isinstance(pad_slot_id, int) or isinstance(pad_slot_id, bool):
        bad_arg("pad_slot_id", pad_slot_id, "an int")
    _check_seed(rand_seed, philox_rounds, state)
    rounds = philox_rounds if rand_seed is not None else 0
    return MaterializeCall(state, x_cache, B_cache, dt_cache, A, ring_start, replay_prefix_len, src_slots, dst_slots,
                           state_scale, pad_slot_id, rand_seed, rounds)  # fmt: skip


def check_materialize_data(call: MaterializeCall) -> None:
    """The request tables' values (reads them back: a host sync): every request whose source and destination
    are not the sentinel needs both inside the pool, ``ring_start`` in ``[0, L)`` and the prefix in ``[0, L]``."""
    S, L = call.state.shape[0], call.x_cache.shape[2]
    src, dst = call.src.tolist(), call.dst.tolist()
    rs, pre = call.ring_start.tolist(), call.prefix.tolist()
    for b in range(len(src)):
        if call.pad_slot_id in (src[b], dst[b]):
            continue
        for name, v, hi in (("src_slots", src[b], S), ("dst_slots", dst[b], S), ("ring_start", rs[b], L),
                            ("replay_prefix_len", pre[b], L + 1)):  # fmt: skip
            if not 0 <= v < hi:
                raise ValueError(f"{name}: got {v} at request {b}; expected a value in [0, {hi})")


# FlashInfer 0.7.2's replayssm_materialize: its per-layer tables, in its argument order
LAYER_TABLES = ("state_ptrs", "state_slot_strides", "x_cache_ptrs", "x_cache_slot_strides", "B_cache_ptrs",
                "B_cache_slot_strides", "dt_cache_ptrs", "dt_cache_slot_strides", "A_ptrs", "state_scale_ptrs",
                "state_scale_slot_strides")  # fmt: skip
MAX_REPLAY_WINDOW = 16  # FlashInfer's bound on max_window (its kernel is built per window)


@dataclass(frozen=True)
class MaterializeLayersCall:
    """``materialize_replayed_layers``: per layer ``l``, the base addresses and slot strides (elements) of its
    pools, each slot contiguous inside: ``state [slot, H, P, N]``, ``x [slot, H, L, P]`` and ``B [slot, G, L, N]``
    bf16, ``dt [slot, H, L]`` fp32, ``A [H]`` (``a_dtype``), ``scale [slot, H, P]`` fp32 (0 beside an unscaled
    state); ``src`` / ``dst [layers, batch]``, ``ring_start`` / ``prefix`` / ``active [batch]`` int32; with
    ``philox_rounds`` > 0 the one-element int64 ``rand_seed`` (None otherwise)."""

    tables: tuple  # LAYER_TABLES' tensors, in that order: [layers] int64, contiguous
    src: torch.Tensor
    dst: torch.Tensor
    ring_start: torch.Tensor
    prefix: torch.Tensor
    active: torch.Tensor
    state_dtype: torch.dtype
    io_dtype: torch.dtype
    a_dtype: torch.dtype
    dim: int
    dstate: int
    heads: int
    heads_per_group: int
    max_window: int
    ring_len: int
    pad_slot_id: int
    rand_seed: torch.Tensor | None
    philox_rounds: int

    @property
    def state(self) -> torch.Tensor:  # the device the call runs on (the dispatcher reads ``call.state``)
        return self.tables[0]

    def table(self, name: str) -> torch.Tensor:
        return self.tables[LAYER_TABLES.index(name)]


def normalize_materialize_layers(state_ptrs, state_slot_strides, x_cache_ptrs, x_cache_slot_strides, B_cache_ptrs,
                                 B_cache_slot_strides, dt_cache_ptrs, dt_cache_slot_strides, A_ptrs,
                                 state_scale_ptrs, state_scale_slot_strides, src_slots, dst_slots, ring_start,
                                 replay_prefix_len, active_request_indices, *, state_dtype, input_dtype,
                                 matrixA_dtype, dim, dstate, num_heads, heads_per_group, max_window, ring_buffer_len,
                                 pad_slot_id=-1, rand_seed=None, philox_rounds=0, dependency_inputs=None,
                                 dependency_outputs=None) -> MaterializeLayersCall:  # fmt: skip
    """FlashInfer 0.7.2's checks of ``replayssm_materialize`` (its Python wrapper's and its launcher's), each as
    a ``ValueError`` naming the argument; MATE's own limits as ``NotImplementedError``. The tables' contents (the
    addresses, slots and request metadata) are not read."""
    tables = (state_ptrs, state_slot_strides, x_cache_ptrs, x_cache_slot_strides, B_cache_ptrs, B_cache_slot_strides,
              dt_cache_ptrs, dt_cache_slot_strides, A_ptrs, state_scale_ptrs, state_scale_slot_strides)  # fmt: skip
    if input_dtype != torch.bfloat16:
        bad_arg("input_dtype", input_dtype, "torch.bfloat16 (the replay x and B caches, as checkpointing_ssu has them)")
    if state_dtype not in STATE_DTYPES + QUANT_STATE_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in STATE_DTYPES + QUANT_STATE_DTYPES)
        bad_arg("state_dtype", state_dtype, f"a state dtype in ({names})")
    if matrixA_dtype not in PARAM_DTYPES:
        bad_arg("matrixA_dtype", matrixA_dtype, "float32, bfloat16 or float16")
    for name, v in (("dim", dim), ("dstate", dstate), ("num_heads", num_heads), ("heads_per_group", heads_per_group),
                    ("ring_buffer_len", ring_buffer_len)):  # fmt: skip
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            bad_arg(name, v, "a positive int")
    if not isinstance(max_window, int) or isinstance(max_window, bool) or not 1 <= max_window <= MAX_REPLAY_WINDOW:
        bad_arg("max_window", max_window, f"an int in [1, {MAX_REPLAY_WINDOW}]")
    if num_heads % heads_per_group:
        bad_arg("heads_per_group", heads_per_group, f"a positive divisor of num_heads ({num_heads})")
    if torch.tensor([], dtype=state_dtype).element_size() == 1 and (dim, dstate) != (64, 128):
        bad_arg("state_dtype", state_dtype, f"a 2- or 4-byte state unless dim=64 and dstate=128 (got {dim}, {dstate})")
    if not isinstance(pad_slot_id, int) or isinstance(pad_slot_id, bool):
        bad_arg("pad_slot_id", pad_slot_id, "an int")
    if not isinstance(philox_rounds, int) or isinstance(philox_rounds, bool) or philox_rounds < 0:
        bad_arg("philox_rounds", philox_rounds, "a non-negative int (0: no stochastic rounding)")
    check_tensor("state_ptrs", state_ptrs, 1, (torch.int64,), device_of="state_ptrs")
    dev = state_ptrs.device
    layers = state_ptrs.shape[0]
    for name, t in zip(LAYER_TABLES, tables, strict=True):
        check_tensor(name, t, 1, (torch.int64,), dev, device_of="state_ptrs")
        if t.shape[0] != layers or not t.is_contiguous():
            bad_arg(name, t, f"a contiguous [{layers}] int64 table (one entry per layer, as state_ptrs)")
    for name, t in (("src_slots", src_slots), ("dst_slots", dst_slots)):
        check_tensor(name, t, 2, (torch.int32,), dev, device_of="state_ptrs")
    if src_slots.shape[0] < 1:
        bad_arg("src_slots", src_slots, "[layers, batch] with at least one layer")
    layers, batch = src_slots.shape
    for name, t, shape in (("src_slots", src_slots, (layers, batch)), ("dst_slots", dst_slots, (layers, batch)),
                           ("ring_start", ring_start, (batch,)), ("replay_prefix_len", replay_prefix_len, (batch,)),
                           ("active_request_indices", active_request_indices, (batch,))):  # fmt: skip
        check_tensor(name, t, len(shape), (torch.int32,), dev, device_of="state_ptrs")
        if tuple(t.shape) != shape or not t.is_contiguous():
            bad_arg(name, t, f"a contiguous int32 tensor of shape {shape} (src_slots is [layers, batch])")
    if batch < 1:
        bad_arg("src_slots", src_slots, "[layers, batch] with at least one request")
    if state_ptrs.shape[0] != layers:
        bad_arg("state_ptrs", state_ptrs, f"[{layers}] (one entry per layer of src_slots)")
    for name, anchors in (("dependency_inputs", dependency_inputs), ("dependency_outputs", dependency_outputs)):
        if anchors is not None and (not isinstance(anchors, (list, tuple)) or not all(
                isinstance(t, torch.Tensor) and t.device == dev for t in anchors)):  # fmt: skip
            bad_arg(name, anchors, f"None or a list of tensors on {dev} (state_ptrs's device)")
    if philox_rounds:  # (FlashInfer reads rand_seed only then)
        if rand_seed is None:
            bad_arg("rand_seed", rand_seed, "a one-element int64 tensor when philox_rounds > 0")
        check_tensor("rand_seed", rand_seed, 1, (torch.int64,), dev, device_of="state_ptrs")
        if rand_seed.numel() != 1:
            bad_arg("rand_seed", rand_seed, "a one-element int64 tensor (the call's seed)")
        if state_dtype not in SR_STATE_DTYPES:
            unsupported(f"philox_rounds > 0 (stochastic rounding) of a {str(state_dtype).removeprefix('torch.')} "
                        "state", f"stochastic rounding serves {SR_STATES} states; pass philox_rounds=0")  # fmt: skip
    else:
        rand_seed = None
    return MaterializeLayersCall(tables, src_slots, dst_slots, ring_start, replay_prefix_len, active_request_indices,
                                 state_dtype, input_dtype, matrixA_dtype, dim, dstate, num_heads, heads_per_group,
                                 max_window, ring_buffer_len, pad_slot_id, rand_seed, philox_rounds)  # fmt: skip


__all__ = ["ReplayCall", "MaterializeCall", "normalize_replay", "normalize_materialize", "check_replay_data",
           "check_materialize_data", "LAYER_TABLES", "MaterializeLayersCall",
           "normalize_materialize_layers"]  # fmt: skip
