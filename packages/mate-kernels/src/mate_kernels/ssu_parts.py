"""The parts both SSU kernels (:mod:`.ssu_one_token`, :mod:`.ssu_packed`) are built from: their tensor argument
types (:func:`tensor_types`) and the per-thread helpers (:func:`row_ops`: where a thread's state rows, A, D and the
row reduction live under an :class:`.ssu_common.SSUTiling`), as TileLang macros (inlined where called) and plain
functions that build TIR expressions.

A thread holds ``rows_per_thread`` rows (``R``) of ``vecs * vec`` state values each, in registers: value ``k`` of
the thread's ``NS = R * vecs * vec`` is row ``r = k // (vecs * vec)``, chunk ``v``, element ``i``, i.e. state entry
``[p, (v * lanes + lane) * vec + i]`` of row ``p = pb * block_p + r * rows_per_pass + tx // lanes``.

A block-scaled quantised tensor (:data:`.formats.QMAX`) comes with its fp32 scales ``[rows, H, P]``: one per
state row, which the row's ``lanes`` lanes all hold. Reading dequantises with it; writing first reduces the row's
max|value| over those lanes (a butterfly of ``shfl_xor`` max), then stores every value times ``QMAX / max``,
rounded to nearest even (integers) or by the fp8 conversion (fp8), within +-QMAX, and every lane of the row
writes the new scale ``max / QMAX`` (:func:`row_ops`' ``quant_ops``).
"""

import functools
from types import SimpleNamespace

from . import ssu_common
from .formats import BYTES, FORMATS, QMAX
from .ssu_common import FLAG_D, FLAG_SOFTPLUS, FLAG_Z


def tensor_types(T, *, dim, dstate, state_dtype, io_dtype, dt_dtype, d_dtype, dt_bias_dtype, src_dtype, dst_dtype,
                 meta_dtype, ibuf_dtype):  # fmt: skip
    """The tensor argument types of both kernels, and the heads count ``H`` (a ``T.dynamic`` the grid uses).
    Every extent and outer stride but P and N is a runtime value: pool slots and strides, rows, heads, groups,
    table lengths; absent optional tensors are passed as small dummies (D, z, dt_bias, the tables). The scales of
    a quantised pool (``state_scale``) and intermediate buffer (``ibuf_scale``) share their tensor's rows and
    heads."""
    P, N = int(dim), int(dstate)
    f32 = "float32"
    i64 = "int64"

    S, H, G, R_, K, HI = T.dynamic("S, H, G, R, K, HI")
    s_s0, s_s1, s_i0, s_i1 = T.dynamic("s_s0, s_s1, s_i0, s_i1", i64)
    sx0, sx1, sx2, sd0, sd1, sd2 = T.dynamic("sx0, sx1, sx2, sd0, sd1, sd2")
    sb0, sb1, sc0, sc1, so0, so1, so2 = T.dynamic("sb0, sb1, sc0, sc1, so0, so1, so2")
    sa0, sa1, sa2 = T.dynamic("sa0, sa1, sa2")
    HD, PD, sD0, sD1, HB, PB, sB0, sB1 = T.dynamic("HD, PD, sD0, sD1, HB, PB, sB0, sB1")
    RZ, HZ, PZ, sz0, sz1, sz2 = T.dynamic("RZ, HZ, PZ, sz0, sz1, sz2")
    LS, LD, LC, LA, LI, NPAR, TPAR, sp0, sp1 = T.dynamic("LS, LD, LC, LA, LI, NPAR, TPAR, sp0, sp1")
    q_s0, q_s1, q_i0, q_i1 = T.dynamic("q_s0, q_s1, q_i0, q_i1", i64)

    return SimpleNamespace(
        H=H,
        S=S,  # pool slots, rows, table lengths and intermediate entries: the bounds the kernels guard indices by
        R=R_,
        LS=LS,
        LD=LD,
        K=K,
        state=T.StridedTensor((S, H, P, N), (s_s0, s_s1, N, 1), state_dtype),
        x=T.StridedTensor((R_, H, P), (sx0, sx1, sx2), io_dtype),
        dt=T.StridedTensor((R_, H, P), (sd0, sd1, sd2), dt_dtype),
        A=T.StridedTensor((H, P, N), (sa0, sa1, sa2), f32),
        B=T.StridedTensor((R_, G, N), (sb0, sb1, 1), io_dtype),
        C=T.StridedTensor((R_, G, N), (sc0, sc1, 1), io_dtype),
        D=T.StridedTensor((HD, PD), (sD0, sD1), d_dtype),
        z=T.StridedTensor((RZ, HZ, PZ), (sz0, sz1, sz2), io_dtype),
        dt_bias=T.StridedTensor((HB, PB), (sB0, sB1), dt_bias_dtype),
        out=T.StridedTensor((R_, H, P), (so0, so1, so2), io_dtype),
        src=T.Tensor((LS,), src_dtype),
        dst=T.Tensor((LD,), dst_dtype),
        cu=T.Tensor((LC,), meta_dtype),
        acc_tok=T.Tensor((LA,), meta_dtype),
        ibuf=T.StridedTensor((K, HI, P, N), (s_i0, s_i1, N, 1), ibuf_dtype),  # HI: heads, or 1 for the dummy
        iidx=T.Tensor((LI,), meta_dtype),
        parent=T.StridedTensor((NPAR, TPAR), (sp0, sp1), meta_dtype),
        state_scale=T.StridedTensor((S, H, P), (q_s0, q_s1, 1), f32),
        ibuf_scale=T.StridedTensor((K, HI, P), (q_i0, q_i1, 1), f32),
        rand_seed=T.Tensor((1,), i64),  # fp16 stochastic rounding's seed
    )


def row_ops(T, *, dim, dstate, tiling, state_dtype, io_dtype, tied, vector_state, transposed):
    """The helpers for one build, with the derived compile-time sizes, as one namespace. ``transposed``: the
    transposed row reduction (see ``reduce_rows``) where the thread's rows fit its row's lanes (so far always:
    R <= 4 rows, L >= 4 lanes for N >= 32)."""
    P, N, tl = int(dim), int(dstate), tiling
    VEC, NV, L, R, TH, BP = tl.vec, tl.vecs, tl.lanes, tl.rows_per_thread, tl.threads, tl.block_p
    RP = tl.rows_per_pass
    guard_p = P % BP != 0
    NS = R * NV * VEC  # state values per thread
    f32 = "float32"
    i64 = "int64"
    LOG_L = L.bit_length() - 1
    transposed = bool(transposed) and R <= L
    TR = R.bit_length() - 1  # the transposed reduction's halving steps (where it is used)

    def prow(pb, r, rg):
        """State row of unrolled row ``r`` (clamped into range for loads when P is not a multiple of block_p)."""
        p = pb * BP + r * RP + rg
        return T.min(p, P - 1) if guard_p else p

    softplus = functools.partial(ssu_common.softplus, T)
    bit = functools.partial(ssu_common.flag_bit, T)

    def aligned(buf, vector, multiple=None):
        """A view of ``buf`` whose dynamic outer strides are written as multiples of ``multiple`` (default
        ``vec``): the caller guarantees that they are (``vector_*``), which lets TileLang prove 16-byte vector
        accesses."""
        if not vector:
            return buf
        m = VEC if multiple is None else multiple
        last = len(buf.strides) - 1
        strides = [st if i == last else T.floordiv(st, m) * m for i, st in enumerate(buf.strides)]
        return T.view(buf, strides=strides)

    # B/C rows are read in 16-byte pieces: ``VEC`` io values (one state chunk's worth) are more than 16 bytes
    # beside a narrower state (a 1-byte state's 16 values, or a 2-byte state with fp32 io)
    IOV = min(VEC, max(1, 16 // BYTES[io_dtype]))

    @T.macro
    def load_io_chunk(dst, k0, src, row, g, n0, vector):
        if not vector:
            for i in T.unroll(VEC):
                dst[k0 + i] = src[row, g, n0 + i]
        elif IOV == VEC:
            for i in T.vectorized(VEC):
                dst[k0 + i] = src[row, g, n0 + i]
        else:
            for c in T.unroll(VEC // IOV):
                for i in T.vectorized(IOV):
                    dst[k0 + c * IOV + i] = src[row, g, n0 + c * IOV + i]

    def pick(arr, sel):
        """``arr[sel]`` for a runtime ``sel`` < R as a chain of selects (registers cannot be indexed at runtime)."""
        v = arr[0]
        for r in range(1, R):
            v = T.if_then_else(sel == r, arr[r], v)
        return v

    # ---- state: fetched raw (in the stored dtype) so other loads can be issued before it is used
    @T.macro
    def fetch_state(raw, pool, slot, h, pb, tx):
        lane = tx % L
        rg = tx // L
        for r in T.unroll(R):
            p = prow(pb, r, rg)
            for v in T.unroll(NV):
                n0 = (v * L + lane) * VEC
                k0 = (r * NV + v) * VEC
                if vector_state:
                    for i in T.vectorized(VEC):
                        raw[k0 + i] = pool[slot, h, p, n0 + i]
                else:
                    for i in T.unroll(VEC):
                        raw[k0 + i] = pool[slot, h, p, n0 + i]

    @T.macro
    def convert_state(s, raw, live):
        for k in T.unroll(NS):
            s[k] = T.if_then_else(live, T.cast(raw[k], f32), T.float32(0))

    @T.macro
    def load_chunk(buf, src, slot, h, p, n0):
        """buf = one chunk (``VEC`` values) of row ``p`` of ``src[slot, h]`` from value ``n0``."""
        if vector_state:
            for i in T.vectorized(VEC):
                buf[i] = src[slot, h, p, n0 + i]
        else:
            for i in T.unroll(VEC):
                buf[i] = src[slot, h, p, n0 + i]

    def stage_at(r, v, tx):
        """Offset in the stage of the thread's chunk ``v`` of row ``r``: chunk-major, so a warp's 16-byte accesses to
        one chunk are 512 contiguous bytes (no bank conflict)."""
        return ((r * NV + v) * TH + tx) * VEC

    @T.macro
    def stage_state(stage, pool, slot, live, h, pb, tx):
        """Start the asynchronous copy (``cp.async``, 16 bytes each) of the thread's chunks of ``pool[slot]`` into
        ``stage`` (``NS * TH`` values in shared memory): the bytes are in flight without registers to land in.
        Where not ``live`` (the sentinel) the chunks are zero-filled and nothing is read (slot 0's address is
        formed, never dereferenced). The thread reads back only its own chunks, so ``T.ptx_wait_group(0)`` is the
        only wait it needs."""
        lane = tx % L
        rg = tx // L
        row = T.if_then_else(live, slot, T.int64(0))
        for r in T.unroll(R):
            p = prow(pb, r, rg)
            for v in T.unroll(NV):
                src = pool.offset_of([row, h, p, (v * L + lane) * VEC])[0]
                T.ptx_cp_async(
                    T.tvm_access_ptr(T.type_annotation(pool.dtype), stage.data, stage_at(r, v, tx), VEC, 2),
                    T.tvm_access_ptr(T.type_annotation(pool.dtype), pool.data, src, VEC, 1),
                    VEC,
                    live,
                )  # fmt: skip
        T.ptx_commit_group()

    @T.macro
    def unstage_chunk(buf, stage, r, v, tx):
        """buf = the thread's staged chunk ``v`` of row ``r`` (one 16-byte shared-memory read)."""
        o = stage_at(r, v, tx)
        for i in T.vectorized(VEC):
            buf[i] = stage[o + i]

    @T.macro
    def store_chunk(buf, dst, slot, h, p, n0):
        """The chunk ``buf`` into row ``p`` of ``dst[slot, h]`` from value ``n0`` (nothing for a row past P)."""
        if guard_p:
            if p < P:
                for i in T.unroll(VEC):
                    dst[slot, h, p, n0 + i] = buf[i]
        elif vector_state:
            for i in T.vectorized(VEC):
                dst[slot, h, p, n0 + i] = buf[i]
        else:
            for i in T.unroll(VEC):
                dst[slot, h, p, n0 + i] = buf[i]

    @T.macro
    def store_state(s, buf, pool, slot, h, pb, tx):
        lane = tx % L
        rg = tx // L
        for r in T.unroll(R):
            p = pb * BP + r * RP + rg
            for v in T.unroll(NV):
                n0 = (v * L + lane) * VEC
                for i in T.unroll(VEC):
                    buf[i] = T.cast(s[(r * NV + v) * VEC + i], pool.dtype)
                store_chunk(buf, pool, slot, h, p, n0)

    @T.macro
    def reload_state(s, buf, pool, slot, h, pb, tx):
        """s = pool[slot] (the parent reload of the packed kernel)."""
        lane = tx % L
        rg = tx // L
        for r in T.unroll(R):
            p = prow(pb, r, rg)
            for v in T.unroll(NV):
                load_chunk(buf, pool, slot, h, p, (v * L + lane) * VEC)
                for i in T.unroll(VEC):
                    s[(r * NV + v) * VEC + i] = T.cast(buf[i], f32)

    @T.macro
    def load_A(Av, A, h, pb, tx):
        if tied:
            Av[0] = A[h, 0, 0]
        else:
            lane = tx % L
            rg = tx // L
            for r in T.unroll(R):
                p = prow(pb, r, rg)
                for v in T.unroll(NV):
                    for i in T.unroll(VEC):
                        Av[(r * NV + v) * VEC + i] = A[h, p, (v * L + lane) * VEC + i]

    @T.macro
    def load_D(dv, D, h, pb, tx, flags):
        rg = tx // L
        hd = bit(flags, FLAG_D)
        for r in T.unroll(R):
            dv[r] = T.cast(D[h * hd, prow(pb, r, rg) * hd], f32) * T.cast(hd, f32)

    @T.macro
    def reduce_rows_as(acc, tx, transposed):
        """Sum each of the thread's ``R`` row partials over the row's ``L`` lanes. Transposed (``R <= L``): each
        of the first log2(R) butterfly steps halves the values a lane holds (it keeps one half of its rows, sends
        the other half to its partner, which keeps the opposite half), so R rows take R - 1 + log2(L / R)
        shuffles in all (6 instead of 20 for 4 rows over 32 lanes) and every lane ends with one row's total in
        ``acc[0]``: row ``lane // (L / R)`` (see ``write_y``). Otherwise every row is reduced on its own and every
        lane ends with every row's total."""
        if transposed:
            lane = tx % L
            for j in T.unroll(TR):
                hi = (lane & (L >> (j + 1))) != 0  # this lane keeps the upper half of its rows
                for k in T.unroll(R // 2):
                    if k < (R >> (j + 1)):
                        send = T.if_then_else(hi, acc[k], acc[k + (R >> (j + 1))])
                        keep = T.if_then_else(hi, acc[k + (R >> (j + 1))], acc[k])
                        acc[k] = keep + T.shfl_xor(send, L >> (j + 1))
            for j in T.unroll(LOG_L - TR):
                acc[0] = acc[0] + T.shfl_xor(acc[0], (L >> TR) >> (j + 1))
        else:
            for j in T.unroll(LOG_L):
                for r in T.unroll(R):
                    acc[r] = acc[r] + T.shfl_xor(acc[r], L >> (j + 1))

    @T.macro
    def reduce_rows(acc, tx):
        reduce_rows_as(acc, tx, transposed)

    @T.macro
    def recur_and_reduce(s, Av, acc, xv, dtv, bv, cv, tx, packed=False):
        """s = s * exp(A dt) + dt x B ; acc = the rows' sums of s * C (where they end: see ``reduce_rows``).
        ``packed``: ``s`` holds the raw (stored-dtype) registers; each value is widened, updated, added into the
        row's dot product and narrowed back into ``s`` at once (``pack_early``)."""
        if tied:
            dtv[1] = T.exp(Av[0] * dtv[0])
        for r in T.unroll(R):
            acc[r] = 0.0
            for v in T.unroll(NV):
                for i in T.unroll(VEC):
                    k = (r * NV + v) * VEC + i
                    s0 = T.cast(s[k], f32) if packed else s[k]  # packed: zeros were put in ``raw`` for a sentinel
                    if tied:
                        s1 = s0 * dtv[1] + (dtv[0] * xv[r]) * bv[v * VEC + i]
                    else:
                        s1 = s0 * T.exp(Av[k] * dtv[r]) + (dtv[r] * xv[r]) * bv[v * VEC + i]
                    acc[r] = acc[r] + s1 * cv[v * VEC + i]
                    s[k] = T.cast(s1, state_dtype) if packed else s1
        reduce_rows(acc, tx)

    @T.macro
    def store_raw(raw, pool, slot, h, pb, tx):
        """Store the stored-dtype registers ``raw`` (``pack_early``)."""
        lane = tx % L
        rg = tx // L
        for r in T.unroll(R):
            p = pb * BP + r * RP + rg
            for v in T.unroll(NV):
                n0 = (v * L + lane) * VEC
                k0 = (r * NV + v) * VEC
                if guard_p:
                    if p < P:
                        for i in T.unroll(VEC):
                            pool[slot, h, p, n0 + i] = raw[k0 + i]
                elif vector_state:
                    for i in T.vectorized(VEC):
                        pool[slot, h, p, n0 + i] = raw[k0 + i]
                else:
                    for i in T.unroll(VEC):
                        pool[slot, h, p, n0 + i] = raw[k0 + i]

    @T.macro
    def write_row_y(acc, xv, dv, zv, r, out, row, h, p, flags):
        """out[row, h, p] = the y of the thread's row ``r`` from its reduced dot product ``acc[r]``."""
        acc[r] = acc[r] + dv[r] * xv[r]  # dv is 0 without D
        if (flags & FLAG_Z) != 0:
            acc[r] = acc[r] * zv[r] / (1.0 + T.exp(-zv[r]))
        if guard_p:
            if p < P:
                out[row, h, p] = T.cast(acc[r], io_dtype)
        else:
            out[row, h, p] = T.cast(acc[r], io_dtype)

    @T.macro
    def write_y_as(acc, xv, dv, zv, out, row, h, pb, tx, flags, transposed):
        lane = tx % L
        rg = tx // L
        if transposed:
            # after the transposed reduction lane ``lane`` holds the total of row ``lane // (L / R)``: the first
            # lane of each such group writes that row (R lanes write one value each)
            sel = lane // (L // R)
            if lane % (L // R) == 0:
                p = pb * BP + sel * RP + rg
                acc[0] = acc[0] + pick(dv, sel) * pick(xv, sel)  # dv is 0 without D
                if (flags & FLAG_Z) != 0:
                    acc[0] = acc[0] * pick(zv, sel) / (1.0 + T.exp(-pick(zv, sel)))
                if guard_p:
                    if p < P:
                        out[row, h, p] = T.cast(acc[0], io_dtype)
                else:
                    out[row, h, p] = T.cast(acc[0], io_dtype)
        elif lane == 0:
            for r in T.unroll(R):
                write_row_y(acc, xv, dv, zv, r, out, row, h, pb * BP + r * RP + rg, flags)

    @T.macro
    def write_y(acc, xv, dv, zv, out, row, h, pb, tx, flags):
        write_y_as(acc, xv, dv, zv, out, row, h, pb, tx, flags, transposed)

    def quant_ops(qdtype, rounds=0):
        """The helpers of one block-scaled quantised dtype (see the module docstring). ``qs``: ``R`` fp32
        registers, the thread's rows' scales once read and the encode factors ``QMAX / max|row|`` while
        storing. ``rounds`` > 0: also ``store_sr``, the store rounding stochastically with Philox-4x32-``rounds``.

        Every conversion stays off the GPU's conversion unit (a quarter of the FP32 rate on Hopper, where three
        conversions per value bounded an int8 update at ~1.9 TB/s): an integer's number ``v`` becomes fp32 as
        the float whose bits are ``0x4B000000 + (v + 2^(b-1))`` (that is, 2^23 + v + 2^(b-1)) minus that
        offset, both exact; an fp32 ``q`` rounds to the nearest-even integer by adding 1.5 * 2^23 (the sum's
        low bits are then ``q``'s rounded two's-complement, truncated into the stored width). fp8 converts two
        values per instruction (``cvt`` of e4m3x2, saturating at +-448)."""
        qmax = QMAX[qdtype]
        fmt = FORMATS[qdtype]
        sr = sr_ops(rounds) if rounds else None  # the Philox draw of store_sr
        integer = qdtype.startswith("int")
        half = 128 if qdtype == "int8" else 32768  # integers: the offset that makes the stored number unsigned
        CV = 8 if VEC % 8 == 0 else (4 if VEC % 4 == 0 else 1)  # fp8 values per vectorised cast

        @T.macro
        def fetch_scales(qs, scale, slot, h, pb, tx):
            rg = tx // L
            for r in T.unroll(R):
                qs[r] = scale[slot, h, prow(pb, r, rg)]

        def number(v):
            """The stored number ``v`` (an element of a quantised register array) as fp32."""
            if not integer:
                return T.cast(v, f32)
            bits = T.cast(v, "int32") + (0x4B000000 + half)
            return T.reinterpret(f32, bits) - T.float32(8388608.0 + half)

        @T.macro
        def widen(s, raw, k0):
            """s[k0 : k0 + VEC] = the stored numbers raw[k0 : k0 + VEC] as fp32."""
            if integer or CV == 1:
                for i in T.unroll(VEC):
                    s[k0 + i] = number(raw[k0 + i])
            else:
                for c in T.unroll(VEC // CV):
                    for i in T.vectorized(CV):
                        s[k0 + c * CV + i] = T.cast(raw[k0 + c * CV + i], f32)

        @T.macro
        def dequantize(s, raw, qs, live):
            for k in T.unroll(NS // VEC):
                widen(s, raw, k * VEC)
            for k in T.unroll(NS):
                s[k] = T.if_then_else(live, s[k] * qs[k // (NV * VEC)], T.float32(0))

        @T.macro
        def reload(s, buf, src, scale, qs, entry, h, pb, tx):
            """s = the dequantised rows of ``src[entry]`` (the parent reload of the packed kernel)."""
            fetch_scales(qs, scale, entry, h, pb, tx)
            lane = tx % L
            rg = tx // L
            for r in T.unroll(R):
                p = prow(pb, r, rg)
                for v in T.unroll(NV):
                    k0 = (r * NV + v) * VEC
                    load_chunk(buf, src, entry, h, p, (v * L + lane) * VEC)
                    if integer or CV == 1:
                        for i in T.unroll(VEC):
                            s[k0 + i] = number(buf[i]) * qs[r]
                    else:
                        for c in T.unroll(VEC // CV):
                            for i in T.vectorized(CV):
                                s[k0 + c * CV + i] = T.cast(buf[c * CV + i], f32)
                        for i in T.unroll(VEC):
                            s[k0 + i] = s[k0 + i] * qs[r]

        @T.macro
        def encode(buf, qf, k0):
            """buf = the scaled values ``qf[k0 : k0 + VEC]`` (fp32, within +-QMAX) as stored numbers."""
            if integer:
                for i in T.unroll(VEC):
                    buf[i] = T.cast(T.reinterpret("int32", qf[k0 + i] + T.float32(12582912.0)), qdtype)
            elif CV == 1:
                for i in T.unroll(VEC):
                    buf[i] = T.cast(qf[k0 + i], qdtype)
            else:
                for c in T.unroll(VEC // CV):
                    for i in T.vectorized(CV):
                        buf[c * CV + i] = T.cast(qf[k0 + c * CV + i], qdtype)

        @T.macro
        def write_scale(scale, slot, h, p, qs, r):
            """scale[slot, h, p] = the stored scale of the row whose encode factor is ``qs[r]``."""
            # every lane of the row writes the (same) scale: a lane that reads the row back later (the packed
            # kernel's tree reload of a parent's entry) then reads its own write, with no ordering needed
            # between the lanes of a warp
            if guard_p:
                if p < P:
                    scale[slot, h, p] = T.float32(1) / qs[r]
            else:
                scale[slot, h, p] = T.float32(1) / qs[r]

        @T.macro
        def encode_factors(s, qs):
            """qs[r] = QMAX / max|row r| (1 for an all-zero row), the maximum over the row's lanes."""
            for r in T.unroll(R):
                qs[r] = T.float32(0)
                for k in T.unroll(NV * VEC):
                    qs[r] = T.max(qs[r], T.abs(s[r * NV * VEC + k]))
            for j in T.unroll(LOG_L):
                for r in T.unroll(R):
                    qs[r] = T.max(qs[r], T.shfl_xor(qs[r], L >> (j + 1)))
            for r in T.unroll(R):
                qs[r] = T.if_then_else(qs[r] == T.float32(0), T.float32(1), T.float32(qmax) / qs[r])

        def rows_store(stochastic: bool):
            """The store of the fp32 rows ``s`` into ``dst[slot]`` with new scales (every lane of the CTA calls it: the
            row maximum is a warp shuffle), rounding to nearest (``encode``) or, ``stochastic``, with ``encode_sr``,
            each chunk with its Philox words for key ``(k0, k1)`` (:func:`row_ops`' ``sr_ops``: the value at flat
            offset ``o`` of the ``[rows, heads, P, N]`` tensor written takes half ``o % 2`` of word ``(o % 8) // 2``
            of counter ``o - o % 8``). |s| x QMAX / max|row| is at most QMAX up to the division's rounding, so the
            rounded numbers stay within +-QMAX without a clamp (fp8's conversion saturates)."""

            @T.macro
            def store_rows(s, buf, dst, scale, qs, slot, h, pb, tx, k0, k1):
                qf = T.alloc_local((VEC,), f32)
                if stochastic:
                    t = T.alloc_local((3,), f32)
                    ctr = T.alloc_local((4,), "uint32")
                    tmp = T.alloc_local((2,), "uint32")
                    words = T.alloc_local((VEC // 2,), "uint32")
                lane = tx % L
                rg = tx // L
                encode_factors(s, qs)
                for r in T.unroll(R):
                    p = pb * BP + r * RP + rg
                    for v in T.unroll(NV):
                        n0 = (v * L + lane) * VEC
                        if stochastic:
                            sr.draw_chunk(words, 0, ctr, tmp, dst, slot, h, p, n0, k0, k1)
                        for i in T.unroll(VEC):
                            qf[i] = s[(r * NV + v) * VEC + i] * qs[r]
                        if stochastic:
                            encode_sr(buf, qf, t, words)
                        else:
                            encode(buf, qf, 0)
                        store_chunk(buf, dst, slot, h, p, n0)
                    write_scale(scale, slot, h, p, qs, r)

            return store_rows

        nearest = rows_store(False)

        @T.macro
        def store(s, buf, dst, scale, qs, slot, h, pb, tx):
            nearest(s, buf, dst, scale, qs, slot, h, pb, tx, None, None)

        @T.macro
        def encode_sr(buf, qf, t, words):
            """buf = the scaled values ``qf`` (fp32) rounded stochastically (the reference's rule,
            ``mate.mamba._reference.rounding.round_scaled``): value ``i`` takes the 16-bit half ``i % 2`` of
            ``words[i // 2]`` (``u``); its magnitude goes to ``step * floor(|v| / step + u / 2^16)`` on the
            format's grid (step 1 for an integer; a float's binade step 2^(e - mantissa), at least 2^min_exp),
            saturated at QMAX and signed as ``v``. After the scaling every operation is exact (a power-of-two step,
            the carry a comparison), so nothing depends on how the compiler contracts them. ``t``: 3 fp32."""
            for i in T.unroll(VEC):
                u = T.cast(T.shift_right(words[i // 2], T.cast((i % 2) * 16, "uint32")) & T.uint32(0xFFFF), f32)
                if integer:  # t[0] = |v| / step, the step 1
                    t[0] = T.abs(qf[i])
                else:
                    t[2] = T.reinterpret(
                        f32,
                        T.max(
                            (T.reinterpret("int32", T.abs(qf[i])) & 0x7F800000) - (fmt.mantissa << 23),
                            (127 + fmt.min_exp) << 23,
                        ),
                    )  # the step
                    t[0] = T.abs(qf[i]) * T.reinterpret(f32, 0x7F000000 - T.reinterpret("int32", t[2]))  # / step
                t[1] = T.floor(t[0])
                t[1] = t[1] + T.if_then_else((t[0] - t[1]) * T.float32(65536) >= T.float32(65536) - u,
                                             T.float32(1), T.float32(0))  # fmt: skip
                if integer:
                    t[1] = T.min(t[1], T.float32(qmax))
                    t[1] = T.if_then_else(qf[i] < T.float32(0), -t[1], t[1])
                    # (an integral value within +-QMAX: its two's complement in the low bits of the sum's bits)
                    buf[i] = T.cast(T.reinterpret("int32", t[1] + T.float32(12582912.0)), qdtype)
                else:
                    t[1] = T.min(t[1] * t[2], T.float32(qmax))
                    buf[i] = T.cast(T.if_then_else(qf[i] < T.float32(0), -t[1], t[1]), qdtype)

        store_sr = rows_store(True) if rounds else None  # (s, buf, dst, scale, qs, slot, h, pb, tx, k0, k1)

        @T.macro
        def unstage_numbers(sv, cb, cw, stage, r, v, tx, k0):
            """sv[k0 : k0 + VEC] = the stored numbers of the thread's staged chunk ``v`` of row ``r`` as fp32. An int8
            chunk is read as 32-bit words and each byte made a float with one byte permute (``__byte_perm``: the
            biased byte under the exponent bits of 2^23) and one subtraction, two instructions per value."""
            if qdtype == "int8":
                EXP23 = 0x4B000000  # the exponent bits of 2^23
                words = T.view(stage, (NS * TH // 4,), "uint32")
                o = stage_at(r, v, tx) // 4
                for w in T.vectorized(VEC // 4):
                    cw[w] = words[o + w]
                for w in T.unroll(VEC // 4):
                    biased = cw[w] ^ T.uint32(0x80808080)
                    for j in T.unroll(4):  # result bytes: byte j of ``biased``, 0, 0, 0x4B
                        bits = T.call_extern("uint32", "__byte_perm", biased, T.uint32(EXP23), T.uint32(0x7540 + j))
                        sv[k0 + w * 4 + j] = T.reinterpret(f32, bits) - T.float32(8388608.0 + half)
            else:
                unstage_chunk(cb, stage, r, v, tx)
                widen(sv, cb, k0)

        @T.macro
        def staged_rows(stage, cb, cw, sv, buf, qs, acc, mx, Av, xv, dtv, dv, zv, bv, cv, out, row, dst, scale, wslot,
                        store, h, pb, tx, flags):  # fmt: skip
            """The staged design's update (the state in shared memory, see ``stage_state``), one row at a time:
            the row's values updated into ``sv`` (``NV * VEC`` fp32), its y and its max |value| reduced over its
            lanes and, where ``store``, the row quantised into ``dst[wslot]`` at once. No more than one row's values
            are live, so a thread's registers do not grow with the rows it holds (the bytes in flight are the
            stage's). The rows' y partials wait for the last row: one transposed reduction (``reduce_rows``: R - 1 +
            log2(L / R) shuffles where each row took log2(L); the same sums, paired in the same order) and one y
            per row written by the lanes it ends on, where lane 0 wrote each row's after it with its warp waiting
            (~35 instructions a row: the address, silu's precise division)."""
            lane = tx % L
            rg = tx // L
            if tied:
                dtv[1] = T.exp(Av[0] * dtv[0])
            for r in T.unroll(R):
                p = pb * BP + r * RP + rg
                acc[r] = 0.0
                mx[r] = T.float32(0)
                if tied:
                    qs[r] = qs[r] * dtv[1]  # the decay folded into the scale: one multiply-add per value
                if r > 0:
                    # no read of this row's stage before the last row's stores: else the compiler hoists every
                    # row's update for its y partial and computes it again for the store
                    T.call_extern("void", "__syncwarp")
                for v in T.unroll(NV):
                    unstage_numbers(sv, cb, cw, stage, r, v, tx, v * VEC)
                    for i in T.unroll(VEC):
                        k = v * VEC + i
                        if tied:
                            s1 = sv[k] * qs[r] + (dtv[0] * xv[r]) * T.cast(bv[k], f32)
                        else:
                            s0 = sv[k] * qs[r]
                            s1 = s0 * T.exp(Av[(r * NV + v) * VEC + i] * dtv[r]) + (dtv[r] * xv[r]) * T.cast(bv[k], f32)
                        acc[r] = acc[r] + s1 * T.cast(cv[k], f32)
                        mx[r] = T.max(mx[r], T.abs(s1))
                        sv[k] = s1
                for j in T.unroll(LOG_L):
                    mx[r] = T.max(mx[r], T.shfl_xor(mx[r], L >> (j + 1)))
                if store:
                    mx[r] = T.if_then_else(mx[r] == T.float32(0), T.float32(1), T.float32(qmax) / mx[r])
                    for v in T.unroll(NV):
                        if integer:  # scaled and rounded in one multiply-add (the exact product rounded once)
                            for i in T.unroll(VEC):
                                bits = T.reinterpret("int32", T.fma(sv[v * VEC + i], mx[r], T.float32(12582912.0)))
                                buf[i] = T.cast(bits, qdtype)
                        else:
                            for i in T.unroll(VEC):
                                sv[v * VEC + i] = sv[v * VEC + i] * mx[r]
                            encode(buf, sv, v * VEC)
                        store_chunk(buf, dst, wslot, h, p, (v * L + lane) * VEC)
                    write_scale(scale, wslot, h, p, mx, r)
            reduce_rows_as(acc, tx, R <= L)
            write_y_as(acc, xv, dv, zv, out, row, h, pb, tx, flags, R <= L)

        return SimpleNamespace(
            fetch_scales=fetch_scales, dequantize=dequantize, reload=reload, store=store,
            staged_rows=staged_rows, store_sr=store_sr,
        )  # fmt: skip

    def sr_ops(rounds):
        """Stochastic rounding of the fp32 rows ``s`` into an fp16 tensor (the reference's rule,
        ``mate.mamba._reference.rounding``): the value at flat offset ``o`` of the ``[rows, heads, P, N]`` tensor
        written takes the 16-bit half ``o % 2`` of word ``(o % 8) // 2`` of Philox-4x32-``rounds`` for key
        ``(k0, k1)`` and counter ``(o - o % 8, 0, 0)`` (one Philox call per eight values of a chunk); 13 of those
        bits are added below the fp16 mantissa of ``|v|``, then the value is truncated, in integer operations only.

        ``draw`` computes a thread's words for a slot ahead of the update (the one-token kernel draws while the
        state loads are in flight, so the generator's integer work overlaps their latency; ``NS / 2`` registers);
        ``store`` rounds with drawn words, ``store_now`` draws as it stores (the packed kernel's per-token
        writes)."""
        if VEC % 8:
            raise ValueError(f"stochastic rounding draws 8 values per counter: a chunk of {VEC} values")
        u32 = "uint32"
        KEY_A, KEY_B, ROUND_A, ROUND_B = 0x9E3779B9, 0xBB67AE85, 0xD2511F53, 0xCD9E8D57
        GW = VEC // 2  # words per chunk
        FP32_MAX = 3.4028234663852886e38

        @T.macro
        def philox(ctr, tmp, k0, k1, offset):
            """ctr = the four words of the counter ``offset`` (int64)."""
            ctr[0] = T.cast(offset, u32)
            ctr[1] = T.cast(T.shift_right(offset, T.int64(32)), u32)
            ctr[2] = T.uint32(0)
            ctr[3] = T.uint32(0)
            for rd in T.unroll(rounds):
                tmp[0] = ctr[0]
                tmp[1] = ctr[2]
                ka = k0 + T.uint32((rd * KEY_A) & 0xFFFFFFFF)
                kb = k1 + T.uint32((rd * KEY_B) & 0xFFFFFFFF)
                ctr[0] = T.call_extern(u32, "__umulhi", T.uint32(ROUND_B), tmp[1]) ^ ctr[1] ^ ka
                ctr[2] = T.call_extern(u32, "__umulhi", T.uint32(ROUND_A), tmp[0]) ^ ctr[3] ^ kb
                ctr[1] = T.uint32(ROUND_B) * tmp[1]
                ctr[3] = T.uint32(ROUND_A) * tmp[0]

        def round16(v, word, half):
            """fp16 bits (uint32) of the fp32 ``v`` rounded up with probability its remainder: 13 bits of the
            16-bit ``half`` (0 or 1) of ``word``. Overflow (to inf) by a min, underflow (to zero) by a select."""
            bits = T.reinterpret(u32, v)
            noise = T.shift_right(word, T.cast(half * 16, u32))
            mag = (bits & T.uint32(0x7FFFFFFF)) + (noise & T.uint32(0x1FFF))  # a NaN's may pass 2^31: unsigned
            h = T.cast(T.shift_right(mag, T.uint32(13)), "int32") - (112 << 10)  # (exp - 112) << 10 | mant >> 13
            h = T.if_then_else(h < (1 << 10), 0, T.min(h, 0x7C00))  # below the smallest normal: zero
            # a NaN is 0x7C00 by now (its magnitude is above inf's): its quiet bit is or-ed in without a branch
            # (a select of 0x7E00 against the whole expression became a branch per value)
            nan = T.cast((bits & T.uint32(0x7FFFFFFF)) > T.uint32(0x7F800000), "int32")
            h = h | T.shift_left(nan, 9)
            return T.cast(h, u32) | (T.shift_right(bits, T.uint32(16)) & T.uint32(0x8000))

        def offset_of(dst, slot, h, p, n0):
            heads = T.cast(dst.shape[1], i64)
            return ((T.cast(slot, i64) * heads + T.cast(h, i64)) * P + T.cast(p, i64)) * N + T.cast(n0, i64)

        @T.macro
        def draw_chunk(words, w0, ctr, tmp, dst, slot, h, p, n0, k0, k1):
            """words[w0 : w0 + GW] = the Philox words of the chunk of row ``p`` of ``dst[slot, h]`` from ``n0``."""
            for j in T.unroll(VEC // 8):
                philox(ctr, tmp, k0, k1, offset_of(dst, slot, h, p, n0 + 8 * j))
                for i in T.unroll(4):
                    words[w0 + 4 * j + i] = ctr[i]

        @T.macro
        def draw(words, dst, slot, h, pb, tx, k0, k1):
            """words = the thread's Philox words for its values in ``dst[slot]`` (``NS // 2`` uint32)."""
            ctr = T.alloc_local((4,), u32)
            tmp = T.alloc_local((2,), u32)
            lane = tx % L
            rg = tx // L
            for r in T.unroll(R):
                p = pb * BP + r * RP + rg
                for v in T.unroll(NV):
                    draw_chunk(words, (r * NV + v) * GW, ctr, tmp, dst, slot, h, p, (v * L + lane) * VEC, k0, k1)

        def truncated(v, word, half):
            """``round16`` of a finite ``v`` as an fp32 value that converts to fp16 exactly: the noise added to the
            bits, the 13 bits below the fp16 mantissa cleared (so the conversion, to nearest, rounds nothing and
            turns 2^16 and above into inf), and below fp16's smallest normal the signed zero."""
            noise = T.shift_right(word, T.cast(half * 16, u32)) & T.uint32(0x1FFF)
            bits = T.reinterpret(u32, v) + noise  # a finite value's magnitude stays below 2^31
            tiny = T.abs(T.reinterpret(f32, bits)) < T.float32(2.0**-14)
            keep = T.if_then_else(tiny, T.uint32(0x80000000), T.uint32(0xFFFFE000))
            return T.reinterpret(f32, bits & keep)

        def all_finite(s, k0):
            """Whether the chunk's ``VEC`` values from ``s[k0]`` are finite (a NaN compares false)."""
            finite = T.abs(s[k0]) <= T.float32(FP32_MAX)
            for i in range(1, VEC):
                finite = T.And(finite, T.abs(s[k0 + i]) <= T.float32(FP32_MAX))
            return finite

        @T.macro
        def round_chunk(buf, s, k0, words, w0):
            # a chunk of finite values (every chunk but a diverged state's) converts with the hardware's fp16
            # conversion: half the integer work of round16, which it equals bit for bit on finite values
            if all_finite(s, k0):
                for i in T.unroll(VEC):
                    buf[i] = T.cast(truncated(s[k0 + i], words[w0 + i // 2], i % 2), "float16")
            else:
                for i in T.unroll(VEC):
                    bits16 = T.cast(round16(s[k0 + i], words[w0 + i // 2], i % 2), "uint16")
                    buf[i] = T.reinterpret("float16", bits16)

        @T.macro
        def store(s, words, buf, dst, slot, h, pb, tx):
            """The rows ``s`` rounded with the drawn ``words`` into ``dst[slot]`` (fp16; ``buf``: ``VEC`` fp16)."""
            lane = tx % L
            rg = tx // L
            for r in T.unroll(R):
                p = pb * BP + r * RP + rg
                for v in T.unroll(NV):
                    round_chunk(buf, s, (r * NV + v) * VEC, words, (r * NV + v) * GW)
                    store_chunk(buf, dst, slot, h, p, (v * L + lane) * VEC)

        @T.macro
        def store_now(s, buf, dst, slot, h, pb, tx, k0, k1):
            """``store`` drawing each chunk's words as it goes."""
            ctr = T.alloc_local((4,), u32)
            tmp = T.alloc_local((2,), u32)
            words = T.alloc_local((GW,), u32)
            lane = tx % L
            rg = tx // L
            for r in T.unroll(R):
                p = pb * BP + r * RP + rg
                for v in T.unroll(NV):
                    n0 = (v * L + lane) * VEC
                    draw_chunk(words, 0, ctr, tmp, dst, slot, h, p, n0, k0, k1)
                    round_chunk(buf, s, (r * NV + v) * VEC, words, 0)
                    store_chunk(buf, dst, slot, h, p, n0)

        return SimpleNamespace(draw=draw, draw_chunk=draw_chunk, store=store, store_now=store_now, words=NS // 2)

    def dt_value(raw, bias):
        """dt + dt_bias (softplus is applied later by ``apply_softplus``, once every load is in flight)."""
        return T.cast(raw, f32) + bias

    @T.macro
    def apply_softplus(vals, n, flags):
        if (flags & FLAG_SOFTPLUS) != 0:
            for k in T.unroll(n):
                vals[k] = softplus(vals[k])

    return SimpleNamespace(
        P=P, N=N, VEC=VEC, NV=NV, L=L, R=R, TH=TH, BP=BP, RP=RP, NB=(P + BP - 1) // BP, guard_p=guard_p, NS=NS,
        NA=1 if tied else NS, transposed=transposed, prow=prow, bit=bit, aligned=aligned, dt_value=dt_value,
        fetch_state=fetch_state, convert_state=convert_state, store_state=store_state, reload_state=reload_state,
        load_A=load_A, load_D=load_D, reduce_rows=reduce_rows, recur_and_reduce=recur_and_reduce, store_raw=store_raw,
        stage_state=stage_state,
        write_y=write_y,
        apply_softplus=apply_softplus, load_io_chunk=load_io_chunk, quant_ops=quant_ops, sr_ops=sr_ops,
    )  # fmt: skip
