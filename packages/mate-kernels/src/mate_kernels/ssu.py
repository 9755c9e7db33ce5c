"""TileLang kernel factories for the Mamba2 selective state update (SSU).

One factory, :func:`ssu_kernel`, builds both kernels of the decode entry point:

* ``one_token=True``: one token per sequence (rows = sequences). The read slot is ``src(b, 0)`` (or ``b``),
  the state is read once and written once (to ``dst(b, 0)``, else the read slot) per (slot, head, row).
* ``one_token=False`` (packed): every other form. Sequence ``b`` owns rows ``[bos, bos + len)`` with
  ``bos = cu_seqlens[b]`` or ``b * seqlen``; the read slot is ``src(b, max(acc[b] - 1, 0))``; the state stays
  in registers across the sequence's tokens; writes per token (destination table or intermediate buffer),
  once at the end, or never; SGLang's ``parent`` reloads the state from the intermediate buffer before
  token ``t > 0``.

Tiling (all compile-time): a CTA owns ``block_p`` rows of the state of one (sequence, head); a row of
``N`` state values is spread over ``lanes`` consecutive lanes of a warp, each lane holding ``vecs`` chunks of
``vec`` contiguous values (16 bytes of state per chunk), so a state row is loaded and stored with 16-byte
vector accesses straight into registers (no shared memory) and ``y = s . C`` is a warp-shuffle reduction over
the row's lanes. ``rows_per_thread`` rows are held by each thread. The grid is
``(P / block_p, heads, sequences)``, which gives ``H * P / block_p`` CTAs even at batch 1.

Runtime (``T.dynamic`` or scalar arguments): pool slots and ``stride(0)``/``stride(1)``, heads, groups,
rows, every stride of x/dt/B/C/z/out/A/D/dt_bias, table lengths and strides, the sentinel, the number of
sequences, the uniform sequence length, ``cache_steps`` and one bitmask of the optional inputs (``FLAG_*``):
absent optional tensors are passed as small dummies, so one compiled kernel serves every combination of
D/z/dt_bias/softplus/tables/write modes. Compile-time: P, N, heads per group, the dtypes, tied (one decay
per head) vs untied A/dt, the tiling, and whether the state/B/C rows are 16-byte aligned (vector accesses).

This module imports nothing from the runtime; TileLang is imported lazily inside the factory.
"""

# no ``from __future__ import annotations``: TileLang evaluates the prim_func annotations (closure variables)

from dataclasses import dataclass

# bits of the ``flags`` scalar argument
FLAG_D = 1
FLAG_Z = 2
FLAG_DT_BIAS = 4
FLAG_SOFTPLUS = 8
FLAG_SRC = 16  # a read table is given (else the read slot is the sequence index)
FLAG_DST = 32  # a destination table is given
FLAG_CU = 64  # cu_seqlens is given (else uniform ``seqlen`` rows per sequence)
FLAG_ACC = 128  # num_accepted_tokens is given
FLAG_IIDX = 256  # intermediate_state_indices is given
FLAG_PARENT = 512  # retrieve_parent_token is given

# write modes (the ``mode`` scalar argument)
MODE_NONE = 0
MODE_FINAL = 1
MODE_PER_TOKEN = 2
MODE_INTERMEDIATE = 3

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class SSUTiling:
    vec: int  # contiguous state values per 16-byte access
    vecs: int  # chunks per lane per row
    lanes: int  # lanes per state row (a power of two <= 32)
    rows_per_thread: int
    threads: int
    block_p: int  # state rows per CTA

    @property
    def rows_per_pass(self) -> int:
        return self.threads // self.lanes


def choose_tiling(dim: int, dstate: int, state_dtype: str, *, target_block_p: int = 16) -> SSUTiling:
    """The tiling for (P, N, state dtype): 16-byte state chunks, at most 32 lanes per row, 128 threads,
    ``block_p`` ~16 rows per CTA (so batch 1 at H 128, P 64 already launches 512 CTAs)."""
    if state_dtype not in _BYTES:
        raise ValueError(f"state_dtype: expected one of {tuple(_BYTES)}, got {state_dtype!r}")
    vec = 16 // _BYTES[state_dtype]
    while dstate % vec:
        vec //= 2
    chunks = dstate // vec
    lanes = 1
    while lanes < 32 and chunks % (lanes * 2) == 0:
        lanes *= 2
    vecs = chunks // lanes
    threads = 128
    rows_per_pass = threads // lanes
    # shrink the CTA when P is small or not a multiple of one pass
    while threads > 32 and dim % rows_per_pass and rows_per_pass > 1:
        threads //= 2
        rows_per_pass = threads // lanes
    rows_per_thread = max(1, target_block_p // rows_per_pass)
    while rows_per_thread > 1 and dim % (rows_per_pass * rows_per_thread):
        rows_per_thread //= 2
    return SSUTiling(vec, vecs, lanes, rows_per_thread, threads, rows_per_pass * rows_per_thread)


def ssu_kernel(
    *,
    dim: int,
    dstate: int,
    heads_per_group: int,
    state_dtype: str,
    io_dtype: str,
    dt_dtype: str = "float32",
    d_dtype: str = "float32",
    dt_bias_dtype: str = "float32",
    src_dtype: str = "int32",
    dst_dtype: str = "int32",
    meta_dtype: str = "int32",
    ibuf_dtype: str | None = None,
    tied: bool = True,
    one_token: bool = True,
    vector_state: bool = True,
    vector_io: bool = True,
    tiling: SSUTiling | None = None,
):
    """Return the ``T.prim_func`` of one SSU kernel configuration (see the module docstring).

    Argument order of the returned function (the launcher passes them positionally):
    ``state, x, dt, A, B, C, D, z, dt_bias, out, src, dst, [cu, acc, ibuf, iidx, parent,]``
    ``nseq, seqlen, src_sb, src_st, dst_sb, dst_st, pad, flags, mode, [cache_steps]``
    (bracketed arguments only for the packed kernel).
    """
    import tilelang.language as T

    P, N, ratio = int(dim), int(dstate), int(heads_per_group)
    tl = tiling or choose_tiling(P, N, state_dtype)
    VEC, NV, L, R, TH, BP = tl.vec, tl.vecs, tl.lanes, tl.rows_per_thread, tl.threads, tl.block_p
    RP = tl.rows_per_pass
    NB = (P + BP - 1) // BP
    guard_p = P % BP != 0
    NS = R * NV * VEC  # state values per thread
    ibuf_dtype = ibuf_dtype or state_dtype
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

    state_t = T.StridedTensor((S, H, P, N), (s_s0, s_s1, N, 1), state_dtype)
    x_t = T.StridedTensor((R_, H, P), (sx0, sx1, sx2), io_dtype)
    dt_t = T.StridedTensor((R_, H, P), (sd0, sd1, sd2), dt_dtype)
    A_t = T.StridedTensor((H, P, N), (sa0, sa1, sa2), f32)
    B_t = T.StridedTensor((R_, G, N), (sb0, sb1, 1), io_dtype)
    C_t = T.StridedTensor((R_, G, N), (sc0, sc1, 1), io_dtype)
    D_t = T.StridedTensor((HD, PD), (sD0, sD1), d_dtype)
    z_t = T.StridedTensor((RZ, HZ, PZ), (sz0, sz1, sz2), io_dtype)
    dtb_t = T.StridedTensor((HB, PB), (sB0, sB1), dt_bias_dtype)
    out_t = T.StridedTensor((R_, H, P), (so0, so1, so2), io_dtype)
    src_t = T.Tensor((LS,), src_dtype)
    dst_t = T.Tensor((LD,), dst_dtype)
    cu_t = T.Tensor((LC,), meta_dtype)
    acc_t = T.Tensor((LA,), meta_dtype)
    ibuf_t = T.StridedTensor((K, HI, P, N), (s_i0, s_i1, N, 1), ibuf_dtype)  # HI: heads, or 1 for the dummy
    iidx_t = T.Tensor((LI,), meta_dtype)
    par_t = T.StridedTensor((NPAR, TPAR), (sp0, sp1), meta_dtype)

    def prow(pb, r, rg):
        """State row of unrolled row ``r`` (clamped into range for loads when P is not a multiple of block_p)."""
        p = pb * BP + r * RP + rg
        return T.min(p, P - 1) if guard_p else p

    def softplus(d):
        return T.if_then_else(d > 20.0, d, T.log1p(T.exp(T.min(d, 20.0))))

    def aligned(buf, vector):
        """A view of ``buf`` whose dynamic outer strides are written as multiples of ``vec``: the caller
        guarantees that they are (``vector_*``), which lets TileLang prove 16-byte vector accesses."""
        if not vector:
            return buf
        last = len(buf.strides) - 1
        strides = [st if i == last else T.floordiv(st, VEC) * VEC for i, st in enumerate(buf.strides)]
        return T.view(buf, strides=strides)

    shfl_offsets = []
    off = L // 2
    while off >= 1:
        shfl_offsets.append(off)
        off //= 2

    @T.macro
    def load_state(s, buf, pool, slot, h, pb, tx):
        lane = tx % L
        rg = tx // L
        for r in T.unroll(R):
            p = prow(pb, r, rg)
            for v in T.unroll(NV):
                n0 = (v * L + lane) * VEC
                if vector_state:
                    for i in T.vectorized(VEC):
                        buf[i] = pool[slot, h, p, n0 + i]
                else:
                    for i in T.unroll(VEC):
                        buf[i] = pool[slot, h, p, n0 + i]
                for i in T.unroll(VEC):
                    s[(r * NV + v) * VEC + i] = T.cast(buf[i], f32)

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
                if guard_p:
                    if p < P:
                        for i in T.unroll(VEC):
                            pool[slot, h, p, n0 + i] = buf[i]
                elif vector_state:
                    for i in T.vectorized(VEC):
                        pool[slot, h, p, n0 + i] = buf[i]
                else:
                    for i in T.unroll(VEC):
                        pool[slot, h, p, n0 + i] = buf[i]

    @T.macro
    def token_step(s, Av, acc, xv, dtv, bv, cv, iov, x, dt, A, B, C, D, z, dt_bias, out, row, h, g, pb, tx, flags):
        """One token: s = s * exp(A dt) + dt x B ; y = s . C (+ D x) (* silu(z)); writes out[row]."""
        lane = tx % L
        rg = tx // L
        # inputs of this token: x / dt per row, B / C chunks of this lane
        for r in T.unroll(R):
            p = prow(pb, r, rg)
            xv[r] = T.cast(x[row, h, p], f32)
            if not tied:
                dtv[r] = T.cast(dt[row, h, p], f32)
                if (flags & FLAG_DT_BIAS) != 0:
                    dtv[r] = dtv[r] + T.cast(dt_bias[h, p], f32)
                if (flags & FLAG_SOFTPLUS) != 0:
                    dtv[r] = softplus(dtv[r])
        if tied:
            dtv[0] = T.cast(dt[row, h, 0], f32)
            if (flags & FLAG_DT_BIAS) != 0:
                dtv[0] = dtv[0] + T.cast(dt_bias[h, 0], f32)
            if (flags & FLAG_SOFTPLUS) != 0:
                dtv[0] = softplus(dtv[0])
            dtv[1] = T.exp(Av[0] * dtv[0])
        for v in T.unroll(NV):
            n0 = (v * L + lane) * VEC
            if vector_io:
                for i in T.vectorized(VEC):
                    iov[i] = B[row, g, n0 + i]
            else:
                for i in T.unroll(VEC):
                    iov[i] = B[row, g, n0 + i]
            for i in T.unroll(VEC):
                bv[v * VEC + i] = T.cast(iov[i], f32)
            if vector_io:
                for i in T.vectorized(VEC):
                    iov[i] = C[row, g, n0 + i]
            else:
                for i in T.unroll(VEC):
                    iov[i] = C[row, g, n0 + i]
            for i in T.unroll(VEC):
                cv[v * VEC + i] = T.cast(iov[i], f32)
        # recurrence + partial dot products
        for r in T.unroll(R):
            acc[r] = 0.0
            for v in T.unroll(NV):
                for i in T.unroll(VEC):
                    k = (r * NV + v) * VEC + i
                    if tied:
                        s[k] = s[k] * dtv[1] + (dtv[0] * xv[r]) * bv[v * VEC + i]
                    else:
                        s[k] = s[k] * T.exp(Av[k] * dtv[r]) + (dtv[r] * xv[r]) * bv[v * VEC + i]
                    acc[r] = acc[r] + s[k] * cv[v * VEC + i]
        # reduce over the row's lanes
        for j in T.unroll(len(shfl_offsets)):
            for r in T.unroll(R):
                acc[r] = acc[r] + T.shfl_xor(acc[r], L >> (j + 1))
        if lane == 0:
            for r in T.unroll(R):
                p = pb * BP + r * RP + rg
                pc = prow(pb, r, rg)
                if (flags & FLAG_D) != 0:
                    acc[r] = acc[r] + T.cast(D[h, pc], f32) * xv[r]
                if (flags & FLAG_Z) != 0:
                    acc[r] = acc[r] * T.cast(z[row, h, pc], f32) / (1.0 + T.exp(-T.cast(z[row, h, pc], f32)))
                if guard_p:
                    if p < P:
                        out[row, h, p] = T.cast(acc[r], io_dtype)
                else:
                    out[row, h, p] = T.cast(acc[r], io_dtype)

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

    NA = 1 if tied else NS

    if one_token:

        @T.prim_func
        def ssu_one_token(
            state: state_t,
            x: x_t,
            dt: dt_t,
            A: A_t,
            B: B_t,
            C: C_t,
            D: D_t,
            z: z_t,
            dt_bias: dtb_t,
            out: out_t,
            src: src_t,
            dst: dst_t,
            nseq: T.int32,
            seqlen: T.int32,
            src_sb: T.int64,
            src_st: T.int64,
            dst_sb: T.int64,
            dst_st: T.int64,
            pad: T.int64,
            flags: T.int32,
            mode: T.int32,
        ):
            pool = aligned(state, vector_state)
            Bv = aligned(B, vector_io)
            Cv = aligned(C, vector_io)
            with T.Kernel(NB, H, nseq, threads=TH) as (pb, h, b):
                tx = T.get_thread_binding()
                s = T.alloc_local((NS,), f32)
                Av = T.alloc_local((NA,), f32)
                buf = T.alloc_local((VEC,), state_dtype)
                iov = T.alloc_local((VEC,), io_dtype)
                bv = T.alloc_local((NV * VEC,), f32)
                cv = T.alloc_local((NV * VEC,), f32)
                xv = T.alloc_local((R,), f32)
                dtv = T.alloc_local((max(R, 2),), f32)
                acc = T.alloc_local((R,), f32)
                slot = T.alloc_var(i64)
                wslot = T.alloc_var(i64)
                g = h // ratio
                slot = T.cast(b, i64)
                if (flags & FLAG_SRC) != 0:
                    slot = T.cast(src[T.cast(b, i64) * src_sb], i64)
                load_A(Av, A, h, pb, tx)
                if slot != pad:
                    load_state(s, buf, pool, slot, h, pb, tx)
                else:
                    for k in T.unroll(NS):
                        s[k] = 0.0
                token_step(
                    s, Av, acc, xv, dtv, bv, cv, iov, x, dt, A, Bv, Cv, D, z, dt_bias, out, b, h, g, pb, tx, flags
                )
                if mode != MODE_NONE and slot != pad:
                    wslot = slot
                    if (flags & FLAG_DST) != 0:
                        wslot = T.cast(dst[T.cast(b, i64) * dst_sb], i64)
                    if wslot != pad:
                        store_state(s, buf, pool, wslot, h, pb, tx)

        return ssu_one_token

    @T.prim_func
    def ssu_packed(
        state: state_t,
        x: x_t,
        dt: dt_t,
        A: A_t,
        B: B_t,
        C: C_t,
        D: D_t,
        z: z_t,
        dt_bias: dtb_t,
        out: out_t,
        src: src_t,
        dst: dst_t,
        cu: cu_t,
        acc_tok: acc_t,
        ibuf: ibuf_t,
        iidx: iidx_t,
        parent: par_t,
        nseq: T.int32,
        seqlen: T.int32,
        src_sb: T.int64,
        src_st: T.int64,
        dst_sb: T.int64,
        dst_st: T.int64,
        pad: T.int64,
        flags: T.int32,
        mode: T.int32,
        cache_steps: T.int64,
    ):
        pool = aligned(state, vector_state)
        Bv = aligned(B, vector_io)
        Cv = aligned(C, vector_io)
        ibv_buf = aligned(ibuf, vector_state)
        with T.Kernel(NB, H, nseq, threads=TH) as (pb, h, b):
            tx = T.get_thread_binding()
            s = T.alloc_local((NS,), f32)
            Av = T.alloc_local((NA,), f32)
            buf = T.alloc_local((VEC,), state_dtype)
            ibv = T.alloc_local((VEC,), ibuf_dtype)
            iov = T.alloc_local((VEC,), io_dtype)
            bv = T.alloc_local((NV * VEC,), f32)
            cv = T.alloc_local((NV * VEC,), f32)
            xv = T.alloc_local((R,), f32)
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
                bos = T.cast(cu[b], "int32")
                ntok = T.cast(cu[b + 1], "int32") - bos
            else:
                bos = b * seqlen
                ntok = seqlen
            rpos = T.int64(0)
            if (flags & FLAG_ACC) != 0:
                rpos = T.max(T.cast(acc_tok[b], i64) - 1, T.int64(0))
            slot = b64
            if (flags & FLAG_SRC) != 0:
                slot = T.cast(src[b64 * src_sb + rpos * src_st], i64)
            ientry = b64
            if (flags & FLAG_IIDX) != 0:
                ientry = T.cast(iidx[b], i64)
            elif (flags & FLAG_SRC) != 0:
                ientry = slot
            load_A(Av, A, h, pb, tx)
            if slot != pad:
                load_state(s, buf, pool, slot, h, pb, tx)
            else:
                for k in T.unroll(NS):
                    s[k] = 0.0
            for t in T.serial(ntok):
                if (flags & FLAG_PARENT) != 0:
                    if t > 0 and slot != pad:
                        par = T.cast(parent[b, t], i64)
                        if par >= 0:
                            load_state(s, ibv, ibv_buf, ientry * cache_steps + par, h, pb, tx)
                token_step(
                    s, Av, acc, xv, dtv, bv, cv, iov, x, dt, A, Bv, Cv, D, z, dt_bias, out, bos + t, h, g, pb, tx, flags
                )
                if slot != pad:
                    if mode == MODE_PER_TOKEN:
                        wslot = T.cast(dst[b64 * dst_sb + T.cast(t, i64) * dst_st], i64)
                        if wslot != pad:
                            store_state(s, buf, pool, wslot, h, pb, tx)
                    elif mode == MODE_INTERMEDIATE:
                        store_state(s, ibv, ibv_buf, ientry * cache_steps + t, h, pb, tx)
            if mode == MODE_FINAL and slot != pad and ntok > 0:
                wslot = slot
                if (flags & FLAG_DST) != 0:
                    wslot = T.cast(dst[b64 * dst_sb], i64)
                if wslot != pad:
                    store_state(s, buf, pool, wslot, h, pb, tx)

    return ssu_packed


__all__ = [
    "FLAG_ACC",
    "FLAG_CU",
    "FLAG_D",
    "FLAG_DST",
    "FLAG_DT_BIAS",
    "FLAG_IIDX",
    "FLAG_PARENT",
    "FLAG_SOFTPLUS",
    "FLAG_SRC",
    "FLAG_Z",
    "MODE_FINAL",
    "MODE_INTERMEDIATE",
    "MODE_NONE",
    "MODE_PER_TOKEN",
    "SSUTiling",
    "choose_tiling",
    "ssu_kernel",
]
