"""The packed SSU kernel: every form but one token per sequence (several tokens per sequence: varlen, MTP,
speculative decoding with intermediate states or SGLang's parent tokens).

Sequence ``b`` owns rows ``[bos, bos + len)`` with ``bos = cu_seqlens[b]`` or ``b * seqlen``; CTA ``(pb, h, b)``
reads the state of ``block_p`` rows of head ``h`` from slot ``src(b, max(acc[b] - 1, 0))`` (or ``b``) and keeps it
in registers across the sequence's tokens; it writes the state per token (``MODE_PER_TOKEN``: to the destination
table's slot; ``MODE_INTERMEDIATE``: to the intermediate buffer), once at the end (``MODE_FINAL``) or never. With
``parent`` (SGLang's tree of draft tokens), token ``t > 0`` first reloads the state its parent token left in the
intermediate buffer.

Index guards: the row range ``cu_seqlens`` gives a sequence is clamped into the rows of x; a read slot outside
the pool, or read from past its table (an accepted-token count too large), is the sentinel; a destination outside
the pool or its table, an intermediate entry outside the buffer, a token past ``cache_steps`` and a parent outside
``[0, cache_steps)`` are skipped. Whatever the tables hold, no access leaves the tensors (the values themselves are
checked on the host by the reference and, in the debugging mode, before the kernels).

The per-token inputs (B, C, x, z, dt and the destination slot) of up to ``TMAX`` tokens are staged in shared
memory at once, all their loads in flight together, so a sequence's tokens do not pay one global-memory latency
each. The row reduction of ``y`` is the transposed one (see :func:`.ssu_parts.row_ops`): against the plain one
1-2 % faster at MTP 6 with bf16 states and level with fp32 (measured 2026-12-01 at 7390f7b on the H200).
"""

from .abi import PACKED, SSU_ARGS, prim_func
from .formats import QMAX
from .ssu_common import (
    FLAG_ACC,
    FLAG_CU,
    FLAG_DST,
    FLAG_DT_BIAS,
    FLAG_IIDX,
    FLAG_PARENT,
    FLAG_SRC,
    FLAG_Z,
    MODE_FINAL,
    MODE_INTERMEDIATE,
    MODE_PER_TOKEN,
)


def packed_kernel(T, ops, ty, *, heads_per_group, state_dtype, io_dtype, ibuf_dtype, tied, vector_state, vector_io,
                  min_blocks, pdl, philox_rounds=0):  # fmt: skip
    """The ``T.prim_func`` (``ops``: :func:`.ssu_parts.row_ops`, ``ty``: :func:`.ssu_parts.tensor_types`)."""
    ratio = heads_per_group
    N, VEC, NV, R, TH, BP, NB, NS, NA = ops.N, ops.VEC, ops.NV, ops.R, ops.TH, ops.BP, ops.NB, ops.NS, ops.NA
    RP, L = ops.RP, ops.L
    prow, bit, aligned, dt_value = ops.prow, ops.bit, ops.aligned, ops.dt_value
    load_A, load_D, fetch_state, convert_state = ops.load_A, ops.load_D, ops.fetch_state, ops.convert_state
    apply_softplus, recur_and_reduce, write_y = ops.apply_softplus, ops.recur_and_reduce, ops.write_y
    store_state, reload_state, load_io_chunk = ops.store_state, ops.reload_state, ops.load_io_chunk
    # block-scaled pool / intermediate buffer: both scales are two more arguments, ``state_scale`` and
    # ``ibuf_scale`` (a dummy for the one that is not quantised)
    sq = ops.quant_ops(state_dtype) if state_dtype in QMAX else None
    iq = ops.quant_ops(ibuf_dtype) if ibuf_dtype in QMAX else None
    quant = sq is not None or iq is not None
    # fp16 stochastic rounding (``rand_seed`` trails the scalars): the pool's writes, and the buffer's if fp16
    sr = ops.sr_ops(philox_rounds) if philox_rounds else None
    sr_ibuf = sr is not None and ibuf_dtype == "float16"
    H, S, R_, LS, LD, K = ty.H, ty.S, ty.R, ty.LS, ty.LD, ty.K
    f32 = "float32"
    i64 = "int64"

    # the per-token inputs of up to TMAX tokens are staged in shared memory at once (all their
    # loads in flight together), so a sequence's tokens do not pay one global-memory latency each
    TMAX = 8
    NCH = N // VEC  # vector chunks per B/C row
    # a block-scaled state's kernel stages B and C as fp32 (widened once per CTA, not once per thread and token),
    # in groups of BW values ordered group-major so that a row's lanes read BW-value groups 16 bytes apart (one
    # conflict-free LDS.128 per group); its per-token work per state value is what bounds it (docs/ssu-kernels.md)
    bc32 = quant
    BW = 4 if VEC % 4 == 0 else 1
    K_BC = (TMAX * NCH + TH - 1) // TH
    guard_bc = (TMAX * NCH) % TH != 0
    K_X = (TMAX * BP + TH - 1) // TH
    guard_x = (TMAX * BP) % TH != 0

    def bc_ok(e, tt, cnt):
        return T.And(e < TMAX * NCH, tt < cnt) if guard_bc else tt < cnt

    def x_ok(e, tt, cnt):
        return T.And(e < TMAX * BP, tt < cnt) if guard_x else tt < cnt

    @T.macro
    def stage(Bs, Cs, xs, dts, zs, dsl, sb, sc, sx, sz, sd, Bv, Cv, x, dt, dt_bias, z, dst, row0, t0, cnt, h, g, pb,
              tx, flags, mode, b64, dst_sb, dst_st, pad):  # fmt: skip
        hz = bit(flags, FLAG_Z)
        hb = bit(flags, FLAG_DT_BIAS)
        hw = T.cast(mode == MODE_PER_TOKEN, i64)
        # phase 1: every global load of the chunk into registers (indices clamped into the chunk)
        tw = T.min(tx, cnt - 1)
        # a destination entry past the table (or a slot outside the pool) is skipped: read as the sentinel
        di = (b64 * dst_sb + T.cast(t0 + tw, i64) * dst_st) * hw
        dsl_v = T.cast(dst[T.min(di, T.cast(LD, i64) - 1)], i64)
        dsl_v = T.if_then_else(T.And(di < T.cast(LD, i64), T.And(dsl_v >= 0, dsl_v < T.cast(S, i64))), dsl_v, pad)
        for k in T.unroll(K_BC):
            e = tx + k * TH
            tt = T.min(e // NCH, cnt - 1)
            n0 = (e % NCH) * VEC
            load_io_chunk(sb, k * VEC, Bv, row0 + tt, g, n0, vector_io)
            load_io_chunk(sc, k * VEC, Cv, row0 + tt, g, n0, vector_io)
        for k in T.unroll(K_X):
            e = tx + k * TH
            tt = T.min(e // BP, cnt - 1)
            p = prow(pb, 0, e % BP)
            sx[k] = T.cast(x[row0 + tt, h, p], f32)
            sz[k] = T.cast(z[(row0 + tt) * hz, h * hz, p * hz], f32)
            if not tied:
                sd[k] = dt_value(dt[row0 + tt, h, p], T.cast(dt_bias[h * hb, p * hb], f32) * T.cast(hb, f32))
        if tied:
            sd[0] = dt_value(dt[row0 + tw, h, 0], T.cast(dt_bias[h * hb, 0], f32) * T.cast(hb, f32))
        # phase 2: to shared memory
        apply_softplus(sd, 1 if tied else K_X, flags)
        for k in T.unroll(K_BC):
            e = tx + k * TH
            if bc_ok(e, e // NCH, cnt):
                if bc32:
                    for c in T.unroll(VEC // BW):
                        for j in T.vectorized(BW):
                            Bs[e // NCH, (c * NCH + e % NCH) * BW + j] = T.cast(sb[k * VEC + c * BW + j], f32)
                            Cs[e // NCH, (c * NCH + e % NCH) * BW + j] = T.cast(sc[k * VEC + c * BW + j], f32)
                else:
                    for i in T.unroll(VEC):
                        Bs[e // NCH, (e % NCH) * VEC + i] = sb[k * VEC + i]
                        Cs[e // NCH, (e % NCH) * VEC + i] = sc[k * VEC + i]
        for k in T.unroll(K_X):
            e = tx + k * TH
            if x_ok(e, e // BP, cnt):
                xs[e // BP, e % BP] = sx[k]
                zs[e // BP, e % BP] = sz[k]
                if not tied:
                    dts[e // BP, e % BP] = sd[k]
        if tx < cnt:
            dsl[tx] = dsl_v
            if tied:
                dts[tx, 0] = sd[0]

    @T.macro
    def token_from_smem(xv, dtv, zv, bv, cv, Bs, Cs, xs, dts, zs, tt, tx):
        lane = tx % L
        rg = tx // L
        for r in T.unroll(R):
            xv[r] = xs[tt, r * RP + rg]
            zv[r] = zs[tt, r * RP + rg]
            if not tied:
                dtv[r] = dts[tt, r * RP + rg]
        if tied:
            dtv[0] = dts[tt, 0]
        for v in T.unroll(NV):
            if bc32:
                for c in T.unroll(VEC // BW):
                    for j in T.vectorized(BW):
                        bv[v * VEC + c * BW + j] = Bs[tt, (c * NCH + v * L + lane) * BW + j]
                        cv[v * VEC + c * BW + j] = Cs[tt, (c * NCH + v * L + lane) * BW + j]
            else:
                n0 = (v * L + lane) * VEC
                for i in T.unroll(VEC):
                    bv[v * VEC + i] = T.cast(Bs[tt, n0 + i], f32)
                    cv[v * VEC + i] = T.cast(Cs[tt, n0 + i], f32)

    @T.macro
    def body(state, x, dt, A, B, C, D, z, dt_bias, out, src, dst, cu, acc_tok, ibuf, iidx, parent, nseq, seqlen,
             src_sb, src_st, dst_sb, dst_st, pad, flags, mode, cache_steps, scale, iscale, seed_t):  # fmt: skip
        pool = aligned(state, vector_state)
        Bv = aligned(B, vector_io)
        Cv = aligned(C, vector_io)
        ibv_buf = aligned(ibuf, vector_state)
        with T.Kernel(NB, H, nseq, threads=TH) as (pb, h, b):
            if min_blocks > 0:
                T.annotate_min_blocks_per_sm(min_blocks)
            if pdl:
                T.pdl_trigger()
                T.pdl_sync()
            tx = T.get_thread_binding()
            Bs = T.alloc_shared((TMAX, N), f32 if bc32 else io_dtype)
            Cs = T.alloc_shared((TMAX, N), f32 if bc32 else io_dtype)
            xs = T.alloc_shared((TMAX, BP), f32)
            zs = T.alloc_shared((TMAX, BP), f32)
            dts = T.alloc_shared((TMAX, BP), f32)
            dsl = T.alloc_shared((TMAX,), i64)
            sb = T.alloc_local((K_BC * VEC,), io_dtype)
            sc = T.alloc_local((K_BC * VEC,), io_dtype)
            sx = T.alloc_local((K_X,), f32)
            sz = T.alloc_local((K_X,), f32)
            sd = T.alloc_local((max(K_X, 1),), f32)
            s = T.alloc_local((NS,), f32)
            raw = T.alloc_local((NS,), state_dtype)
            Av = T.alloc_local((NA,), f32)
            buf = T.alloc_local((VEC,), state_dtype)
            ibv = T.alloc_local((VEC,), ibuf_dtype)
            bv = T.alloc_local((NV * VEC,), f32)
            cv = T.alloc_local((NV * VEC,), f32)
            if quant:
                qs = T.alloc_local((R,), f32)
            xv = T.alloc_local((R,), f32)
            dv = T.alloc_local((R,), f32)
            zv = T.alloc_local((R,), f32)
            dtv = T.alloc_local((max(R, 2),), f32)
            acc = T.alloc_local((R,), f32)
            slot = T.alloc_var(i64)
            wslot = T.alloc_var(i64)
            ientry = T.alloc_var(i64)
            bos = T.alloc_var("int32")
            ntok = T.alloc_var("int32")
            rpos = T.alloc_var(i64)
            g = h // ratio
            b64 = T.cast(b, i64)
            if (flags & FLAG_CU) != 0:
                # clamped into the rows of x: no row outside the tensors whatever cu_seqlens holds
                bos = T.min(T.max(T.cast(cu[b], "int32"), 0), R_)
                ntok = T.min(T.max(T.cast(cu[b + 1], "int32"), bos), R_) - bos
            else:
                bos = b * seqlen
                ntok = seqlen
            rpos = T.int64(0)
            if (flags & FLAG_ACC) != 0:
                rpos = T.max(T.cast(acc_tok[b], i64) - 1, T.int64(0))
            slot = b64
            if (flags & FLAG_SRC) != 0:
                si = b64 * src_sb + rpos * src_st  # past the table (an accepted count too large): the sentinel
                slot = T.cast(src[T.min(T.max(si, T.int64(0)), T.cast(LS, i64) - 1)], i64)
                slot = T.if_then_else(T.And(si >= 0, si < T.cast(LS, i64)), slot, pad)
            # a read slot outside the pool reads as the sentinel (zero state, nothing written)
            slot = T.if_then_else(T.And(slot >= 0, slot < T.cast(S, i64)), slot, pad)
            ientry = b64
            if (flags & FLAG_IIDX) != 0:
                ientry = T.cast(iidx[b], i64)
            elif (flags & FLAG_SRC) != 0:
                ientry = slot
            # an intermediate entry outside the buffer: nothing is reloaded from or written to it
            ilive = T.And(ientry >= 0, ientry < T.cast(K, i64) // T.max(cache_steps, T.int64(1)))
            if sr is not None:
                seed = seed_t[0]
                k0 = T.cast(seed, "uint32")
                k1 = T.cast(T.shift_right(seed, T.int64(32)), "uint32")
            load_A(Av, A, h, pb, tx)
            load_D(dv, D, h, pb, tx, flags)
            if slot != pad:
                fetch_state(raw, pool, slot, h, pb, tx)
                if sq is not None:
                    sq.fetch_scales(qs, scale, slot, h, pb, tx)
            for c in T.serial(T.ceildiv(ntok, TMAX)):
                t0 = c * TMAX
                cnt = T.min(ntok - t0, TMAX)
                stage(Bs, Cs, xs, dts, zs, dsl, sb, sc, sx, sz, sd, Bv, Cv, x, dt, dt_bias, z, dst, bos + t0, t0, cnt,
                      h, g, pb, tx, flags, mode, b64, dst_sb, dst_st, pad)  # fmt: skip
                T.sync_threads()
                if c == 0:
                    if sq is not None:
                        sq.dequantize(s, raw, qs, slot != pad)
                    else:
                        convert_state(s, raw, slot != pad)
                for tt in T.serial(cnt):
                    t = t0 + tt
                    if (flags & FLAG_PARENT) != 0:
                        if t > 0 and slot != pad and ilive:
                            par = T.cast(parent[b, t], i64)
                            if par >= 0 and par < cache_steps:  # a parent outside the entry is not reloaded
                                if iq is not None:
                                    iq.reload(s, ibv, ibv_buf, iscale, qs, ientry * cache_steps + par, h, pb, tx)
                                else:
                                    reload_state(s, ibv, ibv_buf, ientry * cache_steps + par, h, pb, tx)
                    token_from_smem(xv, dtv, zv, bv, cv, Bs, Cs, xs, dts, zs, tt, tx)
                    recur_and_reduce(s, Av, acc, xv, dtv, bv, cv, tx)
                    write_y(acc, xv, dv, zv, out, bos + t, h, pb, tx, flags)
                    if slot != pad:
                        if mode == MODE_PER_TOKEN:
                            wslot = dsl[tt]
                            if wslot != pad:
                                if sq is not None:
                                    sq.store(s, buf, pool, scale, qs, wslot, h, pb, tx)
                                elif sr is not None:
                                    sr.store_now(s, buf, pool, wslot, h, pb, tx, k0, k1)
                                else:
                                    store_state(s, buf, pool, wslot, h, pb, tx)
                        elif mode == MODE_INTERMEDIATE:
                            if ilive and t < cache_steps:  # tokens past the entry's steps are not written
                                if iq is not None:
                                    iq.store(s, ibv, ibv_buf, iscale, qs, ientry * cache_steps + t, h, pb, tx)
                                elif sr_ibuf:
                                    sr.store_now(s, ibv, ibv_buf, ientry * cache_steps + t, h, pb, tx, k0, k1)
                                else:
                                    store_state(s, ibv, ibv_buf, ientry * cache_steps + t, h, pb, tx)
                T.sync_threads()
            if mode == MODE_FINAL and slot != pad and ntok > 0:
                wslot = slot
                if (flags & FLAG_DST) != 0:
                    wslot = T.cast(dst[b64 * dst_sb], i64)
                if wslot != pad and wslot >= 0 and wslot < T.cast(S, i64):  # a destination outside the pool is skipped
                    if sq is not None:
                        sq.store(s, buf, pool, scale, qs, wslot, h, pb, tx)
                    elif sr is not None:
                        sr.store_now(s, buf, pool, wslot, h, pb, tx, k0, k1)
                    else:
                        store_state(s, buf, pool, wslot, h, pb, tx)

    # TileLang reads a kernel's parameters from the Python signature: the scaled kernel is the same body with the
    # two scales as more parameters, and the float kernel keeps its exact signature (and generated code)
    variant = "scaled" if quant else "sr" if sr is not None else None
    name = {None: "ssu_packed", "scaled": "ssu_packed_scaled", "sr": "ssu_packed_sr"}[variant]
    return prim_func(T, name, SSU_ARGS, PACKED, variant, ty, body)
