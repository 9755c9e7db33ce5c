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


def choose_tiling(dim: int, dstate: int, state_dtype: str, per_thread: int = 4) -> SSUTiling:
    """The tiling for (P, N, state dtype): 16-byte state chunks, at most 32 lanes per row, 128 threads,
    ``block_p`` ~16 rows per CTA (so batch 1 at H 128, P 64 already launches 512 CTAs).

    ``per_thread``: 16-byte state chunks per thread when P allows (default 4: 8 KB of state per 128-thread CTA).
    A power of two; 8 is an A/B option for 2-byte states (``MATE_SSU_BF16_CHUNKS``)."""
    if per_thread < 1 or per_thread & (per_thread - 1):
        raise ValueError(f"per_thread: expected a power of two >= 1, got {per_thread!r}")
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
    # ``per_thread`` (default four) 16-byte state chunks per thread (8 KB of state per 128-thread CTA) when P allows
    rows_per_thread = max(1, per_thread // vecs)
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
    pack_early: bool = False,
    min_blocks: int = 0,
    transposed_reduce: bool = True,
    pdl: bool = False,
):
    """Return the ``T.prim_func`` of one SSU kernel configuration (see the module docstring).

    Argument order of the returned function (the launcher passes them positionally):
    ``state, x, dt, A, B, C, D, z, dt_bias, out, src, dst, [cu, acc, ibuf, iidx, parent,]``
    ``nseq, seqlen, src_sb, src_st, dst_sb, dst_st, pad, flags, mode, [cache_steps]``
    (bracketed arguments only for the packed kernel).

    A/B options (defaults: the measured kernels):

    * ``pack_early`` (one-token kernel, 2-byte states): each updated state value is converted back to the stored
      dtype right after its recurrence step (into the registers it was loaded into), so no fp32 copy of the
      whole state stays live across the row reduction, the ``y`` write and the store. Same arithmetic, same
      rounding; fewer registers per thread (96 -> 64 for Nemotron-H bf16, so 8 instead of 5 CTAs per SM).
    * ``transposed_reduce``: the row reduction of ``y = s . C`` transposed (see ``reduce_rows``; R - 1 + log2(L/R)
      shuffles for R rows over L lanes, R lanes write one ``y`` each) where the thread's rows fit its row's lanes;
      False reduces every row on its own and lane 0 writes them all (the runtime's choice for the one-token kernel,
      where the transposed form measured no faster).
    * ``pdl``: programmatic dependent launch (CUDA sm_90+): every CTA first allows the next kernel on the stream
      to launch (``T.pdl_trigger()``), then waits for the previous one to complete (``T.pdl_sync()``) before its
      first global read. TileLang then drops ``__restrict__`` from the pointer parameters.
    * ``min_blocks``: > 0 emits ``__launch_bounds__(threads, min_blocks)`` (ptxas caps the registers so that
      many CTAs fit on an SM; it may spill).
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

    def bit(flags, flag):
        """1 when ``flag`` is set, else 0 (int32): absent inputs are read at index 0 of their dummy and
        masked arithmetically, so every input load is issued without a branch."""
        return T.shift_right(flags, flag.bit_length() - 1) & 1

    def aligned(buf, vector):
        """A view of ``buf`` whose dynamic outer strides are written as multiples of ``vec``: the caller
        guarantees that they are (``vector_*``), which lets TileLang prove 16-byte vector accesses."""
        if not vector:
            return buf
        last = len(buf.strides) - 1
        strides = [st if i == last else T.floordiv(st, VEC) * VEC for i, st in enumerate(buf.strides)]
        return T.view(buf, strides=strides)

    LOG_L = L.bit_length() - 1
    # the transposed row reduction (``reduce_rows``) when asked for and the thread's rows fit its row's lanes (so
    # far always: R <= 4 rows, L >= 4 lanes for N >= 32)
    transposed = bool(transposed_reduce) and R <= L
    TR = R.bit_length() - 1 if transposed else 0

    def pick(arr, sel):
        """``arr[sel]`` for a runtime ``sel`` < R as a chain of selects (registers cannot be indexed at runtime)."""
        v = arr[0]
        for r in range(1, R):
            v = T.if_then_else(sel == r, arr[r], v)
        return v

    NA = 1 if tied else NS
    pack_early = bool(pack_early) and one_token and _BYTES[state_dtype] == 2

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
    def reload_state(s, buf, pool, slot, h, pb, tx):
        """s = pool[slot] (the parent reload of the packed kernel)."""
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
    def reduce_rows(acc, tx):
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
    def write_y(acc, xv, dv, zv, out, row, h, pb, tx, flags):
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
                p = pb * BP + r * RP + rg
                acc[r] = acc[r] + dv[r] * xv[r]  # dv is 0 without D
                if (flags & FLAG_Z) != 0:
                    acc[r] = acc[r] * zv[r] / (1.0 + T.exp(-zv[r]))
                if guard_p:
                    if p < P:
                        out[row, h, p] = T.cast(acc[r], io_dtype)
                else:
                    out[row, h, p] = T.cast(acc[r], io_dtype)

    def dt_value(raw, bias, flags):
        """dt + dt_bias (softplus is applied later by ``apply_softplus``, once every load is in flight)."""
        return T.cast(raw, f32) + bias

    @T.macro
    def apply_softplus(vals, n, flags):
        if (flags & FLAG_SOFTPLUS) != 0:
            for k in T.unroll(n):
                vals[k] = softplus(vals[k])

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
                if min_blocks > 0:
                    T.annotate_min_blocks_per_sm(min_blocks)
                if pdl:
                    T.pdl_trigger()
                    T.pdl_sync()
                tx = T.get_thread_binding()
                s = T.alloc_local((NS,), f32)
                raw = T.alloc_local((NS,), state_dtype)
                Av = T.alloc_local((NA,), f32)
                buf = T.alloc_local((VEC,), state_dtype)
                rb = T.alloc_local((NV * VEC,), io_dtype)
                rc = T.alloc_local((NV * VEC,), io_dtype)
                bv = T.alloc_local((NV * VEC,), f32)
                cv = T.alloc_local((NV * VEC,), f32)
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
                        dtv[r] = dt_value(dt[b, h, p], T.cast(dt_bias[h * hb, p * hb], f32) * T.cast(hb, f32), flags)
                if tied:
                    dtv[0] = dt_value(dt[b, h, 0], T.cast(dt_bias[h * hb, 0], f32) * T.cast(hb, f32), flags)
                for v in T.unroll(NV):
                    n0 = (v * L + lane) * VEC
                    if vector_io:
                        for i in T.vectorized(VEC):
                            rb[v * VEC + i] = Bv[b, g, n0 + i]
                        for i in T.vectorized(VEC):
                            rc[v * VEC + i] = Cv[b, g, n0 + i]
                    else:
                        for i in T.unroll(VEC):
                            rb[v * VEC + i] = Bv[b, g, n0 + i]
                        for i in T.unroll(VEC):
                            rc[v * VEC + i] = Cv[b, g, n0 + i]
                slot = T.if_then_else(hs != 0, src_val, b64)
                if slot != pad:
                    fetch_state(raw, pool, slot, h, pb, tx)
                if pack_early:
                    if slot == pad:
                        for k in T.unroll(NS):
                            raw[k] = T.cast(T.float32(0), state_dtype)
                apply_softplus(dtv, 1 if tied else R, flags)
                if not pack_early:
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
                    if wslot != pad:
                        if pack_early:
                            store_raw(raw, pool, wslot, h, pb, tx)
                        else:
                            store_state(s, buf, pool, wslot, h, pb, tx)

        return ssu_one_token

    # ---- packed: the per-token inputs of up to TMAX tokens are staged in shared memory at once (all their
    # loads in flight together), so a sequence's tokens do not pay one global-memory latency each
    TMAX = 8
    NCH = N // VEC  # vector chunks per B/C row
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
              tx, flags, mode, b64, dst_sb, dst_st):  # fmt: skip
        hz = bit(flags, FLAG_Z)
        hb = bit(flags, FLAG_DT_BIAS)
        hw = T.cast(mode == MODE_PER_TOKEN, i64)
        # phase 1: every global load of the chunk into registers (indices clamped into the chunk)
        tw = T.min(tx, cnt - 1)
        dsl_v = T.cast(dst[(b64 * dst_sb + T.cast(t0 + tw, i64) * dst_st) * hw], i64)
        for k in T.unroll(K_BC):
            e = tx + k * TH
            tt = T.min(e // NCH, cnt - 1)
            n0 = (e % NCH) * VEC
            if vector_io:
                for i in T.vectorized(VEC):
                    sb[k * VEC + i] = Bv[row0 + tt, g, n0 + i]
                for i in T.vectorized(VEC):
                    sc[k * VEC + i] = Cv[row0 + tt, g, n0 + i]
            else:
                for i in T.unroll(VEC):
                    sb[k * VEC + i] = Bv[row0 + tt, g, n0 + i]
                for i in T.unroll(VEC):
                    sc[k * VEC + i] = Cv[row0 + tt, g, n0 + i]
        for k in T.unroll(K_X):
            e = tx + k * TH
            tt = T.min(e // BP, cnt - 1)
            p = prow(pb, 0, e % BP)
            sx[k] = T.cast(x[row0 + tt, h, p], f32)
            sz[k] = T.cast(z[(row0 + tt) * hz, h * hz, p * hz], f32)
            if not tied:
                sd[k] = dt_value(dt[row0 + tt, h, p], T.cast(dt_bias[h * hb, p * hb], f32) * T.cast(hb, f32), flags)
        if tied:
            sd[0] = dt_value(dt[row0 + tw, h, 0], T.cast(dt_bias[h * hb, 0], f32) * T.cast(hb, f32), flags)
        # phase 2: to shared memory
        apply_softplus(sd, 1 if tied else K_X, flags)
        for k in T.unroll(K_BC):
            e = tx + k * TH
            if bc_ok(e, e // NCH, cnt):
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
            n0 = (v * L + lane) * VEC
            for i in T.unroll(VEC):
                bv[v * VEC + i] = T.cast(Bs[tt, n0 + i], f32)
                cv[v * VEC + i] = T.cast(Cs[tt, n0 + i], f32)

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
            if min_blocks > 0:
                T.annotate_min_blocks_per_sm(min_blocks)
            if pdl:
                T.pdl_trigger()
                T.pdl_sync()
            tx = T.get_thread_binding()
            Bs = T.alloc_shared((TMAX, N), io_dtype)
            Cs = T.alloc_shared((TMAX, N), io_dtype)
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
            load_D(dv, D, h, pb, tx, flags)
            if slot != pad:
                fetch_state(raw, pool, slot, h, pb, tx)
            for c in T.serial(T.ceildiv(ntok, TMAX)):
                t0 = c * TMAX
                cnt = T.min(ntok - t0, TMAX)
                stage(Bs, Cs, xs, dts, zs, dsl, sb, sc, sx, sz, sd, Bv, Cv, x, dt, dt_bias, z, dst, bos + t0, t0, cnt,
                      h, g, pb, tx, flags, mode, b64, dst_sb, dst_st)  # fmt: skip
                T.sync_threads()
                if c == 0:
                    convert_state(s, raw, slot != pad)
                for tt in T.serial(cnt):
                    t = t0 + tt
                    if (flags & FLAG_PARENT) != 0:
                        if t > 0 and slot != pad:
                            par = T.cast(parent[b, t], i64)
                            if par >= 0:
                                reload_state(s, ibv, ibv_buf, ientry * cache_steps + par, h, pb, tx)
                    token_from_smem(xv, dtv, zv, bv, cv, Bs, Cs, xs, dts, zs, tt, tx)
                    recur_and_reduce(s, Av, acc, xv, dtv, bv, cv, tx)
                    write_y(acc, xv, dv, zv, out, bos + t, h, pb, tx, flags)
                    if slot != pad:
                        if mode == MODE_PER_TOKEN:
                            wslot = dsl[tt]
                            if wslot != pad:
                                store_state(s, buf, pool, wslot, h, pb, tx)
                        elif mode == MODE_INTERMEDIATE:
                            store_state(s, ibv, ibv_buf, ientry * cache_steps + t, h, pb, tx)
                T.sync_threads()
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
