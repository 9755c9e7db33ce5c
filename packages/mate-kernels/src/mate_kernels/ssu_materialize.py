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

from .abi import MATERIALIZE, MATERIALIZE_ARGS, prim_func
from .formats import QMAX
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

    from .ssu_parts import row_ops
    from .ssu_ring import checkpoint_variant, ring_ops

    variant = checkpoint_variant(state_dtype, philox_rounds)
    P, N, ratio = int(dim), int(dstate), int(heads_per_group)
    tiling = tiling or choose_tiling(P, N, state_dtype)
    ops = row_ops(T, dim=P, dstate=N, tiling=tiling, state_dtype=state_dtype, io_dtype=io_dtype, tied=True,
                  vector_state=vector_state, transposed=False)  # fmt: skip
    VEC, NV, LN, R, TH, BP, RP, NB, NS = ops.VEC, ops.NV, ops.L, ops.R, ops.TH, ops.BP, ops.RP, ops.NB, ops.NS
    prow, aligned, guard_p = ops.prow, ops.aligned, ops.guard_p
    quant = state_dtype in QMAX
    q = ops.quant_ops(state_dtype, philox_rounds) if quant else None
    sr = ops.sr_ops(philox_rounds) if philox_rounds and not quant else None
    f32, i64 = "float32", "int64"
    rops = ring_ops(T, ops, io_dtype=io_dtype, ring_rows=ring_rows, vector_io=vector_io)
    CH, IOB, IOV, XV = rops.CH, rops.IOB, rops.IOV, rops.XV

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
        pool = aligned(state, vector_state)
        ring_b = aligned(B_cache, vector_io, IOB)
        ring_x = aligned(x_cache, vector_io, IOB)
        with T.Kernel(NB, H, batch, threads=TH) as (pb, h, b):
            tx = T.get_thread_binding()
            lane = tx % LN
            rg = tx // LN
            g = h // ratio
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
            sl = T.alloc_var(i64)
            dl = T.alloc_var(i64)
            sl = T.cast(src[b], i64)
            dl = T.cast(dst[b], i64)
            live = T.And(T.And(sl != pad, dl != pad), T.And(T.And(sl >= 0, sl < T.cast(S, i64)),
                                                               T.And(dl >= 0, dl < T.cast(S, i64))))  # fmt: skip
            if live:
                rs = T.alloc_var("int32")
                k = T.alloc_var("int32")
                row = T.alloc_var("int32")
                rs = ((T.cast(ring_start[b], "int32") % L) + L) % L
                k = T.min(T.max(T.cast(prefix[b], "int32"), 0), L)
                a = A[h]
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
                    if philox_rounds == 0:
                        if quant:
                            q.store(s, buf, pool, scale, qs, dl, h, pb, tx)
                        else:
                            ops.store_state(s, buf, pool, dl, h, pb, tx)
                    else:
                        seed = seed_t[0]
                        k0 = T.cast(seed, "uint32")
                        k1 = T.cast(T.shift_right(seed, T.int64(32)), "uint32")
                        if quant:
                            q.store_sr(s, buf, pool, scale, qs, dl, h, pb, tx, k0, k1)
                        else:
                            sr.store_now(s, buf, pool, dl, h, pb, tx, k0, k1)

    # the scaled kernel is the same body with the scales as one more argument, the stochastically rounding one
    # with the seed (a scaled one rounding stochastically with both)
    name = "ssu_materialize" + ("_" + variant.replace("+", "_") if variant else "")
    return prim_func(T, name, MATERIALIZE_ARGS, MATERIALIZE, variant, ty, body)


__all__ = ["materialize_kernel"]
