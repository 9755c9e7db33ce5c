"""What the ReplaySSM kernels share, the decode step (:mod:`.ssu_replay`) and the materialisation
(:mod:`.ssu_materialize`): the checkpoint's format (its ABI variant and its store) and the ring staging, a slot's
ring of cached tokens copied into shared memory by physical row and a lane's values of a staged row, in
:mod:`.ssu_parts`' tiling (a row's ``N`` values over ``lanes`` lanes)."""

from types import SimpleNamespace

from .formats import BYTES, FORMATS, QMAX


def checkpoint_variant(state_dtype: str, philox_rounds: int) -> str | None:
    """The ABI variant (:mod:`.abi`) of a ReplaySSM kernel writing ``state_dtype`` states: the scales of a
    block-scaled one, the seed with ``philox_rounds`` > 0 (a format with stochastic rounding: fp16, int8,
    fp8-e4m3), both for a block-scaled one rounded stochastically."""
    fmt = FORMATS[state_dtype]
    if not isinstance(philox_rounds, int) or philox_rounds < 0 or (philox_rounds and "stochastic" not in fmt.rounding):
        rounded = tuple(name for name, f in FORMATS.items() if "stochastic" in f.rounding)
        raise ValueError(f"philox_rounds: 0, or > 0 (stochastic rounding) with a state of {rounded}, got "
                         f"{philox_rounds!r} with {state_dtype!r}")  # fmt: skip
    groups = ("scaled",) * fmt.block_scaled + ("sr",) * bool(philox_rounds)
    return "+".join(groups) or None


def checkpoint_ops(T, ops, *, state_dtype: str, philox_rounds: int):
    """A ReplaySSM build's checkpoint format (``ops``: its :func:`.ssu_parts.row_ops`): ``quant`` (block-scaled),
    ``q`` (its ``quant_ops``, or None) and the macro ``store(s, buf, pool, scale, qs, slot, h, pb, tx, seed)``
    writing the fp32 rows ``s`` as the checkpoint, rounded to nearest or requantised with new scales (``scale``,
    ``qs``; None for an unscaled state), or with ``philox_rounds`` > 0 rounded stochastically with the Philox key
    of ``seed`` (int64; None without)."""
    quant = state_dtype in QMAX
    q = ops.quant_ops(state_dtype, philox_rounds) if quant else None
    sr = ops.sr_ops(philox_rounds) if philox_rounds and not quant else None

    @T.macro
    def store(s, buf, pool, scale, qs, slot, h, pb, tx, seed):
        if philox_rounds == 0:
            if quant:
                q.store(s, buf, pool, scale, qs, slot, h, pb, tx)
            else:
                ops.store_state(s, buf, pool, slot, h, pb, tx)
        else:
            k0 = T.cast(seed, "uint32")
            k1 = T.cast(T.shift_right(seed, T.int64(32)), "uint32")
            if quant:
                q.store_sr(s, buf, pool, scale, qs, slot, h, pb, tx, k0, k1)
            else:
                sr.store_now(s, buf, pool, slot, h, pb, tx, k0, k1)

    return SimpleNamespace(quant=quant, q=q, store=store)


def table_layout(ring_rows: int, new_rows: int) -> SimpleNamespace:
    """A head's record in the table design's workspace (fp32 ``[sequences, H, rec]``, written by
    :mod:`.ssu_replay_table`, read by :func:`.ssu_replay.replay_rows_kernel`), offsets in fp32 values: ``coef``
    (``coef[t, j]`` at ``t * ring_rows + j``: token ``j``'s weight in new token ``t``'s y), ``fold`` (a flush's
    weights of the live tokens, ``ring_rows``), ``decay`` (the state's decay at each new token, ``new_rows``) and
    ``fdecay`` (a flush's decay of the checkpoint); ``rec``, the record's length, a multiple of 4 (16-byte loads)."""
    fold = new_rows * ring_rows
    decay = fold + ring_rows
    fdecay = decay + new_rows
    return SimpleNamespace(coef=0, fold=fold, decay=decay, fdecay=fdecay, rec=-(-(fdecay + 1) // 4) * 4)


def b_ring_ops(T, *, io_dtype: str, dstate: int, ring_rows: int, new_rows: int, threads: int, vector_io: bool):
    """What every kernel that touches the B ring shares, whatever its state tiling (the fused and rows kernels
    through :func:`ring_ops`, the table kernel directly): the row pieces of a B / C row (``IOV`` io values, the
    widest power of two <= 16 bytes dividing ``dstate``; ``NCB`` of them), the ring row wrap, the staging of a
    slot's whole B ring and the append of the new tokens' B rows. ``threads``: the CTA's."""
    CH, TN, TH, N = int(ring_rows), int(new_rows), int(threads), int(dstate)
    IOV = max(1, 16 // BYTES[io_dtype])
    while N % IOV:
        IOV //= 2
    NCB = N // IOV

    def wrap(v, L):
        """``v % L`` for ``0 <= v < 2 L`` (a ring row ``rs + j`` with ``rs < L`` and ``j < L``): a runtime modulo is
        an integer division, some 20 instructions per use in the token loops."""
        return T.if_then_else(v >= L, v - L, v)

    @T.macro
    def stage_ring_b(Bs, stg, ring_b, slot, g, tx, L):
        """The slot's whole B ring of group ``g`` by physical row (a staged row past the ring's ``L`` rows is not
        loaded); ``stg``: io registers of a piece."""
        for it in T.unroll(-(-CH * NCB // TH)):
            idx = it * TH + tx
            ri = idx // NCB
            n0 = (idx % NCB) * IOV
            if ri < L:
                if vector_io:
                    for i in T.vectorized(IOV):
                        stg[i] = ring_b[slot, g, ri, n0 + i]
                else:
                    for i in T.unroll(IOV):
                        stg[i] = ring_b[slot, g, ri, n0 + i]
                for i in T.vectorized(IOV):
                    Bs[ri, n0 + i] = stg[i]

    @T.macro
    def append_b(Bn, stg, ring_b, slot, g, rs, pk, tb, tx, L):
        """The ``tb`` new tokens' B rows (staged in ``Bn``) into the ring after its ``pk`` live rows from row ``rs``."""
        for it in T.unroll(-(-TN * NCB // TH)):
            idx = it * TH + tx
            ti = idx // NCB
            n0 = (idx % NCB) * IOV
            if ti < tb:
                for i in T.unroll(IOV):
                    stg[i] = Bn[ti, n0 + i]
                if vector_io:
                    for i in T.vectorized(IOV):
                        ring_b[slot, g, wrap(rs + pk + ti, L), n0 + i] = stg[i]
                else:
                    for i in T.unroll(IOV):
                        ring_b[slot, g, wrap(rs + pk + ti, L), n0 + i] = stg[i]

    return SimpleNamespace(IOV=IOV, NCB=NCB, wrap=wrap, stage_ring_b=stage_ring_b, append_b=append_b)


def ring_ops(T, ops, *, io_dtype: str, ring_rows: int, new_rows: int = 1, vector_io: bool = True):
    """The staging sizes and macros of one build (``ops``: its :func:`.ssu_parts.row_ops`). ``ring_rows`` /
    ``new_rows``: the staged ring rows and new tokens (powers of two); ``vector_io``: the rings' rows in 16-byte
    pieces (their outer strides and bases on the 16-byte grid)."""
    VEC, NV, LN, TH, BP, P, N = ops.VEC, ops.NV, ops.L, ops.TH, ops.BP, ops.P, ops.N
    guard_p = ops.guard_p
    f32 = "float32"
    CH, TN = int(ring_rows), int(new_rows)
    if CH < 1 or CH & (CH - 1):
        raise ValueError(f"ring_rows: a power of two (the staged ring rows, >= the ring length L), got {ring_rows!r}")
    if TN < 1 or TN & (TN - 1) or TN > CH:
        raise ValueError(f"new_rows: a power of two <= ring_rows (the staged new tokens, >= T), got {new_rows!r}")
    IOB = max(1, 16 // BYTES[io_dtype])  # io values per 16 bytes

    def piece(n: int) -> int:
        """The widest power of two <= 16 bytes of io values dividing ``n``."""
        v = IOB
        while n % v:
            v //= 2
        return v

    bops = b_ring_ops(T, io_dtype=io_dtype, dstate=N, ring_rows=CH, new_rows=TN, threads=TH, vector_io=vector_io)
    IOV, XV = bops.IOV, piece(BP)  # B/C and x row pieces (of io values) of the staging loads
    LV = piece(VEC)  # a lane's chunk of a staged row, in 16-byte pieces
    NCB, NCX = bops.NCB, BP // XV
    wrap, stage_ring_b = bops.wrap, bops.stage_ring_b

    @T.macro
    def lane_row(dst, rb, src, q, lane):
        """dst = this lane's values of row ``q`` of a staged ``[rows, N]`` tile, as fp32 (``rb``: io registers)."""
        for v in T.unroll(NV):
            n0 = (v * LN + lane) * VEC
            for c in T.unroll(VEC // LV):
                for i in T.vectorized(LV):
                    rb[v * VEC + c * LV + i] = src[q, n0 + c * LV + i]
        for k in T.unroll(NV * VEC):
            dst[k] = T.cast(rb[k], f32)

    @T.macro
    def put(dst, q, j0, stg, width):
        """dst[q, j0 : j0 + width] = the io registers ``stg`` (one shared store of ``width`` values)."""
        for i in T.vectorized(width):
            dst[q, j0 + i] = stg[i]

    @T.macro
    def stage_ring_x(Xs, stg, ring_x, slot, h, pb, tx, L):
        """x of this block's rows of head ``h`` for the whole ring by physical row (rows past P clamped onto row
        P - 1)."""
        for it in T.unroll(-(-CH * NCX // TH)):
            idx = it * TH + tx
            ri = idx // NCX
            j0 = (idx % NCX) * XV
            if ri < L:
                if guard_p or not vector_io:
                    for i in T.unroll(XV):
                        stg[i] = ring_x[slot, h, ri, T.min(pb * BP + j0 + i, P - 1)]
                else:
                    for i in T.vectorized(XV):
                        stg[i] = ring_x[slot, h, ri, pb * BP + j0 + i]
                put(Xs, ri, j0, stg, XV)

    @T.macro
    def stage_ring(Bs, Xs, dts, stg, dq, ring_b, ring_x, dt_cache, slot, g, h, pb, tx, L):
        """The slot's whole ring by physical row: B of group ``g``, x of this block's rows of head ``h`` (rows past
        P clamped onto row P - 1) and dt'; a staged row past the ring's ``L`` rows is not loaded. ``stg``: io
        registers of a piece, ``dq``: one fp32 register."""
        stage_ring_b(Bs, stg, ring_b, slot, g, tx, L)
        stage_ring_x(Xs, stg, ring_x, slot, h, pb, tx, L)
        for it in T.unroll(-(-CH // TH)):
            ri = it * TH + tx
            if ri < L:
                dq[0] = dt_cache[slot, h, ri]
                dts[ri] = dq[0]

    return SimpleNamespace(
        CH=CH, TN=TN, IOB=IOB, IOV=IOV, XV=XV, LV=LV, NCB=NCB, NCX=NCX, D_ITERS=-(-CH // TH),
        NB_ITERS=-(-TN * NCB // TH), NX_ITERS=-(-TN * NCX // TH), ND_ITERS=-(-TN // TH),
        lane_row=lane_row, put=put, wrap=wrap, stage_ring=stage_ring, stage_ring_b=stage_ring_b,
        stage_ring_x=stage_ring_x, append_b=bops.append_b,
    )  # fmt: skip


__all__ = ["b_ring_ops", "checkpoint_ops", "checkpoint_variant", "ring_ops", "table_layout"]
