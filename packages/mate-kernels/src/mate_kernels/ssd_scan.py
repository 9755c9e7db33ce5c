"""The chunk scan of the SSD varlen prefill (Mamba2 over a packed batch): :func:`ssd_fused_kernel`.

One CTA per (P block, head, run of :mod:`.ssd_dt`'s runs table) walks its chunks in order, keeping the running
fp32 state ``[N, block_P]`` in registers, so chunk states never travel through global memory. Each chunk is
processed in tiles of ``block_L`` tokens aligned to the chunk's start (``chunk_size // block_L`` tiles, the tail
ones of a short chunk masked). A producer warpgroup loads each tile's x, B, C and the pre-pass's rows and record
(``dtA``, ``tmeta``) through a ``num_stages`` pipeline; two consumer warpgroups (256 threads) compute, per tile:

1. the entering state, where the tile opens a sequence (its record says which): ``initial_states[seq]`` or zero;
2. ``y = exp(dA_m) C · state`` and ``CB = C Bᵀ`` (wgmma);
3. ``S[m, k] = CB[m, k] exp(dA_m - dA_k) dt'_k`` (causal), ``y += S x`` (wgmma), ``+ D x``, ``* silu(z)``;
   a tile whose rows are all valid leaves by one TMA store, the rows of a short one by predicated stores (the
   rows past the chunk's end belong to the next chunk, maybe another CTA's);
4. ``state = exp(dA_last) state + Bᵀ (x exp(dA_last - dA_k) dt'_k)`` (wgmma accumulating in registers);
5. at a chunk's end, the state is written out (every chunk with ``intermediate``, else the row ``dest[c]`` names).

The pre-pass rows make every decay factor a load (no ``exp2`` per element but the mask's), and the tile record
makes the entering-state, z and chunk-end tests one uniform branch per tile (``dest[c]`` is read into a
register at the tile's start, so its latency hides behind the tile). Splitting a chunk into tiles is exact
algebra (a tile boundary is a state hand-over like a chunk boundary).

Issue order (same arithmetic as the stages above):

- with a ``block_P`` multiple of 64 the tile's GEMMs go in two back-to-back pairs with one wait each:
  ``C·state`` then ``C Bᵀ``; ``S x``, then the x weighting and the state decay on the CUDA cores while it runs,
  then the end-state GEMM (before the epilogue). Each asynchronous GEMM completes before any shared buffer it
  reads is released to the producer or rewritten: TileLang releases a pipelined buffer right after the last GEMM
  that reads it in program order, whatever that GEMM's wait, so the mask cannot run under ``C·state`` (``C_s``
  would be released early) nor the epilogue under the end-state GEMM (``B_s``, and the output tile is ``xw_s``'s
  buffer);
- a ``block_P`` of 64 k + 16 or 64 k + 32 (a head dim of 80: 64 + 16) is two parts: the three GEMMs whose N
  dimension is ``block_P`` (``C·state``, ``S x``, ``Bᵀ x``) run once on the main part and once on the tail, each
  part with its own x, state, output tile and fragments (TileLang 0.1.15 lays out an MN-major wgmma operand
  canonically only where its width is one swizzle atom or a multiple of the 128-byte one; :func:`.p_parts`).
  The tail's GEMMs join the two asynchronous groups (seven GEMMs, two waits per tile) and split their rows over
  the warps (``FullRow``), so the tiling needs 128-token tiles and a dstate of 128 or 256;
- ``narrow_p`` (any other ``block_P`` that is not a multiple of 64, and a tail at 64-token tiles): the three
  GEMMs take their B operand K-major (the state, x and the weighted x transposed into shared memory by the
  consumers); each GEMM waits for itself;
- the consumers load the CTA's first entering state (its first chunk always opens a run, so that is
  ``initial_states[seq_idx[bounds[b]]]``) before the pipelined loop, while the producer waits for the first
  tiles' loads: the two global-memory round trips of a CTA's start overlap instead of adding up;
- a full tile's TMA store is not waited for right away: the wait (``cp.async.bulk.wait_group.read``, a no-op in
  every thread but the one that issued the store) comes right before that shared buffer's next write, and once
  after the loop.

``bounds`` may be a strided view of the runs table (``bounds[::k]`` when k divides the batch): CTA ``b`` then walks
the runs of k consecutive sequences in one pipelined loop, re-opening the state at each (a runtime stride, so no
other kernel). The producer loads the next sequence's first tiles while the consumers finish the current one, and
the grid has k times fewer CTAs; the CTAs in flight stay on neighbouring heads of the same sequences.

Index guards: the chunk-end state row (``final_state_indices`` through the runs table) and the initial state
``seq_idx`` names are read or written only inside their tensors (else nothing is written, and the state enters as
zero); the tile rows stored are the pre-pass's valid ones, clamped into the tokens there; TMA bounds the tile
loads. Whatever the tables hold, no access leaves the tensors.

Token, chunk and batch counts are ``T.dynamic``. Factories take plain Python values only.
"""

# No ``from __future__ import annotations``: TileLang evaluates the T.Tensor annotations.
from types import SimpleNamespace

from .abi import SCAN, SSD_SCAN_ARGS, prim_func
from .ssd_common import DT_ROWS, LOG2E, META_WIDTH, check_tiling, p_parts

# wgmma issued without waiting for it: the next GEMM's wait completes it
NO_WAIT = {"wg_wait": -1}
THREADS = 256  # consumer threads (two warpgroups; the producer warpgroup comes on top)
FLAG_Z = 1  # runtime flags of the chunk scan
FLAG_INIT = 2
# ``prefetch``: one L2 prefetch per 128-byte line (a hint: no alignment needed, nothing waits on it). PTX, so
# only in NVIDIA device code; elsewhere (MUSA's compiler) the hint compiles to nothing.
PREFETCH_L2_SRC = r"""
__device__ __forceinline__ void mate_prefetch_l2(const void* ptr) {
#if defined(__CUDA_ARCH__) && !defined(__MUSA_ARCH__)
  asm volatile("prefetch.global.L2 [%0];" :: "l"(ptr));
#endif
}
"""


def fused_smem_bytes(
    *,
    dim_block: int,
    dstate: int,
    block_L: int,
    io_bytes: int,
    num_stages: int,
    scores_in_shared: bool = False,
    narrow_p: bool = False,
) -> int:
    """Dynamic shared memory of :func:`ssd_fused_kernel`, to pick a tile that fits. TileLang multi-buffers what
    the pipelined loop loads (the x, B, C tiles, the pre-pass's four rows and the tile record) and the scores
    kept in shared memory; the state and output tiles (and with ``narrow_p`` the transposed x tile) are single."""
    per_stage = block_L * (dim_block + 2 * dstate) * io_bytes + block_L * 4 * DT_ROWS + META_WIDTH * 4
    if scores_in_shared:
        per_stage += block_L * block_L * io_bytes
    fixed = (dstate + block_L) * dim_block * io_bytes
    if narrow_p:  # the transposed x tile (x, then x weighted) beside the output tile
        fixed += block_L * dim_block * io_bytes
    return num_stages * per_stage + fixed


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
    D_dtype: str = "float32",
    cu_dtype: str = "int32",
    seq_idx_dtype: str = "int32",
    has_D: bool = True,
    D_per_dim: bool = False,
    intermediate: bool = False,
    block_P: int = 64,
    block_L: int = 128,
    num_stages: int = 2,
    scores_in_shared: bool = False,
    narrow_p: bool = False,
    prefetch: bool = False,
    split: bool = False,
):
    """The chunk scan (see the module doc).

    ``scores_in_shared``: the scores ``S`` feed the ``S x`` GEMM from shared memory (any warp layout) instead of
    registers (the row-split layout, which matches the A operand's only with two consumer warpgroups at 128
    tokens). ``narrow_p``: K-major B operands; without it a ``block_P`` off the 64 grid is a main part and a tail
    (:func:`.p_parts`: 80 = 64 + 16; ValueError for one without such a split, and for a tail at ``block_L`` 64
    or ``dstate`` 64).

    ``prefetch`` (with initial states): where a CTA opens sequence ``s`` it also asks L2 for the entering state of
    sequence ``s + 1`` (one ``prefetch.global.L2`` per 128-byte line, spread over the consumer threads), which the
    same CTA opens next when it walks several sequences, and the CTA of the next sequence and the same head
    otherwise; that state's load then waits on L2 instead of DRAM. A hint: a ``seq_idx`` that opens sequences out
    of order only makes it useless. Same arithmetic. A launch-time choice: the launcher builds both variants and
    picks one per launch.

    ``split``: runs may start mid-sequence (:mod:`.ssd_split`'s design: ``bounds`` cuts the chunks into even
    runs, whatever the sequences). A run whose first tile opens no sequence enters with ``run_states[r - 1]``
    (``run_states [R, H, P, N]`` fp32: the true state at the end of each run, from the split design's state pass
    and hand-over), so every output and state is written once, exact as in the plain scan.

    Arguments in order: ``x [T, H, P]``, ``B, C [T, G, N]``, ``cu_chunk_seqlens [nchunks + 1]``,
    ``seq_idx [nchunks]``, ``bounds [batch + 1]``, ``dest [nchunks]`` (the runs table), ``D [H]`` or ``[H, P]``,
    ``z [Tz, H, P]``, ``initial_states [Bi, H, P, N]``, ``out [T, H, P]``, ``states_out [S, H, P, N]``,
    ``dtA``, ``tmeta`` (the pre-pass's rows and records, :func:`.ssd_dt.ssd_dt_kernel` with the same
    ``block_L``), ``flags`` (``FLAG_Z | FLAG_INIT``: z and the initial states are runtime options); with ``split``
    then ``run_states``. Unused
    optional inputs are still passed (any tensor of the declared form; a 1-row dummy works) and never read.
    ``out`` must be TMA-compatible (16-byte aligned base and row strides).
    """
    H, G, P, N, L = heads, groups, dim, dstate, chunk_size
    check_tiling(heads=H, groups=G, dim=P, chunk_size=L, block_P=block_P, block_L=block_L)
    if not narrow_p:
        _, tail = p_parts(block_P)  # (ValueError where the MN-major tiling cannot split the block)
        if tail and (block_L != 128 or dstate % 128):
            # the tail's GEMMs split their M (block_L rows, dstate for the state GEMM) over the two warpgroups
            raise ValueError(
                f"block_P ({block_P}) with a tail part needs block_L 128 and dstate 128 or 256 "
                f"(got {block_L}, {dstate})"
            )
    import tilelang.language as T  # (after the argument checks: they need no toolchain)

    overlap = not narrow_p  # the GEMMs in two asynchronous pairs (see the module doc)
    # the P block as a main part (a multiple of 64, or all of it K-major) and a tail part of TW columns (16 or 32)
    BM, TW = p_parts(block_P) if not narrow_p else (block_P, 0)
    ROWS = T.GemmWarpPolicy.FullRow  # the tail's GEMMs: rows over the warps (each one's N is the tail's width)
    threads = THREADS
    rep = H // G
    n_pb = P // block_P
    S = L // block_L
    BP, BL = block_P, block_L
    accum = "float32"

    T_ = T.dynamic("T")
    nchunks = T.dynamic("nchunks")
    nchunks1 = T.dynamic("nchunks1")
    batch1 = T.dynamic("batch1")
    Tz = T.dynamic("Tz")
    Bi = T.dynamic("Bi")
    So = T.dynamic("So")
    nvt = T.dynamic("nvt")
    # Row strides are runtime values: x/B/C (and z, out) may be row views of one packed projection buffer, the
    # state pool a strided view (vLLM's pages); inner dims stay dense.
    x_rs, x_hs, b_rs, b_gs, c_rs, c_gs = T.dynamic("x_rs, x_hs, b_rs, b_gs, c_rs, c_gs")
    z_rs, z_hs, o_rs, o_hs, i_bs, s_bs = T.dynamic("z_rs, z_hs, o_rs, o_hs, i_bs, s_bs")
    # bounds may be a strided view (every k-th entry): CTA b then walks the runs of k sequences in one loop
    bnd_s = T.dynamic("bnd_s")
    D_shape = (H, P) if D_per_dim else (H,)
    # Scores feeding wgmma from registers need the row-split (FullRow) layout; from shared memory any.
    policy = T.GemmWarpPolicy.Square if scores_in_shared else T.GemmWarpPolicy.FullRow

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

    @T.macro
    def scan_body(
        x,
        B,
        C,
        cu_chunk_seqlens,
        seq_idx,
        bounds,
        dest,
        D,
        z,
        initial_states,
        out,
        states_out,
        dtA,
        tmeta,
        flags,
        run_states,
    ):
        with T.Kernel(n_pb, H, batch1 - 1, threads=threads, prelude=prelude) as (pb, h, b):
            x_s = T.alloc_shared((BL, BM), io_dtype)
            B_s = T.alloc_shared((BL, N), io_dtype)
            C_s = T.alloc_shared((BL, N), io_dtype)
            y_s = T.alloc_shared((BL, BM), io_dtype)
            if narrow_p:
                # K-major B operands: x transposed (then x weighted, for the state update) and the state
                xt_s = T.alloc_shared((BP, BL), io_dtype)
                st_s = T.alloc_shared((BP, N), io_dtype)
            else:
                # One buffer serves the output tile (epilogue) and then x weighted for the state update.
                xw_s = y_s
                st_s = T.alloc_shared((N, BM), io_dtype)
            if TW:
                # the tail part: its own x, output (then x weighted) and state tiles, 16 or 32 wide
                x_t = T.alloc_shared((BL, TW), io_dtype)
                y_t = T.alloc_shared((BL, TW), io_dtype)
                xw_t = y_t
                st_t = T.alloc_shared((N, TW), io_dtype)
            # the pre-pass's four rows (cumsum in log2 units, dt', end-state weights, entering-state decays)
            dt_sh = T.alloc_shared((BL,), accum)
            dA_cs = T.alloc_shared((BL,), accum)
            meta_s = T.alloc_shared((META_WIDTH,), "int32")
            wx_s = T.alloc_shared((BL,), accum)
            wy_s = T.alloc_shared((BL,), accum)

            state = T.alloc_fragment((N, BM), accum)
            cb = T.alloc_fragment((BL, BL), accum)
            if scores_in_shared:
                cb_c = T.alloc_shared((BL, BL), io_dtype)
            else:
                cb_c = T.alloc_fragment((BL, BL), io_dtype)
            y = T.alloc_fragment((BL, BM), accum)
            if TW:
                state_t = T.alloc_fragment((N, TW), accum)
                y_tl = T.alloc_fragment((BL, TW), accum)
            d_row = T.alloc_local((1,), "int32")

            g = h // rep
            has_z = (flags & FLAG_Z) != 0
            has_init = (flags & FLAG_INIT) != 0
            p0 = pb * BP
            c_first = bounds[b]
            n_tiles = (bounds[b + 1] - c_first) * S

            T.clear(state)
            if TW:
                T.clear(state_t)
            # the first entering state, under the producer's first loads (the loop skips it at j == 0)
            if split:
                # a run that starts mid-sequence enters with the true end state of the run before it
                if n_tiles > 0 and b > 0 and tmeta[c_first * S, 2] < 0:
                    for n, p in T.Parallel(N, BM):
                        state[n, p] = run_states[b - 1, h, p0 + p, n]
                    if TW:
                        for n, p in T.Parallel(N, TW):
                            state_t[n, p] = run_states[b - 1, h, p0 + BM + p, n]
            if n_tiles > 0:
                if has_init:
                    if split:
                        # a run may start mid-sequence: only a first tile that opens its sequence loads a state
                        sq_open = tmeta[c_first * S, 2]
                        if sq_open >= 0 and sq_open < Bi:
                            for n, p in T.Parallel(N, BM):
                                state[n, p] = T.Cast(accum, initial_states[sq_open, h, p0 + p, n])
                            if TW:
                                for n, p in T.Parallel(N, TW):
                                    state_t[n, p] = T.Cast(accum, initial_states[sq_open, h, p0 + BM + p, n])
                    else:
                        sq_first = T.Cast("int32", seq_idx[c_first])
                        if sq_first >= 0 and sq_first < Bi:  # a seq_idx outside the initial states: zero state
                            for n, p in T.Parallel(N, BM):
                                state[n, p] = T.Cast(accum, initial_states[sq_first, h, p0 + p, n])
                            if TW:
                                for n, p in T.Parallel(N, TW):
                                    state_t[n, p] = T.Cast(accum, initial_states[sq_first, h, p0 + BM + p, n])
                            if prefetch:
                                prefetch_next_init(initial_states, sq_first + 1, h, p0)
            for j in T.Pipelined(n_tiles, num_stages=num_stages):
                c = c_first + j // S
                sub = j % S
                s0 = T.Cast("int32", cu_chunk_seqlens[c]) + sub * BL
                T.copy(x[s0 : s0 + BL, h, p0 : p0 + BM], x_s)
                if TW:
                    T.copy(x[s0 : s0 + BL, h, p0 + BM : p0 + BP], x_t)
                T.copy(B[s0 : s0 + BL, g, 0:N], B_s)
                T.copy(C[s0 : s0 + BL, g, 0:N], C_s)
                vt = c * S + sub
                T.copy(dtA[vt, h, 0, 0:BL], dA_cs)
                T.copy(dtA[vt, h, 1, 0:BL], dt_sh)
                T.copy(dtA[vt, h, 2, 0:BL], wx_s)
                T.copy(dtA[vt, h, 3, 0:BL], wy_s)
                T.copy(tmeta[vt, 0:META_WIDTH], meta_s)
                # the consumers' view of the tile: its record (the loads above index by the chunk table)
                s0 = meta_s[0]
                n_valid = meta_s[1]
                opens = T.if_then_else(meta_s[2] >= 0, 1, 0)
                sq = meta_s[2]
                if not intermediate:
                    # the chunk end's output row, loaded at the tile's start so its latency hides behind the tile
                    # (one load and one uniform test per chunk end: a let-bound load is re-issued per element)
                    d_row[0] = dest[c]
                # Entering state (the CTA's first one was loaded before the loop).
                opens = T.if_then_else(j > 0, opens, 0)
                if opens == 1:
                    if has_init and sq < Bi:  # (sq >= 0 where the tile opens; outside the initial states: zero)
                        for n, p in T.Parallel(N, BM):
                            state[n, p] = T.Cast(accum, initial_states[sq, h, p0 + p, n])
                        if TW:
                            for n, p in T.Parallel(N, TW):
                                state_t[n, p] = T.Cast(accum, initial_states[sq, h, p0 + BM + p, n])
                        if prefetch:
                            prefetch_next_init(initial_states, sq + 1, h, p0)
                    else:
                        T.clear(state)
                        if TW:
                            T.clear(state_t)
                # A tile past its chunk's end (the second 128-token tile of a chunk of 128 tokens or fewer at
                # chunk 256: a short sequence) adds nothing: its rows have dt' 0, so the state stays, and it
                # stores no row. It skips to the chunk end's state write. (With one tile per chunk no tile is
                # empty: the test is not compiled in, and those kernels are the same as without it.)
                if S == 1 or n_valid > 0:
                    # y = exp(dA_m) C_m . state; C B^T.
                    if overlap:
                        # issued back to back, one wait (the second GEMM's) for both
                        T.copy(state, st_s)
                        T.gemm(C_s, st_s, y, clear_accum=True, policy=policy, annotations=NO_WAIT)
                        if TW:
                            T.copy(state_t, st_t)
                            T.gemm(C_s, st_t, y_tl, clear_accum=True, policy=ROWS, annotations=NO_WAIT)
                        T.gemm(C_s, B_s, cb, transpose_B=True, clear_accum=True, policy=policy)
                        for m, p in T.Parallel(BL, BM):
                            y[m, p] = y[m, p] * wy_s[m]
                        if TW:
                            for m, p in T.Parallel(BL, TW):
                                y_tl[m, p] = y_tl[m, p] * wy_s[m]
                    else:
                        for p, n in T.Parallel(BM, N):
                            st_s[p, n] = state[n, p]
                        T.gemm(C_s, st_s, y, transpose_B=True, clear_accum=True, policy=policy)
                        for m, p in T.Parallel(BL, BM):
                            y[m, p] = y[m, p] * wy_s[m]
                        T.gemm(C_s, B_s, cb, transpose_B=True, clear_accum=True, policy=policy)

                    # The causal decay mask and dt' weights. No branch around the loads (so the compiler can reuse the
                    # per-row / per-column values): a 0/1 factor lo masks the upper triangle and zeroes its exponent
                    # there (exp2(0) stays finite whatever the decay); the causal part keeps its exact exponent.
                    for m, k in T.Parallel(BL, BL):
                        lo = T.Cast(accum, k <= m)
                        ex = (dA_cs[m] - dA_cs[k]) * lo
                        cb_c[m, k] = cb[m, k] * T.exp2(ex) * (dt_sh[k] * lo)
                    # y += S x
                    if overlap:
                        # S x runs under the x weighting and the state decay; the end-state GEMM's wait covers both
                        # (it runs before the epilogue: the epilogue's output tile shares xw_s's buffer)
                        T.gemm(cb_c, x_s, y, policy=policy, annotations=NO_WAIT)
                        if TW:
                            T.gemm(cb_c, x_t, y_tl, policy=ROWS, annotations=NO_WAIT)
                        T.tma_store_wait()  # the previous tile's output store has read this buffer
                        for k, p in T.Parallel(BL, BM):
                            xw_s[k, p] = x_s[k, p] * wx_s[k]
                        for n, p in T.Parallel(N, BM):
                            state[n, p] = state[n, p] * wy_s[BL - 1]
                        if TW:
                            for k, p in T.Parallel(BL, TW):
                                xw_t[k, p] = x_t[k, p] * wx_s[k]
                            for n, p in T.Parallel(N, TW):
                                state_t[n, p] = state_t[n, p] * wy_s[BL - 1]
                            # the tail's GEMM waits for both
                            T.gemm(B_s, xw_s, state, transpose_A=True, annotations=NO_WAIT)
                            T.gemm(B_s, xw_t, state_t, transpose_A=True, policy=ROWS)
                        else:
                            T.gemm(B_s, xw_s, state, transpose_A=True)
                    else:
                        for p, k in T.Parallel(BM, BL):
                            xt_s[p, k] = x_s[k, p]
                        T.gemm(cb_c, xt_s, y, transpose_B=True, policy=policy)

                    # Epilogue: D x, silu(z), store the valid rows. Each step updates the accumulator fragment in
                    # place: a loop that reads global memory (z) and writes shared memory would be taken for a
                    # producer copy by the warp-specialisation pass and moved out of the consumer.
                    if has_D:
                        for m, p in T.Parallel(BL, BM):
                            if D_per_dim:
                                y[m, p] = y[m, p] + T.Cast(accum, D[h, p0 + p]) * T.Cast(accum, x_s[m, p])
                            else:
                                y[m, p] = y[m, p] + T.Cast(accum, D[h]) * T.Cast(accum, x_s[m, p])
                        if TW:
                            for m, p in T.Parallel(BL, TW):
                                if D_per_dim:
                                    y_tl[m, p] = y_tl[m, p] + T.Cast(accum, D[h, p0 + BM + p]) * T.Cast(
                                        accum, x_t[m, p]
                                    )
                                else:
                                    y_tl[m, p] = y_tl[m, p] + T.Cast(accum, D[h]) * T.Cast(accum, x_t[m, p])
                    if has_z:
                        # rows past the valid ones read a clamped, in-bounds row and are never stored
                        for m, p in T.Parallel(BL, BM):
                            zv = T.Cast(accum, z[T.min(s0 + m, Tz - 1), h, p0 + p])
                            y[m, p] = y[m, p] * zv / (1.0 + T.exp2(-zv * LOG2E))
                        if TW:
                            for m, p in T.Parallel(BL, TW):
                                zv = T.Cast(accum, z[T.min(s0 + m, Tz - 1), h, p0 + BM + p])
                                y_tl[m, p] = y_tl[m, p] * zv / (1.0 + T.exp2(-zv * LOG2E))
                    if narrow_p:
                        T.tma_store_wait()  # y_s's next write (elsewhere y_s is xw_s: its write above waits)
                    T.copy(y, y_s)
                    if TW:
                        T.copy(y_tl, y_t)
                    if n_valid >= BL:
                        # every row belongs to this chunk: one TMA store, waited for before y_s's next write
                        T.tma_copy(y_s, out[s0 : s0 + BL, h, p0 : p0 + BM])
                        if TW:
                            T.tma_copy(y_t, out[s0 : s0 + BL, h, p0 + BM : p0 + BP])
                    else:
                        # the rows past the chunk's end belong to the next chunk (maybe another CTA's)
                        for m, p in T.Parallel(BL, BM):
                            if m < n_valid:
                                out[s0 + m, h, p0 + p] = y_s[m, p]
                        if TW:
                            for m, p in T.Parallel(BL, TW):
                                if m < n_valid:
                                    out[s0 + m, h, p0 + BM + p] = y_t[m, p]

                    # State update (the overlapped form did it before the epilogue): state = exp(dA_last) state +
                    # B^T (x * exp(dA_last - dA_k) dt'_k), the weighted x written transposed (K-major for the GEMM).
                    if narrow_p:
                        for p, k in T.Parallel(BM, BL):
                            xt_s[p, k] = x_s[k, p] * wx_s[k]
                        for n, p in T.Parallel(N, BM):
                            state[n, p] = state[n, p] * wy_s[BL - 1]
                        T.gemm(B_s, xt_s, state, transpose_A=True, transpose_B=True)

                # Chunk end: report the end state where asked.
                if sub == S - 1:
                    if intermediate:
                        for n, p in T.Parallel(N, BM):
                            states_out[c, h, p0 + p, n] = state[n, p]
                        if TW:
                            for n, p in T.Parallel(N, TW):
                                states_out[c, h, p0 + BM + p, n] = state_t[n, p]
                    elif d_row[0] >= 0 and d_row[0] < So:  # a row outside the state output is not written
                        for n, p in T.Parallel(N, BM):
                            states_out[d_row[0], h, p0 + p, n] = state[n, p]
                        if TW:
                            for n, p in T.Parallel(N, TW):
                                states_out[d_row[0], h, p0 + BM + p, n] = state_t[n, p]
            T.tma_store_wait()  # the last tile's store has read shared memory before the CTA exits

    # the split scan is the same body with one more input (its signature from the ABI, abi.SSD_SCAN_ARGS); the plain
    # scan's generated code is unchanged by it
    R_ = T.dynamic("R") if split else None
    ty = SimpleNamespace(
        x=T.StridedTensor((T_, H, P), (x_rs, x_hs, 1), io_dtype),
        B=T.StridedTensor((T_, G, N), (b_rs, b_gs, 1), io_dtype),
        C=T.StridedTensor((T_, G, N), (c_rs, c_gs, 1), io_dtype),
        cu_chunk_seqlens=T.Tensor((nchunks1,), cu_dtype),
        seq_idx=T.Tensor((nchunks,), seq_idx_dtype),
        bounds=T.StridedTensor((batch1,), (bnd_s,), "int32"),
        dest=T.Tensor((nchunks,), "int32"),
        D=T.Tensor(D_shape, D_dtype),
        z=T.StridedTensor((Tz, H, P), (z_rs, z_hs, 1), io_dtype),
        initial_states=T.StridedTensor((Bi, H, P, N), (i_bs, P * N, N, 1), init_dtype),
        out=T.StridedTensor((T_, H, P), (o_rs, o_hs, 1), io_dtype),
        states_out=T.StridedTensor((So, H, P, N), (s_bs, P * N, N, 1), state_dtype),
        dtA=T.Tensor((nvt, H, DT_ROWS, BL), accum),
        tmeta=T.Tensor((nvt, META_WIDTH), "int32"),
    )
    if split:
        ty.run_states = T.Tensor((R_, H, P, N), accum)
        return prim_func(T, "fused_split", SSD_SCAN_ARGS, SCAN, "split", ty, scan_body)
    return prim_func(T, "fused", SSD_SCAN_ARGS, SCAN, None, ty, scan_body)
