"""The dt pre-pass of the SSD varlen prefill: every tile's ``dt'``, its decay rows and its record, plus the runs
table the chunk scan (:mod:`.ssd_scan`) walks.

One launch of :func:`ssd_dt_kernel` does two independent jobs, so the runs table costs no serial time of its own:

- the tile CTAs, one per (tile ``v = c * chunk_size / block_L + sub``, group of ``heads_per_cta`` heads), of
  ``block_L`` threads (one per token), write per head the four rows of :data:`.ssd_common.DT_ROWS`
  (``dt' = clamp(softplus(dt + dt_bias), lo, hi)``, zero past the chunk's end; its inclusive cumsum times
  ``A``, in log2 units; the end-state weights; the entering-state decays) and per tile the record ``tmeta``;
- one more CTA (the grid's last row, first head group) derives from ``seq_idx`` and ``last_chunk_indices`` on the
  GPU (no host sync)

  - ``bounds [batch + 1]``: the first chunk of every *run* (a maximal stretch of chunks with one ``seq_idx``,
    i.e. chunks from an opening chunk up to the next one), padded with ``nchunks``; CTA ``b`` of the chunk scan
    walks chunks ``[bounds[b], bounds[b+1])``. When ``seq_idx`` has more runs than there are sequences, the last
    CTA walks the surplus runs too (the scan re-opens the state at every opening chunk it meets, so the result
    stays exact; only the load balance suffers);
  - ``dest [nchunks]``: the row of the state output that receives the end state of chunk ``c``
    (``b`` or ``final_state_indices[b]`` where ``last_chunk_indices[b] == c``, else -1).

Index guards: a tile's first token is clamped into ``[0, T]`` and its valid tokens to the tokens left, so neither
the dt reads nor the chunk scan's stores of the rows the record calls valid leave the tensors whatever
``cu_chunk_seqlens`` holds; ``last_chunk_indices`` outside the chunks are ignored, and the scan guards the state
rows ``final_state_indices`` and ``seq_idx`` name.

Fully parallel: it takes the dt loads, the softplus, the scan and the ``exp2`` of the decays off the chunk scan's
serial per-tile path.
"""

# No ``from __future__ import annotations``: TileLang evaluates the T.Tensor annotations.
import functools
import math

from .ssd_common import DT_ROWS, LOG2E, META_WIDTH


def dt_prime(T, raw, bias, *, has_dt_bias: bool, dt_softplus: bool, dt_min: float, dt_max: float):
    """``dt' = clamp(softplus(dt + dt_bias), dt_min, dt_max)`` as a TIR expression of the raw fp32 ``dt``.
    Bounds at +-inf are left out."""
    v = raw
    if has_dt_bias:
        v = v + bias
    if dt_softplus:
        v = T.if_then_else(v > 20.0, v, T.log1p(T.exp(v)))
    if dt_max != math.inf:
        v = T.min(v, T.float32(dt_max))
    if dt_min != -math.inf:
        v = T.max(v, T.float32(dt_min))
    return v


def _tile_meta_macro():
    """The record ``tmeta[vt]`` of a tile (first token, valid tokens, the sequence it opens or -1), written by one
    thread of the tile's first CTA."""
    import tilelang.language as T

    @T.macro
    def tile_meta(tmeta, seq_idx, vt, c, sub, s0, n_valid):
        opens = T.if_then_else(
            sub == 0, T.if_then_else(c == 0, 1, T.if_then_else(seq_idx[c] != seq_idx[c - 1], 1, 0)), 0
        )
        tmeta[vt, 0] = s0
        tmeta[vt, 1] = n_valid
        tmeta[vt, 2] = T.if_then_else(opens == 1, T.Cast("int32", seq_idx[c]), -1)
        tmeta[vt, 3] = 0

    return tile_meta


def _runs_macro(threads: int, use_final_indices: bool):
    """The runs table (``bounds``, ``dest``: see the module doc) computed by one CTA of ``threads`` threads, with
    its ``flags [threads]`` / ``carry [1]`` int32 shared buffers: the chunks are taken ``threads`` at a time, each
    thread flags whether its chunk opens a run, and a block cumsum of the flags (plus the runs counted so far,
    ``carry``) numbers the run an opening chunk starts."""
    import tilelang.language as T

    @T.macro
    def runs_body(seq_idx, last_chunk_indices, final_state_indices, bounds, dest, flags, carry, nchunks, batch):
        tx = T.get_thread_binding()
        if tx == 0:
            carry[0] = 0
        T.sync_threads()
        for it in T.serial(T.ceildiv(nchunks, threads)):
            c = it * threads + tx
            opens = T.if_then_else(
                c < nchunks,
                T.if_then_else(c == 0, 1, T.if_then_else(seq_idx[c] != seq_idx[c - 1], 1, 0)),
                0,
            )
            flags[tx] = opens
            if c < nchunks:
                dest[c] = -1
            T.sync_threads()
            T.cumsum(flags, dim=0)
            T.sync_threads()
            if opens == 1:
                r = carry[0] + flags[tx] - 1
                if r < batch:
                    bounds[r] = c
            T.sync_threads()
            if tx == 0:
                carry[0] = carry[0] + flags[threads - 1]
            T.sync_threads()
        for it in T.serial(T.ceildiv(batch + 1, threads)):
            r = it * threads + tx
            if r == batch or (r < batch and r >= carry[0]):
                bounds[r] = nchunks
        T.sync_threads()
        for it in T.serial(T.ceildiv(batch, threads)):
            b = it * threads + tx
            if b < batch:
                lc = T.Cast("int32", last_chunk_indices[b])
                if lc >= 0 and lc < nchunks:
                    if use_final_indices:
                        dest[lc] = T.Cast("int32", final_state_indices[b])
                    else:
                        dest[lc] = b

    return runs_body


def ssd_dt_kernel(
    *,
    heads: int,
    chunk_size: int,
    block_L: int = 128,
    dt_dtype: str = "float32",
    dt_bias_dtype: str = "float32",
    cu_dtype: str = "int32",
    seq_idx_dtype: str = "int32",
    has_dt_bias: bool = True,
    dt_softplus: bool = True,
    dt_min: float = 0.0,
    dt_max: float = math.inf,
    heads_per_cta: int = 1,
    last_dtype: str = "int32",
    fsi_dtype: str = "int32",
    use_final_indices: bool = False,
):
    """The dt pre-pass (see the module doc); ``block_L`` is the chunk scan's tile (it must divide ``chunk_size``).

    Arguments in order: ``dt [T, H]`` (any row stride), ``A [H]`` fp32, ``dt_bias [H]`` (read only with
    ``has_dt_bias``), ``cu_chunk_seqlens [nchunks + 1]``, ``seq_idx [nchunks]``; outputs
    ``dtA [nchunks * S, H, DT_ROWS, block_L]`` fp32 (``S = chunk_size / block_L``: the rows of
    :data:`.ssd_common.DT_ROWS`), ``tmeta [nchunks * S, META_WIDTH]`` int32 (``(first token, valid tokens,
    seq_idx[c] if the tile opens a sequence else -1, 0)``); then the runs table's inputs
    ``last_chunk_indices [batch]``, ``final_state_indices [fsi_len]`` (read only with ``use_final_indices``) and
    outputs ``bounds [batch + 1]``, ``dest [nchunks]`` int32.

    ``heads_per_cta`` (a divisor of ``heads``) > 1: each thread reads its token's ``heads_per_cta`` consecutive
    ``dt`` values (one 32-byte sector at 8 fp32 heads, where one head per CTA uses 4 bytes of each sector it
    fetches) and the heads' scans share the barriers."""
    H, L, BL = heads, chunk_size, block_L
    if L % BL:
        raise ValueError(f"block_L ({BL}) must divide chunk_size ({L})")
    if heads_per_cta < 1 or H % heads_per_cta:
        raise ValueError(f"heads_per_cta ({heads_per_cta}) must divide heads ({H})")
    HB = heads_per_cta
    import tilelang.language as T

    S = L // BL
    accum = "float32"
    dtp = functools.partial(dt_prime, T, has_dt_bias=has_dt_bias, dt_softplus=dt_softplus, dt_min=dt_min, dt_max=dt_max)
    # inclusive scan (Hillis-Steele, ping-pong in shared memory), one step per power of two below the tile
    scan_offsets = [1 << i for i in range(int(math.log2(BL)))]
    tile_meta = _tile_meta_macro()
    runs_body = _runs_macro(BL, use_final_indices)

    T_ = T.dynamic("T")
    nchunks = T.dynamic("nchunks")
    nchunks1 = T.dynamic("nchunks1")
    nvt = T.dynamic("nvt")
    dt_rs = T.dynamic("dt_rs")

    @T.macro
    def tile(dt, A, dt_bias, cu_chunk_seqlens, seq_idx, dtA, tmeta, vt, h):
        i = T.get_thread_binding()
        c = vt // S
        sub = vt % S
        # clamped into the tokens (a no-op for valid chunk tables): the dt reads below and the scan's stores of the
        # tile's valid rows stay inside the tensors whatever cu_chunk_seqlens holds
        s0 = T.min(T.max(T.Cast("int32", cu_chunk_seqlens[c]) + sub * BL, 0), T_)
        n_valid = T.min(T.Cast("int32", cu_chunk_seqlens[c + 1]), T_) - s0
        if HB == 1:
            a_s = T.alloc_shared((BL,), accum)
            b_s = T.alloc_shared((BL,), accum)
            raw = T.if_then_else(i < n_valid, T.Cast(accum, dt[s0 + i, h]), T.float32(0))
            v = T.if_then_else(i < n_valid, dtp(raw, T.Cast(accum, dt_bias[h])), T.float32(0))
            dtA[vt, h, 1, i] = v
            a_s[i] = v * A[h]
            T.sync_threads()
            src_buf, dst_buf = a_s, b_s
            for off in scan_offsets:
                dst_buf[i] = src_buf[i] + T.if_then_else(i >= off, src_buf[i - off], T.float32(0))
                T.sync_threads()
                src_buf, dst_buf = dst_buf, src_buf
            a = src_buf[i] * LOG2E
            dtA[vt, h, 0, i] = a
            dtA[vt, h, 2, i] = T.exp2(src_buf[BL - 1] * LOG2E - a) * v
            dtA[vt, h, 3, i] = T.exp2(a)
        else:  # HB heads per CTA
            a_s = T.alloc_shared((HB, BL), accum)
            b_s = T.alloc_shared((HB, BL), accum)
            v = T.alloc_local((HB,), accum)
            h0 = h * HB
            # the token's HB consecutive dt values first (one sector), then the per-head work
            for j in T.unroll(HB):
                v[j] = T.if_then_else(i < n_valid, T.Cast(accum, dt[s0 + i, h0 + j]), T.float32(0))
            for j in T.unroll(HB):
                v[j] = T.if_then_else(i < n_valid, dtp(v[j], T.Cast(accum, dt_bias[h0 + j])), T.float32(0))
                dtA[vt, h0 + j, 1, i] = v[j]
                a_s[j, i] = v[j] * A[h0 + j]
            T.sync_threads()
            src_buf, dst_buf = a_s, b_s
            for off in scan_offsets:
                for j in T.unroll(HB):
                    dst_buf[j, i] = src_buf[j, i] + T.if_then_else(i >= off, src_buf[j, i - off], T.float32(0))
                T.sync_threads()
                src_buf, dst_buf = dst_buf, src_buf
            for j in T.unroll(HB):
                a = src_buf[j, i] * LOG2E
                dtA[vt, h0 + j, 0, i] = a
                dtA[vt, h0 + j, 2, i] = T.exp2(src_buf[j, BL - 1] * LOG2E - a) * v[j]
                dtA[vt, h0 + j, 3, i] = T.exp2(a)
        if h == 0:
            if i == 0:
                tile_meta(tmeta, seq_idx, vt, c, sub, s0, n_valid)

    batch = T.dynamic("batch")
    batch1 = T.dynamic("batch1")
    fsi_len = T.dynamic("fsi_len")

    @T.prim_func
    def dtpass_runs(
        dt: T.StridedTensor((T_, H), (dt_rs, 1), dt_dtype),
        A: T.Tensor((H,), "float32"),
        dt_bias: T.Tensor((H,), dt_bias_dtype),
        cu_chunk_seqlens: T.Tensor((nchunks1,), cu_dtype),
        seq_idx: T.Tensor((nchunks,), seq_idx_dtype),
        dtA: T.Tensor((nvt, H, DT_ROWS, BL), accum),
        tmeta: T.Tensor((nvt, META_WIDTH), "int32"),
        last_chunk_indices: T.Tensor((batch,), last_dtype),
        final_state_indices: T.Tensor((fsi_len,), fsi_dtype),
        bounds: T.Tensor((batch1,), "int32"),
        dest: T.Tensor((nchunks,), "int32"),
    ):
        with T.Kernel(nchunks * S + 1, H // HB, threads=BL) as (vt, h):
            flags = T.alloc_shared((BL,), "int32")
            carry = T.alloc_shared((1,), "int32")
            if vt < nchunks * S:
                tile(dt, A, dt_bias, cu_chunk_seqlens, seq_idx, dtA, tmeta, vt, h)
            elif h == 0:
                runs_body(seq_idx, last_chunk_indices, final_state_indices, bounds, dest, flags, carry, nchunks, batch)

    return dtpass_runs
