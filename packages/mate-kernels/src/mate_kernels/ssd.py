"""TileLang kernel factories for the SSD varlen prefill (Mamba2 chunked scan over a packed batch).

Two kernels serve one call:

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
import math

LOG2E = 1.4426950408889634
FLAG_Z = 1  # runtime flags of the fused kernel
FLAG_INIT = 2


def fused_smem_bytes(
    *,
    dim_block: int,
    dstate: int,
    block_L: int,
    io_bytes: int,
    num_stages: int,
    threads: int = 256,
    scores_in_shared: bool = False,
) -> int:
    """Dynamic shared memory of the fused kernel (TileLang multi-buffers the tiles the pipelined loop loads:
    x, B, C, dt'; scores kept in shared memory are multi-buffered too), to pick a tile that fits."""
    per_stage = block_L * (dim_block + 2 * dstate) * io_bytes + block_L * 4
    if scores_in_shared:
        per_stage += block_L * block_L * io_bytes
    fixed = (dstate + block_L) * dim_block * io_bytes + 2 * max(block_L, threads) * 4
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
):
    """The fused SSD prefill kernel (see the module doc).

    Arguments in order: ``x [T, H, P]``, ``dt [T, H]``, ``A [H]`` fp32, ``B, C [T, G, N]``,
    ``cu_chunk_seqlens [nchunks + 1]``, ``seq_idx [nchunks]``, ``bounds [batch + 1]``, ``dest [nchunks]``,
    ``dt_bias [H]``, ``D [H]`` or ``[H, P]``, ``z [Tz, H, P]``, ``initial_states [Bi, H, P, N]``,
    ``out [T, H, P]``, ``states_out [S, H, P, N]``, ``flags`` (``FLAG_Z | FLAG_INIT``: z and the
    initial states are runtime options). Unused optional inputs are still passed (any tensor of
    the declared form; a 1-row dummy works) and never read.
    """
    import tilelang.language as T

    H, G, P, N, L = heads, groups, dim, dstate, chunk_size
    if H % G:
        raise ValueError(f"heads ({H}) must be a multiple of groups ({G})")
    if P % block_P:
        raise ValueError(f"block_P ({block_P}) must divide dim ({P})")
    if L % block_L:
        raise ValueError(f"block_L ({block_L}) must divide chunk_size ({L})")
    rep = H // G
    n_pb = P // block_P
    S = L // block_L
    BP, BL = block_P, block_L
    accum = "float32"
    hi_finite = dt_max != math.inf
    lo_active = dt_min != -math.inf

    T_ = T.dynamic("T")
    nchunks = T.dynamic("nchunks")
    nchunks1 = T.dynamic("nchunks1")
    batch1 = T.dynamic("batch1")
    Tz = T.dynamic("Tz")
    Bi = T.dynamic("Bi")
    So = T.dynamic("So")
    # Row strides are runtime values: x/B/C (and z, out) may be row views of one packed projection buffer,
    # dt a column slice, the state pool a strided view (vLLM's pages); inner dims stay dense.
    x_rs, x_hs, dt_rs, b_rs, b_gs, c_rs, c_gs = T.dynamic("x_rs, x_hs, dt_rs, b_rs, b_gs, c_rs, c_gs")
    z_rs, z_hs, o_rs, o_hs, i_bs, s_bs = T.dynamic("z_rs, z_hs, o_rs, o_hs, i_bs, s_bs")
    D_shape = (H, P) if D_per_dim else (H,)
    # Scores feeding wgmma from registers need the row-split (FullRow) layout; from shared memory any.
    policy = T.GemmWarpPolicy.Square if scores_in_shared else T.GemmWarpPolicy.FullRow
    # The scan runs over every consumer thread (a subset would need non-uniform partial barriers).
    SCAN = max(BL, threads)
    scan_offsets = [1 << i for i in range(int(math.log2(SCAN)))]

    @T.prim_func
    def fused(
        x: T.StridedTensor((T_, H, P), (x_rs, x_hs, 1), io_dtype),
        dt: T.StridedTensor((T_, H), (dt_rs, 1), dt_dtype),
        A: T.Tensor((H,), "float32"),
        B: T.StridedTensor((T_, G, N), (b_rs, b_gs, 1), io_dtype),
        C: T.StridedTensor((T_, G, N), (c_rs, c_gs, 1), io_dtype),
        cu_chunk_seqlens: T.Tensor((nchunks1,), cu_dtype),
        seq_idx: T.Tensor((nchunks,), seq_idx_dtype),
        bounds: T.Tensor((batch1,), "int32"),
        dest: T.Tensor((nchunks,), "int32"),
        dt_bias: T.Tensor((H,), dt_bias_dtype),
        D: T.Tensor(D_shape, D_dtype),
        z: T.StridedTensor((Tz, H, P), (z_rs, z_hs, 1), io_dtype),
        initial_states: T.StridedTensor((Bi, H, P, N), (i_bs, P * N, N, 1), init_dtype),
        out: T.StridedTensor((T_, H, P), (o_rs, o_hs, 1), io_dtype),
        states_out: T.StridedTensor((So, H, P, N), (s_bs, P * N, N, 1), state_dtype),
        flags: T.int32,
    ):
        with T.Kernel(n_pb, H, batch1 - 1, threads=threads) as (pb, h, b):
            x_s = T.alloc_shared((BL, BP), io_dtype)
            B_s = T.alloc_shared((BL, N), io_dtype)
            C_s = T.alloc_shared((BL, N), io_dtype)
            # One buffer serves the output tile (epilogue) and then x weighted for the state update.
            y_s = T.alloc_shared((BL, BP), io_dtype)
            xw_s = y_s
            st_s = T.alloc_shared((N, BP), io_dtype)
            dt_sh = T.alloc_shared((BL,), accum)
            dA_sh = T.alloc_shared((SCAN,), accum)
            dA_tmp = T.alloc_shared((SCAN,), accum)

            state = T.alloc_fragment((N, BP), accum)
            cb = T.alloc_fragment((BL, BL), accum)
            if scores_in_shared:
                cb_c = T.alloc_shared((BL, BL), io_dtype)
            else:
                cb_c = T.alloc_fragment((BL, BL), io_dtype)
            y = T.alloc_fragment((BL, BP), accum)
            dt_f = T.alloc_fragment((BL,), accum)

            g = h // rep
            has_z = (flags & FLAG_Z) != 0
            has_init = (flags & FLAG_INIT) != 0
            p0 = pb * BP
            c_first = bounds[b]
            n_tiles = (bounds[b + 1] - c_first) * S
            a_h = A[h]

            T.clear(state)
            for j in T.Pipelined(n_tiles, num_stages=num_stages):
                c = c_first + j // S
                sub = j % S
                s0 = T.Cast("int32", cu_chunk_seqlens[c]) + sub * BL
                n_valid = T.Cast("int32", cu_chunk_seqlens[c + 1]) - s0

                T.copy(x[s0 : s0 + BL, h, p0 : p0 + BP], x_s)
                T.copy(B[s0 : s0 + BL, g, 0:N], B_s)
                T.copy(C[s0 : s0 + BL, g, 0:N], C_s)

                # Stage 1: dt' and the within-tile cumsum of A * dt' (zero past the chunk's end).
                for i in T.Parallel(BL):
                    v = T.if_then_else(i < n_valid, T.Cast(accum, dt[s0 + i, h]), T.float32(0))
                    if has_dt_bias:
                        v = v + T.Cast(accum, dt_bias[h])
                    if dt_softplus:
                        v = T.if_then_else(v > 20.0, v, T.log1p(T.exp(v)))
                    if hi_finite:
                        v = T.min(v, T.float32(dt_max))
                    if lo_active:
                        v = T.max(v, T.float32(dt_min))
                    v = T.if_then_else(i < n_valid, v, T.float32(0))
                    dt_f[i] = v
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

                # Entering state: a chunk opening a sequence starts from its initial state (or zero).
                opens = T.if_then_else(
                    sub == 0,
                    T.if_then_else(c == 0, 1, T.if_then_else(seq_idx[c] != seq_idx[c - 1], 1, 0)),
                    0,
                )
                sq = T.Cast("int32", seq_idx[c])
                for n, p in T.Parallel(N, BP):
                    state[n, p] = T.if_then_else(
                        opens == 1,
                        T.if_then_else(has_init, T.Cast(accum, initial_states[sq, h, p0 + p, n]), T.float32(0)),
                        state[n, p],
                    )
                T.copy(state, st_s)

                # Stages 4-5, inter-chunk part: y = exp(dA_m) * C_m . state.
                T.gemm(C_s, st_s, y, clear_accum=True, policy=policy)
                for m, p in T.Parallel(BL, BP):
                    y[m, p] = y[m, p] * T.exp2(dA_cs[m] * LOG2E)

                # Stage 4: C B^T, then the causal decay mask and dt' weights.
                T.gemm(C_s, B_s, cb, transpose_B=True, clear_accum=True, policy=policy)
                for m, k in T.Parallel(BL, BL):
                    cb_c[m, k] = T.if_then_else(
                        k <= m, cb[m, k] * T.exp2((dA_cs[m] - dA_cs[k]) * LOG2E) * dt_sh[k], T.float32(0)
                    )
                # Stage 5: intra-chunk scan.
                T.gemm(cb_c, x_s, y, policy=policy)

                # Epilogue: D x, silu(z), store the valid rows. Each step updates the accumulator fragment in
                # place: a loop that reads global memory (z) and writes shared memory would be taken for a
                # producer copy by the warp-specialisation pass and moved out of the consumer.
                if has_D:
                    for m, p in T.Parallel(BL, BP):
                        if D_per_dim:
                            y[m, p] = y[m, p] + T.Cast(accum, D[h, p0 + p]) * T.Cast(accum, x_s[m, p])
                        else:
                            y[m, p] = y[m, p] + T.Cast(accum, D[h]) * T.Cast(accum, x_s[m, p])
                for m, p in T.Parallel(BL, BP):
                    zv = T.if_then_else(
                        has_z,
                        T.if_then_else(m < n_valid, T.Cast(accum, z[s0 + m, h, p0 + p]), T.float32(0)),
                        T.float32(0),
                    )
                    y[m, p] = T.if_then_else(has_z, y[m, p] * zv / (1.0 + T.exp2(-zv * LOG2E)), y[m, p])
                T.copy(y, y_s)
                for m, p in T.Parallel(BL, BP):
                    if m < n_valid:
                        out[s0 + m, h, p0 + p] = y_s[m, p]

                # State update: state = exp(dA_last) state + B^T (x * exp(dA_last - dA_k) dt'_k).
                for k, p in T.Parallel(BL, BP):
                    xw_s[k, p] = x_s[k, p] * T.exp2((dA_cs[BL - 1] - dA_cs[k]) * LOG2E) * dt_sh[k]
                for n, p in T.Parallel(N, BP):
                    state[n, p] = state[n, p] * T.exp2(dA_cs[BL - 1] * LOG2E)
                T.gemm(B_s, xw_s, state, transpose_A=True)

                # Chunk end: report the end state where asked.
                if sub == S - 1:
                    if intermediate:
                        for n, p in T.Parallel(N, BP):
                            states_out[c, h, p0 + p, n] = state[n, p]
                    else:
                        d = dest[c]
                        if d >= 0:
                            for n, p in T.Parallel(N, BP):
                                states_out[d, h, p0 + p, n] = state[n, p]

    return fused


# ---------------------------------------------------------------------------------------------------------------
# Split variant: chunk-parallel local work (A), a sequential fp32 state hand-over (B), chunk-parallel output (C).
#
# Every chunk is cut into ``chunk_size // block_L`` tiles aligned to its start (the tail tiles of a short chunk
# are empty: dt' = 0), and tile ``t = c * S + sub`` is the unit of all three kernels. A tile boundary is a state
# hand-over like a chunk boundary, so the split is exact algebra:
#
#   y_m     = [S x]_m + D x_m + exp(dA_m) C_m · h_enter(t)          (dA: cumsum of A dt' from the tile's start)
#   h_end(t) = exp(dA_last) h_enter(t) + local(t),  local(t) = Bᵀ (x_k exp(dA_last - dA_k) dt'_k)
#
# A computes everything that does not depend on the entering state (dt', dA, C Bᵀ once per group and head
# block, ``S x + D x`` into ``out``, ``local`` and ``dA`` into workspaces); B walks each run's tiles in order
# doing only ``s = exp(dA_last) s + local`` in fp32 (writing the entering state of every tile in the io dtype,
# exactly what the fused kernel feeds its C·state wgmma, and the chunk-end states the call returns); C adds
# ``exp(dA_m) C · h_enter`` to ``out`` and applies silu(z).
# ---------------------------------------------------------------------------------------------------------------


def split_chunk_smem_bytes(*, dim_block: int, dstate: int, block_L: int, io_bytes: int, num_stages: int,
                           heads_per_cta: int = 8, scores_in_shared: bool = False) -> int:  # fmt: skip
    """Dynamic shared memory of the split variant's chunk kernel (B and C tiles once, x multi-buffered)."""
    fixed = 2 * block_L * dstate * io_bytes + block_L * dim_block * io_bytes + 3 * heads_per_cta * block_L * 4
    if scores_in_shared:
        fixed += block_L * block_L * io_bytes
    return fixed + num_stages * block_L * dim_block * io_bytes


def split_out_smem_bytes(*, dim_block: int, dstate: int, block_L: int, io_bytes: int, num_stages: int) -> int:
    """Dynamic shared memory of the split variant's output kernel (C tile and the output tile once; entering
    state, partial output, z and dA multi-buffered)."""
    per_stage = dim_block * dstate * io_bytes + 2 * block_L * dim_block * io_bytes + block_L * 4
    return block_L * dstate * io_bytes + block_L * dim_block * io_bytes + num_stages * per_stage


def ssd_chunk_kernel(
    *,
    heads: int,
    groups: int,
    dim: int,
    dstate: int,
    chunk_size: int,
    io_dtype: str = "bfloat16",
    dt_dtype: str = "float32",
    dt_bias_dtype: str = "float32",
    D_dtype: str = "float32",
    cu_dtype: str = "int32",
    local_dtype: str = "float32",
    has_dt_bias: bool = True,
    dt_softplus: bool = True,
    dt_min: float = 0.0,
    dt_max: float = math.inf,
    has_D: bool = True,
    D_per_dim: bool = False,
    block_L: int = 128,
    heads_per_cta: int = 8,
    block_P: int = 64,
    threads: int = 256,
    num_stages: int = 2,
    scores_in_shared: bool = False,
):
    """Split variant, kernel A: one CTA per (tile, block of ``heads_per_cta`` heads of one group).

    ``CB = C Bᵀ`` is computed once per CTA and reused for its heads; a pipelined loop over (head, P-block)
    then computes dt', the in-tile cumsum ``dA``, the masked scores ``S``, ``out = S x + D x`` (the partial
    output, in the io dtype: kernel C adds the inter-tile term), ``dA_ws[t, h, :] = dA`` and the tile-local end
    state ``local_ws[t, h] = Bᵀ (x exp(dA_last - dA_k) dt'_k)``.

    Arguments in order: ``x [T, H, P]``, ``dt [T, H]``, ``A [H]`` fp32, ``B, C [T, G, N]``,
    ``cu_chunk_seqlens [nchunks + 1]``, ``dt_bias [H]``, ``D [H]`` or ``[H, P]``, ``out [T, H, P]``,
    ``dA_ws [ntiles, H, block_L]`` fp32, ``local_ws [ntiles, H, P, N]`` (``ntiles = nchunks * chunk_size /
    block_L``: the grid).
    """
    import tilelang.language as T

    H, G, P, N, L = heads, groups, dim, dstate, chunk_size
    if H % G:
        raise ValueError(f"heads ({H}) must be a multiple of groups ({G})")
    rep = H // G
    if rep % heads_per_cta:
        raise ValueError(f"heads_per_cta ({heads_per_cta}) must divide heads per group ({rep})")
    if P % block_P:
        raise ValueError(f"block_P ({block_P}) must divide dim ({P})")
    if L % block_L:
        raise ValueError(f"block_L ({block_L}) must divide chunk_size ({L})")
    HB = heads_per_cta
    n_pb = P // block_P
    S = L // block_L
    BP, BL = block_P, block_L
    accum = "float32"
    hi_finite = dt_max != math.inf
    lo_active = dt_min != -math.inf

    T_ = T.dynamic("T")
    nchunks1 = T.dynamic("nchunks1")
    ntiles = T.dynamic("ntiles")
    x_rs, x_hs, dt_rs, b_rs, b_gs, c_rs, c_gs = T.dynamic("x_rs, x_hs, dt_rs, b_rs, b_gs, c_rs, c_gs")
    o_rs, o_hs = T.dynamic("o_rs, o_hs")
    D_shape = (H, P) if D_per_dim else (H,)
    # Scores feeding wgmma from registers need the row-split (FullRow) layout; a 64-token tile cannot split its
    # rows over two consumer warpgroups, so there the scores go through shared memory (any policy).
    policy = T.GemmWarpPolicy.Square if scores_in_shared else T.GemmWarpPolicy.FullRow
    scan_offsets = [1 << i for i in range(int(math.log2(BL)))]

    @T.prim_func
    def chunk(
        x: T.StridedTensor((T_, H, P), (x_rs, x_hs, 1), io_dtype),
        dt: T.StridedTensor((T_, H), (dt_rs, 1), dt_dtype),
        A: T.Tensor((H,), "float32"),
        B: T.StridedTensor((T_, G, N), (b_rs, b_gs, 1), io_dtype),
        C: T.StridedTensor((T_, G, N), (c_rs, c_gs, 1), io_dtype),
        cu_chunk_seqlens: T.Tensor((nchunks1,), cu_dtype),
        dt_bias: T.Tensor((H,), dt_bias_dtype),
        D: T.Tensor(D_shape, D_dtype),
        out: T.StridedTensor((T_, H, P), (o_rs, o_hs, 1), io_dtype),
        dA_ws: T.Tensor((ntiles, H, BL), accum),
        local_ws: T.Tensor((ntiles, H, P, N), local_dtype),
    ):
        with T.Kernel(H // HB, ntiles, threads=threads) as (hbk, t):
            B_s = T.alloc_shared((BL, N), io_dtype)
            C_s = T.alloc_shared((BL, N), io_dtype)
            x_s = T.alloc_shared((BL, BP), io_dtype)
            # One buffer serves the partial output tile and then x weighted for the local state.
            y_s = T.alloc_shared((BL, BP), io_dtype)
            xw_s = y_s
            # dt' and the in-tile cumsum of A dt' of every head of the block (rows: heads)
            dt_hb = T.alloc_shared((HB, BL), accum)
            dA_hb = T.alloc_shared((HB, BL), accum)
            dA_tmp = T.alloc_shared((HB, BL), accum)

            cb = T.alloc_fragment((BL, BL), accum)
            if scores_in_shared:
                cb_c = T.alloc_shared((BL, BL), io_dtype)
            else:
                cb_c = T.alloc_fragment((BL, BL), io_dtype)
            y = T.alloc_fragment((BL, BP), accum)
            st = T.alloc_fragment((N, BP), accum)

            c = t // S
            sub = t % S
            s0 = T.Cast("int32", cu_chunk_seqlens[c]) + sub * BL
            n_valid = T.Cast("int32", cu_chunk_seqlens[c + 1]) - s0
            h0 = hbk * HB
            g = h0 // rep

            # Plain (non-TMA) loads: with T.copy, TileLang 0.1.15 issues B's TMA load here but places the
            # barrier wait at B_s's first use *inside* the pipelined loop, so the C B^T wgmma below would read
            # B_s before it lands. Rows past the end of the tokens are zero.
            for i, n in T.Parallel(BL, N):
                B_s[i, n] = T.if_then_else(s0 + i < T_, B[s0 + i, g, n], T.Cast(io_dtype, 0))
            for i, n in T.Parallel(BL, N):
                C_s[i, n] = T.if_then_else(s0 + i < T_, C[s0 + i, g, n], T.Cast(io_dtype, 0))
            # Writer-side proxy fence (the CUTLASS order: fence, barrier, wgmma): every thread, producer warps
            # included, wrote part of B_s/C_s through the generic proxy, and the wgmma reads them through the
            # async proxy. TileLang's own fence sits on the reader's side after the barrier.
            T.fence_proxy_async()
            # dt' and the in-tile inclusive cumsum of A dt' (zero past the chunk's end) of all the block's heads
            # at once, before the head loop (one Hillis-Steele scan over [HB, BL] instead of one per head):
            # the loop below then has no scan barriers on its serial path.
            for hh, i in T.Parallel(HB, BL):
                v = T.if_then_else(i < n_valid, T.Cast(accum, dt[s0 + i, h0 + hh]), T.float32(0))
                if has_dt_bias:
                    v = v + T.Cast(accum, dt_bias[h0 + hh])
                if dt_softplus:
                    v = T.if_then_else(v > 20.0, v, T.log1p(T.exp(v)))
                if hi_finite:
                    v = T.min(v, T.float32(dt_max))
                if lo_active:
                    v = T.max(v, T.float32(dt_min))
                v = T.if_then_else(i < n_valid, v, T.float32(0))
                dt_hb[hh, i] = v
                dA_hb[hh, i] = v * A[h0 + hh]
            src_buf, dst_buf = dA_hb, dA_tmp
            for off in scan_offsets:
                for hh, i in T.Parallel(HB, BL):
                    dst_buf[hh, i] = src_buf[hh, i] + T.if_then_else(i >= off, src_buf[hh, i - off], T.float32(0))
                src_buf, dst_buf = dst_buf, src_buf
            dA_all = src_buf
            for hh, i in T.Parallel(HB, BL):
                dA_ws[t, h0 + hh, i] = dA_all[hh, i]
            T.gemm(C_s, B_s, cb, transpose_B=True, clear_accum=True, policy=policy)

            for j in T.Pipelined(HB * n_pb, num_stages=num_stages):
                hh = j // n_pb
                h = h0 + hh
                p0 = (j % n_pb) * BP
                T.copy(x[s0 : s0 + BL, h, p0 : p0 + BP], x_s)

                # Partial output: S x (+ D x), S[m, k] = CB[m, k] exp(dA_m - dA_k) dt'_k for k <= m.
                for m, k in T.Parallel(BL, BL):
                    cb_c[m, k] = T.if_then_else(
                        k <= m, cb[m, k] * T.exp2((dA_all[hh, m] - dA_all[hh, k]) * LOG2E) * dt_hb[hh, k], T.float32(0)
                    )
                T.gemm(cb_c, x_s, y, clear_accum=True, policy=policy)
                if has_D:
                    for m, p in T.Parallel(BL, BP):
                        if D_per_dim:
                            y[m, p] = y[m, p] + T.Cast(accum, D[h, p0 + p]) * T.Cast(accum, x_s[m, p])
                        else:
                            y[m, p] = y[m, p] + T.Cast(accum, D[h]) * T.Cast(accum, x_s[m, p])
                T.copy(y, y_s)
                for m, p in T.Parallel(BL, BP):
                    if m < n_valid:
                        out[s0 + m, h, p0 + p] = y_s[m, p]

                # Tile-local end state (zero entering state): B^T (x exp(dA_last - dA_k) dt'_k).
                for k, p in T.Parallel(BL, BP):
                    xw_s[k, p] = x_s[k, p] * T.exp2((dA_all[hh, BL - 1] - dA_all[hh, k]) * LOG2E) * dt_hb[hh, k]
                T.gemm(B_s, xw_s, st, transpose_A=True, clear_accum=True, policy=policy)
                for n, p in T.Parallel(N, BP):
                    local_ws[t, h, p0 + p, n] = st[n, p]

    return chunk


def ssd_state_pass_kernel(
    *,
    heads: int,
    dim: int,
    dstate: int,
    chunk_size: int,
    block_L: int,
    ent_dtype: str = "bfloat16",
    local_dtype: str = "float32",
    state_dtype: str = "float32",
    init_dtype: str = "float32",
    seq_idx_dtype: str = "int32",
    intermediate: bool = False,
    block_E: int = 1024,
    threads: int = 128,
):
    """Split variant, kernel B: one CTA per (block of ``block_E`` state elements, head, run) walks the run's
    tiles in order with the fp32 state in registers: at a tile opening a sequence ``s = initial_states[seq]``
    (or zero), then ``ent_ws[t] = s`` (io dtype) and ``s = exp(dA_last(t)) s + local_ws[t]``; at a chunk's
    end the state goes to ``states_out`` (every chunk with intermediate states, else where ``dest`` names).

    Arguments in order: ``dA_ws [ntiles, H, block_L]``, ``local_ws [ntiles, H, P*N]``, ``seq_idx [nchunks]``,
    ``bounds [batch + 1]``, ``dest [nchunks]``, ``initial_states [Bi, H, P*N]``, ``ent_ws [ntiles, H, P*N]``,
    ``states_out [S, H, P*N]``, ``flags`` (``FLAG_INIT``).
    """
    import tilelang.language as T

    H, P, N, L, BL = heads, dim, dstate, chunk_size, block_L
    PN = P * N
    if L % BL:
        raise ValueError(f"block_L ({BL}) must divide chunk_size ({L})")
    if PN % block_E:
        raise ValueError(f"block_E ({block_E}) must divide dim * dstate ({PN})")
    S = L // BL
    BE = block_E
    accum = "float32"

    ntiles = T.dynamic("ntiles")
    nchunks = T.dynamic("nchunks")
    batch1 = T.dynamic("batch1")
    Bi = T.dynamic("Bi")
    So = T.dynamic("So")
    i_bs, s_bs = T.dynamic("i_bs, s_bs")

    @T.prim_func
    def state_pass(
        dA_ws: T.Tensor((ntiles, H, BL), accum),
        local_ws: T.Tensor((ntiles, H, PN), local_dtype),
        seq_idx: T.Tensor((nchunks,), seq_idx_dtype),
        bounds: T.Tensor((batch1,), "int32"),
        dest: T.Tensor((nchunks,), "int32"),
        initial_states: T.StridedTensor((Bi, H, PN), (i_bs, PN, 1), init_dtype),
        ent_ws: T.Tensor((ntiles, H, PN), ent_dtype),
        states_out: T.StridedTensor((So, H, PN), (s_bs, PN, 1), state_dtype),
        flags: T.int32,
    ):
        with T.Kernel(PN // BE, H, batch1 - 1, threads=threads) as (eb, h, b):
            s = T.alloc_fragment((BE,), accum)
            has_init = (flags & FLAG_INIT) != 0
            e0 = eb * BE
            t_first = bounds[b] * S
            n_t = (bounds[b + 1] - bounds[b]) * S
            T.clear(s)
            for i in T.serial(n_t):
                t = t_first + i
                c = t // S
                sub = t % S
                opens = T.if_then_else(
                    sub == 0,
                    T.if_then_else(c == 0, 1, T.if_then_else(seq_idx[c] != seq_idx[c - 1], 1, 0)),
                    0,
                )
                sq = T.Cast("int32", seq_idx[c])
                for e in T.Parallel(BE):
                    s[e] = T.if_then_else(
                        opens == 1,
                        T.if_then_else(has_init, T.Cast(accum, initial_states[sq, h, e0 + e]), T.float32(0)),
                        s[e],
                    )
                for e in T.Parallel(BE):
                    ent_ws[t, h, e0 + e] = s[e]
                decay = T.exp2(dA_ws[t, h, BL - 1] * LOG2E)
                for e in T.Parallel(BE):
                    s[e] = s[e] * decay + T.Cast(accum, local_ws[t, h, e0 + e])
                if sub == S - 1:
                    if intermediate:
                        for e in T.Parallel(BE):
                            states_out[c, h, e0 + e] = s[e]
                    else:
                        d = dest[c]
                        if d >= 0:
                            for e in T.Parallel(BE):
                                states_out[d, h, e0 + e] = s[e]

    return state_pass


def ssd_chunk_out_kernel(
    *,
    heads: int,
    groups: int,
    dim: int,
    dstate: int,
    chunk_size: int,
    io_dtype: str = "bfloat16",
    cu_dtype: str = "int32",
    block_L: int = 128,
    heads_per_cta: int = 8,
    block_P: int = 64,
    threads: int = 128,
    num_stages: int = 2,
):
    """Split variant, kernel C: one CTA per (tile, block of ``heads_per_cta`` heads of one group) loads the
    tile's C once and, per (head, P-block), ``y = out + exp(dA_m) C · ent_ws[t, h]ᵀ`` (wgmma), ``* silu(z)``,
    stored to ``out`` for the tile's valid rows.

    Arguments in order: ``C [T, G, N]``, ``cu_chunk_seqlens [nchunks + 1]``, ``dA_ws [ntiles, H, block_L]``,
    ``ent_ws [ntiles, H, P, N]``, ``z [Tz, H, P]``, ``out [T, H, P]``, ``flags`` (``FLAG_Z``).
    """
    import tilelang.language as T

    H, G, P, N, L = heads, groups, dim, dstate, chunk_size
    if H % G:
        raise ValueError(f"heads ({H}) must be a multiple of groups ({G})")
    rep = H // G
    if rep % heads_per_cta:
        raise ValueError(f"heads_per_cta ({heads_per_cta}) must divide heads per group ({rep})")
    if P % block_P or L % block_L:
        raise ValueError(f"block_P ({block_P}) must divide dim ({P}) and block_L ({block_L}) chunk_size ({L})")
    HB = heads_per_cta
    n_pb = P // block_P
    S = L // block_L
    BP, BL = block_P, block_L
    accum = "float32"

    T_ = T.dynamic("T")
    nchunks1 = T.dynamic("nchunks1")
    ntiles = T.dynamic("ntiles")
    Tz = T.dynamic("Tz")
    c_rs, c_gs, z_rs, z_hs, o_rs, o_hs = T.dynamic("c_rs, c_gs, z_rs, z_hs, o_rs, o_hs")

    @T.prim_func
    def chunk_out(
        C: T.StridedTensor((T_, G, N), (c_rs, c_gs, 1), io_dtype),
        cu_chunk_seqlens: T.Tensor((nchunks1,), cu_dtype),
        dA_ws: T.Tensor((ntiles, H, BL), accum),
        ent_ws: T.Tensor((ntiles, H, P, N), io_dtype),
        z: T.StridedTensor((Tz, H, P), (z_rs, z_hs, 1), io_dtype),
        out: T.StridedTensor((T_, H, P), (o_rs, o_hs, 1), io_dtype),
        flags: T.int32,
    ):
        with T.Kernel(H // HB, ntiles, threads=threads) as (hbk, t):
            C_s = T.alloc_shared((BL, N), io_dtype)
            e_s = T.alloc_shared((BP, N), io_dtype)
            o_s = T.alloc_shared((BL, BP), io_dtype)
            z_s = T.alloc_shared((BL, BP), io_dtype)
            dA_s = T.alloc_shared((BL,), accum)
            y_s = T.alloc_shared((BL, BP), io_dtype)
            y = T.alloc_fragment((BL, BP), accum)

            has_z = (flags & FLAG_Z) != 0
            c = t // S
            sub = t % S
            s0 = T.Cast("int32", cu_chunk_seqlens[c]) + sub * BL
            n_valid = T.Cast("int32", cu_chunk_seqlens[c + 1]) - s0
            h0 = hbk * HB
            g = h0 // rep

            T.copy(C[s0 : s0 + BL, g, 0:N], C_s)
            for j in T.Pipelined(HB * n_pb, num_stages=num_stages):
                h = h0 + j // n_pb
                p0 = (j % n_pb) * BP
                # Producer (TMA) loads: the entering state, the partial output kernel A wrote, z (a 1-row
                # dummy without z: out-of-range rows read as zero), the tile's dA.
                T.copy(ent_ws[t, h, p0 : p0 + BP, 0:N], e_s)
                T.copy(out[s0 : s0 + BL, h, p0 : p0 + BP], o_s)
                T.copy(z[s0 : s0 + BL, h, p0 : p0 + BP], z_s)
                T.copy(dA_ws[t, h, 0:BL], dA_s)
                T.gemm(C_s, e_s, y, transpose_B=True, clear_accum=True)
                # Update the accumulator fragment in place (see the fused kernel's epilogue note).
                for m, p in T.Parallel(BL, BP):
                    y[m, p] = T.Cast(accum, o_s[m, p]) + y[m, p] * T.exp2(dA_s[m] * LOG2E)
                for m, p in T.Parallel(BL, BP):
                    zv = T.Cast(accum, z_s[m, p])
                    y[m, p] = T.if_then_else(has_z, y[m, p] * zv / (1.0 + T.exp2(-zv * LOG2E)), y[m, p])
                T.copy(y, y_s)
                for m, p in T.Parallel(BL, BP):
                    if m < n_valid:
                        out[s0 + m, h, p0 + p] = y_s[m, p]

    return chunk_out
