"""TileLang kernel factories for the SSD varlen prefill (Mamba2 chunked scan over a packed batch).

Two kernels serve one call, three when ``ssd_dt_kernel`` (the per-tile ``dt'`` pre-pass, at the end of this
module) feeds the fused kernel (``precomputed_dt``):

``ssd_runs_kernel``
    One CTA reads ``seq_idx`` and ``last_chunk_indices`` on the GPU (no host sync) and writes

    - ``bounds [batch + 1]``: the first chunk of every *run* (a maximal stretch of chunks with one
      ``seq_idx``, i.e. chunks from an opening chunk up to the next one), padded with ``nchunks``; CTA ``b``
      of the fused kernel walks chunks ``[bounds[b], bounds[b+1])``. When ``seq_idx`` has more runs than
      there are sequences, the last CTA walks the surplus runs too (the fused kernel re-opens the state at
      every opening chunk it meets, so the result stays exact; only the load balance suffers);
    - ``dest [nchunks]``: the row of the state output that receives the end state of chunk ``c``
      (``b`` or ``final_state_indices[b]`` where ``last_chunk_indices[b] == c``, else -1).

``ssd_fused_kernel``
    One CTA per (run, head, P-block) walks its chunks in order, keeping the running fp32 state
    ``[N, block_P]`` in registers, so chunk states never travel through global memory. Each chunk is
    processed in tiles of ``block_L`` tokens aligned to the chunk's start (``chunk_size // block_L`` tiles,
    the tail ones of a short chunk masked). Per tile, the five stages of the contract fuse into:

    1. ``dt' = clamp(softplus(dt + dt_bias), lo, hi)`` (zero past the chunk's end) and the inclusive
       cumsum ``dA`` of ``A * dt'`` over the tile;
    2. ``CB = C Bᵀ`` (wgmma), masked causally and scaled: ``S[m, k] = CB[m, k] exp(dA_m - dA_k) dt'_k``;
    3. ``y = exp(dA_m) C · state + S x`` (two wgmmas into one accumulator), ``+ D x``, ``* silu(z)``,
       stored for the tile's valid rows only;
    4. ``state = exp(dA_last) state + Bᵀ (x * exp(dA_last - dA_k) dt'_k)`` (wgmma accumulating in registers);
    5. at a chunk's end, the state is written out (every chunk with intermediate states, else the chunks
       that ``dest`` names). A chunk opening a sequence (``c == 0`` or ``seq_idx[c] != seq_idx[c-1]``)
       starts from ``initial_states[seq_idx[c]]`` or zero.

    Splitting a chunk into tiles is exact algebra (a tile boundary is a state hand-over like a chunk
    boundary); the contract's per-chunk results (end states) are reported at chunk ends.

Token, chunk and batch counts are ``T.dynamic``. Factories take plain Python values only.
"""

# No ``from __future__ import annotations``: TileLang evaluates the T.Tensor annotations.
import functools
import math

LOG2E = 1.4426950408889634
# wgmma issued without waiting for it (``overlap``): the next GEMM's wait completes it
NO_WAIT = {"wg_wait": -1}
FLAG_Z = 1  # runtime flags of the fused kernel
FLAG_INIT = 2
# Per-tile record of the dt pre-pass (first token, valid tokens, opening sequence or -1): 3 int32 used, padded
# to 128 bytes because a TMA load's shared-memory destination (one per pipeline stage) must be 128-byte aligned.
META_WIDTH = 32
# ``prefetch``: one L2 prefetch per 128-byte line (a hint: no alignment needed, nothing waits on it). PTX, so
# only in NVIDIA device code; elsewhere (MUSA's compiler) the hint compiles to nothing.
PREFETCH_L2_SRC = r"""
__device__ __forceinline__ void mate_prefetch_l2(const void* ptr) {
#if defined(__CUDA_ARCH__) && !defined(__MUSA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" :: "l"(ptr));
#endif
}
"""


def dt_prime(T, raw, bias, *, has_dt_bias: bool, dt_softplus: bool, dt_min: float, dt_max: float):
    """``dt' = clamp(softplus(dt + dt_bias), dt_min, dt_max)`` as a TIR expression of the raw fp32 ``dt`` (the one
    place the rule is written; both kernels that compute dt' build it here). Bounds at +-inf are left out."""
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


def fused_smem_bytes(
    *,
    dim_block: int,
    dstate: int,
    block_L: int,
    io_bytes: int,
    num_stages: int,
    threads: int = 256,
    scores_in_shared: bool = False,
    precomputed_dt: bool = False,
    decay_rows: bool = False,
    narrow_p: bool = False,
) -> int:
    """Dynamic shared memory of the fused kernel (TileLang multi-buffers the tiles the pipelined loop loads:
    x, B, C, dt' (and with ``precomputed_dt`` the cumsum and the tile record); scores kept in shared memory are
    multi-buffered too), to pick a tile that fits. Without ``precomputed_dt`` the scan's two buffers are fixed."""
    per_stage = block_L * (dim_block + 2 * dstate) * io_bytes + block_L * 4
    if scores_in_shared:
        per_stage += block_L * block_L * io_bytes
    fixed = (dstate + block_L) * dim_block * io_bytes
    if narrow_p:  # the transposed x tile (x, then x weighted) beside the output tile
        fixed += block_L * dim_block * io_bytes
    if precomputed_dt:
        per_stage += block_L * 4 * (3 if decay_rows else 1) + META_WIDTH * 4
    else:
        fixed += 2 * max(block_L, threads) * 4
    return num_stages * per_stage + fixed


def ssd_runs_kernel(
    *,
    seq_idx_dtype: str = "int32",
    last_dtype: str = "int32",
    fsi_dtype: str = "int32",
    use_final_indices: bool = False,
    threads: int = 1024,
):
    """Run bounds and chunk -> state row map (see the module doc). Inputs ``seq_idx [nchunks]``,
    ``last_chunk_indices [batch]``, ``final_state_indices [batch]`` (read only with ``use_final_indices``);
    outputs ``bounds [batch + 1]`` int32 and ``dest [nchunks]`` int32."""
    import tilelang.language as T

    nchunks = T.dynamic("nchunks")
    batch = T.dynamic("batch")
    batch1 = T.dynamic("batch1")
    fsi_len = T.dynamic("fsi_len")

    runs_body = _runs_macro(threads, use_final_indices)

    @T.prim_func
    def runs(
        seq_idx: T.Tensor((nchunks,), seq_idx_dtype),
        last_chunk_indices: T.Tensor((batch,), last_dtype),
        final_state_indices: T.Tensor((fsi_len,), fsi_dtype),
        bounds: T.Tensor((batch1,), "int32"),
        dest: T.Tensor((nchunks,), "int32"),
    ):
        with T.Kernel(1, threads=threads) as _bx:
            flags = T.alloc_shared((threads,), "int32")
            carry = T.alloc_shared((1,), "int32")
            runs_body(seq_idx, last_chunk_indices, final_state_indices, bounds, dest, flags, carry, nchunks, batch)

    return runs


def ssd_fused_kernel(
    *,
    heads: int,
    groups: int,
    dim: int,
    dstate: int,
    chunk_size: int,
    io_dtype: str = "bfloat16",
    state_dtype: str = "float32",
    init_dtype: str = "float32",
    dt_dtype: str = "float32",
    dt_bias_dtype: str = "float32",
    D_dtype: str = "float32",
    cu_dtype: str = "int32",
    seq_idx_dtype: str = "int32",
    has_dt_bias: bool = True,
    dt_softplus: bool = True,
    dt_min: float = 0.0,
    dt_max: float = math.inf,
    has_D: bool = True,
    D_per_dim: bool = False,
    intermediate: bool = False,
    block_P: int = 64,
    block_L: int = 128,
    threads: int = 256,
    num_stages: int = 2,
    scores_in_shared: bool = False,
    precomputed_dt: bool = False,
    lean: bool = False,
    decay_rows: bool = False,
    narrow_p: bool = False,
    overlap: bool = False,
    heads_per_cta: int = 1,
    preload: bool = False,
    prefetch: bool = False,
    deferred_store: bool = False,
):
    """The fused SSD prefill kernel (see the module doc).

    ``lean`` trims the per-tile instruction stream that Nsight Compute and the SASS show dominating the tile
    (semantics unchanged): the entering-state, z and chunk-end tests become one uniform branch per tile instead
    of one per element (``dest[c]`` is read once into a register), and a tile whose rows are all valid stores
    its output with one TMA store instead of 32 predicated scalar stores per thread (``out`` must then be
    TMA-compatible: 16-byte aligned base and row strides).

    ``narrow_p`` serves a ``block_P`` that is not a multiple of 64 (e.g. a head dim of 80): the three GEMMs whose
    N dimension is ``block_P`` (``C·state``, ``S x``, ``Bᵀ x``) take their B operand K-major (the state, x and the
    weighted x transposed into shared memory by the consumers), because TileLang 0.1.15 has no canonical
    MN-major wgmma layout for such a width; with a multiple of 64 the operands stay as loaded.

    ``overlap`` (lean with ``decay_rows``, a ``block_P`` multiple of 64) issues the tile's GEMMs in two
    back-to-back pairs with one wait each: ``C·state`` then ``C Bᵀ``; ``S x``, then the x weighting and the
    state decay on the CUDA cores while it runs, then the end-state GEMM (before the epilogue). Each
    asynchronous GEMM completes before any shared buffer it reads is released to the producer or rewritten:
    TileLang releases a pipelined buffer right after the last GEMM that reads it in program order, whatever
    that GEMM's wait, so the mask cannot run under ``C·state`` (``C_s`` would be released early) nor the
    epilogue under the end-state GEMM (``B_s``, and the output tile is ``xw_s``'s buffer). Same arithmetic.

    ``heads_per_cta`` > 1 (lean): one CTA per (P block, group of that many consecutive heads, sequence) walks the
    sequence's tiles once per head in one pipelined loop: the producer loads the next head's first tiles while
    the consumers finish the current head, and the grid has that many times fewer CTAs, so each CTA's start
    (pipeline fill, barrier setup) and the wave quantisation are paid less often. A head's first tile re-opens
    the state like any sequence start; its chunk ends write its own rows.

    ``preload`` (lean): the consumers load the CTA's first entering state (its first chunk always opens a run,
    so that is ``initial_states[seq_idx[bounds[b]]]``) before the pipelined loop, while the producer is still
    waiting for the first tiles' loads, instead of after the first tile has arrived: the two global-memory
    round trips of a CTA's start overlap instead of adding up. Later openings (more runs than CTAs, or a head
    change with ``heads_per_cta``) load in the loop as before. Same arithmetic.

    ``prefetch`` (lean, with initial states): where a CTA opens sequence ``s`` it also asks L2 for the entering
    state of sequence ``s + 1`` (one ``prefetch.global.L2`` per 128-byte line, spread over the consumer threads),
    which the same CTA opens next when it walks several sequences, and the CTA of the next sequence and the same
    head otherwise; that state's load then waits on L2 instead of DRAM. A hint: a ``seq_idx`` that opens
    sequences out of order only makes it useless. Same arithmetic.

    ``deferred_store`` (lean): a full tile's TMA store of the output is issued without waiting for it to have
    read the shared output tile; the wait (``cp.async.bulk.wait_group.read``, a no-op in every thread but the
    one that issued the store) comes right before that buffer's next write (with ``overlap``: the next tile's x
    weighting, after its first three GEMMs) and once after the loop. Without it the issuing thread waits right
    after the store, and the other consumer warps wait for it at the next tile's first barrier. Same arithmetic.

    ``bounds`` may be a strided view of the runs table (``bounds[::k]`` when k divides the batch): CTA ``b``
    then walks the runs of k consecutive sequences in one pipelined loop, re-opening the state at each (the
    launcher's sequences-per-CTA choice; a runtime stride, so no other kernel). The producer loads the next
    sequence's first tiles while the consumers finish the current one, and the grid has k times fewer CTAs; the
    CTAs in flight stay on neighbouring heads of the same sequences.

    ``decay_rows`` (with ``precomputed_dt``) takes the pre-pass's four rows (``ssd_dt_kernel(decay_rows=True)``):
    the cumsum already in log2 units and the per-row factors ``exp(dA_last - dA_k) dt'_k`` and ``exp(dA_m)``, so
    the x weighting, the ``C·state`` scaling and the state decay need no ``exp2`` per element.

    With ``precomputed_dt`` the per-tile ``dt'``, its cumsum and the tile's bounds come from
    :func:`ssd_dt_kernel` (``dtA``, ``tmeta``), loaded by the producer warpgroup with the x/B/C tiles: the
    consumers start a tile with no global load, no softplus and no scan. Otherwise ``dtA`` / ``tmeta`` may be
    1-row dummies and are never read.

    Arguments in order: ``x [T, H, P]``, ``dt [T, H]``, ``A [H]`` fp32, ``B, C [T, G, N]``,
    ``cu_chunk_seqlens [nchunks + 1]``, ``seq_idx [nchunks]``, ``bounds [batch + 1]``, ``dest [nchunks]``,
    ``dt_bias [H]``, ``D [H]`` or ``[H, P]``, ``z [Tz, H, P]``, ``initial_states [Bi, H, P, N]``,
    ``out [T, H, P]``, ``states_out [S, H, P, N]``, ``flags`` (``FLAG_Z | FLAG_INIT``: z and the
    initial states are runtime options). Unused optional inputs are still passed (any tensor of
    the declared form; a 1-row dummy works) and never read.
    """
    H, G, P, N, L = heads, groups, dim, dstate, chunk_size
    if H % G:
        raise ValueError(f"heads ({H}) must be a multiple of groups ({G})")
    if P % block_P:
        raise ValueError(f"block_P ({block_P}) must divide dim ({P})")
    if L % block_L:
        raise ValueError(f"block_L ({block_L}) must divide chunk_size ({L})")
    if block_P % 16:
        raise ValueError(f"block_P ({block_P}) must be a multiple of 16")
    if block_P % 64 and not narrow_p:
        raise ValueError(f"block_P ({block_P}) not a multiple of 64 needs narrow_p (K-major B operands)")
    if decay_rows and not precomputed_dt:
        raise ValueError("decay_rows needs precomputed_dt (the rows come from ssd_dt_kernel)")
    if overlap and not (lean and decay_rows and not narrow_p):
        raise ValueError("overlap needs lean and decay_rows, and a block_P that is a multiple of 64")
    if preload and not lean:
        raise ValueError("preload needs lean (the entering state behind one uniform branch per tile)")
    if prefetch and not lean:
        raise ValueError("prefetch needs lean (the entering state behind one uniform branch per tile)")
    if deferred_store and not lean:
        raise ValueError("deferred_store needs lean (the only design whose full tiles leave by TMA store)")
    HPC = heads_per_cta
    if HPC < 1 or H % HPC or (HPC > 1 and not (lean and precomputed_dt)):
        raise ValueError(f"heads_per_cta ({HPC}) must divide heads ({H}); more than 1 needs lean")
    import tilelang.language as T  # (after the argument checks: they need no toolchain)

    DTR = 4 if decay_rows else 2  # rows per (tile, head) of the pre-pass output
    rep = H // G
    n_pb = P // block_P
    S = L // block_L
    BP, BL = block_P, block_L
    accum = "float32"
    dtp = functools.partial(dt_prime, T, has_dt_bias=has_dt_bias, dt_softplus=dt_softplus, dt_min=dt_min, dt_max=dt_max)

    T_ = T.dynamic("T")
    nchunks = T.dynamic("nchunks")
    nchunks1 = T.dynamic("nchunks1")
    batch1 = T.dynamic("batch1")
    Tz = T.dynamic("Tz")
    Bi = T.dynamic("Bi")
    So = T.dynamic("So")
    nvt = T.dynamic("nvt")
    # Row strides are runtime values: x/B/C (and z, out) may be row views of one packed projection buffer,
    # dt a column slice, the state pool a strided view (vLLM's pages); inner dims stay dense.
    x_rs, x_hs, dt_rs, b_rs, b_gs, c_rs, c_gs = T.dynamic("x_rs, x_hs, dt_rs, b_rs, b_gs, c_rs, c_gs")
    z_rs, z_hs, o_rs, o_hs, i_bs, s_bs = T.dynamic("z_rs, z_hs, o_rs, o_hs, i_bs, s_bs")
    # bounds may be a strided view (every k-th entry): CTA b then walks the runs of k sequences in one loop
    bnd_s = T.dynamic("bnd_s")
    D_shape = (H, P) if D_per_dim else (H,)
    # Scores feeding wgmma from registers need the row-split (FullRow) layout; from shared memory any.
    policy = T.GemmWarpPolicy.Square if scores_in_shared else T.GemmWarpPolicy.FullRow
    # The scan runs over every consumer thread (a subset would need non-uniform partial barriers).
    SCAN = max(BL, threads)
    scan_offsets = [1 << i for i in range(int(math.log2(SCAN)))]

    init_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[init_dtype]
    per_line = 128 // init_bytes  # values per 128-byte line (N is a multiple of it)
    n_lines = BP * N // per_line

    prelude = PREFETCH_L2_SRC if prefetch else None  # (the device function the prefetch calls)

    @T.macro
    def prefetch_next_init(initial_states, nxt, hh, p0):
        # the [block_P, N] block of initial_states[nxt, hh] (contiguous rows), one line per consumer thread
        if nxt < Bi:
            tx = T.get_thread_binding() % threads
            for it in T.serial(T.ceildiv(n_lines, threads)):
                e = (it * threads + tx) * per_line
                if e < BP * N:
                    T.call_extern(
                        "handle", "mate_prefetch_l2", T.address_of(initial_states[nxt, hh, p0 + e // N, e % N])
                    )

    @T.prim_func
    def fused(
        x: T.StridedTensor((T_, H, P), (x_rs, x_hs, 1), io_dtype),
        dt: T.StridedTensor((T_, H), (dt_rs, 1), dt_dtype),
        A: T.Tensor((H,), "float32"),
        B: T.StridedTensor((T_, G, N), (b_rs, b_gs, 1), io_dtype),
        C: T.StridedTensor((T_, G, N), (c_rs, c_gs, 1), io_dtype),
        cu_chunk_seqlens: T.Tensor((nchunks1,), cu_dtype),
        seq_idx: T.Tensor((nchunks,), seq_idx_dtype),
        bounds: T.StridedTensor((batch1,), (bnd_s,), "int32"),
        dest: T.Tensor((nchunks,), "int32"),
        dt_bias: T.Tensor((H,), dt_bias_dtype),
        D: T.Tensor(D_shape, D_dtype),
        z: T.StridedTensor((Tz, H, P), (z_rs, z_hs, 1), io_dtype),
        initial_states: T.StridedTensor((Bi, H, P, N), (i_bs, P * N, N, 1), init_dtype),
        out: T.StridedTensor((T_, H, P), (o_rs, o_hs, 1), io_dtype),
        states_out: T.StridedTensor((So, H, P, N), (s_bs, P * N, N, 1), state_dtype),
        dtA: T.Tensor((nvt, H, DTR, BL), accum),
        tmeta: T.Tensor((nvt, META_WIDTH), "int32"),
        flags: T.int32,
    ):
        with T.Kernel(n_pb, H // HPC, batch1 - 1, threads=threads, prelude=prelude) as (pb, h, b):
            x_s = T.alloc_shared((BL, BP), io_dtype)
            B_s = T.alloc_shared((BL, N), io_dtype)
            C_s = T.alloc_shared((BL, N), io_dtype)
            y_s = T.alloc_shared((BL, BP), io_dtype)
            if narrow_p:
                # K-major B operands: x transposed (then x weighted, for the state update) and the state
                xt_s = T.alloc_shared((BP, BL), io_dtype)
                st_s = T.alloc_shared((BP, N), io_dtype)
            else:
                # One buffer serves the output tile (epilogue) and then x weighted for the state update.
                xw_s = y_s
                st_s = T.alloc_shared((N, BP), io_dtype)
            dt_sh = T.alloc_shared((BL,), accum)
            if precomputed_dt:
                dA_pre = T.alloc_shared((BL,), accum)
                meta_s = T.alloc_shared((META_WIDTH,), "int32")
                if decay_rows:
                    wx_s = T.alloc_shared((BL,), accum)
                    wy_s = T.alloc_shared((BL,), accum)
            else:
                dA_sh = T.alloc_shared((SCAN,), accum)
                dA_tmp = T.alloc_shared((SCAN,), accum)

            state = T.alloc_fragment((N, BP), accum)
            cb = T.alloc_fragment((BL, BL), accum)
            if scores_in_shared:
                cb_c = T.alloc_shared((BL, BL), io_dtype)
            else:
                cb_c = T.alloc_fragment((BL, BL), io_dtype)
            y = T.alloc_fragment((BL, BP), accum)
            if not precomputed_dt:
                dt_f = T.alloc_fragment((BL,), accum)
            if lean:
                d_row = T.alloc_local((1,), "int32")

            g = h // rep
            has_z = (flags & FLAG_Z) != 0
            has_init = (flags & FLAG_INIT) != 0
            p0 = pb * BP
            c_first = bounds[b]
            n_tiles = (bounds[b + 1] - c_first) * S
            a_h = A[h]

            T.clear(state)
            if preload:
                # the first entering state, under the producer's first loads (the loop skips it at j == 0)
                if n_tiles > 0:
                    if has_init:
                        sq_first = T.Cast("int32", seq_idx[c_first])
                        for n, p in T.Parallel(N, BP):
                            state[n, p] = T.Cast(accum, initial_states[sq_first, h * HPC, p0 + p, n])
                        if prefetch:
                            prefetch_next_init(initial_states, sq_first + 1, h * HPC, p0)
            for j in T.Pipelined(n_tiles * HPC if HPC > 1 else n_tiles, num_stages=num_stages):
                if HPC > 1:
                    # the CTA's heads one after the other, each over the sequence's tiles
                    hh = h * HPC + j // n_tiles
                    gg = hh // rep
                    c = c_first + (j % n_tiles) // S
                else:
                    hh, gg = h, g
                    c = c_first + j // S
                sub = j % S
                s0 = T.Cast("int32", cu_chunk_seqlens[c]) + sub * BL
                n_valid = T.Cast("int32", cu_chunk_seqlens[c + 1]) - s0

                T.copy(x[s0 : s0 + BL, hh, p0 : p0 + BP], x_s)
                T.copy(B[s0 : s0 + BL, gg, 0:N], B_s)
                T.copy(C[s0 : s0 + BL, gg, 0:N], C_s)
                if precomputed_dt:
                    vt = c * S + sub
                    T.copy(dtA[vt, hh, 0, 0:BL], dA_pre)
                    T.copy(dtA[vt, hh, 1, 0:BL], dt_sh)
                    if decay_rows:
                        T.copy(dtA[vt, hh, 2, 0:BL], wx_s)
                        T.copy(dtA[vt, hh, 3, 0:BL], wy_s)
                    T.copy(tmeta[vt, 0:META_WIDTH], meta_s)
                    s0 = meta_s[0]
                    n_valid = meta_s[1]
                    dA_cs = dA_pre
                    opens = T.if_then_else(meta_s[2] >= 0, 1, 0)
                    sq = meta_s[2]
                else:
                    # Stage 1: dt' and the within-tile cumsum of A * dt' (zero past the chunk's end).
                    for i in T.Parallel(BL):
                        raw = T.if_then_else(i < n_valid, T.Cast(accum, dt[s0 + i, h]), T.float32(0))
                        dt_f[i] = T.if_then_else(i < n_valid, dtp(raw, T.Cast(accum, dt_bias[h])), T.float32(0))
                    T.copy(dt_f, dt_sh)
                    for i in T.Parallel(SCAN):
                        dA_sh[i] = T.if_then_else(i < BL, dt_sh[i] * a_h, T.float32(0))
                    # Inclusive scan (Hillis-Steele, ping-pong in shared memory). T.cumsum is not used: its
                    # CUDA template scans with threads 0-31 only, which are producer threads under warp
                    # specialisation.
                    src_buf, dst_buf = dA_sh, dA_tmp
                    for off in scan_offsets:
                        for i in T.Parallel(SCAN):
                            dst_buf[i] = src_buf[i] + T.if_then_else(i >= off, src_buf[i - off], T.float32(0))
                        src_buf, dst_buf = dst_buf, src_buf
                    dA_cs = src_buf
                    # A chunk opening a sequence starts from its initial state (or zero).
                    opens = T.if_then_else(
                        sub == 0,
                        T.if_then_else(c == 0, 1, T.if_then_else(seq_idx[c] != seq_idx[c - 1], 1, 0)),
                        0,
                    )
                    sq = T.Cast("int32", seq_idx[c])

                if lean and not intermediate:
                    # the chunk end's output row, loaded at the tile's start so its latency hides behind the tile
                    # (one load and one uniform test per chunk end: a let-bound load is re-issued per element)
                    d_row[0] = dest[c]
                # Entering state.
                if preload:
                    opens = T.if_then_else(j > 0, opens, 0)  # the first one was loaded before the loop
                if lean:
                    if opens == 1:
                        if has_init:
                            for n, p in T.Parallel(N, BP):
                                state[n, p] = T.Cast(accum, initial_states[sq, hh, p0 + p, n])
                            if prefetch:
                                prefetch_next_init(initial_states, sq + 1, hh, p0)
                        else:
                            T.clear(state)
                else:
                    for n, p in T.Parallel(N, BP):
                        state[n, p] = T.if_then_else(
                            opens == 1,
                            T.if_then_else(has_init, T.Cast(accum, initial_states[sq, hh, p0 + p, n]), T.float32(0)),
                            state[n, p],
                        )
                # Stages 4-5, inter-chunk part: y = exp(dA_m) * C_m . state; stage 4: C B^T.
                if overlap:
                    # issued back to back, one wait (the second GEMM's) for both
                    T.copy(state, st_s)
                    T.gemm(C_s, st_s, y, clear_accum=True, policy=policy, annotations=NO_WAIT)
                    T.gemm(C_s, B_s, cb, transpose_B=True, clear_accum=True, policy=policy)
                    for m, p in T.Parallel(BL, BP):
                        y[m, p] = y[m, p] * wy_s[m]
                else:
                    if narrow_p:
                        for p, n in T.Parallel(BP, N):
                            st_s[p, n] = state[n, p]
                        T.gemm(C_s, st_s, y, transpose_B=True, clear_accum=True, policy=policy)
                    else:
                        T.copy(state, st_s)
                        T.gemm(C_s, st_s, y, clear_accum=True, policy=policy)
                    for m, p in T.Parallel(BL, BP):
                        if decay_rows:
                            y[m, p] = y[m, p] * wy_s[m]
                        else:
                            y[m, p] = y[m, p] * T.exp2(dA_cs[m] * LOG2E)
                    T.gemm(C_s, B_s, cb, transpose_B=True, clear_accum=True, policy=policy)

                # The causal decay mask and dt' weights.
                if lean:
                    # No branch around the loads (so the compiler can reuse the per-row / per-column values): a
                    # 0/1 factor lo masks the upper triangle and zeroes its exponent there (exp2(0) stays finite
                    # whatever the decay); the causal part keeps its exact exponent.
                    for m, k in T.Parallel(BL, BL):
                        lo = T.Cast(accum, k <= m)
                        ex = (dA_cs[m] - dA_cs[k]) * lo
                        if not decay_rows:  # with the decay rows the cumsum is already in log2 units
                            ex = ex * LOG2E
                        cb_c[m, k] = cb[m, k] * T.exp2(ex) * (dt_sh[k] * lo)
                else:
                    for m, k in T.Parallel(BL, BL):
                        cb_c[m, k] = T.if_then_else(
                            k <= m, cb[m, k] * T.exp2((dA_cs[m] - dA_cs[k]) * LOG2E) * dt_sh[k], T.float32(0)
                        )
                # Stage 5: intra-chunk scan.
                if narrow_p:
                    for p, k in T.Parallel(BP, BL):
                        xt_s[p, k] = x_s[k, p]
                    T.gemm(cb_c, xt_s, y, transpose_B=True, policy=policy)
                elif overlap:
                    # S x runs under the x weighting and the state decay; the end-state GEMM's wait covers both
                    # (it runs before the epilogue: the epilogue's output tile shares xw_s's buffer)
                    T.gemm(cb_c, x_s, y, policy=policy, annotations=NO_WAIT)
                    if deferred_store:
                        T.tma_store_wait()  # the previous tile's output store has read this buffer
                    for k, p in T.Parallel(BL, BP):
                        xw_s[k, p] = x_s[k, p] * wx_s[k]
                    for n, p in T.Parallel(N, BP):
                        state[n, p] = state[n, p] * wy_s[BL - 1]
                    T.gemm(B_s, xw_s, state, transpose_A=True)
                else:
                    T.gemm(cb_c, x_s, y, policy=policy)

                # Epilogue: D x, silu(z), store the valid rows. Each step updates the accumulator fragment in
                # place: a loop that reads global memory (z) and writes shared memory would be taken for a
                # producer copy by the warp-specialisation pass and moved out of the consumer.
                if has_D:
                    for m, p in T.Parallel(BL, BP):
                        if D_per_dim:
                            y[m, p] = y[m, p] + T.Cast(accum, D[hh, p0 + p]) * T.Cast(accum, x_s[m, p])
                        else:
                            y[m, p] = y[m, p] + T.Cast(accum, D[hh]) * T.Cast(accum, x_s[m, p])
                if lean:
                    if has_z:
                        # rows past the valid ones read a clamped, in-bounds row and are never stored
                        for m, p in T.Parallel(BL, BP):
                            zv = T.Cast(accum, z[T.min(s0 + m, Tz - 1), hh, p0 + p])
                            y[m, p] = y[m, p] * zv / (1.0 + T.exp2(-zv * LOG2E))
                else:
                    for m, p in T.Parallel(BL, BP):
                        zv = T.if_then_else(
                            has_z,
                            T.if_then_else(m < n_valid, T.Cast(accum, z[s0 + m, hh, p0 + p]), T.float32(0)),
                            T.float32(0),
                        )
                        y[m, p] = T.if_then_else(has_z, y[m, p] * zv / (1.0 + T.exp2(-zv * LOG2E)), y[m, p])
                if deferred_store and narrow_p:
                    T.tma_store_wait()  # y_s's next write (elsewhere y_s is xw_s: its writes above/below wait)
                T.copy(y, y_s)
                if lean:
                    if n_valid >= BL:
                        # every row belongs to this chunk: one TMA store
                        if deferred_store:
                            T.tma_copy(y_s, out[s0 : s0 + BL, hh, p0 : p0 + BP])
                        else:
                            T.copy(y_s, out[s0 : s0 + BL, hh, p0 : p0 + BP])
                    else:
                        # the rows past the chunk's end belong to the next chunk (maybe another CTA's)
                        for m, p in T.Parallel(BL, BP):
                            if m < n_valid:
                                out[s0 + m, hh, p0 + p] = y_s[m, p]
                else:
                    for m, p in T.Parallel(BL, BP):
                        if m < n_valid:
                            out[s0 + m, hh, p0 + p] = y_s[m, p]

                # State update: state = exp(dA_last) state + B^T (x * exp(dA_last - dA_k) dt'_k) (with overlap:
                # done before the epilogue).
                if narrow_p:  # written transposed (K-major for the GEMM below)
                    for p, k in T.Parallel(BP, BL):
                        if decay_rows:
                            xt_s[p, k] = x_s[k, p] * wx_s[k]
                        else:
                            xt_s[p, k] = x_s[k, p] * T.exp2((dA_cs[BL - 1] - dA_cs[k]) * LOG2E) * dt_sh[k]
                elif not overlap:
                    if deferred_store:
                        T.tma_store_wait()  # this tile's output store has read the buffer
                    for k, p in T.Parallel(BL, BP):
                        if decay_rows:
                            xw_s[k, p] = x_s[k, p] * wx_s[k]
                        else:
                            xw_s[k, p] = x_s[k, p] * T.exp2((dA_cs[BL - 1] - dA_cs[k]) * LOG2E) * dt_sh[k]
                if not overlap:
                    for n, p in T.Parallel(N, BP):
                        if decay_rows:
                            state[n, p] = state[n, p] * wy_s[BL - 1]
                        else:
                            state[n, p] = state[n, p] * T.exp2(dA_cs[BL - 1] * LOG2E)
                    if narrow_p:
                        T.gemm(B_s, xt_s, state, transpose_A=True, transpose_B=True)
                    else:
                        T.gemm(B_s, xw_s, state, transpose_A=True)

                # Chunk end: report the end state where asked.
                if sub == S - 1:
                    if intermediate:
                        for n, p in T.Parallel(N, BP):
                            states_out[c, hh, p0 + p, n] = state[n, p]
                    elif lean:
                        if d_row[0] >= 0:
                            for n, p in T.Parallel(N, BP):
                                states_out[d_row[0], hh, p0 + p, n] = state[n, p]
                    else:
                        d = dest[c]
                        if d >= 0:
                            for n, p in T.Parallel(N, BP):
                                states_out[d, hh, p0 + p, n] = state[n, p]
            if deferred_store:
                T.tma_store_wait()  # the last tile's store has read shared memory before the CTA exits

    return fused


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
    decay_rows: bool = False,
    heads_per_cta: int = 1,
    with_runs: bool = False,
    last_dtype: str = "int32",
    fsi_dtype: str = "int32",
    use_final_indices: bool = False,
):
    """The per-tile ``dt'`` pre-pass of :func:`ssd_fused_kernel` with ``precomputed_dt``: one CTA of ``block_L``
    threads per (tile ``v = c * chunk_size / block_L + sub``, head). Writes

    - ``dtA[v, h, 0, :]`` the inclusive cumsum of ``A[h] dt'`` over the tile, ``dtA[v, h, 1, :]`` ``dt'`` itself,
      ``dt' = clamp(softplus(dt + dt_bias), lo, hi)`` and zero past the chunk's end;
    - ``tmeta[v] = (first token, valid tokens, seq_idx[c] if the tile opens a sequence else -1, 0)``;
    - with ``decay_rows`` (the fused kernel's ``decay_rows``): row 0 holds the cumsum times log2(e), row 2
      ``exp(dA_last - dA_k) dt'_k`` (the end-state weight of token k), row 3 ``exp(dA_m)``;

    Inputs: ``dt [T, H]`` (any row stride), ``A [H]`` fp32, ``dt_bias [H]``, ``cu_chunk_seqlens [nchunks + 1]``,
    ``seq_idx [nchunks]``; outputs ``dtA [nchunks * S, H, 2 or 4, block_L]`` fp32,
    ``tmeta [nchunks * S, META_WIDTH]`` int32.
    Fully parallel: it takes the loads, softplus and scan off the fused kernel's serial per-tile path.

    ``heads_per_cta`` > 1: one CTA per (tile, group of that many heads): each thread reads its token's
    ``heads_per_cta`` consecutive ``dt`` values (one 32-byte sector at 8 fp32 heads, where one head per CTA
    uses 4 bytes of each sector it fetches) and the heads' scans share the barriers.

    ``with_runs``: one more CTA (the grid's last row of tiles, first head group) computes what
    :func:`ssd_runs_kernel` computes (``bounds``, ``dest``; with ``block_L`` threads) while the others do the
    tiles, so a call launches two kernels instead of three and the runs table costs no serial time of its own.
    Extra arguments after ``tmeta``: ``last_chunk_indices [batch]``, ``final_state_indices [fsi_len]``,
    ``bounds [batch + 1]``, ``dest [nchunks]``."""
    H, L, BL = heads, chunk_size, block_L
    if L % BL:
        raise ValueError(f"block_L ({BL}) must divide chunk_size ({L})")
    if heads_per_cta < 1 or H % heads_per_cta:
        raise ValueError(f"heads_per_cta ({heads_per_cta}) must divide heads ({H})")
    HB = heads_per_cta
    import tilelang.language as T

    S = L // BL
    DTR = 4 if decay_rows else 2
    accum = "float32"
    dtp = functools.partial(dt_prime, T, has_dt_bias=has_dt_bias, dt_softplus=dt_softplus, dt_min=dt_min, dt_max=dt_max)
    scan_offsets = [1 << i for i in range(int(math.log2(BL)))]
    tile_meta = _tile_meta_macro()

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
        s0 = T.Cast("int32", cu_chunk_seqlens[c]) + sub * BL
        n_valid = T.Cast("int32", cu_chunk_seqlens[c + 1]) - s0
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
            if decay_rows:
                a = src_buf[i] * LOG2E
                dtA[vt, h, 0, i] = a
                dtA[vt, h, 2, i] = T.exp2(src_buf[BL - 1] * LOG2E - a) * v
                dtA[vt, h, 3, i] = T.exp2(a)
            else:
                dtA[vt, h, 0, i] = src_buf[i]
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
                if decay_rows:
                    a = src_buf[j, i] * LOG2E
                    dtA[vt, h0 + j, 0, i] = a
                    dtA[vt, h0 + j, 2, i] = T.exp2(src_buf[j, BL - 1] * LOG2E - a) * v[j]
                    dtA[vt, h0 + j, 3, i] = T.exp2(a)
                else:
                    dtA[vt, h0 + j, 0, i] = src_buf[j, i]
        if h == 0:
            if i == 0:
                tile_meta(tmeta, seq_idx, vt, c, sub, s0, n_valid)

    # Two signatures (a prim_func's parameters are parsed from its def, so the shared ones are written twice);
    # one tile body.
    if not with_runs:

        @T.prim_func
        def dtpass(
            dt: T.StridedTensor((T_, H), (dt_rs, 1), dt_dtype),
            A: T.Tensor((H,), "float32"),
            dt_bias: T.Tensor((H,), dt_bias_dtype),
            cu_chunk_seqlens: T.Tensor((nchunks1,), cu_dtype),
            seq_idx: T.Tensor((nchunks,), seq_idx_dtype),
            dtA: T.Tensor((nvt, H, DTR, BL), accum),
            tmeta: T.Tensor((nvt, META_WIDTH), "int32"),
        ):
            with T.Kernel(nchunks * S, H // HB, threads=BL) as (vt, h):
                tile(dt, A, dt_bias, cu_chunk_seqlens, seq_idx, dtA, tmeta, vt, h)

        return dtpass

    batch = T.dynamic("batch")
    batch1 = T.dynamic("batch1")
    fsi_len = T.dynamic("fsi_len")
    runs_body = _runs_macro(BL, use_final_indices)

    @T.prim_func
    def dtpass_runs(
        dt: T.StridedTensor((T_, H), (dt_rs, 1), dt_dtype),
        A: T.Tensor((H,), "float32"),
        dt_bias: T.Tensor((H,), dt_bias_dtype),
        cu_chunk_seqlens: T.Tensor((nchunks1,), cu_dtype),
        seq_idx: T.Tensor((nchunks,), seq_idx_dtype),
        dtA: T.Tensor((nvt, H, DTR, BL), accum),
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


def _runs_macro(threads: int, use_final_indices: bool):
    """The runs computation (``bounds``, ``dest``: see :func:`ssd_runs_kernel`) for one CTA of ``threads``
    threads, with its ``flags [threads]`` / ``carry [1]`` int32 shared buffers; one rule for the runs kernel and
    the dt pre-pass that can carry it (``ssd_dt_kernel(with_runs=True)``)."""
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


def _tile_meta_macro():
    """The pre-pass's ``tmeta[vt]`` record (first token, valid tokens, the sequence a tile opens or -1), one rule
    for both pre-pass kernels (written by one thread of the tile's first CTA)."""
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
