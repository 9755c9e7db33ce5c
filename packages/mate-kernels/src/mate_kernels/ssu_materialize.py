"""The ReplaySSM materialisation kernel (FlashInfer 0.7.2's ``replayssm_materialize`` for one layer; the
reference is ``mate.mamba._reference.replay.materialize_replayed_state``).

Request ``b`` writes into slot ``dst[b]`` the true state of slot ``src[b]`` after ``prefix[b]`` tokens of that
slot's ring from row ``ring_start[b]``: ``s = exp(A dt'_j) s + dt'_j x_j B_j^T`` per token, oldest first (the
ring caches ``dt' = softplus(dt + dt_bias)``). CTA ``(pb, h, b)`` owns ``block_p`` rows of head ``h`` of request
``b`` in the SSU tiling (:mod:`.ssu_parts`: a row's ``N`` values over ``lanes`` lanes, in registers); it stages the
source slot's ring by physical row in shared memory (B of the head's group, x of its rows, dt'), as the decode
kernel does, folds the tokens into the registers and stores the rows rounded to nearest, or requantised with new
row scales (with a seed, rounded stochastically as the decode kernel rounds a flush). A prefix of 0 copies the
stored numbers (and scales) exactly.

Index guards: a request whose source or destination is the sentinel or outside the pool writes nothing;
``ring_start`` is taken modulo ``L`` and the prefix clamped into ``[0, L]``, so whatever the tables hold no access
leaves the tensors (the planner launches rings of at most ``ring_rows`` rows). This is not a hot path (a
prefix-cache event, not a decode step), so the fold is the plain recurrence.
"""

from types import SimpleNamespace

from .abi import MATERIALIZE, MATERIALIZE_ARGS, MATERIALIZE_LAYERS, MATERIALIZE_LAYERS_ARGS, prim_func
from .ssu_common import SSUTiling, choose_tiling


def materialize_kernel(
    *,
    dim: int,
    dstate: int,
    heads_per_group: int,
    state_dtype: str,
    io_dtype: str,
    index_dtype: str = "int32",
    ring_rows: int = 32,
    tiling: SSUTiling | None = None,
    vector_state: bool = True,
    vector_io: bool = True,
    philox_rounds: int = 0,
):
    """Return the ``T.prim_func`` of one materialisation configuration (see the module docstring).

    Arguments (:data:`.abi.MATERIALIZE_ARGS`, in launch order): ``state [S, H, P, N]``, ``x_cache [S, H, L, P]``,
    ``B_cache [S, G, L, N]``, ``dt_cache [S, H, L]`` fp32, ``A [H]`` fp32, ``ring_start``, ``prefix``, ``src``,
    ``dst`` ``[batch]`` (``index_dtype``), then ``batch``, ``pad`` (int64), then ``state_scale [S, H, P]`` fp32 for
    a block-scaled state, then ``rand_seed [1]`` int64 with ``philox_rounds`` > 0 (the rows written rounded
    stochastically, as the decode kernel rounds a flush: an fp16, int8 or fp8-e4m3 state).

    ``ring_rows``: the staged ring rows (a power of two >= ``L``); ``tiling`` (default
    :func:`.ssu_common.choose_tiling`) and ``vector_state`` mean what they mean for :func:`.ssu.ssu_kernel`,
    ``vector_io`` what it means for :func:`.ssu_replay.replay_kernel`.
    """
    import tilelang.language as T

    from .ssu_ring import checkpoint_variant

    variant = checkpoint_variant(state_dtype, philox_rounds)
    P, N = int(dim), int(dstate)
    tiling = tiling or choose_tiling(P, N, state_dtype)
    k = _fold_ops(T, dim=P, dstate=N, heads_per_group=heads_per_group, state_dtype=state_dtype, io_dtype=io_dtype,
                  ring_rows=ring_rows, tiling=tiling, vector_state=vector_state, vector_io=vector_io,
                  philox_rounds=philox_rounds)  # fmt: skip
    NB, TH, ratio, f32, i64 = k.NB, k.TH, k.ratio, "float32", "int64"

    S, H, G, L, NREQ = T.dynamic("S, H, G, L, NREQ")
    s_s0, s_s1, q_s0, q_s1 = T.dynamic("s_s0, s_s1, q_s0, q_s1", i64)
    xc0, xc1, xc2, bc0, bc1, bc2, dc0, dc1, dc2 = T.dynamic("xc0, xc1, xc2, bc0, bc1, bc2, dc0, dc1, dc2", i64)
    sa0 = T.dynamic("sa0")
    ty = SimpleNamespace(
        state=T.StridedTensor((S, H, P, N), (s_s0, s_s1, N, 1), state_dtype),
        x_cache=T.StridedTensor((S, H, L, P), (xc0, xc1, xc2, 1), io_dtype),
        B_cache=T.StridedTensor((S, G, L, N), (bc0, bc1, bc2, 1), io_dtype),
        dt_cache=T.StridedTensor((S, H, L), (dc0, dc1, dc2), f32),
        A=T.StridedTensor((H,), (sa0,), f32),
        ring_start=T.Tensor((NREQ,), index_dtype),
        prefix=T.Tensor((NREQ,), index_dtype),
        src=T.Tensor((NREQ,), index_dtype),
        dst=T.Tensor((NREQ,), index_dtype),
        state_scale=T.StridedTensor((S, H, P), (q_s0, q_s1, 1), f32),
        rand_seed=T.Tensor((1,), i64),
    )

    @T.macro
    def body(state, x_cache, B_cache, dt_cache, A, ring_start, prefix, src, dst, batch, pad, scale, seed_t):
        pool = k.aligned(state, vector_state)
        ring_b = k.aligned(B_cache, vector_io, k.IOB)
        ring_x = k.aligned(x_cache, vector_io, k.IOB)
        with T.Kernel(NB, H, batch, threads=TH) as (pb, h, b):
            tx = T.get_thread_binding()
            sl = T.alloc_var(i64)
            dl = T.alloc_var(i64)
            sl = T.cast(src[b], i64)
            dl = T.cast(dst[b], i64)
            live = T.And(T.And(sl != pad, dl != pad), T.And(T.And(sl >= 0, sl < T.cast(S, i64)),
                                                               T.And(dl >= 0, dl < T.cast(S, i64))))  # fmt: skip
            if live:
                seed = None if seed_t is None else seed_t[0]
                k.fold(pool, ring_b, ring_x, dt_cache, A[h], scale, seed, sl, dl, ring_start[b], prefix[b], h,
                       h // ratio, pb, tx, L)  # fmt: skip

    # the scaled kernel is the same body with the scales as one more argument, the stochastically rounding one
    # with the seed (a scaled one rounding stochastically with both)
    name = "ssu_materialize" + ("_" + variant.replace("+", "_") if variant else "")
    return prim_func(T, name, MATERIALIZE_ARGS, MATERIALIZE, variant, ty, body)


def materialize_layers_kernel(
    *,
    dim: int,
    dstate: int,
    heads_per_group: int,
    state_dtype: str,
    io_dtype: str,
    a_dtype: str = "float32",
    ring_rows: int = 32,
    tiling: SSUTiling | None = None,
    philox_rounds: int = 0,
):
    """Return the ``T.prim_func`` of the multi-layer materialisation (FlashInfer 0.7.2's ``replayssm_materialize``):
    the fold of :func:`materialize_kernel` over layers whose pools are named by base addresses read on the device.

    Arguments (:data:`.abi.MATERIALIZE_LAYERS_ARGS`): per layer ``l``, int64 tables ``[layers]`` of base addresses
    and slot strides (in elements): the state ``[slot, H, P, N]`` (``state_dtype``), the rings ``x [slot, H, L, P]``,
    ``B [slot, G, L, N]`` (``io_dtype``), ``dt [slot, H, L]`` fp32, ``A [H]`` (``a_dtype``, no stride) and the
    scales ``[slot, H, P]`` fp32 (block-scaled states; a zero address writes nothing); everything inside a slot
    is contiguous. Then ``src``, ``dst`` ``[layers, batch]``, ``ring_start``, ``prefix``, ``active`` ``[batch]``
    int32, and ``heads``, ``ring_len`` (``L``), ``pad``, then ``rand_seed [1]`` int64 with ``philox_rounds`` > 0
    (an fp16, int8 or fp8-e4m3 state rounded stochastically, each layer with its own Philox key derived from the
    seed as FlashInfer derives it: ``_GOLDEN`` below).

    CTA ``(pb, layer * heads + h, v)`` serves virtual request ``v``: physical request ``active[v]`` (none when it
    is negative or past the batch) of that layer. The addresses are not known to be 16-byte aligned, so every
    global access is scalar; a request whose slot is the sentinel or negative writes nothing; ``ring_start`` is
    taken modulo ``L`` and the prefix clamped into ``[0, L]`` as in :func:`materialize_kernel`; the pools' slot
    counts are not known here, so a slot past a pool is the caller's mistake (as in FlashInfer).
    """
    import tilelang.language as T

    from .ssu_ring import checkpoint_variant

    checkpoint_variant(state_dtype, philox_rounds)  # (the ValueError of a format without stochastic rounding)
    P, N = int(dim), int(dstate)
    tiling = tiling or choose_tiling(P, N, state_dtype)
    k = _fold_ops(T, dim=P, dstate=N, heads_per_group=heads_per_group, state_dtype=state_dtype, io_dtype=io_dtype,
                  ring_rows=ring_rows, tiling=tiling, vector_state=False, vector_io=False,
                  philox_rounds=philox_rounds)  # fmt: skip
    NB, TH, ratio, f32, i64 = k.NB, k.TH, k.ratio, "float32", "int64"
    # a pool's slot count is not known on the device: its buffers' outer extent is the largest int32 slot
    SLOTS = 2**31 - 1

    NL, NREQ = T.dynamic("NL, NREQ")
    # one tensor type per argument (a shared one would make them one buffer)
    tables = ("state_ptrs", "state_strides", "x_ptrs", "x_strides", "B_ptrs", "B_strides", "dt_ptrs", "dt_strides",
              "A_ptrs", "scale_ptrs", "scale_strides")  # fmt: skip
    ty = SimpleNamespace(
        **{name: T.Tensor((NL,), i64) for name in tables},
        **{name: T.Tensor((NL, NREQ), "int32") for name in ("src", "dst")},
        **{name: T.Tensor((NREQ,), "int32") for name in ("ring_start", "prefix", "active")},
        rand_seed=T.Tensor((1,), i64),
    )

    @T.macro
    def layer_key(key, seed, layer):
        """key[0] = the Philox key of layer ``layer`` for the call's ``rand_seed`` ``seed`` (``_GOLDEN`` below)."""
        key[0] = T.bitwise_xor(T.cast(seed, "uint64"), T.uint64(_GOLDEN) * (T.cast(layer, "uint64") + T.uint64(1)))
        key[0] = T.bitwise_xor(key[0], T.shift_right(key[0], T.uint64(30))) * T.uint64(_MIX1)
        key[0] = T.bitwise_xor(key[0], T.shift_right(key[0], T.uint64(27))) * T.uint64(_MIX2)
        key[0] = T.bitwise_xor(key[0], T.shift_right(key[0], T.uint64(31)))

    @T.macro
    def body(state_ptrs, state_strides, x_ptrs, x_strides, B_ptrs, B_strides, dt_ptrs, dt_strides, A_ptrs,
             scale_ptrs, scale_strides, src, dst, ring_start, prefix, active, heads, ring_len, pad,
             seed_t):  # fmt: skip
        with T.Kernel(NB, NL * heads, NREQ, threads=TH) as (pb, lh, v):
            tx = T.get_thread_binding()
            layer = lh // heads
            h = lh % heads
            G = heads // ratio
            L = ring_len
            r = T.alloc_var("int32")
            r = active[v]
            if T.And(r >= 0, r < NREQ):
                sl = T.alloc_var(i64)
                dl = T.alloc_var(i64)
                sl = T.cast(src[layer, r], i64)
                dl = T.cast(dst[layer, r], i64)
                live = T.And(T.And(sl != pad, dl != pad), T.And(sl >= 0, dl >= 0))
                if k.quant:
                    live = T.And(live, scale_ptrs[layer] != 0)
                if live:
                    pool = T.make_tensor(state_ptrs[layer], (SLOTS, heads, P, N), state_dtype,
                                         strides=(state_strides[layer], P * N, N, 1))  # fmt: skip
                    ring_x = T.make_tensor(x_ptrs[layer], (SLOTS, heads, L, P), io_dtype,
                                           strides=(x_strides[layer], L * P, P, 1))  # fmt: skip
                    ring_b = T.make_tensor(B_ptrs[layer], (SLOTS, G, L, N), io_dtype,
                                           strides=(B_strides[layer], L * N, N, 1))  # fmt: skip
                    dt_cache = T.make_tensor(dt_ptrs[layer], (SLOTS, heads, L), f32,
                                             strides=(dt_strides[layer], L, 1))  # fmt: skip
                    A = T.make_tensor(A_ptrs[layer], (heads,), a_dtype)
                    scale = None
                    if k.quant:
                        scale = T.make_tensor(scale_ptrs[layer], (SLOTS, heads, P), f32,
                                              strides=(scale_strides[layer], P, 1))  # fmt: skip
                    seed = None
                    if philox_rounds:
                        key = T.alloc_local((1,), "uint64")
                        layer_key(key, seed_t[0], layer)
                        seed = T.cast(key[0], i64)
                    k.fold(pool, ring_b, ring_x, dt_cache, T.cast(A[h], f32), scale, seed, sl, dl, ring_start[r],
                           prefix[r], h, h // ratio, pb, tx, L)  # fmt: skip

    # (the scale tables are arguments of every build; the stochastically rounding one takes the seed too)
    variant = "sr" if philox_rounds else None
    name = "ssu_materialize_layers" + ("_scaled" if k.quant else "") + ("_sr" if philox_rounds else "")
    return prim_func(T, name, MATERIALIZE_LAYERS_ARGS, MATERIALIZE_LAYERS, variant, ty, body)


# FlashInfer 0.7.2's layer_philox_seed: layer l of a multi-layer call rounds with the SplitMix64 finaliser (Stafford's
# mix13) of ``rand_seed ^ (_GOLDEN * (l + 1))`` (uint64; ``mate.mamba._reference.rounding.layer_seed`` on the host)
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _fold_ops(T, *, dim, dstate, heads_per_group, state_dtype, io_dtype, ring_rows, tiling, vector_state, vector_io,
              philox_rounds):  # fmt: skip
    """What both kernels share: the tiling's sizes, ``aligned`` and the macro ``fold``, one CTA's work once its
    request is live (with ``philox_rounds`` > 0 storing the rows rounded stochastically)."""
    from .ssu_parts import row_ops
    from .ssu_ring import checkpoint_ops, ring_ops

    P, N, ratio = int(dim), int(dstate), int(heads_per_group)
    ops = row_ops(T, dim=P, dstate=N, tiling=tiling, state_dtype=state_dtype, io_dtype=io_dtype, tied=True,
                  vector_state=vector_state, transposed=False)  # fmt: skip
    VEC, NV, LN, R, TH, BP, RP, NS = ops.VEC, ops.NV, ops.L, ops.R, ops.TH, ops.BP, ops.RP, ops.NS
    guard_p = ops.guard_p
    ck = checkpoint_ops(T, ops, state_dtype=state_dtype, philox_rounds=philox_rounds)
    quant, q = ck.quant, ck.q
    f32 = "float32"
    rops = ring_ops(T, ops, io_dtype=io_dtype, ring_rows=ring_rows, vector_io=vector_io)
    CH, IOV, XV = rops.CH, rops.IOV, rops.XV

    @T.macro
    def fold(pool, ring_b, ring_x, dt_cache, a, scale, seed, sl, dl, ring_start, prefix, h, g, pb, tx, L):
        """``pool[dl]`` rows of this CTA = ``pool[sl]``'s advanced through ``prefix`` tokens of the slot's ring from
        row ``ring_start`` (``a``: the head's A as fp32; ``scale``: the row scales of a block-scaled state;
        ``seed``: the Philox key (int64) of a stochastically rounding build)."""
        lane = tx % LN
        rg = tx // LN
        Bs = T.alloc_shared((CH, N), io_dtype)
        Xs = T.alloc_shared((CH, BP), io_dtype)
        dts = T.alloc_shared((CH,), f32)
        s = T.alloc_local((NS,), f32)
        raw = T.alloc_local((NS,), state_dtype)
        buf = T.alloc_local((VEC,), state_dtype)
        stg = T.alloc_local((max(IOV, XV),), io_dtype)
        dq = T.alloc_local((1,), f32)
        rb = T.alloc_local((NV * VEC,), io_dtype)
        bv = T.alloc_local((NV * VEC,), f32)
        if quant:
            qs = T.alloc_local((R,), f32)
        rs = T.alloc_var("int32")
        k = T.alloc_var("int32")
        row = T.alloc_var("int32")
        rs = ((T.cast(ring_start, "int32") % L) + L) % L
        k = T.min(T.max(T.cast(prefix, "int32"), 0), L)
        ops.fetch_state(raw, pool, sl, h, pb, tx)
        if quant:
            q.fetch_scales(qs, scale, sl, h, pb, tx)
        rops.stage_ring(Bs, Xs, dts, stg, dq, ring_b, ring_x, dt_cache, sl, g, h, pb, tx, L)
        T.sync_threads()
        if k == 0:
            # nothing to replay: the stored numbers (and scales) copied exactly
            ops.store_raw(raw, pool, dl, h, pb, tx)
            if quant:
                for r in T.unroll(R):
                    p = pb * BP + r * RP + rg
                    if lane == 0:
                        if guard_p:
                            if p < P:
                                scale[dl, h, p] = qs[r]
                        else:
                            scale[dl, h, p] = qs[r]
        else:
            if quant:
                q.dequantize(s, raw, qs, True)
            else:
                ops.convert_state(s, raw, True)
            row = rs
            for _j in T.serial(k):
                rops.lane_row(bv, rb, Bs, row, lane)
                dtj = dts[row]
                dA = T.exp(a * dtj)
                for r in T.unroll(R):
                    xr = dtj * T.cast(Xs[row, r * RP + rg], f32)
                    for kk in T.unroll(NV * VEC):
                        s[r * NV * VEC + kk] = s[r * NV * VEC + kk] * dA + xr * bv[kk]
                row = T.if_then_else(row + 1 == L, 0, row + 1)
            ck.store(s, buf, pool, scale, qs if quant else None, dl, h, pb, tx, seed)

    return SimpleNamespace(NB=ops.NB, TH=TH, IOB=rops.IOB, ratio=ratio, quant=quant, aligned=ops.aligned, fold=fold)


__all__ = ["materialize_kernel", "materialize_layers_kernel"]
