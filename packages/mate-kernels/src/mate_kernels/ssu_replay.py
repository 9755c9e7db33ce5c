"""The ReplaySSM decode kernel (FlashInfer 0.7.2's ``checkpointing_ssu`` contract; the reference is
``mate.mamba._reference.replay``).

A slot keeps a checkpoint state ``h0`` and a ring of its last tokens (``x_cache [S, H, L, P]``, ``B_cache [S, G,
L, N]``, ``dt_cache [S, H, L]`` = ``softplus(dt + dt_bias)``); ``pnat`` of them, from ring row ``ring_start``, are
live (not yet folded into ``h0``). CTA ``(pb, h, b)`` owns ``block_p`` rows of head ``h`` for sequence ``b``, as
the SSU kernels do (:mod:`.ssu_parts`' tiling: a row's ``N`` values over ``lanes`` lanes, in registers).

Staging: the CTA copies into shared memory the slot's whole ring by physical row (``ring_rows`` >= ``L`` rows of B,
of x for its block, and of dt') and the step's new tokens by index (``new_rows`` >= T rows of B, C, x, dt'). No
placement depends on ``ring_start`` or ``pnat``, so the loads need only the slot: the new tokens' are issued at
once, the state's and the ring's together one round trip later. A ring row past the live ones is copied and never
read.

The step's tokens in order (the live ones oldest first, then the new ones) have the prefix sums ``cum`` of
``A dt'`` (one warp scan). Without a flush the state is only read: the state after token ``t`` is
``exp(cum_t) h0 + sum_{j <= t} exp(cum_t - cum_j) dt'_j x_j B_j^T``, so

    y_t[p] = exp(cum_t) (h0[p] . C_t) + sum_j coef[t, j] x_j[p],   coef[t, j] = exp(cum_t - cum_j) dt'_j (B_j . C_t)

The CTA computes the ``coef`` table once into shared memory (each ``B_j . C_t`` over one row group's lanes, the row
groups over the tokens ``j``); then per new token each lane adds its partial ``h0[p] . C_t`` over its own ``N``
values and ``coef[t, j] x_j[p]`` over every ``lanes``-th token, and one transposed reduction over the row's lanes
gives each row's total to one lane, which writes it. The state bytes of such a step are one read (a stored-state
decode reads and writes them).

A flush (``pnat + T_b > window``) folds the live tokens into the registers as one rank-``pnat`` update
(``s = exp(cum_last) s + sum_j exp(cum_last - cum_j) dt'_j x_j B_j^T``), writes them back as the new checkpoint
(rounded or requantised as the SSU kernels store a state; with a seed an fp16 state rounded stochastically as
the SSU kernels round it, an int8 / fp8 one requantised with stochastic rounding, :func:`.ssu_parts.row_ops`'
``quant_ops``), and the new tokens then run
against the unrounded registers with no live tokens, as the reference does.

Every call appends its tokens to the ring after the live ones (rows ``(ring_start + pnat + t) % L``): ``x`` by
each CTA for its rows, ``B`` by the CTA of block 0 of the group's first head, the processed ``dt`` by block 0 of
each head. Those rows are never live rows (``pnat <= window = L - T``): a CTA that stages one of them while it is
written never reads it.

Index guards: a slot outside the pool or the sentinel runs nothing (no ``out`` row is written, as the reference);
``ring_start`` is taken modulo ``L``, ``pnat`` clamped into ``[0, window]``, a packed sequence's rows clamped into
x's rows and into ``new_rows``. Whatever the tables hold, no access leaves the tensors (the planner launches a ring
of at most ``ring_rows`` rows and at most ``new_rows`` tokens per sequence).
"""

from types import SimpleNamespace

from .abi import REPLAY, REPLAY_ARGS, REPLAY_ROWS, REPLAY_ROWS_ARGS, prim_func
from .ssu_common import FLAG_CU, FLAG_D, FLAG_DT_BIAS, FLAG_SRC, FLAG_Z, SSUTiling, choose_tiling, ring_dt


def replay_kernel(
    *,
    dim: int,
    dstate: int,
    heads_per_group: int,
    state_dtype: str,
    io_dtype: str,
    dt_dtype: str = "float32",
    slot_dtype: str = "int32",
    ring_rows: int = 32,
    new_rows: int = 1,
    tiling: SSUTiling | None = None,
    min_blocks: int = 0,
    philox_rounds: int = 0,
    vector_state: bool = True,
    vector_io: bool = True,
):
    """Return the ``T.prim_func`` of one ReplaySSM decode configuration (see the module docstring).

    Arguments (:data:`.abi.REPLAY_ARGS`, in launch order): ``state [S, H, P, N]``, ``x_cache [S, H, L, P]``,
    ``B_cache [S, G, L, N]``, ``dt_cache [S, H, L]`` fp32, ``ring_start [S]``, ``pnat [S]`` int32, ``x [XB, XT,
    H, P]``, ``dt [XB, XT, H]``, ``A [H]`` fp32, ``B, C [XB, XT, G, N]``, ``D [HD]``, ``z [.., .., .., ..]``,
    ``dt_bias [HB]`` (fp32; D, z, dt_bias dummies when absent), ``out`` like x, ``slots [LS]``, ``cu [LC]`` int32,
    then ``nseq, ntok`` (T, or ``max_seqlen`` packed), ``window`` (``L - T``), ``pad`` (int64), ``flags``
    (``FLAG_D | FLAG_Z | FLAG_DT_BIAS | FLAG_SOFTPLUS | FLAG_SRC | FLAG_CU``), then ``state_scale [S, H, P]`` for
    a block-scaled state, then ``rand_seed [1]`` int64 with ``philox_rounds`` > 0 (the flush of an fp16, int8 or
    fp8-e4m3 state rounded stochastically).

    ``ring_rows`` / ``new_rows``: the staged rows (powers of two; the planner's ``staged_rows``). ``tiling``
    (default :func:`.ssu_common.choose_tiling`), ``min_blocks`` (``__launch_bounds__``) and ``vector_state`` mean
    what they mean for :func:`.ssu.ssu_kernel`; ``vector_io``: the rings' rows in 16-byte pieces (their outer
    strides and bases on the 16-byte grid).
    """
    return _replay(dim=dim, dstate=dstate, heads_per_group=heads_per_group, state_dtype=state_dtype,
                   io_dtype=io_dtype, dt_dtype=dt_dtype, slot_dtype=slot_dtype, ring_rows=ring_rows, new_rows=new_rows,
                   tiling=tiling, min_blocks=min_blocks, philox_rounds=philox_rounds, vector_state=vector_state,
                   vector_io=vector_io)  # fmt: skip


def replay_rows_kernel(
    *,
    dim: int,
    dstate: int,
    heads_per_group: int,
    state_dtype: str,
    io_dtype: str,
    slot_dtype: str = "int32",
    ring_rows: int = 32,
    new_rows: int = 1,
    tiling: SSUTiling | None = None,
    min_blocks: int = 0,
    philox_rounds: int = 0,
    vector_state: bool = True,
    vector_io: bool = True,
    pdl: bool = False,
):
    """Return the ``T.prim_func`` of the rows kernel of the table design: :func:`replay_kernel`'s work with each
    head's token table read from the workspace that :func:`.ssu_replay_table.replay_table_kernel` wrote (its
    record: :func:`.ssu_ring.table_layout`) instead of computed by every CTA. It stages no new B row and no dt',
    the B ring only on a flush, and appends only x (the table kernel appends B and dt'). Grid ``(P / block_p, H,
    sequences)``, as the fused kernel's.

    Arguments (:data:`.abi.REPLAY_ROWS_ARGS`): ``state``, ``x_cache``, ``B_cache``, ``ring_start``, ``pnat``,
    ``x``, ``C``, ``D``, ``z``, ``out``, ``slots``, ``cu`` as for :func:`replay_kernel`, ``table [TS, H, rec]`` fp32,
    ``nseq, ntok, window, pad, flags``, then the variant's ``state_scale`` / ``rand_seed``. ``pdl``: launched as
    a programmatic dependent of the table kernel (CUDA sm_90+): the state and ring loads are issued before it waits
    for the table."""
    return _replay(dim=dim, dstate=dstate, heads_per_group=heads_per_group, state_dtype=state_dtype,
                   io_dtype=io_dtype, dt_dtype="float32", slot_dtype=slot_dtype, ring_rows=ring_rows,
                   new_rows=new_rows, tiling=tiling, min_blocks=min_blocks, philox_rounds=philox_rounds,
                   vector_state=vector_state, vector_io=vector_io, rows=True, pdl=pdl)  # fmt: skip


def _replay(*, dim, dstate, heads_per_group, state_dtype, io_dtype, dt_dtype, slot_dtype, ring_rows, new_rows, tiling,
            min_blocks, philox_rounds, vector_state, vector_io, rows=False, pdl=False):  # fmt: skip
    """The fused kernel, or with ``rows`` the table design's rows kernel (one body: what differs is chosen here,
    at build time)."""
    import tilelang.language as T

    from .ssu_parts import row_ops
    from .ssu_ring import checkpoint_ops, checkpoint_variant, ring_ops, table_layout

    variant = checkpoint_variant(state_dtype, philox_rounds)
    P, N, ratio = int(dim), int(dstate), int(heads_per_group)
    tiling = tiling or choose_tiling(P, N, state_dtype)
    ops = row_ops(T, dim=P, dstate=N, tiling=tiling, state_dtype=state_dtype, io_dtype=io_dtype, tied=True,
                  vector_state=vector_state, transposed=True)  # fmt: skip
    VEC, NV, LN, R, TH, BP, RP, NB, NS = ops.VEC, ops.NV, ops.L, ops.R, ops.TH, ops.BP, ops.RP, ops.NB, ops.NS
    prow, bit, aligned = ops.prow, ops.bit, ops.aligned
    fetch_state, convert_state = ops.fetch_state, ops.convert_state
    guard_p, transposed, reduce_rows = ops.guard_p, ops.transposed, ops.reduce_rows
    ck = checkpoint_ops(T, ops, state_dtype=state_dtype, philox_rounds=philox_rounds)
    quant, q = ck.quant, ck.q
    f32, i64 = "float32", "int64"
    LOG_LN = LN.bit_length() - 1
    RG = TH // LN  # row groups per CTA
    rops = ring_ops(T, ops, io_dtype=io_dtype, ring_rows=ring_rows, new_rows=new_rows, vector_io=vector_io)
    CH, TN, IOB, IOV, XV, NCB, NCX = rops.CH, rops.TN, rops.IOB, rops.IOV, rops.XV, rops.NCB, rops.NCX
    D_ITERS, NB_ITERS, NX_ITERS, ND_ITERS = rops.D_ITERS, rops.NB_ITERS, rops.NX_ITERS, rops.ND_ITERS
    lane_row, put, wrap = rops.lane_row, rops.put, rops.wrap
    NCH = -(-CH // 32)  # 32-position chunks of the prefix scan
    lay = table_layout(CH, TN)
    REC = lay.rec

    S, H, G, L, XB, XT, HD, HB, LS, LC, TS = T.dynamic("S, H, G, L, XB, XT, HD, HB, LS, LC, TS")
    ZB, ZT, HZ, PZ = T.dynamic("ZB, ZT, HZ, PZ")
    s_s0, s_s1, q_s0, q_s1 = T.dynamic("s_s0, s_s1, q_s0, q_s1", i64)
    xc0, xc1, xc2, bc0, bc1, bc2, dc0, dc1, dc2 = T.dynamic("xc0, xc1, xc2, bc0, bc1, bc2, dc0, dc1, dc2", i64)
    sx0, sx1, sx2, sx3, sd0, sd1, sd2 = T.dynamic("sx0, sx1, sx2, sx3, sd0, sd1, sd2")
    sb0, sb1, sb2, sc0, sc1, sc2 = T.dynamic("sb0, sb1, sb2, sc0, sc1, sc2")
    so0, so1, so2, so3, sz0, sz1, sz2, sz3 = T.dynamic("so0, so1, so2, so3, sz0, sz1, sz2, sz3")
    sa0, sD0, sB0 = T.dynamic("sa0, sD0, sB0")
    # (one type object per parameter: TileLang binds parameters of one annotation object to one buffer)
    ty = SimpleNamespace(
        state=T.StridedTensor((S, H, P, N), (s_s0, s_s1, N, 1), state_dtype),
        x_cache=T.StridedTensor((S, H, L, P), (xc0, xc1, xc2, 1), io_dtype),
        B_cache=T.StridedTensor((S, G, L, N), (bc0, bc1, bc2, 1), io_dtype),
        dt_cache=T.StridedTensor((S, H, L), (dc0, dc1, dc2), f32),
        ring_start=T.Tensor((S,), "int32"),
        pnat=T.Tensor((S,), "int32"),
        x=T.StridedTensor((XB, XT, H, P), (sx0, sx1, sx2, sx3), io_dtype),
        dt=T.StridedTensor((XB, XT, H), (sd0, sd1, sd2), dt_dtype),
        A=T.StridedTensor((H,), (sa0,), f32),
        B=T.StridedTensor((XB, XT, G, N), (sb0, sb1, sb2, 1), io_dtype),
        C=T.StridedTensor((XB, XT, G, N), (sc0, sc1, sc2, 1), io_dtype),
        D=T.StridedTensor((HD,), (sD0,), f32),
        z=T.StridedTensor((ZB, ZT, HZ, PZ), (sz0, sz1, sz2, sz3), io_dtype),
        dt_bias=T.StridedTensor((HB,), (sB0,), f32),
        out=T.StridedTensor((XB, XT, H, P), (so0, so1, so2, so3), io_dtype),
        slots=T.Tensor((LS,), slot_dtype),
        cu=T.Tensor((LC,), "int32"),
        state_scale=T.StridedTensor((S, H, P), (q_s0, q_s1, 1), f32),
        rand_seed=T.Tensor((1,), i64),
        table=T.Tensor((TS, H, REC), f32),
    )

    def dt_of(dt, dt_bias, xb, tok, h, flags):
        """The processed dt of a new token (what the ring caches)."""
        hb = bit(flags, FLAG_DT_BIAS)
        return ring_dt(T, dt[xb, tok, h], dt_bias[h * hb], hb, flags)

    @T.macro
    def write_row(out, z, Xn, total, r, pb, rg, xb, t0, t, h, dv, hz):
        """out of row ``r`` of the thread's rows for new token ``t``: the row's total, + D x, gated by z."""
        p = pb * BP + r * RP + rg
        y = total + dv * T.cast(Xn[t, r * RP + rg], f32)
        zt = T.cast(z[xb * hz, (t0 + t) * hz, h * hz, prow(pb, r, rg) * hz], f32)
        y = T.if_then_else(hz != 0, y * zt / (1.0 + T.exp(-zt)), y)
        if guard_p:
            if p < P:
                out[xb, t0 + t, h, p] = T.cast(y, io_dtype)
        else:
            out[xb, t0 + t, h, p] = T.cast(y, io_dtype)

    @T.macro
    def common(state, x_cache, B_cache, dt_cache, ring_start, pnat, x, dt, A, B, C, D, z, dt_bias, out, slots, cu,
               table, nseq, ntok, window, pad, flags, scale, seed_t):  # fmt: skip
        pool = aligned(state, vector_state)
        ring_b = aligned(B_cache, vector_io, IOB)  # (the rings' outer strides on the 16-byte grid: vector_io)
        ring_x = aligned(x_cache, vector_io, IOB)
        with T.Kernel(NB, H, nseq, threads=TH) as (pb, h, b):
            if min_blocks > 0:
                T.annotate_min_blocks_per_sm(min_blocks)
            tx = T.get_thread_binding()
            lane = tx % LN
            rg = tx // LN
            wl = tx % 32
            g = h // ratio
            # Staged in shared memory in the io dtype (as fp32 they take twice the space, which costs occupancy:
            # docs/design/decisions.md): the slot's whole ring by physical row (B, x of this block and dt'), and
            # the new tokens by index (B, C, x, dt'). Neither placement depends on
            # the ring's position or live count, so every load is issued as soon as its address is known: the new
            # tokens' at once, the ring's and the state's together once the slot is (one round trip after).
            Bs = T.alloc_shared((CH, N), io_dtype)
            Xs = T.alloc_shared((CH, BP), io_dtype)
            if not rows:
                dts = T.alloc_shared((CH,), f32)
                Bn = T.alloc_shared((TN, N), io_dtype)
            Cn = T.alloc_shared((TN, N), io_dtype)
            Xn = T.alloc_shared((TN, BP), io_dtype)
            if not rows:
                dtn = T.alloc_shared((TN,), f32)
            # (static shared buffers: each its own buffer, so writing one inside a loop that reads the dynamic
            # buffer does not make TileLang fence every iteration)
            if rows:
                rec = T.alloc_shared((REC,), f32, scope="shared")  # the head's record of the table
            else:
                cum = T.alloc_shared((CH,), f32, scope="shared")
                dtp = T.alloc_shared((CH,), f32, scope="shared")
                cb = T.alloc_shared((TN, CH), f32, scope="shared")
                coef = T.alloc_shared((TN, CH), f32, scope="shared")
                fold = T.alloc_shared((CH,), f32, scope="shared")
            s = T.alloc_local((NS,), f32)
            raw = T.alloc_local((NS,), state_dtype)
            buf = T.alloc_local((VEC,), state_dtype)
            stg = T.alloc_local((max(IOV, XV),), io_dtype)
            rb = T.alloc_local((NV * VEC,), io_dtype)
            bv = T.alloc_local((NV * VEC,), f32)
            cv = T.alloc_local((NV * VEC,), f32)
            acc = T.alloc_local((R,), f32)
            dot = T.alloc_local((1,), f32)
            sc = T.alloc_local((1,), f32)
            dq = T.alloc_local((1,), f32)
            if quant:
                qs = T.alloc_local((R,), f32)
            slot = T.alloc_var(i64)
            t0 = T.alloc_var("int32")
            tb = T.alloc_var("int32")
            w = T.alloc_var(f32)
            row = T.alloc_var("int32")
            b64 = T.cast(b, i64)
            hs = bit(flags, FLAG_SRC)
            hc = bit(flags, FLAG_CU)
            slot = T.if_then_else(hs != 0, T.cast(slots[b64 * T.cast(hs, i64)], i64), b64)
            live_slot = T.And(slot != pad, T.And(slot >= 0, slot < T.cast(S, i64)))
            # a packed sequence's rows clamped into x's rows (uniform: T rows of batch entry b), at most TN of them
            t0 = T.if_then_else(hc != 0, T.min(T.max(cu[b * hc], 0), XT), 0)
            tb = T.if_then_else(hc != 0, T.min(T.max(cu[(b + 1) * hc] - t0, 0), T.min(ntok, XT - t0)), ntok)
            tb = T.min(tb, T.min(TN, L))  # (tb <= T <= TN, T <= L <= CH for every call the planner launches)
            xb = b * (1 - hc)
            if not rows:
                a = A[h]
            # the new tokens (B and C in 16-byte pieces over the threads; x rows past P clamped onto row P - 1)
            for it in T.unroll(NB_ITERS):
                idx = it * TH + tx
                ti = idx // NCB
                n0 = (idx % NCB) * IOV
                if ti < tb:
                    if not rows:
                        for i in T.unroll(IOV):
                            stg[i] = B[xb, t0 + ti, g, n0 + i]
                        put(Bn, ti, n0, stg, IOV)
                    for i in T.unroll(IOV):
                        stg[i] = C[xb, t0 + ti, g, n0 + i]
                    put(Cn, ti, n0, stg, IOV)
            for it in T.unroll(NX_ITERS):
                idx = it * TH + tx
                ti = idx // NCX
                j0 = (idx % NCX) * XV
                if ti < tb:
                    for i in T.unroll(XV):
                        stg[i] = x[xb, t0 + ti, h, T.min(pb * BP + j0 + i, P - 1)]
                    put(Xn, ti, j0, stg, XV)
            if not rows:
                for it in T.unroll(ND_ITERS):
                    ti = it * TH + tx
                    if ti < tb:
                        dq[0] = dt_of(dt, dt_bias, xb, t0 + ti, h, flags)
                        dtn[ti] = dq[0]
            if live_slot and tb > 0:
                rs = T.alloc_var("int32")
                pk = T.alloc_var("int32")
                rs = ((ring_start[slot] % L) + L) % L
                pk = T.min(T.max(pnat[slot], 0), T.min(window, L - tb))
                fetch_state(raw, pool, slot, h, pb, tx)
                if quant:
                    q.fetch_scales(qs, scale, slot, h, pb, tx)
                first = T.alloc_var("int32")
                if rows:
                    first = T.if_then_else(pk + tb > window, pk, 0)  # a flush: the new tokens start from the fold
                    # the whole ring by physical row: x, and B where the live tokens are folded
                    rops.stage_ring_x(Xs, stg, ring_x, slot, h, pb, tx, L)
                    if first > 0:
                        rops.stage_ring_b(Bs, stg, ring_b, slot, g, tx, L)
                    if pdl:
                        T.pdl_sync()  # the table kernel's writes are visible from here
                    for it in T.unroll(-(-REC // (4 * TH))):
                        k = (it * TH + tx) * 4
                        if k < REC:
                            for i in T.vectorized(4):
                                rec[k + i] = table[b, h, k + i]
                    if quant:
                        q.dequantize(s, raw, qs, True)
                    else:
                        convert_state(s, raw, True)
                    T.sync_threads()
                else:
                    # the whole ring by physical row (a row past the live ones is staged and never read)
                    rops.stage_ring(Bs, Xs, dts, stg, dq, ring_b, ring_x, dt_cache, slot, g, h, pb, tx, L)
                    T.sync_threads()
                    first = T.if_then_else(pk + tb > window, pk, 0)  # a flush: the new tokens start from the fold
                if not rows:
                    # the prefix sums of A dt' over the step's token sequence (live oldest first, then the new ones),
                    # a scan over every warp's lanes (warp 0's stored), and dt' by position
                    cv[0] = T.float32(0)
                    for c in T.unroll(NCH):
                        pos = c * 32 + wl
                        inl = pos < pk
                        dtq = T.if_then_else(inl, dts[wrap(rs + T.min(pos, CH - 1), L)],
                                             dtn[T.min(T.max(pos - pk, 0), TN - 1)])  # fmt: skip
                        sc[0] = T.if_then_else(pos < pk + tb, a * dtq, T.float32(0))
                        for d in T.unroll(5):
                            up = T.shfl_up(sc[0], 1 << d)
                            sc[0] = sc[0] + T.if_then_else(wl >= (1 << d), up, T.float32(0))
                        sc[0] = sc[0] + cv[0]
                        if tx < 32 and pos < CH:
                            cum[pos] = sc[0]
                            dtp[pos] = dtq
                        cv[0] = T.shfl_sync(sc[0], 31)
                    # the table cb[t, j] = B_j . C_t, token j >= first up to the new token t: each dot over one row
                    # group's lanes, the row groups over the tokens j (then scaled by all threads at once, not by one
                    # lane per dot inside the loop)
                    for t in T.serial(tb):
                        lane_row(cv, rb, Cn, t, lane)
                        for jj in T.serial((pk + t + RG - first) // RG):
                            j = T.min(first + jj * RG + rg, pk + t)
                            if j < pk:
                                lane_row(bv, rb, Bs, wrap(rs + j, L), lane)
                            else:
                                lane_row(bv, rb, Bn, j - pk, lane)
                            dot[0] = T.float32(0)
                            for k in T.unroll(NV * VEC):
                                dot[0] = dot[0] + bv[k] * cv[k]
                            for d in T.unroll(LOG_LN):
                                dot[0] = dot[0] + T.shfl_xor(dot[0], LN >> (d + 1))
                            if lane == 0:
                                cb[t, j] = dot[0]
                    T.sync_threads()
                    # the weights coef[t, j] = exp(cum[k + t] - cum[j]) dt'_j cb[t, j], and the flush's
                    # h_flushed = exp(cum[k - 1]) h0 + sum_j fold[j] x_j B_j^T over the live tokens
                    for it in T.unroll(-(-TN * CH // TH)):
                        e = it * TH + tx
                        t = e // CH
                        j = e % CH
                        if t < tb and j >= first and j <= pk + t:
                            coef[t, j] = T.exp(cum[pk + t] - cum[j]) * dtp[j] * cb[t, j]
                    for it in T.unroll(D_ITERS):
                        j = it * TH + tx
                        if j < pk:
                            fold[j] = T.exp(cum[pk - 1] - cum[j]) * dtp[j]
                    if quant:
                        q.dequantize(s, raw, qs, True)
                    else:
                        convert_state(s, raw, True)
                    T.sync_threads()
                if first > 0:
                    # a flush: the live tokens folded into the checkpoint, written back
                    w = rec[lay.fdecay] if rows else T.exp(cum[pk - 1])
                    for k in T.unroll(NS):
                        s[k] = s[k] * w
                    for j in T.serial(pk):
                        row = wrap(rs + j, L)
                        lane_row(bv, rb, Bs, row, lane)
                        for r in T.unroll(R):
                            xr = (rec[lay.fold + j] if rows else fold[j]) * T.cast(Xs[row, r * RP + rg], f32)
                            for k in T.unroll(NV * VEC):
                                s[r * NV * VEC + k] = s[r * NV * VEC + k] + xr * bv[k]
                    ck.store(s, buf, pool, scale, qs if quant else None, slot, h, pb, tx,
                             seed_t[0] if philox_rounds else None)  # fmt: skip
                hd = bit(flags, FLAG_D)
                hz = bit(flags, FLAG_Z)
                dv = D[h * hd] * T.cast(hd, f32)
                for t in T.serial(tb):
                    # y_t = decay_t (h0 . C_t) + sum_j coef[t, j] x_j: the state's part per lane, the tokens' over
                    # the lanes (token first + lane, + LN, ...), then one reduction over the row's lanes
                    lane_row(cv, rb, Cn, t, lane)
                    if rows:
                        w = rec[lay.decay + t]
                    else:
                        w = T.exp(cum[pk + t] - T.if_then_else(first > 0, cum[T.max(first - 1, 0)], T.float32(0)))
                    for r in T.unroll(R):
                        dot[0] = T.float32(0)
                        for k in T.unroll(NV * VEC):
                            dot[0] = dot[0] + s[r * NV * VEC + k] * cv[k]
                        acc[r] = w * dot[0]
                    for jj in T.serial((pk + t + LN - first) // LN):
                        j = first + jj * LN + lane
                        if j <= pk + t:
                            cf = rec[t * CH + j] if rows else coef[t, j]
                            if j < pk:
                                row = wrap(rs + j, L)
                                for r in T.unroll(R):
                                    acc[r] = acc[r] + cf * T.cast(Xs[row, r * RP + rg], f32)
                            else:
                                for r in T.unroll(R):
                                    acc[r] = acc[r] + cf * T.cast(Xn[j - pk, r * RP + rg], f32)
                    reduce_rows(acc, tx)
                    if transposed:
                        # lane ``lane`` holds the total of row ``lane // (LN / R)``: one lane per row writes it
                        if lane % (LN // R) == 0:
                            write_row(out, z, Xn, acc[0], lane // (LN // R), pb, rg, xb, t0, t, h, dv, hz)
                    elif lane == 0:
                        for r in T.unroll(R):
                            write_row(out, z, Xn, acc[r], r, pb, rg, xb, t0, t, h, dv, hz)
                # the new tokens into the ring after the live ones (rows no CTA reads as live in this call): x by
                # each CTA for its rows, B by block 0 of the group's first head, dt' by block 0 of each head (the
                # rows kernel: x; the table kernel appended B and dt')
                for it in T.unroll(NX_ITERS):
                    idx = it * TH + tx
                    ti = idx // NCX
                    j0 = (idx % NCX) * XV
                    if ti < tb:
                        for i in T.unroll(XV):
                            if pb * BP + j0 + i < P:
                                ring_x[slot, h, wrap(rs + pk + ti, L), pb * BP + j0 + i] = Xn[ti, j0 + i]
                if not rows:
                    if pb == 0:
                        if h % ratio == 0:
                            rops.append_b(Bn, stg, ring_b, slot, g, rs, pk, tb, tx, L)
                        for it in T.unroll(ND_ITERS):
                            ti = it * TH + tx
                            if ti < tb:
                                dt_cache[slot, h, wrap(rs + pk + ti, L)] = dtn[ti]

    suffix = "_" + variant.replace("+", "_") if variant else ""
    if rows:

        @T.macro
        def rows_body(state, x_cache, B_cache, ring_start, pnat, x, C, D, z, out, slots, cu, table, nseq, ntok, window,
                      pad, flags, scale, seed_t):  # fmt: skip
            common(state, x_cache, B_cache, None, ring_start, pnat, x, None, None, None, C, D, z, None, out, slots, cu,
                   table, nseq, ntok, window, pad, flags, scale, seed_t)  # fmt: skip

        return prim_func(T, "ssu_replay_rows" + suffix, REPLAY_ROWS_ARGS, REPLAY_ROWS, variant, ty, rows_body)

    @T.macro
    def body(state, x_cache, B_cache, dt_cache, ring_start, pnat, x, dt, A, B, C, D, z, dt_bias, out, slots, cu,
             nseq, ntok, window, pad, flags, scale, seed_t):  # fmt: skip
        common(state, x_cache, B_cache, dt_cache, ring_start, pnat, x, dt, A, B, C, D, z, dt_bias, out, slots, cu, None,
               nseq, ntok, window, pad, flags, scale, seed_t)  # fmt: skip

    # the scaled kernel is the same body with the scales as one more argument, the stochastically rounding one
    # with the seed (a scaled one rounding stochastically with both)
    return prim_func(T, "ssu_replay" + suffix, REPLAY_ARGS, REPLAY, variant, ty, body)


__all__ = ["replay_kernel", "replay_rows_kernel"]
