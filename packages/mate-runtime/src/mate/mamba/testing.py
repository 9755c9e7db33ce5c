"""The float64 oracle MATE is tested against: the Mamba2 SSM run one token at a time.

Shipped in ``mate-runtime`` so that every package's tests (the runtime's and the adapters') check against the
same expectation. The oracle is written from the contract (``docs/mamba.md``), independently of the backends:
it imports nothing from ``mate.mamba``, takes the public arguments as given (every accepted form), loops in
Python over sequences and tokens (vectorised only over one token's heads x dim x dstate), computes in float64
and never modifies its inputs. The reference backend (``mate/mamba/_reference/ssu.py``, ``naive_ssd.py``) computes
the same thing in fp32 in a different way (gathers, chunked matrix products); its tests compare it to this.

The recurrence, per token and head ``h`` of group ``g = h // (H // G)``, is written once, in :func:`step`::

    dt' = softplus(dt + dt_bias)          (softplus only with dt_softplus; the prefill then clamps to dt_limit)
    s   = s * exp(A dt') + dt' x (x) B[g]
    y   = s . C[g] + D x
    y   = y * silu(z)                     (with z)

What is here:

* :func:`softplus`, :func:`discretize_dt`, :func:`step`: one token of the recurrence.
* :func:`ssu_recurrence`: the expected result of ``selective_state_update`` (the decode step over a slot pool,
  every layout, table form, sentinel and write mode; the slot rules are listed on the function).
* :func:`ssd_recurrence`: the expected result of ``ssd_combined_fwd_varlen`` (the prefill over packed ragged
  sequences, with initial states, D, z, dt_bias, softplus and dt limits; chunk-end states on request).
* :func:`consumer_tensors`, :func:`run_sequence`: consumer-shaped decode tensors (tied per-head dt/A/D/dt_bias,
  x/B/C as row views of one conv buffer, a strided state pool with a storage offset) and the recurrence over
  chosen rows of them, for the adapters' tests, which write their consumer's slot rules by hand on top.
* :func:`rms_norm_gated_rows`: the expected result of ``rms_norm_gated`` (the gated RMSNorm after the SSM), one
  row and one group at a time.
* :func:`gpu_skip_reason`: why a test marked ``gpu`` cannot run here (each package's ``conftest.py`` skips on it).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import torch.nn.functional as F

F64 = torch.float64

# ------------------------------------------------------------------------------------------ one token


def softplus(v: torch.Tensor) -> torch.Tensor:
    """``log(1 + exp(v))``, and ``v`` itself above 20 (PyTorch's threshold, which the kernels share)."""
    return F.softplus(v.to(F64), beta=1.0, threshold=20.0)


def discretize_dt(dt, dt_bias=None, dt_softplus=False, dt_limit=None) -> torch.Tensor:
    """``dt' = clamp(softplus(dt + dt_bias), *dt_limit)`` in float64; each step only when asked for."""
    d = dt.to(F64)
    if dt_bias is not None:
        d = d + dt_bias.to(F64)
    if dt_softplus:
        d = softplus(d)
    if dt_limit is not None:
        d = d.clamp(min=dt_limit[0], max=dt_limit[1])
    return d


def step(s, x, dt, A, B, C, D=None, z=None):
    """One token of the recurrence for every head. Returns ``(state after the token, y)``, both float64.

    ``s`` ``[H, P, N]`` the state entering the token; ``x`` ``[H, P]``; ``dt`` ``[H, P]`` the discretised
    ``dt'`` (see :func:`discretize_dt`); ``A`` ``[H, P, N]``; ``B``, ``C`` ``[G, N]``; ``D`` ``[H, P]`` or None;
    ``z`` ``[H, P]`` or None. Any dtype and device; the arithmetic is float64 on the inputs' device."""
    s, x, dt, A = s.to(F64), x.to(F64), dt.to(F64), A.to(F64)
    heads_per_group = s.shape[0] // B.shape[0]
    Bh = B.to(F64).repeat_interleave(heads_per_group, dim=0)  # [H, N]: the group each head reads
    Ch = C.to(F64).repeat_interleave(heads_per_group, dim=0)
    s = s * torch.exp(A * dt[..., None]) + (dt * x)[..., None] * Bh[:, None, :]
    y = torch.einsum("hpn,hn->hp", s, Ch)
    if D is not None:
        y = y + D.to(F64) * x
    if z is not None:
        z = z.to(F64)
        y = y * z * torch.sigmoid(z)
    return s, y


def _per_head(p, H: int, P: int):
    """None / ``[H]`` / ``[H, P]`` (and ``[P]`` when H == 1) -> float64 ``[H, P]`` or None."""
    if p is None:
        return None
    p = p.to(F64)
    if p.dim() == 1 and p.shape[0] == H:
        return p.view(H, 1).expand(H, P)
    return p.reshape(H, P)


# ------------------------------------------------------------------------------------ decode (SSU)


@dataclass
class SSUExpectation:
    y: torch.Tensor  # like x, in x's dtype
    y64: torch.Tensor  # float64, like x
    state: torch.Tensor  # a copy of the pool with the expected writes (pool dtype)
    written: set = field(default_factory=set)  # pool slots written
    ibuf: torch.Tensor | None = None  # a copy of the intermediate buffer with the expected writes
    ibuf_written: set = field(default_factory=set)  # flat (entry * cache_steps + step) positions written
    rows: list = field(default_factory=list)  # x rows the call computes


def _entry(table: torch.Tensor, b: int, t: int) -> int:
    """Entry ``(b, t)`` of a slot table: ``table[b + t]`` when flat, ``table[b, t]`` when 2-D."""
    if table.dim() == 1:
        return int(table[b + t])
    return int(table[b, t])


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

    The slot rules:

    * sequence ``b`` owns rows ``[cu[b], cu[b+1])`` (packed), ``[b*T, (b+1)*T)`` (dense 4-D) or row ``b``;
    * a table entry ``(b, t)`` is ``table[b + t]`` for a flat table and ``table[b, t]`` for a 2-D one;
    * the read slot is entry ``(b, max(acc[b] - 1, 0))`` (position 0 without ``num_accepted_tokens``), or ``b``
      without a table; a read slot equal to ``pad_slot_id`` reads zeros and the sequence writes no state;
    * writes: an intermediate buffer takes the state after token ``t`` at ``buf[idx, t]`` (5-D) or
      ``buf[idx * cache_steps + t]`` (flat 4-D), ``idx`` = ``intermediate_state_indices[b]``, else the read
      slot, and the pool is left alone; otherwise ``disable_state_update`` writes nothing; otherwise a
      destination table or ``num_accepted_tokens`` publishes every token's state to ``dst(b, t)``
      (``src(b, t)`` without a destination table), skipping sentinel destinations; otherwise the final state
      goes to the read slot;
    * every read sees the pool as it was before the call.

    The last three arguments are the adapter-only rules of the normaliser: SGLang's EAGLE parents (before
    token ``t > 0`` the state is reloaded from the intermediate buffer at ``[idx, parent[b, t]]`` when
    ``parent[b, t] >= 0``), vLLM's single final write to ``dst(b, 0)``, and FlashInfer's final-only write to
    the read slot when ``num_accepted_tokens`` comes without a destination table.
    """
    single_head = state.dim() == 3
    S = state.shape[0]
    H, P, N = (1, *state.shape[1:]) if single_head else tuple(state.shape[1:])
    dense = x.dim() == (3 if single_head else 4)
    G = 1 if single_head else B.shape[-2]

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
    Br, Cr = rows_of(B, (G, N)), rows_of(C, (G, N))
    zr = None if z is None else rows_of(z, (H, P))
    A3 = A.to(F64).view(H, 1, 1).expand(H, P, N) if A.dim() == 1 else A.to(F64).reshape(H, P, N)
    D2 = _per_head(D, H, P)
    bias2 = _per_head(dt_bias, H, P)

    if cu_seqlens is not None:
        cu = [int(v) for v in cu_seqlens]
        seqs = [(cu[b], cu[b + 1] - cu[b]) for b in range(len(cu) - 1)]
    elif dense:
        T = x.shape[1]
        seqs = [(b * T, T) for b in range(x.shape[0])]
    else:
        seqs = [(b, 1) for b in range(R)]

    ibuf = None if intermediate_states_buffer is None else intermediate_states_buffer.clone()
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

    def ibuf_at(idx, t):  # [H, P, N] view of one intermediate entry
        return ibuf[idx, t] if ibuf.dim() == 5 else ibuf[idx * steps + t]

    pool0 = state.reshape(S, H, P, N)
    new_state = state.clone()
    new_pool = new_state.view(S, H, P, N)
    written, ibuf_written, rows = set(), set(), []
    y = torch.zeros(R, H, P, dtype=F64)

    for b, (bos, length) in enumerate(seqs):
        src = state_batch_indices
        if src is None:
            slot = b
        else:
            pos = 0 if num_accepted_tokens is None else max(int(num_accepted_tokens[b]) - 1, 0)
            slot = _entry(src, b, pos)
        pad = slot == pad_slot_id
        s = torch.zeros(H, P, N, dtype=F64) if pad else pool0[slot].to(F64)
        idx = None
        if mode == "intermediate":
            idx = slot if intermediate_state_indices is None else int(intermediate_state_indices[b])
        for t in range(length):
            r = bos + t
            if retrieve_parent_token is not None and t > 0 and not pad and int(retrieve_parent_token[b, t]) >= 0:
                s = ibuf_at(idx, int(retrieve_parent_token[b, t])).to(F64)
            rows.append(r)
            d = discretize_dt(dtr[r], bias2, dt_softplus)
            s, y[r] = step(s, xr[r], d, A3, Br[r], Cr[r], D2, None if zr is None else zr[r])
            if pad:
                continue
            if mode == "intermediate":
                ibuf_at(idx, t).copy_(s.view(ibuf_at(idx, t).shape))
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


# ----------------------------------------------------------------------------------- prefill (SSD)


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
    """The expected result of ``ssd_combined_fwd_varlen``: the decode recurrence run token by token through
    each sequence of a packed batch.

    ``x`` ``[T, H, P]``, ``dt`` ``[T, H]``, ``A`` ``[H]``, ``B``/``C`` ``[T, G, N]``, ``D`` ``[H]`` or
    ``[H, P]``, ``z`` ``[T, H, P]``, ``dt_bias`` ``[H]``; sequence ``b`` owns the next ``seqlens[b]`` tokens
    and enters from ``initial_states[b]`` (zeros without). ``dt' = clamp(softplus(dt + dt_bias), *dt_limit)``:
    the default limit floors a negative ``dt'`` at zero. With ``cu_chunk_seqlens`` the state after each
    chunk's last token is returned too (which is what ``return_intermediate_states`` gives)."""
    T, H, P = x.shape
    N = B.shape[2]
    A3 = A.to(F64).view(H, 1, 1).expand(H, P, N)
    D2 = _per_head(D, H, P)
    y = torch.zeros(T, H, P, dtype=F64)
    closers = set() if cu_chunk_seqlens is None else {int(v) - 1 for v in cu_chunk_seqlens[1:]}
    after = {}  # token closing a chunk -> the state after it
    finals = []
    bos = 0
    for b, length in enumerate(seqlens):
        s = torch.zeros(H, P, N, dtype=F64) if initial_states is None else initial_states[b].to(F64)
        for t in range(bos, bos + length):
            d = discretize_dt(dt[t], dt_bias, dt_softplus, dt_limit)  # [H]
            zt = None if z is None else z[t]
            s, y[t] = step(s, x[t], d[:, None].expand(H, P), A3, B[t], C[t], D2, zt)
            if t in closers:
                after[t] = s
        finals.append(s)
        bos += length
    chunk_end = None
    if cu_chunk_seqlens is not None:
        chunk_end = torch.stack([after[int(v) - 1] for v in cu_chunk_seqlens[1:]])
    return SSDExpectation(y=y, final=torch.stack(finals), chunk_end=chunk_end)


# ---------------------------------------------------------------------------- the adapters' tensors


def run_sequence(s0, rows, t, softplus=True):
    """The recurrence over packed rows ``rows`` of the tensors in namespace ``t`` (per-head ``dt_h [R, H]``,
    ``A_h``, ``D_h``, ``dtb_h`` and ``x [R, H, P]``, ``B``/``C`` ``[R, G, N]``, optional ``z``; as
    :func:`consumer_tensors` makes them), entering from ``s0`` ``[H, P, N]`` (None = zeros). Returns (the
    float64 state after each token, the float64 output of each token)."""
    H, P = t.x.shape[1], t.x.shape[2]
    N = t.B.shape[2]
    A3 = t.A_h.to(F64).view(H, 1, 1).expand(H, P, N)
    D2 = _per_head(t.D_h, H, P)
    z = getattr(t, "z", None)
    s = torch.zeros(H, P, N, dtype=F64) if s0 is None else s0.to(F64)
    states, ys = [], []
    for r in rows:
        d = discretize_dt(t.dt_h[r], t.dtb_h, softplus)  # [H]
        s, y = step(s, t.x[r], d[:, None].expand(H, P), A3, t.B[r], t.C[r], D2, None if z is None else z[r])
        states.append(s)
        ys.append(y)
    return states, ys


def consumer_tensors(rows, H=4, P=4, N=8, G=2, S=10, seed=0, z=False, io_dtype=torch.float32):
    """Tensors shaped like a consumer's decode call: per-head ``dt_h``/``A_h``/``D_h``/``dtb_h`` and their
    tied expansions ``dt``/``A``/``D``/``dt_bias`` (stride 0 over dim/dstate), ``x``/``B``/``C`` as row views
    of one conv buffer, a state pool ``state`` of ``S`` slots strided inside a page buffer with a storage
    offset, and ``out``."""
    g = torch.Generator().manual_seed(seed)
    t = SimpleNamespace()
    t.dt_h = torch.randn(rows, H, generator=g) * 0.5
    t.A_h = -torch.rand(H, generator=g) - 0.1
    t.D_h = torch.randn(H, generator=g)
    t.dtb_h = torch.rand(H, generator=g) * 0.2
    conv = torch.randn(rows, H * P + 2 * G * N, generator=g).to(io_dtype)
    t.x = conv[:, : H * P].view(rows, H, P)
    t.B = conv[:, H * P : H * P + G * N].view(rows, G, N)
    t.C = conv[:, H * P + G * N :].view(rows, G, N)
    t.dt = t.dt_h.unsqueeze(-1).expand(rows, H, P)
    t.A = t.A_h.view(H, 1, 1).expand(H, P, N)
    t.D = t.D_h.view(H, 1).expand(H, P)
    t.dt_bias = t.dtb_h.view(H, 1).expand(H, P)
    t.z = torch.randn(rows, H, P, generator=g).to(io_dtype) if z else None
    page = torch.randn(S, H * P * N + 16, generator=g)
    t.state = page[:, 8 : 8 + H * P * N].view(S, H, P, N)
    t.out = torch.empty(rows, H, P, dtype=io_dtype)
    return t


# ------------------------------------------------------------------------------------- gated RMSNorm


def rms_norm_gated_rows(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True) -> torch.Tensor:
    """``rms_norm_gated``'s result in float64, shaped like ``x``: per row of ``x``'s last dim and per group of
    ``group_size`` features (None: the whole row), with ``g = silu(z)``: ``norm(x * g)`` when not
    ``norm_before_gate``, else ``norm(x) * g``, where ``norm(h) = h / sqrt(mean(h^2) + eps) * weight + bias``."""
    n = x.shape[-1]
    gs = n if group_size is None else group_size
    xs = x.reshape(-1, n).to(F64)
    zs = None if z is None else z.reshape(-1, n).to(F64)
    w = weight.to(F64)
    b = None if bias is None else bias.to(F64)
    out = torch.empty_like(xs)
    for r in range(xs.shape[0]):
        gate = None if zs is None else zs[r] * torch.sigmoid(zs[r])
        h = xs[r] if gate is None or norm_before_gate else xs[r] * gate
        for g0 in range(0, n, gs):
            part = h[g0 : g0 + gs]
            y = part / math.sqrt(float((part * part).mean()) + eps) * w[g0 : g0 + gs]
            if b is not None:
                y = y + b[g0 : g0 + gs]
            if gate is not None and norm_before_gate:
                y = y * gate[g0 : g0 + gs]
            out[r, g0 : g0 + gs] = y
    return out.reshape(x.shape)


# ------------------------------------------------------------------------------------- GPU tests


@functools.cache
def gpu_skip_reason() -> str | None:
    """None where a test marked ``gpu`` can run (a CUDA or MUSA device and TileLang, the conditions under which
    ``backend="auto"`` picks the kernels), else why not."""
    from mate.mamba._dispatch import tilelang_installed
    from mate.mamba._platform.device import default_accelerator

    if default_accelerator() is None:
        return "needs a CUDA or MUSA device"
    if not tilelang_installed():
        return "needs TileLang"
    return None


__all__ = [
    "SSDExpectation",
    "SSUExpectation",
    "consumer_tensors",
    "discretize_dt",
    "gpu_skip_reason",
    "rms_norm_gated_rows",
    "run_sequence",
    "softplus",
    "ssd_recurrence",
    "ssu_recurrence",
    "step",
]
