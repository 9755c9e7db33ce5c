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


# Layout of the chained kernel's synchronisation words (int32, zeroed before every launch).
SYNC_TICKET = 0  # CTA ticket counter: tickets hand out (tile, head, P-block) in tile-major order
SYNC_ERRORS = 1  # bounded spins that gave up (a correct launch leaves 0)
SYNC_WORDS = 2  # then ``ring * heads * P-blocks`` publish flags, then as many read marks


def chained_sync_words(*, heads: int, dim: int, block_P: int = 64, ring: int = 8) -> int:
    """Length of the int32 ``sync`` array of :func:`ssd_chained_kernel`."""
    return SYNC_WORDS + 2 * ring * heads * (dim // block_P)


def chained_smem_bytes(
    *, dim_block: int, dstate: int, block_L: int, io_bytes: int, threads: int = 256, scores_in_shared: bool = False
) -> int:
    """Shared memory of the chained kernel: x, B, C tiles, x weighted (reused for the output tile), and the fp32
    dt / cumsum scratch. The entering state ``[dstate, dim_block]`` in the io dtype takes B's tile once the
    end-state GEMM has read it (TileLang's shared-memory planner merges buffers whose lifetimes do not
    overlap; ``dim_block <= block_L`` makes it fit)."""
    tiles = block_L * (2 * dim_block + 2 * dstate) * io_bytes
    if dim_block > block_L:
        tiles += dstate * dim_block * io_bytes
    if scores_in_shared:
        tiles += block_L * block_L * io_bytes
    return tiles + 3 * max(block_L, threads) * 4


def ssd_chained_kernel(
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
    ring: int = 8,
    min_blocks: int = 2,
    spin_limit: int = 1 << 16,
    scores_in_shared: bool = False,
    sleep_ns: int = 32,
    chain: bool = True,
):
    """The chunk-parallel SSD prefill kernel: one CTA per (tile, head, P-block), tiles chained through a ring of
    fp32 states in global memory.

    A *tile* is ``block_L`` tokens aligned to its chunk's start (``chunk_size // block_L`` tiles per chunk; the
    tail tiles of a short chunk are empty and pass the state through). Tile ``v`` of head ``h`` and P-block
    ``pb`` is one CTA, which

    1. takes a ticket (``atomic_add`` on ``sync[SYNC_TICKET]``): tickets, not ``blockIdx``, name the work, in
       tile-major order, so a CTA only ever waits for a CTA that holds an earlier ticket and is therefore
       resident or finished (no deadlock whatever order the hardware dispatches blocks in);
    2. does every state-independent part of the tile: ``dt'``, the in-tile cumsum ``dA`` of ``A dt'``,
       ``y = S x`` with ``S = (C Bᵀ) ∘ exp(dA_m - dA_k) dt'_k`` (causal), and the tile's own end state from
       zero, ``s = Bᵀ (x exp(dA_last - dA_k) dt'_k)``;
    3. takes its entering state ``h``: the sequence's initial state (or zero) when the tile opens a sequence
       (first tile of a chunk with ``c == 0`` or ``seq_idx[c] != seq_idx[c-1]``), else tile ``v-1``'s end
       state from ring slot ``(v-1) % ring`` once ``v-1`` has published it (acquire load of its flag);
    4. publishes ``exp(dA_last) h + s`` into slot ``v % ring`` (after tile ``v-ring+1`` has marked that slot
       read) with a release store of its flag, and writes it to ``states_out`` at a chunk's end (every chunk
       with ``intermediate``, else the chunks ``dest`` names);
    5. finishes ``y += exp(dA_m) C h``, ``+ D x``, ``* silu(z)`` and stores the tile's valid rows.

    Only step 3-4 is serial along a sequence (a load, a scaled add and a store of ``[N, block_P]`` fp32), so a
    single long sequence spreads over every SM. Spins are bounded by ``spin_limit``; one that gives up counts
    into ``sync[SYNC_ERRORS]`` instead of hanging the GPU.

    Arguments in order: ``x [T, H, P]``, ``dt [T, H]``, ``A [H]`` fp32, ``B, C [T, G, N]``,
    ``cu_chunk_seqlens [nchunks + 1]``, ``seq_idx [nchunks]``, ``dest [nchunks]``, ``dt_bias [H]``,
    ``D [H]`` or ``[H, P]``, ``z [Tz, H, P]``, ``initial_states [Bi, H, P, N]``, ``out [T, H, P]``,
    ``states_out [S, H, P, N]``, ``ring_states [ring, H, N, P]`` fp32, ``sync [chained_sync_words(...)]``
    int32 zeroed before the launch, ``flags`` (``FLAG_Z | FLAG_INIT``).
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
    HP = H * n_pb
    R = ring
    BP, BL = block_P, block_L
    accum = "float32"
    hi_finite = dt_max != math.inf
    lo_active = dt_min != -math.inf
    flag_base = SYNC_WORDS
    mark_base = SYNC_WORDS + R * HP
    n_sync = SYNC_WORDS + 2 * R * HP

    T_ = T.dynamic("T")
    nchunks = T.dynamic("nchunks")
    nchunks1 = T.dynamic("nchunks1")
    Tz = T.dynamic("Tz")
    Bi = T.dynamic("Bi")
    So = T.dynamic("So")
    x_rs, x_hs, dt_rs, b_rs, b_gs, c_rs, c_gs = T.dynamic("x_rs, x_hs, dt_rs, b_rs, b_gs, c_rs, c_gs")
    z_rs, z_hs, o_rs, o_hs, i_bs, s_bs = T.dynamic("z_rs, z_hs, o_rs, o_hs, i_bs, s_bs")
    D_shape = (H, P) if D_per_dim else (H,)
    # Scores feeding wgmma from registers need the row-split (FullRow) layout, which takes 64 rows per
    # warpgroup; a 64-token tile over two warpgroups keeps its scores in shared memory instead.
    policy = T.GemmWarpPolicy.Square if scores_in_shared else T.GemmWarpPolicy.FullRow
    SCAN = max(BL, threads)
    scan_offsets = [1 << i for i in range(int(math.log2(SCAN)))]

    @T.prim_func
    def chained(
        x: T.StridedTensor((T_, H, P), (x_rs, x_hs, 1), io_dtype),
        dt: T.StridedTensor((T_, H), (dt_rs, 1), dt_dtype),
        A: T.Tensor((H,), "float32"),
        B: T.StridedTensor((T_, G, N), (b_rs, b_gs, 1), io_dtype),
        C: T.StridedTensor((T_, G, N), (c_rs, c_gs, 1), io_dtype),
        cu_chunk_seqlens: T.Tensor((nchunks1,), cu_dtype),
        seq_idx: T.Tensor((nchunks,), seq_idx_dtype),
        dest: T.Tensor((nchunks,), "int32"),
        dt_bias: T.Tensor((H,), dt_bias_dtype),
        D: T.Tensor(D_shape, D_dtype),
        z: T.StridedTensor((Tz, H, P), (z_rs, z_hs, 1), io_dtype),
        initial_states: T.StridedTensor((Bi, H, P, N), (i_bs, P * N, N, 1), init_dtype),
        out: T.StridedTensor((T_, H, P), (o_rs, o_hs, 1), io_dtype),
        states_out: T.StridedTensor((So, H, P, N), (s_bs, P * N, N, 1), state_dtype),
        ring_states: T.Tensor((R, H, N, P), accum),
        sync: T.Tensor((n_sync,), "int32"),
        flags: T.int32,
    ):
        with T.Kernel(nchunks * (S * HP), threads=threads) as _bid:
            if min_blocks > 0:
                T.annotate_min_blocks_per_sm(min_blocks)
            x_s = T.alloc_shared((BL, BP), io_dtype)
            B_s = T.alloc_shared((BL, N), io_dtype)
            C_s = T.alloc_shared((BL, N), io_dtype)
            # x weighted for the end state, then (once that GEMM is done) the output tile of the epilogue.
            xw_s = T.alloc_shared((BL, BP), io_dtype)
            y_s = xw_s
            st_s = T.alloc_shared((N, BP), io_dtype)
            dt_sh = T.alloc_shared((SCAN,), accum)
            dA_sh = T.alloc_shared((SCAN,), accum)
            dA_tmp = T.alloc_shared((SCAN,), accum)
            tk = T.alloc_shared((1,), "int32")
            bar = T.alloc_barrier(1)

            cb = T.alloc_fragment((BL, BL), accum)
            if scores_in_shared:
                cb_c = T.alloc_shared((BL, BL), io_dtype)
            else:
                cb_c = T.alloc_fragment((BL, BL), io_dtype)
            y = T.alloc_fragment((BL, BP), accum)
            y2 = T.alloc_fragment((BL, BP), accum)
            s_loc = T.alloc_fragment((N, BP), accum)
            dt_f = T.alloc_fragment((BL,), accum)
            spins = T.alloc_var("int32")

            tx = T.get_thread_binding()
            if tx == 0:
                tk[0] = T.atomic_add(sync[SYNC_TICKET], 1, return_prev=True)
            T.sync_threads()
            t = tk[0]
            v = t // HP
            hp = t % HP
            h = hp // n_pb
            pb = hp % n_pb
            c = v // S
            sub = v % S
            g = h // rep
            p0 = pb * BP
            has_z = (flags & FLAG_Z) != 0
            has_init = (flags & FLAG_INIT) != 0
            s0 = T.Cast("int32", cu_chunk_seqlens[c]) + sub * BL
            n_valid = T.Cast("int32", cu_chunk_seqlens[c + 1]) - s0
            a_h = A[h]
            if chain:
                opens = T.if_then_else(
                    sub == 0, T.if_then_else(c == 0, 1, T.if_then_else(seq_idx[c] != seq_idx[c - 1], 1, 0)), 0
                )
            else:  # measurement probe only: every tile starts from its initial state (not a correct result)
                opens = 1
            sq = T.Cast("int32", seq_idx[c])

            # The tiles land by TMA while the threads work out dt' and its cumsum. tma_copy elects its issuing
            # thread with a full-warp elect.sync, so it must be reached by whole warps (never inside
            # ``if tx == 0``); the elected thread is thread 0, which then arrives once on the barrier.
            T.tma_copy(x[s0 : s0 + BL, h, p0 : p0 + BP], x_s, barrier=bar[0])
            T.tma_copy(B[s0 : s0 + BL, g, 0:N], B_s, barrier=bar[0])
            T.tma_copy(C[s0 : s0 + BL, g, 0:N], C_s, barrier=bar[0])
            if tx == 0:
                T.barrier_arrive(bar[0])

            # dt' (zero past the chunk's end) and the in-tile inclusive cumsum of A * dt'.
            for i in T.Parallel(BL):
                dv = T.if_then_else(i < n_valid, T.Cast(accum, dt[s0 + i, h]), T.float32(0))
                if has_dt_bias:
                    dv = dv + T.Cast(accum, dt_bias[h])
                if dt_softplus:
                    dv = T.if_then_else(dv > 20.0, dv, T.log1p(T.exp(dv)))
                if hi_finite:
                    dv = T.min(dv, T.float32(dt_max))
                if lo_active:
                    dv = T.max(dv, T.float32(dt_min))
                dt_f[i] = T.if_then_else(i < n_valid, dv, T.float32(0))
            T.copy(dt_f, dt_sh[0:BL])
            for i in T.Parallel(SCAN):
                dA_sh[i] = T.if_then_else(i < BL, dt_sh[i] * a_h, T.float32(0))
            src_buf, dst_buf = dA_sh, dA_tmp
            for off in scan_offsets:
                for i in T.Parallel(SCAN):
                    dst_buf[i] = src_buf[i] + T.if_then_else(i >= off, src_buf[i - off], T.float32(0))
                src_buf, dst_buf = dst_buf, src_buf
            dA_cs = src_buf

            T.mbarrier_wait_parity(bar[0], 0)

            # State-independent part: y = S x and the tile's own end state from zero.
            T.gemm(C_s, B_s, cb, transpose_B=True, clear_accum=True, policy=policy)
            for m, k in T.Parallel(BL, BL):
                cb_c[m, k] = T.if_then_else(
                    k <= m, cb[m, k] * T.exp2((dA_cs[m] - dA_cs[k]) * LOG2E) * dt_sh[k], T.float32(0)
                )
            T.gemm(cb_c, x_s, y, clear_accum=True, policy=policy)
            for k, p in T.Parallel(BL, BP):
                xw_s[k, p] = x_s[k, p] * T.exp2((dA_cs[BL - 1] - dA_cs[k]) * LOG2E) * dt_sh[k]
            T.gemm(B_s, xw_s, s_loc, transpose_A=True, clear_accum=True)

            # The chain: wait for tile v-1's end state (unless this tile opens a sequence).
            prev = (v + (R - 1)) % R
            if tx == 0:
                if opens == 0:
                    spins = 0
                    while T.atomic_load(sync[flag_base + prev * HP + hp], memory_order="acquire") != v:
                        spins = spins + 1
                        if spins > spin_limit:
                            T.atomic_add(sync[SYNC_ERRORS], 1)
                            T.loop_break()
                        if sleep_ns > 0:
                            T.call_extern("handle", "__nanosleep", sleep_ns)
            T.sync_threads()
            decay = T.exp2(dA_cs[BL - 1] * LOG2E)
            for n, p in T.Parallel(N, BP):
                hv = T.if_then_else(
                    opens == 1,
                    T.if_then_else(has_init, T.Cast(accum, initial_states[sq, h, p0 + p, n]), T.float32(0)),
                    T.call_extern(accum, "__ldcg", T.address_of(ring_states[prev, h, n, p0 + p])),
                )
                st_s[n, p] = hv
                s_loc[n, p] = s_loc[n, p] + decay * hv
            # Tile v-1's slot is read: mark it (tile v+ring-1 reuses it). Then wait for tile v-ring+1 to have
            # read this tile's slot before overwriting it.
            T.sync_threads()
            if tx == 0:
                if v > 0:
                    T.atomic_store(sync[mark_base + prev * HP + hp], v, memory_order="release")
                if v >= R:
                    spins = 0
                    while T.atomic_load(sync[mark_base + (v % R) * HP + hp], memory_order="acquire") < v - R + 1:
                        spins = spins + 1
                        if spins > spin_limit:
                            T.atomic_add(sync[SYNC_ERRORS], 1)
                            T.loop_break()
                        if sleep_ns > 0:
                            T.call_extern("handle", "__nanosleep", sleep_ns)
            T.sync_threads()
            for n, p in T.Parallel(N, BP):
                ring_states[v % R, h, n, p0 + p] = s_loc[n, p]
            T.sync_threads()
            if tx == 0:
                T.call_extern("handle", "__threadfence")
                T.atomic_store(sync[flag_base + (v % R) * HP + hp], v + 1, memory_order="release")
            if sub == S - 1:
                if intermediate:
                    for n, p in T.Parallel(N, BP):
                        states_out[c, h, p0 + p, n] = s_loc[n, p]
                else:
                    d = dest[c]
                    if d >= 0:
                        for n, p in T.Parallel(N, BP):
                            states_out[d, h, p0 + p, n] = s_loc[n, p]

            # State-dependent part: y += exp(dA_m) C h, then D x, silu(z), store the valid rows.
            T.gemm(C_s, st_s, y2, clear_accum=True, policy=policy)
            for m, p in T.Parallel(BL, BP):
                y[m, p] = y[m, p] + y2[m, p] * T.exp2(dA_cs[m] * LOG2E)
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

    return chained
