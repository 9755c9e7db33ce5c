"""The table kernel of ReplaySSM's table design: the token tables of a step, once per (sequence, group), into a
workspace that the rows kernel (:func:`.ssu_replay.replay_rows_kernel`, launched next) reads.

The fused kernel (:func:`.ssu_replay.replay_kernel`) has every CTA stage the ring's B rows, compute the ``B . C``
dot products, the prefix sums of ``A dt'`` and the token table before its state rows' work: at small batch that
serial work is each warp's critical path, and it is the same for every block of a head and, the dot products, for
every head of a group. Here one CTA per (sequence, ``heads_per_cta`` heads of one group) does it once:

- **stage**: the group's B ring by physical row, the step's new B and C rows, dt' of the new tokens of each of its
  heads (``dt + dt_bias``, softplus where asked) and each head's dt' ring;
- **dot products** ``cb[t, j] = B_j . C_t`` for every new token ``t`` and every token ``j`` from ``first`` up to it
  (``first``: 0, or the live count on a flush, whose new tokens start from the folded state), each over ``DL``
  lanes, a lane group per token ``j`` against every new token's C;
- **prefix sums** ``cum`` of ``A dt'`` over the step's tokens (live oldest first, then the new ones): one warp
  scan per head;
- **each head's record** (:func:`.ssu_ring.table_layout`): ``coef[t, j] = exp(cum_t - cum_j) dt'_j cb[t, j]``, the
  state's decay at each new token ``exp(cum_t - cum_{first - 1})``, and on a flush the fold weights
  ``exp(cum_{k-1} - cum_j) dt'_j`` of the live tokens and the checkpoint's decay ``exp(cum_{k-1})``;
- **ring append**: B of the new tokens (by the group's first CTA) and dt' of each head, after the live rows. No
  CTA of the step reads those rows as live.

Entries outside a sequence's tokens are not written (the rows kernel does not read them). A slot outside the pool,
the sentinel or an empty sequence writes nothing. The kernel allows the rows kernel to launch at once
(programmatic dependent launch, ``pdl``): that one issues its state and ring loads before it waits for the table.
"""

from types import SimpleNamespace

from .abi import REPLAY_TABLE, REPLAY_TABLE_ARGS, prim_func
from .ssu_common import FLAG_CU, FLAG_DT_BIAS, FLAG_SRC, flag_bit, ring_dt


def replay_table_kernel(
    *,
    dstate: int,
    heads_per_group: int,
    io_dtype: str,
    dt_dtype: str = "float32",
    slot_dtype: str = "int32",
    ring_rows: int = 32,
    new_rows: int = 1,
    heads_per_cta: int = 1,
    warps: int = 4,
    vector_io: bool = True,
    pdl: bool = False,
):
    """Return the ``T.prim_func`` of one table kernel (see the module docstring), grid ``(groups * heads_per_group /
    heads_per_cta, sequences)``.

    Arguments (:data:`.abi.REPLAY_TABLE_ARGS`, in launch order): ``B_cache [S, G, L, N]``, ``dt_cache [S, H, L]``
    fp32, ``ring_start [S]``, ``pnat [S]`` int32, ``dt [XB, XT, H]``, ``A [H]`` fp32, ``B, C [XB, XT, G, N]``,
    ``dt_bias [HB]`` fp32 (a dummy when absent), ``slots [LS]``, ``cu [LC]`` int32, ``table [TS, H, rec]`` fp32 (the
    workspace, ``TS >= nseq``), then ``nseq, ntok, window, pad, flags`` as for the fused kernel.

    ``ring_rows`` / ``new_rows``: the staged rows (powers of two, as the rows kernel's); ``heads_per_cta``: a
    divisor of ``heads_per_group``; ``warps``: the CTA's warps; ``vector_io``: the B ring's rows in 16-byte pieces;
    ``pdl``: trigger the dependent launch first (CUDA sm_90+).
    """
    import tilelang.language as T

    from .ssu_ring import b_ring_ops, table_layout

    N, ratio, HC, W = int(dstate), int(heads_per_group), int(heads_per_cta), int(warps)
    CH, TN = int(ring_rows), int(new_rows)
    if CH < 1 or CH & (CH - 1):
        raise ValueError(f"ring_rows: a power of two (the staged ring rows, >= the ring length L), got {ring_rows!r}")
    if TN < 1 or TN & (TN - 1) or TN > CH:
        raise ValueError(f"new_rows: a power of two <= ring_rows (the staged new tokens, >= T), got {new_rows!r}")
    if HC < 1 or ratio % HC:
        raise ValueError(f"heads_per_cta: a divisor of heads_per_group ({ratio}), got {heads_per_cta!r}")
    if W < 1 or W & (W - 1) or W > 32:
        raise ValueError(f"warps: a power of two in [1, 32], got {warps!r}")
    lay = table_layout(CH, TN)
    REC, FOLD, DECAY, FDECAY = lay.rec, lay.fold, lay.decay, lay.fdecay
    TH = 32 * W
    bops = b_ring_ops(T, io_dtype=io_dtype, dstate=N, ring_rows=CH, new_rows=TN, threads=TH, vector_io=vector_io)
    IOV, NCB, wrap = bops.IOV, bops.NCB, bops.wrap  # io values per 16-byte piece of a B / C row, pieces a row
    DL = 1  # lanes per dot product (a row's pieces over them)
    while DL < 32 and NCB % (DL * 2) == 0:
        DL *= 2
    NVD = NCB // DL  # pieces per lane
    DG = TH // DL  # dot products at a time
    LOG_DL = DL.bit_length() - 1
    NCH = -(-CH // 32)  # 32-position chunks of the prefix scan
    HI = -(-HC // W)  # heads per warp
    CHUNKS = ratio // HC
    f32, i64 = "float32", "int64"

    S, G, L, H, XB, XT, HB, LS, LC, TS = T.dynamic("S, G, L, H, XB, XT, HB, LS, LC, TS")
    bc0, bc1, bc2, dc0, dc1, dc2 = T.dynamic("bc0, bc1, bc2, dc0, dc1, dc2", i64)
    sd0, sd1, sd2, sb0, sb1, sb2, sc0, sc1, sc2, sa0, sB0 = T.dynamic(
        "sd0, sd1, sd2, sb0, sb1, sb2, sc0, sc1, sc2, sa0, sB0"
    )
    ty = SimpleNamespace(
        B_cache=T.StridedTensor((S, G, L, N), (bc0, bc1, bc2, 1), io_dtype),
        dt_cache=T.StridedTensor((S, H, L), (dc0, dc1, dc2), f32),
        ring_start=T.Tensor((S,), "int32"),
        pnat=T.Tensor((S,), "int32"),
        dt=T.StridedTensor((XB, XT, H), (sd0, sd1, sd2), dt_dtype),
        A=T.StridedTensor((H,), (sa0,), f32),
        B=T.StridedTensor((XB, XT, G, N), (sb0, sb1, sb2, 1), io_dtype),
        C=T.StridedTensor((XB, XT, G, N), (sc0, sc1, sc2, 1), io_dtype),
        dt_bias=T.StridedTensor((HB,), (sB0,), f32),
        slots=T.Tensor((LS,), slot_dtype),
        cu=T.Tensor((LC,), "int32"),
        table=T.Tensor((TS, H, REC), f32),
    )

    def bit(flags, flag):
        return flag_bit(T, flags, flag)

    @T.macro
    def lane_vals(dst, rb, src, q, lane):
        """dst = this lane's values of row ``q`` of a staged ``[rows, N]`` tile, as fp32 (``rb``: io registers)."""
        for v in T.unroll(NVD):
            for i in T.vectorized(IOV):
                rb[v * IOV + i] = src[q, (v * DL + lane) * IOV + i]
        for k in T.unroll(NVD * IOV):
            dst[k] = T.cast(rb[k], f32)

    @T.macro
    def put(dst, q, n0, stg):
        for i in T.vectorized(IOV):
            dst[q, n0 + i] = stg[i]

    @T.macro
    def body(B_cache, dt_cache, ring_start, pnat, dt, A, B, C, dt_bias, slots, cu, table, nseq, ntok, window, pad,
             flags):  # fmt: skip
        # (the B ring's outer strides on the 16-byte grid: vector_io)
        ring_b = B_cache
        if vector_io:
            ring_b = T.view(B_cache, strides=[T.floordiv(st, IOV) * IOV if i < 3 else st
                                              for i, st in enumerate(B_cache.strides)])  # fmt: skip
        with T.Kernel(G * CHUNKS, nseq, threads=TH) as (gc, b):
            if pdl:
                T.pdl_trigger()
            tx = T.get_thread_binding()
            lane = tx % DL
            grp = tx // DL
            wl = tx % 32
            wp = tx // 32
            g = gc // CHUNKS
            h0 = g * ratio + (gc % CHUNKS) * HC  # the CTA's first head
            Bs = T.alloc_shared((CH, N), io_dtype)
            Bn = T.alloc_shared((TN, N), io_dtype)
            Cn = T.alloc_shared((TN, N), io_dtype)
            # (static shared buffers: written in loops that read others, see ssu_replay)
            dts = T.alloc_shared((HC, CH), f32, scope="shared")
            dtn = T.alloc_shared((HC, TN), f32, scope="shared")
            ah = T.alloc_shared((HC,), f32, scope="shared")
            cb = T.alloc_shared((TN, CH), f32, scope="shared")
            cum = T.alloc_shared((HC, CH), f32, scope="shared")
            dtp = T.alloc_shared((HC, CH), f32, scope="shared")
            stg = T.alloc_local((IOV,), io_dtype)
            rb = T.alloc_local((NVD * IOV,), io_dtype)
            bv = T.alloc_local((NVD * IOV,), f32)
            cv = T.alloc_local((NVD * IOV,), f32)
            dot = T.alloc_local((TN,), f32)
            sc = T.alloc_local((1,), f32)
            carry = T.alloc_local((1,), f32)
            dq = T.alloc_local((1,), f32)
            slot = T.alloc_var(i64)
            t0 = T.alloc_var("int32")
            tb = T.alloc_var("int32")
            b64 = T.cast(b, i64)
            hs = bit(flags, FLAG_SRC)
            hc = bit(flags, FLAG_CU)
            slot = T.if_then_else(hs != 0, T.cast(slots[b64 * T.cast(hs, i64)], i64), b64)
            live_slot = T.And(slot != pad, T.And(slot >= 0, slot < T.cast(S, i64)))
            # a packed sequence's rows clamped into x's rows, at most TN of them (as the rows kernel clamps them)
            t0 = T.if_then_else(hc != 0, T.min(T.max(cu[b * hc], 0), XT), 0)
            tb = T.if_then_else(hc != 0, T.min(T.max(cu[(b + 1) * hc] - t0, 0), T.min(ntok, XT - t0)), ntok)
            tb = T.min(tb, T.min(TN, L))
            xb = b * (1 - hc)
            hb = bit(flags, FLAG_DT_BIAS)
            # the new tokens: B and C rows in 16-byte pieces over the threads, dt' of each head, A of each head
            for it in T.unroll(-(-TN * NCB // TH)):
                idx = it * TH + tx
                ti = idx // NCB
                n0 = (idx % NCB) * IOV
                if ti < tb:
                    for i in T.unroll(IOV):
                        stg[i] = B[xb, t0 + ti, g, n0 + i]
                    put(Bn, ti, n0, stg)
                    for i in T.unroll(IOV):
                        stg[i] = C[xb, t0 + ti, g, n0 + i]
                    put(Cn, ti, n0, stg)
            for it in T.unroll(-(-HC * TN // TH)):
                e = it * TH + tx
                hh = e // TN
                td = e % TN  # (a name of its own per loop: TileLang binds a constant, TN 1's, to the old one)
                if T.And(hh < HC, td < tb):
                    dtn[hh, td] = ring_dt(T, dt[xb, t0 + td, h0 + hh], dt_bias[(h0 + hh) * hb], hb, flags)
            for it in T.unroll(-(-HC // TH)):
                hh = it * TH + tx
                if hh < HC:
                    ah[hh] = A[h0 + hh]
            if live_slot and tb > 0:
                rs = T.alloc_var("int32")
                pk = T.alloc_var("int32")
                first = T.alloc_var("int32")
                rs = ((ring_start[slot] % L) + L) % L
                pk = T.min(T.max(pnat[slot], 0), T.min(window, L - tb))
                # the whole ring by physical row (a row past the live ones is staged and never read)
                bops.stage_ring_b(Bs, stg, ring_b, slot, g, tx, L)
                for it in T.unroll(-(-HC * CH // TH)):
                    e = it * TH + tx
                    hh = e // CH
                    ri = e % CH
                    if T.And(hh < HC, ri < L):
                        dq[0] = dt_cache[slot, h0 + hh, ri]
                        dts[hh, ri] = dq[0]
                T.sync_threads()
                first = T.if_then_else(pk + tb > window, pk, 0)  # a flush: the new tokens start from the fold
                # cb[t, j] = B_j . C_t for the tokens j from first up to t: a lane group per token j, against every
                # new token's C at once (independent sums, so their reductions overlap: a round per DG tokens j, not
                # per (t, j)); the last j of a round repeated by the groups past it, so every lane takes part in
                # the shuffles (a guard on t < tb is the CTA's own)
                for jj in T.serial((pk + tb - first + DG - 1) // DG):
                    j = T.min(first + jj * DG + grp, pk + tb - 1)
                    if j < pk:
                        lane_vals(bv, rb, Bs, wrap(rs + j, L), lane)
                    else:
                        lane_vals(bv, rb, Bn, j - pk, lane)
                    for t in T.unroll(TN):
                        if t < tb:
                            lane_vals(cv, rb, Cn, t, lane)
                            dot[t] = T.float32(0)
                            for k in T.unroll(NVD * IOV):
                                dot[t] = dot[t] + bv[k] * cv[k]
                    for d in T.unroll(LOG_DL):
                        for t in T.unroll(TN):
                            if t < tb:
                                dot[t] = dot[t] + T.shfl_xor(dot[t], DL >> (d + 1))
                    for t in T.unroll(TN):
                        if T.And(t < tb, T.And(lane == 0, j <= pk + t)):
                            cb[t, j] = dot[t]
                # each head's prefix sums of A dt' over the step's tokens, and dt' by position: one warp per head
                # (every warp scans, a warp past the CTA's heads scans its last one again and stores nothing)
                for k in T.unroll(HI):
                    hq = k * W + wp
                    hh = T.min(hq, HC - 1)
                    carry[0] = T.float32(0)
                    for c in T.unroll(NCH):
                        pos = c * 32 + wl
                        dtq = T.if_then_else(pos < pk, dts[hh, wrap(rs + T.min(pos, CH - 1), L)],
                                             dtn[hh, T.min(T.max(pos - pk, 0), TN - 1)])  # fmt: skip
                        sc[0] = T.if_then_else(pos < pk + tb, ah[hh] * dtq, T.float32(0))
                        for d in T.unroll(5):
                            up = T.shfl_up(sc[0], 1 << d)
                            sc[0] = sc[0] + T.if_then_else(wl >= (1 << d), up, T.float32(0))
                        sc[0] = sc[0] + carry[0]
                        if T.And(hq < HC, pos < CH):
                            cum[hh, pos] = sc[0]
                            dtp[hh, pos] = dtq
                        carry[0] = T.shfl_sync(sc[0], 31)
                T.sync_threads()
                # each head's record: the token weights, the state's decays, a flush's fold weights
                for it in T.unroll(-(-HC * TN * CH // TH)):
                    e = it * TH + tx
                    hh = e // (TN * CH)
                    tc = (e // CH) % TN
                    jc = e % CH
                    if T.And(T.And(hh < HC, tc < tb), T.And(jc >= first, jc <= pk + tc)):
                        table[b, h0 + hh, tc * CH + jc] = (T.exp(cum[hh, pk + tc] - cum[hh, jc]) * dtp[hh, jc]
                                                           * cb[tc, jc])  # fmt: skip
                for it in T.unroll(-(-HC * TN // TH)):
                    e = it * TH + tx
                    hh = e // TN
                    tw = e % TN
                    if T.And(hh < HC, tw < tb):
                        table[b, h0 + hh, DECAY + tw] = T.exp(
                            cum[hh, pk + tw] - T.if_then_else(first > 0, cum[hh, T.max(first - 1, 0)], T.float32(0))
                        )
                if first > 0:
                    for it in T.unroll(-(-HC * CH // TH)):
                        e = it * TH + tx
                        hh = e // CH
                        jf = e % CH
                        if T.And(hh < HC, jf < pk):
                            table[b, h0 + hh, FOLD + jf] = T.exp(cum[hh, pk - 1] - cum[hh, jf]) * dtp[hh, jf]
                    for it in T.unroll(-(-HC // TH)):
                        hh = it * TH + tx
                        if hh < HC:
                            table[b, h0 + hh, FDECAY] = T.exp(cum[hh, pk - 1])
                # the new tokens into the rings after the live ones: B by the group's first CTA, dt' of each head
                if gc % CHUNKS == 0:
                    bops.append_b(Bn, stg, ring_b, slot, g, rs, pk, tb, tx, L)
                for it in T.unroll(-(-HC * TN // TH)):
                    e = it * TH + tx
                    hh = e // TN
                    ta = e % TN
                    if T.And(hh < HC, ta < tb):
                        dt_cache[slot, h0 + hh, wrap(rs + pk + ta, L)] = dtn[hh, ta]

    return prim_func(T, "ssu_replay_table", REPLAY_TABLE_ARGS, REPLAY_TABLE, None, ty, body)


__all__ = ["replay_table_kernel"]
