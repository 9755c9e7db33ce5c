"""SGLang's native Mamba2 op signatures, served by MATE.

``selective_state_update`` follows SGLang 0.5.23's Triton op (``sglang/kernels/ops/mamba/triton_ops/mamba_ssm.py``):

* A 2-D/3-D ``x`` is one token per sequence (run as MATE's one-token form, the same recurrence as SGLang's
  ``T = 1`` dense form); a 4-D ``x [batch, T, H, P]`` is the dense multi-token form; the sentinel is
  ``pad_slot_id`` (default -1); ``state_batch_indices`` is ``[batch]``; ``out`` is required and written in
  place; returns None.
* A sentinel read slot reads a zero state and writes nothing (pool or intermediate buffer).
* Without ``intermediate_states_buffer``: the final state goes back to the read slot unless
  ``disable_state_update``.
* Dtypes: SGLang's kernel loads every input as fp32, so any float mix is valid. One dtype for x/B/C/z/out, or
  fp32 B/C beside a bf16/fp16 x, runs natively; any other mix is computed in fp32 (x, B, C, z upcast, y
  stored into ``out``'s dtype), and a bf16/fp16 ``A`` is upcast (exact).
* ``enable_stochastic_rounding`` (an fp16 state, ``cache_philox_rounds >= 0``: SGLang's checks): as SGLang's
  kernel, the final state store is rounded stochastically with a fresh seed per call (``torch.randint`` on the
  state's device: a captured graph draws a new one per replay) and ``cache_philox_rounds`` Philox rounds (0: 10);
  the intermediate buffer's stores round to nearest, as there. The random bits are MATE's
  (``mate.mamba._reference.rounding``), not Triton's: the same distribution, other values.
* Speculative verify: with ``intermediate_states_buffer`` (``[entries, cache_steps, H, P, N]``, contiguous) the
  state after token ``t`` is written to ``buf[idx, t]``, ``idx`` = ``intermediate_state_indices[b]``, else the
  read slot; ``retrieve_parent_token [batch, T]`` (EAGLE trees) reloads the state before token ``t > 0`` from
  ``buf[idx, parent[b, t]]`` when the parent is >= 0.

Differences kept on purpose (each one an SGLang edge that is a silent no-op or undefined there):

* ``intermediate_states_buffer`` with ``disable_state_update=False`` makes SGLang write the buffer *and* the
  final state: MATE raises ``NotImplementedError`` (SGLang's verify always disables the state update).
* ``intermediate_states_buffer`` without ``state_batch_indices`` makes SGLang write nothing to the buffer: MATE
  raises ``ValueError``.
* ``cache_steps=None`` with a 5-D buffer: MATE uses the buffer's second dimension (SGLang would use 0).
* A pad row's output: SGLang may reload it from a stale buffer entry under a parent tree; MATE computes it from
  the zero state. Pad rows' outputs are discarded by SGLang either way.

``mamba_chunk_scan_combined`` follows SGLang's prefill (the older vLLM scheme): ``x [1, T, H, P]`` packed over
the batch with per-token ``seq_idx [1, T]``, ``chunk_indices`` / ``chunk_offsets`` describing pseudo-chunks
(the absolute ``chunk_size`` grid split where a sequence starts), ``initial_states [num_seqs, H, P, N]``. It is
mapped onto MATE's varlen prefill: the pseudo-chunks become ``cu_chunk_seqlens`` (one chunk per pseudo-chunk),
the owning sequence of each becomes the per-chunk ``seq_idx``. **This needs host-side metadata**: the
per-token ``seq_idx`` (or ``cu_seqlens``) is copied to the host once per call to derive the chunk tables,
which is a device synchronisation (SGLang's prefill is not graph-captured). Without ``seq_idx`` the batch
rows are independent sequences of ``T`` tokens and nothing is synchronised. SGLang's ``return_track_states``
(prefix-cache tracking) is served by splitting a chunk at every tracked position, whose state is then a
chunk-end state. ``chunk_size`` 1, 2 and 4 (valid for SGLang) raise ``NotImplementedError``.
"""

from __future__ import annotations

import math

import torch

from ._adapter import adapter

PAD_SLOT_ID = -1


def _bad(name, value, expected):
    desc = (
        f"tensor(shape={tuple(value.shape)}, dtype={value.dtype})" if isinstance(value, torch.Tensor) else repr(value)
    )
    raise ValueError(f"{name}: got {desc}; expected {expected}")


def _to4d(t):
    """SGLang's wrapper: 2-D -> [b, 1, ...] -> 3-D -> [b, 1, ...] (so every input ends up dense 4-D)."""
    if t is None:
        return None
    if t.dim() == 2:
        t = t.unsqueeze(1)
    if t.dim() == 3:
        t = t.unsqueeze(1)
    return t


def _to3d(t):
    """One token per sequence: 2-D ``[b, dim]`` -> ``[b, 1, dim]`` (a single head), 3-D unchanged."""
    if t is None or t.dim() != 2:
        return t
    return t.unsqueeze(1)


def selective_state_update(
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
    pad_slot_id=PAD_SLOT_ID,
    out=None,
    disable_state_update=False,
    intermediate_states_buffer=None,
    cache_steps=None,
    retrieve_parent_token=None,
    intermediate_state_indices=None,
    enable_stochastic_rounding=False,
    cache_philox_rounds=0,
):
    """SGLang's ``selective_state_update`` (see the module docstring). Writes ``out`` and the state in place."""
    # SGLang's own argument checks first (a call SGLang rejects is rejected here the same way)
    if not isinstance(cache_philox_rounds, int) or isinstance(cache_philox_rounds, bool) or cache_philox_rounds < 0:
        _bad("cache_philox_rounds", cache_philox_rounds, "a non-negative int")
    rand_seed = None
    if enable_stochastic_rounding:
        if isinstance(state, torch.Tensor) and state.dtype != torch.float16:
            _bad("state", state, "dtype float16 with enable_stochastic_rounding (SGLang's rule)")
        # SGLang rounds the final state store only: none with a buffer (its stores round to nearest) or without
        # a state update
        if intermediate_states_buffer is None and not disable_state_update and isinstance(state, torch.Tensor):
            rand_seed = torch.randint(0, 2**32, (1,), device=state.device)
    if out is None:
        _bad("out", out, "a preallocated tensor shaped like x (SGLang's op writes it in place)")
    if state_batch_indices is not None and (
        not isinstance(state_batch_indices, torch.Tensor) or state_batch_indices.dim() != 1
    ):
        _bad("state_batch_indices", state_batch_indices, "a 1-D [batch] slot table")
    if intermediate_states_buffer is not None:
        if not disable_state_update:
            raise NotImplementedError(
                "intermediate_states_buffer with disable_state_update=False (SGLang then writes both the buffer and "
                "the final state) is not supported by MATE yet; pass disable_state_update=True as SGLang's verify does"
            )
        if state_batch_indices is None:
            _bad(
                "state_batch_indices",
                None,
                "a [batch] slot table with intermediate_states_buffer (SGLang's kernel writes the buffer only then)",
            )
    if cache_steps is None:
        cache_steps = 0
    if state.dim() == 3:  # SGLang's single-head forms: state [S, dim, dstate], A [dim, dstate]
        state = state.unsqueeze(1)
        if A.dim() == 2:
            A = A.unsqueeze(0)
    if x.dim() == 4 or retrieve_parent_token is not None:
        canon = _to4d  # SGLang's dense [batch, T, H, P] form (the parent tree needs it)
    else:
        canon = _to3d  # one token per sequence: the same recurrence, and MATE's one-token fast path
    x, B, C, z, run_out, copy_to = _ssu_io(x, B, C, z, out)
    if isinstance(A, torch.Tensor) and A.dtype != torch.float32:
        A = _f32_keep_broadcast(A)  # SGLang's kernel loads A as fp32: a bf16/fp16 A upcasts exactly
    # positionally, in mate.mamba.selective_state_update's order (binding a dozen keywords costs ~0.6 us a call)
    adapter().runtime().selective_state_update(
        state, canon(x), canon(dt), A, canon(B), canon(C), D, canon(z), dt_bias, dt_softplus, state_batch_indices,
        pad_slot_id,
        None,  # state_scale
        canon(run_out), disable_state_update, intermediate_states_buffer, intermediate_state_indices,
        None,  # intermediate_state_scales
        rand_seed, cache_philox_rounds or 10, cache_steps,
        "auto", None, None, None, "auto",  # algorithm, dst table, cu_seqlens, num_accepted_tokens, backend
        retrieve_parent_token=retrieve_parent_token,
    )  # fmt: skip
    if copy_to is not None:
        copy_to.copy_(run_out)
    return None


_HALF = (torch.bfloat16, torch.float16)


def _f32_keep_broadcast(t):
    """``t`` in fp32 with its stride-0 (broadcast) dims kept broadcast: a tied per-head A stays tied, so the
    runtime still takes its tied fast path."""
    one = tuple(slice(0, 1) if st == 0 else slice(None) for st in t.stride())
    return t[one].float().expand(t.shape)


def _ssu_io(x, B, C, z, out):
    """The dtypes of x, B, C, z and out as MATE's runtime takes them: ``(x, B, C, z, out to compute into,
    caller's out to copy into or None)``.

    SGLang's kernel loads every input as fp32 and stores y in out's dtype, so any float mix is valid there.
    Served natively: all five in one dtype, and fp32 B/C beside a bf16/fp16 x (z and out in x's dtype).
    Any other mix computes in fp32 (x, B, C, z upcast: the same arithmetic as SGLang's) into an fp32 out,
    copied into the caller's out when that is narrower."""
    tensors = [t for t in (x, B, C, z, out) if isinstance(t, torch.Tensor)]
    if len(tensors) < 5 - (z is None):
        return x, B, C, z, out, None  # a non-tensor: the runtime names it
    io = x.dtype
    same = all(t.dtype == io for t in tensors)
    wide_bc = io in _HALF and B.dtype == C.dtype == torch.float32 and out.dtype == io and (z is None or z.dtype == io)
    if same or wide_bc:
        return x, B, C, z, out, None
    f32 = torch.float32
    x, B, C = x.to(f32), B.to(f32), C.to(f32)
    z = None if z is None else z.to(f32)
    if out.dtype == f32:
        return x, B, C, z, out, None
    return x, B, C, z, torch.empty(out.shape, dtype=f32, device=out.device), out


# ---------------------------------------------------------------------------------------------- prefill


def pseudo_chunks(starts: list[int], total: int, chunk_size: int) -> list[int]:
    """Chunk boundaries: the absolute ``chunk_size`` grid over the packed tokens, split at every sequence start
    (what SGLang's ``chunk_indices`` / ``chunk_offsets`` describe). Returns ``cu_chunk_seqlens`` as a list."""
    return sorted(set(range(0, total, chunk_size)) | {s for s in starts if s < total} | {total})


def _check_pseudo_chunks(cu_chunk, chunk_size, chunk_indices, chunk_offsets):
    starts = cu_chunk[:-1]
    want_idx = [s // chunk_size for s in starts]
    want_off = [s % chunk_size for s in starts]
    if chunk_indices is not None and [int(v) for v in chunk_indices.reshape(-1).tolist()] != want_idx:
        _bad("chunk_indices", chunk_indices, f"{want_idx} (the pseudo-chunks of seq_idx / cu_seqlens)")
    if chunk_offsets is not None and [int(v) for v in chunk_offsets.reshape(-1).tolist()] != want_off:
        _bad("chunk_offsets", chunk_offsets, f"{want_off} (the pseudo-chunks of seq_idx / cu_seqlens)")


def mamba_chunk_scan_combined(
    x,
    dt,
    A,
    B,
    C,
    chunk_size,
    D=None,
    z=None,
    dt_bias=None,
    initial_states=None,
    seq_idx=None,
    chunk_indices=None,
    chunk_offsets=None,
    cu_seqlens=None,
    dt_softplus=False,
    dt_limit=(0.0, float("inf")),
    out=None,
    return_final_states=False,
    return_varlen_states=False,
    return_intermediate_states=False,
    state_dtype=None,
    return_track_states=False,
    track_seq_idx=None,
    track_end_locs=None,
):
    """SGLang's chunked prefill (see the module docstring). Writes ``out [batch, T, H, P]`` in place.

    Returns (SGLang's order): nothing; ``final_states`` ``[batch, H, P, N]`` (the state after each batch row's
    last token); ``varlen_states`` ``[num_seqs, H, P, N]`` (each sequence's final state; needs ``cu_seqlens``);
    ``(final_states, varlen_states)``; with ``return_intermediate_states`` the chunk states
    ``[batch, nchunks, H, P, N]`` come first (chunk ``c``'s entry is the state carried into absolute chunk ``c``:
    the state after token ``c * chunk_size - 1`` of the sequence owning it, or the first sequence's initial
    state for ``c = 0``). With ``return_track_states`` (needs ``return_varlen_states``; the other two flags are
    then ignored, as in SGLang): ``(chunk states, varlen_states, track_states)``, ``track_states``
    ``[1, n, H, P, N]`` entry ``i`` the state of sequence ``track_seq_idx[i]`` after its tokens before packed
    position ``track_end_locs[i]`` (None without track positions).

    Dtypes as SGLang's: ``final_states`` fp32; the chunk, varlen and track states in ``state_dtype``, default
    C's dtype. A bf16/fp16 ``A`` is upcast to fp32 (exact).
    """
    mamba = adapter().runtime()
    for name, t in (("x", x), ("dt", dt), ("B", B), ("C", C)):
        if not isinstance(t, torch.Tensor):
            _bad(name, t, "a torch.Tensor")
    if x.dim() != 4:
        _bad("x", x, "[batch, seqlen, heads, headdim]")
    if out is None:
        _bad("out", out, "a preallocated [batch, seqlen, heads, headdim] tensor (SGLang's prefill writes it in place)")
    if not isinstance(chunk_size, int) or chunk_size < 1 or chunk_size & (chunk_size - 1):
        _bad("chunk_size", chunk_size, "a power of two")
    if chunk_size < 8:  # valid for SGLang's Python check; MATE's prefill serves powers of two from 8
        raise NotImplementedError(
            f"chunk_size={chunk_size} is not supported by MATE's prefill (powers of two from 8; 64 and up on TileLang)"
        )
    batch, T, H, P = x.shape
    if return_varlen_states and cu_seqlens is None:
        _bad("cu_seqlens", None, "[num_sequences + 1] offsets when return_varlen_states is True")
    if return_track_states and not return_varlen_states:
        _bad("return_track_states", True, "False unless return_varlen_states is True (SGLang's rule)")
    if isinstance(A, torch.Tensor) and A.dtype in (torch.bfloat16, torch.float16):
        A = A.float()  # SGLang's kernels read A as fp32; the upcast is exact
    sdt = state_dtype if state_dtype is not None else C.dtype  # SGLang's default: C's dtype
    # SGLang's final_states are fp32 whatever the state dtype: compute in fp32 then, rounding the others after
    run_sdt = torch.float32 if return_final_states else sdt
    if tuple(out.shape) != tuple(x.shape):
        _bad("out", out, f"shape {tuple(x.shape)}")

    # ---- sequences and chunks (host metadata)
    if seq_idx is None and not return_varlen_states:
        lens = [T] * batch
        seq_of = list(range(batch))  # runtime sequence -> index into initial_states
        tokens = batch * T
        if chunk_indices is not None or chunk_offsets is not None:
            _bad("chunk_indices", chunk_indices, "None without seq_idx (pseudo-chunks describe packed sequences)")
    else:
        if batch != 1:
            _bad("x", x, "[1, T, heads, headdim] with seq_idx / cu_seqlens (sequences packed along T)")
        tokens = T
        if cu_seqlens is not None:
            cu = [int(v) for v in cu_seqlens.tolist()]  # host metadata (one device -> host copy)
            if cu[0] != 0 or cu[-1] != T or any(b < a for a, b in zip(cu, cu[1:], strict=False)):
                _bad("cu_seqlens", cu_seqlens, f"non-decreasing offsets from 0 to {T}")
            if seq_idx is not None:
                sid = seq_idx.reshape(-1).tolist()
                want = [b for b in range(len(cu) - 1) for _ in range(cu[b + 1] - cu[b])]
                if len(sid) != T or sid != want:
                    _bad("seq_idx", seq_idx, "[1, T] sequence ids consistent with cu_seqlens")
        else:
            if tuple(seq_idx.shape) != (1, T):
                _bad("seq_idx", seq_idx, f"[1, {T}] per-token sequence ids")
            sid = seq_idx.reshape(-1).tolist()  # host metadata (one device -> host copy)
            if sid[0] != 0 or any(b not in (a, a + 1) for a, b in zip(sid, sid[1:], strict=False)):
                _bad("seq_idx", seq_idx, "runs of 0, 1, 2, ... (sequences packed in order)")
            cu = [0] + [t for t in range(1, T) if sid[t] != sid[t - 1]] + [T]
        lens = [b - a for a, b in zip(cu, cu[1:], strict=False)]
        seq_of = [b for b, n in enumerate(lens) if n > 0]
    nseq_all = len(lens)
    live_lens = [lens[b] for b in seq_of]
    starts, acc = [], 0
    for n in live_lens:
        starts.append(acc)
        acc += n
    if seq_idx is None and not return_varlen_states:
        # independent rows: each row's chunks start at its own token 0
        cu_chunk = sorted({b * T + k for b in range(batch) for k in range(0, T, chunk_size)} | {tokens})
    else:
        cu_chunk = pseudo_chunks(starts, tokens, chunk_size)
        _check_pseudo_chunks(cu_chunk, chunk_size, chunk_indices, chunk_offsets)
    # SGLang's tracked states: the state of sequence track_seq_idx[i] before packed position track_end_locs[i].
    # Each position inside a sequence becomes one more chunk boundary, so the state is a chunk-end state.
    track = []  # (sequence, end): end > the sequence's start, else the entering state
    want_track = bool(return_track_states) and track_seq_idx is not None and track_end_locs is not None
    if want_track:
        tsid = [int(v) for v in track_seq_idx.reshape(-1).tolist()]  # host metadata
        tend = [int(v) for v in track_end_locs.reshape(-1).tolist()]
        if len(tsid) != len(tend):
            _bad("track_end_locs", track_end_locs, f"{len(tsid)} entries (one per track_seq_idx entry)")
        for b, e in zip(tsid, tend, strict=True):
            if not 0 <= b < nseq_all:
                _bad("track_seq_idx", track_seq_idx, f"sequence ids in [0, {nseq_all})")
            if not cu[b] <= e <= cu[b + 1]:
                _bad("track_end_locs", track_end_locs, f"a position of sequence {b}, in [{cu[b]}, {cu[b + 1]}]")
            track.append((b, e))
        want_track = len(track) > 0
        cu_chunk = sorted(set(cu_chunk) | {e for b, e in track if e > cu[b]})
    chunk_seq, last_chunk = [], []
    s = 0
    for c in range(len(cu_chunk) - 1):
        while cu_chunk[c] >= starts[s] + live_lens[s]:
            s += 1
        chunk_seq.append(s)
    for s in range(len(live_lens)):
        last_chunk.append(max(c for c, q in enumerate(chunk_seq) if q == s))

    dev = x.device
    meta = dict(dtype=torch.int32, device=dev)
    cu_rt = torch.tensor([*starts, tokens], **meta)
    cu_chunk_t = torch.tensor(cu_chunk, **meta)
    chunk_seq_t = torch.tensor(chunk_seq, **meta)
    last_chunk_t = torch.tensor(last_chunk, **meta)

    # ---- tensors in the runtime's packed layout
    def flat(t):
        return None if t is None else t.reshape(tokens, *t.shape[2:])

    try:
        out_rows, scratch = out.view(tokens, H, P), False
    except RuntimeError:  # an out that cannot be flattened: compute into scratch, copy back
        out_rows, scratch = torch.empty((tokens, H, P), dtype=out.dtype, device=dev), True
    init = None
    if initial_states is not None:
        if not isinstance(initial_states, torch.Tensor) or initial_states.dim() != 4:
            _bad("initial_states", initial_states, "[num_sequences, heads, headdim, dstate]")
        expected_rows = batch if seq_idx is None and not return_varlen_states else nseq_all
        if initial_states.shape[0] != expected_rows:
            _bad("initial_states", initial_states, f"{expected_rows} rows (one per sequence)")
        init = initial_states if len(seq_of) == initial_states.shape[0] else initial_states[seq_of]
    lo, hi = dt_limit
    want_chunks = bool(return_intermediate_states) or bool(return_track_states)
    res = mamba.ssd_combined_fwd_varlen(
        flat(x), flat(dt), A, flat(B), flat(C), chunk_size, cu_rt, cu_chunk_t, last_chunk_t, chunk_seq_t, out_rows,
        D, flat(z), dt_bias, dt_softplus=dt_softplus, dt_limit=(float(lo), float(hi)), initial_states=init,
        return_intermediate_states=want_chunks, state_dtype=run_sdt,
    )  # fmt: skip
    if scratch:
        out.copy_(out_rows.view(out.shape))
    if want_chunks:
        chunk_end = res
        final_live = chunk_end[last_chunk_t.long()]
    else:
        final_live = res

    # ---- SGLang's return values
    def init_or_zero(b):
        if initial_states is None:
            return torch.zeros((H, P, final_live.shape[-1]), dtype=run_sdt, device=dev)
        return initial_states[b].to(run_sdt)

    if seq_idx is None and not return_varlen_states:
        final_states = final_live
    else:
        final_states = final_live[-1:]  # the state after the packed row's last token
    final_states = final_states.float()  # SGLang's final_states are fp32
    varlen_states = None
    if return_varlen_states:
        if len(seq_of) == nseq_all:
            varlen_states = final_live
        else:  # empty sequences keep their entering state
            rows, k = [], 0
            for b in range(nseq_all):
                if lens[b] > 0:
                    rows.append(final_live[k])
                    k += 1
                else:
                    rows.append(init_or_zero(b))
            varlen_states = torch.stack(rows)
        varlen_states = varlen_states.to(sdt)
    if not want_chunks:
        if return_varlen_states:
            return (final_states, varlen_states) if return_final_states else varlen_states
        return final_states if return_final_states else None

    nabs = math.ceil(T / chunk_size)
    ends_at = {p: k for k, p in enumerate(cu_chunk[1:])}  # boundary -> the (pseudo-)chunk ending there
    packed = seq_idx is not None or return_varlen_states
    per_row = []
    for r in range(batch):
        # chunk 0 enters with initial_states[0] when packed (SGLang reads row 0), else the row's own
        first = init_or_zero(0 if packed else r)[None]
        ids = [ends_at[r * T + c * chunk_size] for c in range(1, nabs)]
        per_row.append(torch.cat([first, chunk_end[torch.tensor(ids, dtype=torch.long, device=dev)]]))
    states = torch.stack(per_row).to(sdt)
    if return_track_states:
        track_states = None
        if want_track:
            track_states = torch.stack([chunk_end[ends_at[e]] if e > cu[b] else init_or_zero(b) for b, e in track]).to(
                sdt
            )[None]
        return states, varlen_states, track_states
    tail = []
    if return_final_states:
        tail.append(final_states)
    if return_varlen_states:
        tail.append(varlen_states)
    return (states, *tail) if tail else states


__all__ = ["selective_state_update", "mamba_chunk_scan_combined", "pseudo_chunks", "PAD_SLOT_ID"]
