"""The one normalisation point of ``selective_state_update``.

Every accepted form of the decode call (``docs/mamba.md``, "The contract": 3-D/4-D/packed layouts, tied and untied
dt/A/D/dt_bias, flat and 2-D slot tables of either int dtype, strided state pools, the sentinel, optional
tensors) is validated here and turned into one :class:`SSUCall`. Every backend consumes that description
and nothing else, so a form accepted here is exercised by the reference and by the kernels alike.

Canonical form (H heads, P head dim, N state size, G groups, R packed rows, S pool slots, ``nseq`` sequences):

* ``state [S, H, P, N]``, inner three dims dense, ``stride(0)`` and storage offset free;
* ``x, dt, z, out [R, H, P]``, ``B, C [R, G, N]``: rows of every sequence packed one after another;
  sequence ``b`` owns rows ``[bos(b), bos(b) + len(b))`` with ``bos = cu_seqlens[b]`` (packed form) or
  ``b * seqlen`` (one-token and dense 4-D forms, ``seqlen`` tokens each);
* ``A [H, P, N]``, ``D, dt_bias [H, P]``: per-head values appear as stride-0 broadcasts, which is what the
  ``*_tied`` flags record;
* slot tables as :class:`SlotTable`: entry ``(b, t)`` lives at ``base[b * stride_b + t * stride_t]``;
  a flat table has ``stride_b == stride_t`` (entry ``b + t``, the seed's flat form).

Slot rules (one place): the read slot of sequence ``b`` is ``src(b, max(acc[b] - 1, 0))`` (``acc`` =
``num_accepted_tokens``, else position 0), or ``b`` without a table. A read slot equal to ``pad_slot_id``
reads as a zero state and the sequence writes no state at all (pool and intermediate buffer). The write
mode is one of:

* ``"none"``: nothing is written (``disable_state_update``);
* ``"final"``: the state after the sequence's last token goes to ``dst(b, 0)`` when ``dst`` is set, else to
  the read slot;
* ``"per_token"``: the state after token ``t`` goes to ``dst(b, t)``; a sentinel destination is skipped;
* ``"intermediate"``: the state after token ``t`` goes to ``ibuf[idx(b) * cache_steps + t]``, with ``idx(b)``
  = ``intermediate_state_indices[b]``, else the read slot, else ``b``; the pool is not written.

``parent`` (SGLang's ``retrieve_parent_token [nseq, T]``) reloads the state before token ``t > 0`` from
``ibuf[idx(b) * cache_steps + parent[b, t]]`` when ``parent[b, t] >= 0``.
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
    SSU_SR_STATE_DTYPES,
    SSU_SR_STATES,
    STATE_DTYPES,
)
from mate.mamba._contract.errors import bad_arg, check_tensor, majority_culprit, unsupported, values

ALGORITHMS = ("auto", "simple", "vertical", "horizontal")
BACKENDS = ("auto", "tilelang", "torch")
WRITE_MODES = ("none", "final", "per_token", "intermediate")


@dataclass(frozen=True)
class SlotTable:
    """An index table addressed through two strides: entry ``(b, t)`` is ``base[b * stride_b + t * stride_t]``.

    ``base`` is a 1-D, stride-1 view over the table's storage that reaches its last element; ``rows`` and
    ``cols`` are the table's own extent (a flat table has ``cols == 1``: later positions are reached through
    ``stride_t`` and must exist in ``base``).
    """

    base: torch.Tensor
    stride_b: int
    stride_t: int
    rows: int
    cols: int
    flat: bool

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype


@dataclass(frozen=True)
class SSUCall:
    state: torch.Tensor
    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor | None
    z: torch.Tensor | None
    dt_bias: torch.Tensor | None
    out: torch.Tensor  # [R, H, P] rows the backends write
    result: torch.Tensor  # what the caller gets back (a view of ``out`` or the caller's ``out``)
    copy_back: bool  # ``out`` is scratch whose rows must be copied into ``result``
    dt_softplus: bool
    nseq: int
    seqlen: int | None  # tokens per sequence for the one-token / dense forms; None with cu_seqlens
    cu_seqlens: torch.Tensor | None
    num_accepted: torch.Tensor | None
    src: SlotTable | None
    dst: SlotTable | None
    write_mode: str
    pad_slot_id: int
    ibuf: torch.Tensor | None  # [K, H, P, N]: flattened (slot, step) intermediate buffer
    state_scale: torch.Tensor | None  # [slots, H, P] fp32 with a quantised state (QUANT_STATE_DTYPES), else None
    rand_seed: torch.Tensor | None  # one int64: stochastic rounding of fp16 writes (mate.mamba._reference.rounding)
    philox_rounds: int
    ibuf_scale: torch.Tensor | None  # [K, H, P] fp32 with a quantised intermediate buffer, else None
    ibuf_indices: torch.Tensor | None  # [nseq]
    cache_steps: int
    parent: torch.Tensor | None  # [nseq, T] int
    dt_tied: bool
    A_tied: bool
    D_tied: bool
    dt_bias_tied: bool

    @property
    def heads(self) -> int:
        return self.state.shape[1]

    @property
    def dim(self) -> int:
        return self.state.shape[2]

    @property
    def dstate(self) -> int:
        return self.state.shape[3]

    @property
    def groups(self) -> int:
        return self.B.shape[1]

    @property
    def rows(self) -> int:
        return self.x.shape[0]

    @property
    def tie_hdim(self) -> bool:
        """One decay per (row, head): dt, A and dt_bias are all broadcast over P (and N)."""
        return self.dt_tied and self.A_tied and (self.dt_bias is None or self.dt_bias_tied)

    @property
    def max_seqlen(self) -> int | None:
        return self.seqlen


# --------------------------------------------------------------------------------------------- helpers

_CALL_FIELDS = frozenset(SSUCall.__dataclass_fields__)


def _new_call(**fields) -> SSUCall:
    """``SSUCall(**fields)`` without the frozen dataclass ``__init__`` (one ``object.__setattr__`` per field,
    ~10 us of host time per decode call); same fields, same immutability afterwards."""
    if fields.keys() != _CALL_FIELDS:
        raise TypeError(f"SSUCall fields mismatch: {sorted(fields.keys() ^ _CALL_FIELDS)}")
    call = object.__new__(SSUCall)
    call.__dict__.update(fields)
    return call


_check_tensor = functools.partial(check_tensor, device_of="the state")  # (name, t, *, ndims, dtypes, device)


def _state_scale(name, scale, of, st, single_head, device, entries=None):
    """The fp32 ``[rows, H, P]`` scales of a quantised state tensor ``st`` (``[rows, H, P, N]``), or None for a
    float one. FlashInfer's forms are taken: ``[slots, H, P]`` (``[slots, P]`` beside a 3-D state), a trailing 1
    (``[.., 1]``), and for a 5-D intermediate buffer ``[entries, cache_steps, H, P]``. A scale beside a float
    state, or a quantised state without one, is the caller's mistake."""
    quantised = st.dtype in QUANT_STATE_DTYPES
    if scale is None:
        if quantised:
            bad_arg(name, None, f"a float32 [{'rows' if entries else 'slots'}, heads, dim] tensor of the {of}'s "
                    f"block scales (the {of} is {str(st.dtype).removeprefix('torch.')})")  # fmt: skip
        return None
    if not quantised:
        names = ", ".join(str(d).removeprefix("torch.") for d in QUANT_STATE_DTYPES)
        bad_arg(name, scale, f"None with a {str(st.dtype).removeprefix('torch.')} {of} (scales go with {names})")
    _check_tensor(name, scale, ndims=(2, 3, 4, 5), dtypes=(torch.float32,), device=device)
    sc = scale.squeeze(-1) if scale.shape[-1] == 1 and scale.dim() > 2 else scale
    if single_head and sc.dim() == 2:
        sc = sc.unsqueeze(1)
    rows, H, P = st.shape[0], st.shape[1], st.shape[2]
    lead = tuple(entries) if entries is not None else (rows,)
    if tuple(sc.shape) != lead + (H, P):
        bad_arg(name, scale, f"shape {lead + (H, P)} (one fp32 scale per row of dstate values)")
    if sc.dim() != 3:
        try:  # a view: the new scales are written through it, in place
            sc = sc.view(rows, H, P)
        except RuntimeError:
            bad_arg(name, scale, "a tensor whose leading dims flatten to one")
    if sc.stride(2) != 1 or (sc.stride(1) != P and H > 1):
        bad_arg(name, scale, "the inner (heads, dim) dims dense")
    return sc


def _check_shape(name, t, shape):
    if tuple(t.shape) != tuple(shape):
        bad_arg(name, t, f"shape {tuple(shape)}")


def slot_table(name: str, t: torch.Tensor, *, min_rows: int, device) -> SlotTable:
    """Validate an int32/int64 slot table, flat ``[n]`` or 2-D ``[n, T]``, and wrap it for stride addressing."""
    _check_tensor(name, t, ndims=(1, 2), dtypes=INDEX_DTYPES, device=device)
    if t.shape[0] < min_rows:
        bad_arg(name, t, f"at least {min_rows} rows (one per sequence)")
    if t.dim() == 1:
        s = t.stride(0)
        rows, cols, sb, st = t.shape[0], 1, s, s
    else:
        rows, cols = t.shape
        sb, st = t.stride(0), t.stride(1)
    if t.dim() == 1 and sb == 1:
        base = t  # already the 1-D, stride-1 view (skips an as_strided, ~3 us of host time)
    else:
        span = 0 if t.numel() == 0 else (rows - 1) * sb + (cols - 1) * st + 1
        base = torch.as_strided(t, (span,), (1,), t.storage_offset())
    return SlotTable(base=base, stride_b=sb, stride_t=st, rows=rows, cols=cols, flat=t.dim() == 1)


def _per_head(name, t, heads, dim, *, device, allow_none=True):
    """D / dt_bias: ``[H]`` (per head) or ``[H, P]`` (any strides) -> ``[H, P]`` view."""
    if t is None:
        if allow_none:
            return None
        bad_arg(name, t, f"a tensor of shape ({heads},) or ({heads}, {dim})")
    _check_tensor(name, t, ndims=(1, 2), dtypes=PARAM_DTYPES, device=device)
    if t.dim() == 1:
        if heads == 1 and t.shape[0] == dim:
            return t.unsqueeze(0)
        _check_shape(name, t, (heads,))
        return t.unsqueeze(1).expand(heads, dim)
    _check_shape(name, t, (heads, dim))
    return t


def _rows_view(name, t, layout_dense):
    """Dense ``[bs, T, ...]`` -> rows ``[bs*T, ...]`` (a view when strides allow it, else a copy)."""
    if not layout_dense:
        return t
    return t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])


# ------------------------------------------------------------------------------------------ normalise
# normalize_ssu's parts, in the order it calls them: the order of the checks decides which error a bad call gets.


def _check_options(algorithm, pad_slot_id, cache_steps, philox_rounds) -> None:
    if algorithm not in ALGORITHMS:
        bad_arg("algorithm", algorithm, f"one of {ALGORITHMS}")
    if not isinstance(pad_slot_id, int) or isinstance(pad_slot_id, bool):
        bad_arg("pad_slot_id", pad_slot_id, "a Python int")
    if not isinstance(cache_steps, int) or isinstance(cache_steps, bool) or cache_steps < 0:
        bad_arg("cache_steps", cache_steps, "an int >= 0")
    if not isinstance(philox_rounds, int) or isinstance(philox_rounds, bool):
        bad_arg("philox_rounds", philox_rounds, "an int")


def _pool(state, state_scale, rand_seed, philox_rounds):
    """The state pool (it fixes H, P, N and the device) and its scales, with the seed's checks:
    ``(state as [slots, H, P, N], single_head, device, scales or None)``."""
    _check_tensor("state", state, ndims=(3, 4), dtypes=STATE_DTYPES + QUANT_STATE_DTYPES, device=None)
    device = state.device
    single_head = state.dim() == 3
    st = state.unsqueeze(1) if single_head else state
    _, H, P, N = st.shape
    if st.stride(3) != 1 or (st.stride(2) != N and P > 1) or (st.stride(1) != P * N and H > 1):
        bad_arg("state", state, "[slots, heads, dim, dstate] with the inner three dims dense (stride(0) is free)")
    sscale = _state_scale("state_scale", state_scale, "state", st, single_head, device)
    if rand_seed is not None:
        _check_tensor("rand_seed", rand_seed, ndims=(0, 1, 2), dtypes=(torch.int64,), device=device)
        if rand_seed.numel() != 1:
            bad_arg("rand_seed", rand_seed, "a one-element int64 tensor (the step's seed)")
        if sscale is not None:
            bad_arg("rand_seed", rand_seed, "None with a block-scaled state (state_scale)")
        if philox_rounds <= 0:
            bad_arg("philox_rounds", philox_rounds, "> 0 with rand_seed")
        if st.dtype not in SSU_SR_STATE_DTYPES:
            unsupported(
                f"rand_seed (stochastic rounding) of a {str(st.dtype).removeprefix('torch.')} state",
                f"stochastic rounding serves {SSU_SR_STATES} states; pass rand_seed=None",
            )
    return st, single_head, device, sscale


def _layout(x, cu_seqlens, single_head, H, P, device):
    """x's layout: one-token ``[R, H, P]``, packed ``[R, H, P]`` + cu_seqlens, dense ``[bs, T, H, P]``:
    ``(x with its head dim, dense, leading dims, nseq, seqlen)``."""
    _check_tensor("x", x, ndims=(2, 3) if single_head else (3, 4), dtypes=IO_DTYPES, device=device)
    xh = x.unsqueeze(-2) if single_head else x  # insert the head dim
    dense = xh.dim() == 4
    if dense and cu_seqlens is not None:
        bad_arg("cu_seqlens", cu_seqlens, "None with the dense 4-D x (packed rows use a 3-D x)")
    if xh.shape[-2:] != (H, P):
        bad_arg("x", x, f"trailing dims (heads={H}, dim={P}) matching the state")
    lead = tuple(xh.shape[:-2])  # (R,) or (bs, T)
    if dense:
        nseq, seqlen = lead
    elif cu_seqlens is not None:
        _check_tensor("cu_seqlens", cu_seqlens, ndims=(1,), dtypes=INDEX_DTYPES, device=device)
        if cu_seqlens.shape[0] < 1:
            bad_arg("cu_seqlens", cu_seqlens, "[num_sequences + 1] cumulative row offsets")
        nseq, seqlen = cu_seqlens.shape[0] - 1, None
    else:
        nseq, seqlen = lead[0], 1
    return xh, dense, lead, nseq, seqlen


def _like_x(name, t, trailing, dtypes, xh, lead, single_head, device):
    _check_tensor(name, t, ndims=(xh.dim() - (1 if single_head else 0),), dtypes=dtypes, device=device)
    th = t.unsqueeze(-2) if single_head else t
    if tuple(th.shape) != lead + trailing:
        bad_arg(name, t, f"shape {lead + trailing if not single_head else lead + trailing[1:]}")
    return th


def _row_tensors(dt, B, C, z, xh, lead, single_head, io_dtype, H, P, N, device):
    """The per-row tensors beside x, with their head dims: ``(dt, B, C, z or None)``."""
    # dt: like x, or per head without the P dim ([R, H] / [bs, T, H]), which broadcasts over P
    if isinstance(dt, torch.Tensor) and not single_head and dt.dim() == xh.dim() - 1:
        _check_tensor("dt", dt, ndims=(dt.dim(),), dtypes=PARAM_DTYPES, device=device)
        if tuple(dt.shape) != lead + (H,):
            bad_arg("dt", dt, f"shape {lead + (H, P)} or the per-head {lead + (H,)}")
        dth = dt.unsqueeze(-1).expand(*lead, H, P)
    else:
        dth = _like_x("dt", dt, (H, P), PARAM_DTYPES, xh, lead, single_head, device)

    # B/C in x's dtype, or fp32 beside a 2-byte x (the engines' ops read either natively)
    bc_dtypes = (io_dtype,) if io_dtype == torch.float32 else (io_dtype, torch.float32)
    _check_tensor("B", B, ndims=(xh.dim() - (1 if single_head else 0),), dtypes=bc_dtypes, device=device)
    Bh = B.unsqueeze(-2) if single_head else B
    G = Bh.shape[-2]
    if tuple(Bh.shape) != lead + (G, N) or G < 1 or H % G != 0:
        bad_arg("B", B, f"shape {lead} + (groups, {N}) with heads ({H}) divisible by groups, dtype {io_dtype}")
    _check_tensor("C", C, ndims=(B.dim(),), dtypes=(B.dtype,), device=device)
    if tuple(C.shape) != tuple(B.shape):
        bad_arg("C", C, f"the shape of B {tuple(B.shape)}")
    Ch = C.unsqueeze(-2) if single_head else C
    zh = None if z is None else _like_x("z", z, (H, P), (io_dtype,), xh, lead, single_head, device)
    return dth, Bh, Ch, zh


def _head_params(A, D, dt_bias, single_head, H, P, N, device):
    """A as ``[H, P, N]``, D and dt_bias as ``[H, P]`` (or None)."""
    _check_tensor("A", A, ndims=(1, 2, 3), dtypes=(torch.float32,), device=device)
    if A.dim() == 1:
        _check_shape("A", A, (H,))
        Ah = A.view(H, 1, 1).expand(H, P, N)
    elif A.dim() == 2:
        if not single_head:
            bad_arg("A", A, f"[heads] or [heads, dim, dstate] = ({H}, {P}, {N}) with a 4-D state")
        _check_shape("A", A, (P, N))
        Ah = A.unsqueeze(0)
    else:
        _check_shape("A", A, (H, P, N))
        Ah = A
    return Ah, _per_head("D", D, H, P, device=device), _per_head("dt_bias", dt_bias, H, P, device=device)


def _out(out, x, single_head, dense, nseq, seqlen, H, P, device):
    """The caller's ``out`` (same shape and dtype as x) or a new one: ``(result, out rows [R, H, P], copy_back)``."""
    if out is None:
        result = torch.empty(x.shape, dtype=x.dtype, device=device)
    else:
        _check_tensor("out", out, ndims=(x.dim(),), dtypes=(x.dtype,), device=device)
        _check_shape("out", out, x.shape)
        result = out
    outh = result.unsqueeze(-2) if single_head else result
    if not dense:
        return result, outh, False
    try:
        return result, outh.view(nseq * seqlen, H, P), False
    except RuntimeError:  # a dense out that cannot be flattened: compute into scratch, copy back
        return result, torch.empty((nseq * seqlen, H, P), dtype=x.dtype, device=device), True


def _tables(state, st, state_batch_indices, dst_state_batch_indices, num_accepted_tokens, final_write_to_dst, dense,
            nseq, seqlen, device):  # fmt: skip
    """The slot tables and accepted-token counts: ``(src, dst, acc)``."""
    src = None
    if state_batch_indices is not None:
        src = slot_table("state_batch_indices", state_batch_indices, min_rows=nseq, device=device)
    dst = None
    if dst_state_batch_indices is not None:
        dst = slot_table("dst_state_batch_indices", dst_state_batch_indices, min_rows=nseq, device=device)
    acc = None
    if num_accepted_tokens is not None:
        _check_tensor("num_accepted_tokens", num_accepted_tokens, ndims=(1,), dtypes=INDEX_DTYPES, device=device)
        _check_shape("num_accepted_tokens", num_accepted_tokens, (nseq,))
        if src is None:
            bad_arg("state_batch_indices", None, "a slot table when num_accepted_tokens is given")
        acc = num_accepted_tokens
    if src is None and nseq > st.shape[0]:
        bad_arg("state", state, f"at least {nseq} slots (sequence b uses slot b without state_batch_indices)")
    if dense and dst is not None and not dst.flat and dst.cols < seqlen and not final_write_to_dst:
        bad_arg("dst_state_batch_indices", dst_state_batch_indices, f"at least {seqlen} columns (one per token)")
    return src, dst, acc


def _intermediate(buf, indices, scales, dst_state_batch_indices, dst, src, cache_steps, dense, nseq, seqlen, H, P, N,
                  device):  # fmt: skip
    """The intermediate buffer (write mode "intermediate") as ``[entries * cache_steps, H, P, N]``:
    ``(ibuf, cache_steps, entry indices or None, scales or None)``."""
    if dst is not None:
        bad_arg(
            "dst_state_batch_indices",
            dst_state_batch_indices,
            "None when intermediate_states_buffer is given (the two write modes are exclusive)",
        )
    _check_tensor(
        "intermediate_states_buffer", buf, ndims=(4, 5), dtypes=STATE_DTYPES + QUANT_STATE_DTYPES, device=device
    )
    if buf.dim() == 5:
        if tuple(buf.shape[2:]) != (H, P, N) or (cache_steps not in (0, buf.shape[1])):
            bad_arg(
                "intermediate_states_buffer",
                buf,
                f"[entries, cache_steps, {H}, {P}, {N}] with cache_steps ({cache_steps}) 0 or equal to dim 1",
            )
        cache_steps = buf.shape[1]
        try:
            ibuf = buf.view(buf.shape[0] * buf.shape[1], H, P, N)
        except RuntimeError:
            bad_arg("intermediate_states_buffer", buf, "a buffer whose (entry, step) dims flatten to one")
    else:
        if tuple(buf.shape[1:]) != (H, P, N) or cache_steps < 1:
            bad_arg("intermediate_states_buffer", buf, f"[entries * cache_steps, {H}, {P}, {N}] with cache_steps >= 1")
        ibuf = buf
    if ibuf.stride(3) != 1 or ibuf.stride(2) != N or ibuf.stride(1) != P * N:
        bad_arg("intermediate_states_buffer", buf, "the inner (heads, dim, dstate) dims dense")
    if dense and seqlen > cache_steps:
        bad_arg("cache_steps", cache_steps, f">= the tokens per sequence ({seqlen})")
    if indices is not None:
        _check_tensor("intermediate_state_indices", indices, ndims=(1,), dtypes=INDEX_DTYPES, device=device)
        if indices.shape[0] < nseq:
            bad_arg("intermediate_state_indices", indices, f"at least {nseq} entries")
    elif src is None and nseq > ibuf.shape[0] // max(cache_steps, 1):
        bad_arg(
            "intermediate_states_buffer",
            buf,
            f"at least {nseq} entries (sequence b writes entry b without a table or entry indices)",
        )
    iscale = _state_scale(
        "intermediate_state_scales", scales, "intermediate_states_buffer", ibuf, False, device, entries=buf.shape[:-3]
    )
    return ibuf, cache_steps, indices, iscale


def _pool_write_mode(disable_state_update, final_write_to_dst, accepted_writes_per_token, src, dst, acc,
                     intermediate_state_scales, intermediate_state_indices):  # fmt: skip
    """The write mode without an intermediate buffer: ``(mode, dst)`` (per-token writes to the read table when
    num_accepted_tokens comes without a destination table)."""
    if intermediate_state_scales is not None:
        bad_arg("intermediate_state_scales", intermediate_state_scales, "None without intermediate_states_buffer")
    if intermediate_state_indices is not None:
        bad_arg("intermediate_state_indices", intermediate_state_indices, "None without intermediate_states_buffer")
    if disable_state_update:
        return "none", dst
    if dst is not None and final_write_to_dst:
        return "final", dst
    if dst is not None or (acc is not None and accepted_writes_per_token):
        return "per_token", src if dst is None else dst
    return "final", dst


def _parent(parent, ibuf, dense, nseq, seqlen, device):
    """SGLang's ``retrieve_parent_token`` ``[nseq, T]`` (beside an intermediate buffer and a dense x), or None."""
    if parent is None:
        return None
    if ibuf is None:
        bad_arg("retrieve_parent_token", parent, "None without intermediate_states_buffer")
    _check_tensor("retrieve_parent_token", parent, ndims=(2,), dtypes=INDEX_DTYPES, device=device)
    if not dense or tuple(parent.shape) != (nseq, seqlen):
        bad_arg("retrieve_parent_token", parent, "[batch, T] with the dense 4-D x [batch, T, H, P]")
    return parent


def normalize_ssu(
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
    state_scale=None,
    out=None,
    disable_state_update=False,
    intermediate_states_buffer=None,
    intermediate_state_indices=None,
    intermediate_state_scales=None,
    rand_seed=None,
    philox_rounds=10,
    cache_steps=0,
    algorithm="auto",
    dst_state_batch_indices=None,
    cu_seqlens=None,
    num_accepted_tokens=None,
    retrieve_parent_token=None,
    final_write_to_dst=False,
    accepted_writes_per_token=True,
) -> SSUCall:
    """Validate ``selective_state_update``'s arguments (in ``mate.mamba._ops.SSU_PARAMS`` order, all but ``backend``)
    and return the canonical :class:`SSUCall`.

    ``retrieve_parent_token``, ``final_write_to_dst`` and ``accepted_writes_per_token`` are the keyword-only
    extensions of ``mate.mamba.selective_state_update`` the adapters pass: SGLang's EAGLE trees, vLLM's
    one-final-write rule, and FlashInfer's rule that ``num_accepted_tokens`` without a destination table
    writes only the final state back to the read slot (``accepted_writes_per_token=False``).
    """
    try:
        _check_options(algorithm, pad_slot_id, cache_steps, philox_rounds)
        st, single_head, device, sscale = _pool(state, state_scale, rand_seed, philox_rounds)
        _, H, P, N = st.shape
        xh, dense, lead, nseq, seqlen = _layout(x, cu_seqlens, single_head, H, P, device)
        dth, Bh, Ch, zh = _row_tensors(dt, B, C, z, xh, lead, single_head, x.dtype, H, P, N, device)
        Ah, Dh, dtbh = _head_params(A, D, dt_bias, single_head, H, P, N, device)
        result, out_rows, copy_back = _out(out, x, single_head, dense, nseq, seqlen, H, P, device)
        src, dst, acc = _tables(state, st, state_batch_indices, dst_state_batch_indices, num_accepted_tokens,
                                final_write_to_dst, dense, nseq, seqlen, device)  # fmt: skip
        if intermediate_states_buffer is not None:
            write_mode = "intermediate"
            ibuf, cache_steps, ibuf_idx, iscale = _intermediate(
                intermediate_states_buffer, intermediate_state_indices, intermediate_state_scales,
                dst_state_batch_indices, dst, src, cache_steps, dense, nseq, seqlen, H, P, N, device,
            )  # fmt: skip
        else:
            ibuf = ibuf_idx = iscale = None
            write_mode, dst = _pool_write_mode(disable_state_update, final_write_to_dst, accepted_writes_per_token,
                                               src, dst, acc, intermediate_state_scales,
                                               intermediate_state_indices)  # fmt: skip
        parent = _parent(retrieve_parent_token, ibuf, dense, nseq, seqlen, device)

        return _new_call(
            state=st,
            x=_rows_view("x", xh, dense),
            dt=_rows_view("dt", dth, dense),
            A=Ah,
            B=_rows_view("B", Bh, dense),
            C=_rows_view("C", Ch, dense),
            D=Dh,
            z=None if zh is None else _rows_view("z", zh, dense),
            dt_bias=dtbh,
            out=out_rows,
            result=result,
            copy_back=copy_back,
            dt_softplus=bool(dt_softplus),
            nseq=nseq,
            seqlen=seqlen,
            cu_seqlens=cu_seqlens,
            num_accepted=acc,
            src=src,
            dst=dst,
            write_mode=write_mode,
            pad_slot_id=pad_slot_id,
            ibuf=ibuf,
            state_scale=sscale,
            ibuf_scale=iscale,
            rand_seed=rand_seed,
            philox_rounds=philox_rounds,
            ibuf_indices=ibuf_idx,
            cache_steps=cache_steps,
            parent=parent,
            dt_tied=dth.stride(-1) == 0 or P == 1,
            A_tied=(Ah.stride(1) == 0 or P == 1) and (Ah.stride(2) == 0 or N == 1),
            D_tied=Dh is None or Dh.stride(1) == 0 or P == 1,
            dt_bias_tied=dtbh is None or dtbh.stride(1) == 0 or P == 1,
        )
    except ValueError:
        culprit = _ssu_culprit(state, x, dt, A, B, C, D, z, dt_bias, out, intermediate_states_buffer)
        if culprit is None:
            raise
        raise culprit from None


def _ssu_culprit(state, x, dt, A, B, C, D, z, dt_bias, out, ibuf) -> ValueError | None:
    """For a call whose shapes disagree: the error naming the argument that breaks the majority (e.g. an x with
    the wrong head count, not the dt that agrees with the state and A), or None (``_errors.majority_culprit``).
    Multi-head pools only (a 4-D state); each argument votes with the dims its form shows."""
    if not isinstance(state, torch.Tensor) or state.dim() != 4 or not isinstance(x, torch.Tensor) or x.dim() < 3:
        return None
    rank = x.dim()

    def dims(t, ndims):
        return isinstance(t, torch.Tensor) and t.dim() in ndims

    def last(t, k, ndims):  # the k-th dim from the end, for a tensor of one of these ranks
        return t.shape[-k] if dims(t, ndims) and t.dim() >= k else None

    def lead(t, trailing):
        return tuple(t.shape[: t.dim() - trailing]) if dims(t, (rank, rank - 1)) else None

    dt_full = dims(dt, (rank,))  # like x; else the per-head [.., H] form
    per_head = [("A", A, last(A, 1, (1,)) if dims(A, (1,)) else last(A, 3, (3,)))]
    per_head += [(n, t, t.shape[0] if dims(t, (1, 2)) else None) for n, t in (("D", D), ("dt_bias", dt_bias))]
    return majority_culprit({
        "heads": [("state", state, state.shape[1]), ("x", x, x.shape[-2]),
                  ("dt", dt, last(dt, 2, (rank,)) if dt_full else last(dt, 1, (rank - 1,))), *per_head,
                  ("z", z, last(z, 2, (rank,))), ("out", out, last(out, 2, (rank,))),
                  ("intermediate_states_buffer", ibuf, last(ibuf, 3, (4, 5)))],
        "dim": [("state", state, state.shape[2]), ("x", x, x.shape[-1]), ("dt", dt, last(dt, 1, (rank,))),
                ("z", z, last(z, 1, (rank,))), ("out", out, last(out, 1, (rank,))),
                ("A", A, last(A, 2, (3,))), ("D", D, last(D, 1, (2,))), ("dt_bias", dt_bias, last(dt_bias, 1, (2,))),
                ("intermediate_states_buffer", ibuf, last(ibuf, 2, (4, 5)))],
        "dstate": [("state", state, state.shape[3]), ("B", B, last(B, 1, (rank,))), ("C", C, last(C, 1, (rank,))),
                   ("A", A, last(A, 1, (3,))), ("intermediate_states_buffer", ibuf, last(ibuf, 1, (4, 5)))],
        "groups": [("B", B, last(B, 2, (rank,))), ("C", C, last(C, 2, (rank,)))],
        "rows": [("x", x, lead(x, 2)), ("dt", dt, lead(dt, 2 if dt_full else 1)), ("B", B, lead(B, 2)),
                 ("C", C, lead(C, 2)), ("z", z, lead(z, 2)), ("out", out, lead(out, 2))],
    })  # fmt: skip


# ------------------------------------------------------------------------------------ index data


def host_ints(t: torch.Tensor | None) -> torch.Tensor | None:
    """An index tensor as int64 on the CPU (one copy: a device-to-host sync for an accelerator tensor)."""
    return None if t is None else t.detach().to("cpu", torch.int64)


def _host_table(table: SlotTable | None) -> SlotTable | None:
    if table is None:
        return None
    return SlotTable(host_ints(table.base), table.stride_b, table.stride_t, table.rows, table.cols, table.flat)


def _entries(name: str, table: SlotTable, b: torch.Tensor, t: torch.Tensor, why: str = "") -> torch.Tensor:
    """Entries ``(b, t)`` of a host table after checking that each exists: a 2-D table has a column per position,
    a flat table an entry per packed row (stride addressing would otherwise read the next row's entries)."""
    if b.numel() == 0:
        return b
    if not table.flat and int(t.max()) >= table.cols:
        bad_arg(name, f"a [{table.rows}, {table.cols}] table", f"a column for position {int(t.max())}{why}")
    flat = b * table.stride_b + t * table.stride_t
    if int(flat.max()) >= table.base.numel():
        n = table.base.numel()
        bad_arg(name, f"a flat table of {n} entries", f"an entry for row b + t = {int(flat.max())}{why}")
    return table.base[flat]


def _in_pool(name: str, slots: torch.Tensor, pool: int, pad: int) -> None:
    bad = (slots != pad) & ((slots < 0) | (slots >= pool))
    if bool(bad.any()):
        bad_arg(name, int(slots[bad][0]), f"slots in [0, {pool}) or pad_slot_id ({pad})")


def check_index_data(call: SSUCall) -> None:
    """The checks on the index tables' values, which the normaliser cannot make without reading device memory:
    row offsets, every slot the call reads or writes, accepted-token counts, intermediate-buffer entries and
    parent tokens. The reference backend runs them on every call before anything is written; the TileLang
    backend with ``MATE_CHECK_INPUTS=1`` (the tables are copied to the host: a device sync per table)."""
    nseq, S, pad = call.nseq, call.state.shape[0], call.pad_slot_id
    if nseq == 0:
        return
    cu = host_ints(call.cu_seqlens)
    if cu is not None:
        if int(cu[0]) < 0 or bool((cu[1:] < cu[:-1]).any()) or int(cu[-1]) > call.rows:
            bad_arg("cu_seqlens", values(cu), f"non-decreasing row offsets within [0, {call.rows}] (the rows of x)")
        lens = cu[1:] - cu[:-1]
    else:
        lens = torch.full((nseq,), call.seqlen, dtype=torch.int64)
    b = torch.arange(nseq, dtype=torch.int64)
    acc = host_ints(call.num_accepted)
    src, dst = _host_table(call.src), _host_table(call.dst)
    if src is None:
        slot = b  # nseq <= S: checked by the normaliser
    else:
        if acc is None:
            slot = _entries("state_batch_indices", src, b, torch.zeros_like(b))
        else:
            pos = (acc - 1).clamp(min=0)
            slot = _entries("num_accepted_tokens", src, b, pos, " of state_batch_indices (read slot max(acc - 1, 0))")
        _in_pool("state_batch_indices", slot, S, pad)
    writers = b[(slot != pad) & (lens > 0)]
    wlens = lens[writers]
    if call.write_mode == "per_token" and writers.numel():
        name = "state_batch_indices" if call.dst is call.src else "dst_state_batch_indices"
        bb = writers.repeat_interleave(wlens)
        tt = torch.arange(bb.numel()) - (wlens.cumsum(0) - wlens).repeat_interleave(wlens)
        _in_pool(name, _entries(name, dst, bb, tt, " of a sequence (one per token)"), S, pad)
    elif call.write_mode == "final" and dst is not None and writers.numel():
        name = "dst_state_batch_indices"
        _in_pool(name, _entries(name, dst, writers, torch.zeros_like(writers)), S, pad)
    elif call.write_mode == "intermediate" and writers.numel():
        if int(wlens.max()) > call.cache_steps:
            bad_arg("cache_steps", call.cache_steps, f">= the longest sequence ({int(wlens.max())} tokens)")
        entries = call.ibuf.shape[0] // call.cache_steps
        if call.ibuf_indices is not None:
            idx = host_ints(call.ibuf_indices)[:nseq][writers]
            bad = (idx < 0) | (idx >= entries)
            if bool(bad.any()):
                bad_arg("intermediate_state_indices", int(idx[bad][0]), f"entries in [0, {entries}) of the buffer")
        elif int(slot[writers].max()) >= entries:  # the entry is the read slot
            bad_arg(
                "intermediate_states_buffer",
                call.ibuf,
                f"an entry for read slot {int(slot[writers].max())} (no intermediate_state_indices given)",
            )
        if call.parent is not None:
            par = host_ints(call.parent)[writers]
            if bool((par >= call.cache_steps).any()):
                bad_arg("retrieve_parent_token", int(par.max()), f"parents below cache_steps ({call.cache_steps})")


def finish(call: SSUCall) -> torch.Tensor:
    """Copy scratch output back (the rare non-flattenable dense ``out``) and return the caller's result."""
    if call.copy_back:
        call.result.copy_(call.out.view(call.result.shape))
    return call.result


__all__ = ["SSUCall", "SlotTable", "check_index_data", "finish", "host_ints", "normalize_ssu", "slot_table"]
