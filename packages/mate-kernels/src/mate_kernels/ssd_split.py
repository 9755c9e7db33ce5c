"""The split design of the SSD varlen prefill: a sequence's chunks spread over several CTAs of the chunk scan.

The chunk scan (:mod:`.ssd_scan`) walks each run of chunks serially with the state in registers, so one long
sequence gives only ``heads x P-blocks`` CTAs; at 16-32 heads per rank most SMs idle. The split design cuts the
chunk list into ``R`` even runs, whatever the sequences, and runs three kernels after the dt pre-pass:

:func:`ssd_run_states_kernel`
    the state pass: one CTA per (P block, head, run) walks its run's tiles with only the state recurrence
    (``state = exp(dA_last) state + Bᵀ (x exp(dA_last - dA_k) dt'_k)``: one GEMM per tile of the scan's four,
    reading x and B only), from a zero state where the run starts mid-sequence and from the initial state (or
    zero) at every sequence it opens; it writes the run's end state and the log2 decay across it
    (:data:`SPLIT_OPENED` where a sequence opens in the run: the state entering the run no longer reaches its end);
:func:`ssd_combine_kernel`
    the hand-over, short and sequential: ``S[r] = S_local[r] + exp2(dec[r]) S[r - 1]`` over the runs in order, in
    place, in fp32, per (head, block of the state): each run's true end state;
the chunk scan with ``split``
    every run at once, a run that starts mid-sequence entering with ``S[r - 1]``: outputs and states written once,
    as exact as the plain scan's.

Cost: x and B read once more and one GEMM per tile more, in exchange for a serial walk ``R`` times shorter. The
planner (``mate.mamba._tilelang.ssd_plan``) picks ``R`` from the shape and the SM count, and keeps the plain scan where
splitting does not pay.

Index guards: as the scan's (TMA bounds the tile loads; ``seq_idx`` through the tile records names an initial
state only inside ``initial_states``); run ``r`` writes only its own rows.
"""

# No ``from __future__ import annotations``: TileLang evaluates the T.Tensor annotations.
from .ssd_common import DT_ROWS, META_WIDTH, check_tiling
from .ssd_scan import FLAG_INIT  # the chunk scan's runtime flags, which the state pass reads

# the log2 decay recorded for a run in which a sequence opens (exp2 of it is 0; any real decay sum stays far above
# half of it)
SPLIT_OPENED = -1.0e30

COMBINE_THREADS = 128
COMBINE_BLOCK = 1024  # state elements per combine CTA (8 per thread)
FIX_THREADS = 128  # one warpgroup: the C·state GEMM of one tile


def ssd_combine_kernel(*, heads: int, dim: int, dstate: int):
    """The hand-over of the run end states (see the module doc). Arguments: ``run_states [R, H, P * N]`` fp32
    (the scan's run end states, made true in place), ``run_dec [R, H]`` fp32."""
    H, E = heads, dim * dstate
    if E % COMBINE_BLOCK:
        raise ValueError(f"dim * dstate ({E}) must be a multiple of {COMBINE_BLOCK}")
    import tilelang.language as T

    EB = COMBINE_BLOCK
    R_ = T.dynamic("R")

    @T.prim_func
    def combine(
        run_states: T.Tensor((R_, H, E), "float32"),
        run_dec: T.Tensor((R_, H), "float32"),
    ):
        with T.Kernel(E // EB, H, threads=COMBINE_THREADS) as (eb, h):
            carry = T.alloc_fragment((EB,), "float32")
            for i in T.Parallel(EB):
                carry[i] = run_states[0, h, eb * EB + i]
            for r in T.serial(R_ - 1):
                f = T.exp2(run_dec[r + 1, h])  # 0 where a sequence opens in run r + 1
                for i in T.Parallel(EB):
                    carry[i] = run_states[r + 1, h, eb * EB + i] + f * carry[i]
                    run_states[r + 1, h, eb * EB + i] = carry[i]

    return combine


def states_smem_bytes(*, dim_block: int, dstate: int, block_L: int, io_bytes: int, num_stages: int) -> int:
    """Dynamic shared memory of :func:`ssd_run_states_kernel`: the pipelined x, B tiles, three decay rows and the
    tile record per stage, and the weighted x tile."""
    per_stage = block_L * (dim_block + dstate) * io_bytes + 3 * block_L * 4 + META_WIDTH * 4
    return num_stages * per_stage + block_L * dim_block * io_bytes


def ssd_run_states_kernel(
    *,
    heads: int,
    groups: int,
    dim: int,
    dstate: int,
    chunk_size: int,
    io_dtype: str = "bfloat16",
    init_dtype: str = "float32",
    block_P: int = 64,
    block_L: int = 128,
    num_stages: int = 2,
):
    """The state pass (see the module doc). ``block_P`` and ``block_L`` are the chunk scan's; ``num_stages``
    tiles in flight (:func:`states_smem_bytes`).

    Arguments in order: ``x [T, H, P]``, ``B [T, G, N]``, ``cu_chunk_seqlens [nchunks + 1]``, ``bounds [R + 1]``
    (the runs), ``initial_states [Bi, H, P, N]``, ``dtA``, ``tmeta`` (the pre-pass's), ``run_states [R, H, P, N]``
    fp32 and ``run_dec [R, H]`` fp32 (written), ``flags`` (the scan's: ``FLAG_INIT``)."""
    H, G, P, N, L = heads, groups, dim, dstate, chunk_size
    check_tiling(heads=H, groups=G, dim=P, chunk_size=L, block_P=block_P, block_L=block_L)
    import tilelang.language as T

    rep = H // G
    n_pb = P // block_P
    S = L // block_L
    BP, BL = block_P, block_L
    accum = "float32"
    threads = 256 if N > 128 else 128  # the [N, block_P] fp32 state in registers: at most 64 per thread
    narrow = block_P % 64 != 0  # TileLang 0.1.15 has MN-major wgmma operands only for multiples of 64

    T_ = T.dynamic("T")
    nchunks1 = T.dynamic("nchunks1")
    R1 = T.dynamic("R1")
    R_ = T.dynamic("R")
    Bi = T.dynamic("Bi")
    nvt = T.dynamic("nvt")
    x_rs, x_hs, b_rs, b_gs, i_bs = T.dynamic("x_rs, x_hs, b_rs, b_gs, i_bs")

    @T.prim_func
    def run_states_pass(
        x: T.StridedTensor((T_, H, P), (x_rs, x_hs, 1), io_dtype),
        B: T.StridedTensor((T_, G, N), (b_rs, b_gs, 1), io_dtype),
        cu_chunk_seqlens: T.Tensor((nchunks1,), "int32"),
        bounds: T.Tensor((R1,), "int32"),
        initial_states: T.StridedTensor((Bi, H, P, N), (i_bs, P * N, N, 1), init_dtype),
        dtA: T.Tensor((nvt, H, DT_ROWS, BL), accum),
        tmeta: T.Tensor((nvt, META_WIDTH), "int32"),
        run_states: T.Tensor((R_, H, P, N), accum),
        run_dec: T.Tensor((R_, H), accum),
        flags: T.int32,
    ):
        with T.Kernel(n_pb, H, R_, threads=threads) as (pb, h, b):
            x_s = T.alloc_shared((BL, BP), io_dtype)
            B_s = T.alloc_shared((BL, N), io_dtype)
            if narrow:
                xw_s = T.alloc_shared((BP, BL), io_dtype)  # x weighted, K-major (a block_P off the 64 grid)
            else:
                xw_s = T.alloc_shared((BL, BP), io_dtype)  # x weighted, MN-major: written row for row
            dA_cs = T.alloc_shared((BL,), accum)
            wx_s = T.alloc_shared((BL,), accum)
            wy_s = T.alloc_shared((BL,), accum)
            meta_s = T.alloc_shared((META_WIDTH,), "int32")
            state = T.alloc_fragment((N, BP), accum)
            acc = T.alloc_local((1,), accum)

            g = h // rep
            p0 = pb * BP
            has_init = (flags & FLAG_INIT) != 0
            c_first = bounds[b]
            n_tiles = (bounds[b + 1] - c_first) * S
            T.clear(state)
            acc[0] = 0.0
            for j in T.Pipelined(n_tiles, num_stages=num_stages):
                c = c_first + j // S
                s0 = cu_chunk_seqlens[c] + (j % S) * BL
                T.copy(x[s0 : s0 + BL, h, p0 : p0 + BP], x_s)
                T.copy(B[s0 : s0 + BL, g, 0:N], B_s)
                vt = c * S + j % S
                T.copy(dtA[vt, h, 0, 0:BL], dA_cs)
                T.copy(dtA[vt, h, 2, 0:BL], wx_s)
                T.copy(dtA[vt, h, 3, 0:BL], wy_s)
                T.copy(tmeta[vt, 0:META_WIDTH], meta_s)
                sq = meta_s[2]
                if sq >= 0:  # the tile opens a sequence: its initial state (zero without, or outside them)
                    acc[0] = SPLIT_OPENED
                    if has_init and sq < Bi:
                        for n, p in T.Parallel(N, BP):
                            state[n, p] = T.Cast(accum, initial_states[sq, h, p0 + p, n])
                    else:
                        T.clear(state)
                # rows past the chunk's end have dt' = 0 (the pre-pass), so their weight is 0
                for n, p in T.Parallel(N, BP):
                    state[n, p] = state[n, p] * wy_s[BL - 1]
                if narrow:
                    for p, k in T.Parallel(BP, BL):
                        xw_s[p, k] = x_s[k, p] * wx_s[k]
                    T.gemm(B_s, xw_s, state, transpose_A=True, transpose_B=True)
                else:
                    for k, p in T.Parallel(BL, BP):
                        xw_s[k, p] = x_s[k, p] * wx_s[k]
                    T.gemm(B_s, xw_s, state, transpose_A=True)
                acc[0] = acc[0] + dA_cs[BL - 1]
            for n, p in T.Parallel(N, BP):
                run_states[b, h, p0 + p, n] = state[n, p]
            if pb == 0:
                run_dec[b, h] = acc[0]

    return run_states_pass
