"""The one-token SSU kernel: one token per sequence (rows = sequences), as in a plain decode step.

CTA ``(pb, h, b)`` owns ``block_p`` state rows of head ``h`` for sequence ``b``: it reads the state from slot
``src(b, 0)`` (or ``b``; the sentinel ``pad`` means no state: zeros, nothing written), updates it once, ``s = s
exp(A dt) + dt x B``, writes ``y = s . C (+ D x) (* silu(z))`` and stores the state once, to ``dst(b, 0)`` (else the
read slot) unless ``mode`` is ``MODE_NONE``. Slots outside the pool are guarded: such a read slot reads as the
sentinel, such a destination is skipped (the slot tables' own extents are the normaliser's to check). Every input
load is issued before the first use of any of them (branch-free: absent inputs are read at index 0 of their dummy
and masked arithmetically), so the loads' latencies overlap. The row reduction of ``y`` is the plain one (every row
on its own; lane 0 writes every row's ``y``): the transposed one measured no faster here (slower with bf16 states,
level with fp32; 2026-12-01 at 7390f7b on the H200).

``pack_early`` (2-byte states): each updated state value is converted back to the stored dtype right after its
recurrence step (into the registers it was loaded into), so no fp32 copy of the whole state stays live across the
row reduction, the ``y`` write and the store. Same arithmetic, same rounding; fewer registers per thread (96 -> 64
for Nemotron-H bf16, so 8 instead of 5 CTAs per SM). Not with a block-scaled state: a row's new scale needs its
maximum before any value can be narrowed, so its rows stay in fp32 until the store.

``staged`` (int8 / fp8 states on large grids): the thread's state chunks are copied into shared memory by
``cp.async`` as soon as the slot is known, then updated one row at a time (the row's y and max reduced, the row
quantised and stored at once), so no more than one row's values are live in registers.
"""

from .abi import ONE_TOKEN, SSU_ARGS, prim_func
from .formats import QMAX
from .ssu_common import FLAG_DST, FLAG_DT_BIAS, FLAG_SRC, FLAG_Z, MODE_NONE


def one_token_kernel(T, ops, ty, *, heads_per_group, state_dtype, io_dtype, tied, vector_state, vector_io,
                     pack_early, min_blocks, pdl, philox_rounds=0, staged=False):  # fmt: skip
    """The ``T.prim_func`` (``ops``: :func:`.ssu_parts.row_ops`, ``ty``: :func:`.ssu_parts.tensor_types`)."""
    ratio = heads_per_group
    VEC, NV, L, R, TH, NB, NS, NA = ops.VEC, ops.NV, ops.L, ops.R, ops.TH, ops.NB, ops.NS, ops.NA
    prow, bit, aligned, dt_value = ops.prow, ops.bit, ops.aligned, ops.dt_value
    load_A, load_D, fetch_state, convert_state = ops.load_A, ops.load_D, ops.fetch_state, ops.convert_state
    apply_softplus, recur_and_reduce, write_y = ops.apply_softplus, ops.recur_and_reduce, ops.write_y
    store_raw, store_state, load_io_chunk = ops.store_raw, ops.store_state, ops.load_io_chunk
    quant = state_dtype in QMAX  # block-scaled: the scales are one more argument, ``state_scale``
    if staged and not (quant and vector_state):
        raise ValueError("staged: the staged design serves a block-scaled state with 16-byte accesses")
    q = ops.quant_ops(state_dtype) if quant else None
    sr = ops.sr_ops(philox_rounds) if philox_rounds else None  # fp16 stochastic rounding: ``rand_seed`` trails
    H, S = ty.H, ty.S
    f32 = "float32"
    i64 = "int64"

    @T.macro
    def body(state, x, dt, A, B, C, D, z, dt_bias, out, src, dst, nseq, seqlen, src_sb, src_st, dst_sb, dst_st, pad,
             flags, mode, scale, seed_t):  # fmt: skip
        pool = aligned(state, vector_state)
        Bv = aligned(B, vector_io)
        Cv = aligned(C, vector_io)
        with T.Kernel(NB, H, nseq, threads=TH) as (pb, h, b):
            if min_blocks > 0:
                T.annotate_min_blocks_per_sm(min_blocks)
            if pdl:
                T.pdl_trigger()
                T.pdl_sync()
            tx = T.get_thread_binding()
            if staged:
                stage = T.alloc_shared((NS * TH,), state_dtype)
                cb = T.alloc_local((VEC,), state_dtype)
                cw = T.alloc_local((max(VEC // 4, 1),), "uint32")  # an int8 chunk as words
                sv = T.alloc_local((NV * VEC,), f32)  # one row's values
                mx = T.alloc_local((R,), f32)
            else:
                s = T.alloc_local((NS,), f32)
                raw = T.alloc_local((NS,), state_dtype)
            Av = T.alloc_local((NA,), f32)
            buf = T.alloc_local((VEC,), state_dtype)
            rb = T.alloc_local((NV * VEC,), io_dtype)
            rc = T.alloc_local((NV * VEC,), io_dtype)
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
            g = h // ratio
            lane = tx % L
            rg = tx // L
            b64 = T.cast(b, i64)
            # every load is issued before the first use of any of them (branch-free, dummies at index 0)
            hs = T.cast(bit(flags, FLAG_SRC), i64)
            src_val = T.cast(src[b64 * src_sb * hs], i64)
            hz = bit(flags, FLAG_Z)
            hb = bit(flags, FLAG_DT_BIAS)
            load_A(Av, A, h, pb, tx)
            load_D(dv, D, h, pb, tx, flags)
            for r in T.unroll(R):
                p = prow(pb, r, rg)
                xv[r] = T.cast(x[b, h, p], f32)
                zv[r] = T.cast(z[b * hz, h * hz, p * hz], f32)
                if not tied:
                    dtv[r] = dt_value(dt[b, h, p], T.cast(dt_bias[h * hb, p * hb], f32) * T.cast(hb, f32))
            if tied:
                dtv[0] = dt_value(dt[b, h, 0], T.cast(dt_bias[h * hb, 0], f32) * T.cast(hb, f32))
            for v in T.unroll(NV):
                n0 = (v * L + lane) * VEC
                load_io_chunk(rb, v * VEC, Bv, b, g, n0, vector_io)
                load_io_chunk(rc, v * VEC, Cv, b, g, n0, vector_io)
            slot = T.if_then_else(hs != 0, src_val, b64)
            # a read slot outside the pool reads as the sentinel (zero state, nothing written): no access
            # leaves the pool whatever the table holds
            slot = T.if_then_else(T.And(slot >= 0, slot < T.cast(S, i64)), slot, pad)
            if staged:
                ops.stage_state(stage, pool, slot, slot != pad, h, pb, tx)
                # the write slot, known before the update: each row is stored once it is updated
                hd = T.cast(bit(flags, FLAG_DST), i64)
                wslot = T.if_then_else(hd != 0, T.cast(dst[b64 * dst_sb * hd], i64), slot)
                # a sentinel's rows: zero-filled numbers times a zero scale (never an unset register)
                for r in T.unroll(R):
                    qs[r] = T.float32(0)
            if slot != pad:
                if not staged:
                    fetch_state(raw, pool, slot, h, pb, tx)
                if quant:
                    q.fetch_scales(qs, scale, slot, h, pb, tx)
            if sr is not None:
                # the random words of the slot written, drawn while the state loads are in flight
                words = T.alloc_local((sr.words,), "uint32")
                seed = seed_t[0]
                hd = T.cast(bit(flags, FLAG_DST), i64)
                wslot = T.if_then_else(hd != 0, T.cast(dst[b64 * dst_sb * hd], i64), slot)
                if slot != pad:
                    sr.draw(words, pool, wslot, h, pb, tx, T.cast(seed, "uint32"),
                            T.cast(T.shift_right(seed, T.int64(32)), "uint32"))  # fmt: skip
            if pack_early:
                if slot == pad:
                    for k in T.unroll(NS):
                        raw[k] = T.cast(T.float32(0), state_dtype)
            apply_softplus(dtv, 1 if tied else R, flags)
            if staged:
                T.ptx_wait_group(0)  # the thread's own staged chunks (it reads no other thread's)
                # a destination outside the pool is skipped
                inside = T.And(wslot != pad, T.And(wslot >= 0, wslot < S))
                store = T.And(T.And(mode != MODE_NONE, slot != pad), inside)
                # B and C widened at each use (fewer registers); y and the rows written row by row
                q.staged_rows(stage, cb, cw, sv, buf, qs, acc, mx, Av, xv, dtv, dv, zv, rb, rc, out, b, pool, scale,
                              wslot, store, h, pb, tx, flags)  # fmt: skip
            else:
                if quant:
                    q.dequantize(s, raw, qs, slot != pad)
                elif not pack_early:
                    convert_state(s, raw, slot != pad)
                for k in T.unroll(NV * VEC):
                    bv[k] = T.cast(rb[k], f32)
                    cv[k] = T.cast(rc[k], f32)
                if pack_early:
                    recur_and_reduce(raw, Av, acc, xv, dtv, bv, cv, tx, True)
                else:
                    recur_and_reduce(s, Av, acc, xv, dtv, bv, cv, tx)
                write_y(acc, xv, dv, zv, out, b, h, pb, tx, flags)
                if mode != MODE_NONE and slot != pad:
                    wslot = slot
                    if (flags & FLAG_DST) != 0:
                        wslot = T.cast(dst[b64 * dst_sb], i64)
                    # a destination outside the pool is skipped
                    if wslot != pad and wslot >= 0 and wslot < T.cast(S, i64):
                        if quant:
                            q.store(s, buf, pool, scale, qs, wslot, h, pb, tx)
                        elif sr is not None:
                            sr.store(s, words, buf, pool, wslot, h, pb, tx)
                        elif pack_early:
                            store_raw(raw, pool, wslot, h, pb, tx)
                        else:
                            store_state(s, buf, pool, wslot, h, pb, tx)

    # the scaled kernel is the same body with the scales as one more argument, the stochastically rounding one
    # with the seed; the float kernel keeps its exact signature (and generated code)
    variant = "scaled" if quant else "sr" if sr is not None else None
    name = {None: "ssu_one_token", "scaled": "ssu_one_token_scaled", "sr": "ssu_one_token_sr"}[variant]
    return prim_func(T, name, SSU_ARGS, ONE_TOKEN, variant, ty, body)
