"""TileLang kernel factory for a Mamba2 layer's fused decode step (``mamba2_decode_step``): :func:`decode_step_kernel`.

One launch, no grid-wide barrier. CTA ``(pb, h, b)`` holds ``block_p`` state rows of head ``h`` for sequence ``b``
as the one-token SSU kernel does (:mod:`.ssu_parts`' row helpers and tiling):

1. the conv: it filters its own x channels (``h * P + p``: reads their conv-pool rows, writes their new rows) and
   the SSM group's B and C channels (reads only), each value as the conv1d update rounds it (products in the
   promoted dtype of pool and weight, summed in fp32 from the bias, SiLU, stored through the pool's dtype);
2. the SSU: its state rows updated with the tied per-head ``dt`` (``+ dt_bias``, softplus), ``A`` and ``D``;
   ``y = s . C + D x`` rounded to the io dtype (the SSU's ``out``), kept as fp32 in the workspace row ``y_ws[b]``,
   and the CTA's partial sum of ``(y * silu(z))^2`` in its own slot of ``partials`` (fixed order: the result does
   not depend on which CTA finishes first);
3. the hand-over (CUDA's threadFenceReduction pattern): every thread fences its writes, then thread 0 increments the
   sequence's counter of the CTA's norm group and that of its SSM group. The CTA that brings a norm group's counter
   to the group's CTA count normalises the group (partials and y read with relaxed atomic loads, past L1), writes
   ``out`` and sets the counter back to 0; the last CTA of an SSM group writes the B and C channels' new conv rows
   (every CTA of the group has read them by then) and sets its counter back to 0. So the counters are zero between
   calls: they are zeroed once, at allocation, and a CUDA graph replays the kernel as it is.

A sequence whose slot is the sentinel ``pad`` (or outside either pool) reads no state and writes none: its conv is
skipped (x, B and C are xBC's raw values, as the conv update leaves a skipped row) and its SSM state is zero, as the
three ops compose; its output row is still computed.

Runtime: the batch, heads, the pools' slots and strides, every row stride, ``pad`` and ``eps``. Compile-time: the
spec (P, N, heads per SSM group and per norm group, the conv width, dtypes, tiling).
"""

# no ``from __future__ import annotations``: TileLang evaluates the prim_func annotations (closure variables)

from .ssu_common import FLAG_SOFTPLUS, SSUTiling
from .ssu_parts import row_ops


def decode_step_kernel(*, dim: int, dstate: int, heads_per_group: int, heads_per_norm: int, width: int, io_dtype: str,
                       state_dtype: str, dt_dtype: str, weight_dtype: str, bias_dtype: str, has_bias: bool,
                       d_dtype: str, has_D: bool, dt_bias_dtype: str, has_dt_bias: bool, norm_weight_dtype: str,
                       index_dtype: str, tiling: SSUTiling, vector_state: bool):  # fmt: skip
    """Return the ``T.prim_func``. Arguments, positionally: ``xBC [B, CD]`` (row stride free), ``z [B, HP]``,
    ``dt [B, H]``, ``conv_state [S, CD, K]`` (any strides; io dtype), ``conv_weight [CD, W]``, ``conv_bias [CD]``
    (never read without ``has_bias``), ``ssm_state [S2, H, P, N]`` (inner dims dense), ``A [H]`` fp32, ``D [H]``,
    ``dt_bias [H]`` (never read without their flags), ``norm_weight [HP]``, ``slots [B]``, ``out [B, HP]``,
    ``y_ws [B, HP]`` fp32, ``partials [B * norm groups * CTAs per norm group]`` fp32, ``counters [B * (norm groups
    + SSM groups)]`` int32 (zero on entry, zero on exit), ``pad`` int64, ``eps`` fp32; launched over ``(P /
    block_p, H, B)`` with ``tiling.threads`` threads."""
    for name, dt in (("io_dtype", io_dtype), ("weight_dtype", weight_dtype), ("bias_dtype", bias_dtype),
                     ("d_dtype", d_dtype),
                     ("dt_bias_dtype", dt_bias_dtype), ("norm_weight_dtype", norm_weight_dtype),
                     ("dt_dtype", dt_dtype), ("state_dtype", state_dtype)):  # fmt: skip
        if dt not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"{name}: expected float32, bfloat16 or float16, got {dt!r}")
    if not 2 <= width <= 4:
        raise ValueError(f"width: expected 2 to 4, got {width}")
    if dim % tiling.block_p:
        raise ValueError(f"tiling: block_p {tiling.block_p} does not divide dim {dim}")
    import tilelang.language as T

    f32, i32, i64 = "float32", "int32", "int64"
    P, N, W, HPG, HPN = int(dim), int(dstate), int(width), int(heads_per_group), int(heads_per_norm)
    ops = row_ops(T, dim=P, dstate=N, tiling=tiling, state_dtype=state_dtype, io_dtype=io_dtype, tied=True,
                  vector_state=vector_state, transposed=False)  # fmt: skip
    VEC, NV, L, R, TH, BP, RP, NB, NS = ops.VEC, ops.NV, ops.L, ops.R, ops.TH, ops.BP, ops.RP, ops.NB, ops.NS
    GS = HPN * P  # features per norm group
    CH = BP + 2 * N  # conv channels per CTA: its x rows, the group's B and C
    KC = (CH + TH - 1) // TH  # of them, per thread
    # 2-byte states: the SSU one-token kernel's occupancy, 1024 threads per SM (Nemotron-H: 64 registers, no
    # spill; 80 without it, 6 CTAs per SM); an fp32 state would spill under it
    MIN_BLOCKS = 1024 // TH if state_dtype in ("bfloat16", "float16") else 0
    if TH % 32:
        raise ValueError(f"tiling: {TH} threads are not whole warps")
    NF = (GS + TH - 1) // TH  # features per thread in the norm group's last CTA
    FB = min(NF, 8)  # of them, those whose loads are issued together
    CPG = HPN * NB  # CTAs per norm group
    CPS = HPG * NB  # CTAs per SSM group
    # the conv's products are rounded to the promoted dtype of pool and weight (fp32 when they differ)
    prod = io_dtype if weight_dtype == io_dtype else f32

    Bt, H, HP, CD, S1, S2, K, LP, LC = T.dynamic("Bt, H, HP, CD, S1, S2, K, LP, LC")  # HP = H * P
    sxr, szr, sd0, sd1, sw0, sw1, sbias, sa, sdd, sdb, snw, ssl, sor = T.dynamic(
        "sxr, szr, sd0, sd1, sw0, sw1, sbias, sa, sdd, sdb, snw, ssl, sor"
    )
    sc0, sc1, sc2, ss0 = T.dynamic("sc0, sc1, sc2, ss0", i64)

    def conv_value(k, tokv, oldv, wv, biasv):
        """The conv update's value (before SiLU) of the thread's channel ``k`` from its loaded pool row, token,
        weights and bias: products in ``prod``, summed in fp32 from the bias."""
        v = T.cast(biasv[k], f32) if has_bias else T.float32(0)
        for j in range(W - 1):
            v = v + T.cast(T.cast(T.cast(oldv[k * (W - 1) + j], f32) * T.cast(wv[k * W + j], f32), prod), f32)
        return v + T.cast(T.cast(T.cast(tokv[k], f32) * T.cast(wv[k * W + W - 1], f32), prod), f32)

    @T.macro
    def load_features(yl, zl, wl, y_ws, z, norm_weight, b, ng, k, tx):
        """Pass ``k`` of the norm group's features, FB per thread: y, z and the norm weight as fp32 (past the
        group's end, a partial last pass, its last feature is read, nothing written)."""
        for i in T.unroll(FB):
            col = ng * GS + T.min((k * FB + i) * TH + tx, GS - 1)
            yl[i] = T.atomic_load(y_ws[b, col], memory_order="relaxed")
            zl[i] = T.cast(z[b, col], f32)
            wl[i] = T.cast(norm_weight[col], f32)

    @T.prim_func
    def mamba2_decode_step(
        xBC: T.StridedTensor((Bt, CD), (sxr, 1), io_dtype),
        z: T.StridedTensor((Bt, HP), (szr, 1), io_dtype),
        dt: T.StridedTensor((Bt, H), (sd0, sd1), dt_dtype),
        conv_state: T.StridedTensor((S1, CD, K), (sc0, sc1, sc2), io_dtype),
        conv_weight: T.StridedTensor((CD, W), (sw0, sw1), weight_dtype),
        conv_bias: T.StridedTensor((CD,), (sbias,), bias_dtype),
        ssm_state: T.StridedTensor((S2, H, P, N), (ss0, P * N, N, 1), state_dtype),
        A: T.StridedTensor((H,), (sa,), f32),
        D: T.StridedTensor((H,), (sdd,), d_dtype),
        dt_bias: T.StridedTensor((H,), (sdb,), dt_bias_dtype),
        norm_weight: T.StridedTensor((HP,), (snw,), norm_weight_dtype),
        slots: T.StridedTensor((Bt,), (ssl,), index_dtype),
        out: T.StridedTensor((Bt, HP), (sor, 1), io_dtype),
        y_ws: T.Tensor((Bt, HP), f32),
        partials: T.Tensor((LP,), f32),
        counters: T.Tensor((LC,), i32),
        pad: T.int64,
        eps: T.float32,
    ):
        pool = ops.aligned(ssm_state, vector_state)
        with T.Kernel(NB, H, Bt, threads=TH) as (pb, h, b):
            if MIN_BLOCKS:
                T.annotate_min_blocks_per_sm(MIN_BLOCKS)
            tx = T.get_thread_binding()
            raw = T.alloc_local((NS,), state_dtype)
            bv = T.alloc_local((NV * VEC,), f32)
            cv = T.alloc_local((NV * VEC,), f32)
            xv = T.alloc_local((R,), f32)
            zv = T.alloc_local((R,), f32)
            Av = T.alloc_local((2,), f32)  # A, D
            dtv = T.alloc_local((2,), f32)
            acc = T.alloc_local((R,), f32)
            cacc = T.alloc_local((1,), f32)
            old = T.alloc_local((W - 1,), io_dtype)
            ci = T.alloc_local((KC,), i32)  # the thread's conv channels, their token, pool row, weights, bias
            tokv = T.alloc_local((KC,), io_dtype)
            oldv = T.alloc_local((KC * (W - 1),), io_dtype)
            wv = T.alloc_local((KC * W,), weight_dtype)
            biasv = T.alloc_local((KC,), bias_dtype)
            yl = T.alloc_local((FB,), f32)
            zl = T.alloc_local((FB,), f32)
            wl = T.alloc_local((FB,), f32)
            chan = T.alloc_shared((CH,), f32)  # the CTA's conv outputs: its x rows, then the group's B, then C
            red = T.alloc_shared((RP,), f32)
            wsum = T.alloc_shared((TH // 32,), f32)
            flag = T.alloc_shared((2,), i32)
            part = T.alloc_var(f32)
            total = T.alloc_var(f32)
            y = T.alloc_var(f32)
            yq = T.alloc_var(f32)
            zf = T.alloc_var(f32)
            hv = T.alloc_var(f32)
            slot = T.alloc_var(i64)
            lane = tx % L
            rg = tx // L
            G = H // HPG
            g = h // HPG
            ng = h // HPN
            NG = H // HPN
            hp = H * P
            slot = T.cast(slots[b], i64)
            live = T.And(slot != pad, T.And(slot >= 0, T.And(slot < T.cast(S1, i64), slot < T.cast(S2, i64))))
            # the state's loads first: in flight during the conv (a sentinel's state is zero)
            if live:
                ops.fetch_state(raw, pool, slot, h, pb, tx)
            else:
                for k in T.unroll(NS):
                    raw[k] = T.cast(T.float32(0), state_dtype)
            Av[0] = A[h]
            if has_D:
                Av[1] = T.cast(D[h], f32)
            dtv[0] = T.cast(dt[b, h], f32)
            if has_dt_bias:
                dtv[0] = dtv[0] + T.cast(dt_bias[h], f32)
            for r in T.unroll(R):
                zv[r] = T.cast(z[b, h * P + pb * BP + r * RP + rg], f32)
            # the conv, each of the CTA's channels by one thread: an x channel's conv-pool row is read by this
            # thread alone (written at once); B and C rows by every CTA of the group (the last one writes them).
            # Every pass's loads are issued before any value is computed (a thread past the last channel reads
            # the last one and stores nothing)
            for k in T.unroll(KC):
                j = T.min(k * TH + tx, CH - 1)
                bc = T.if_then_else(j < BP + N, hp + g * N + j - BP, hp + G * N + g * N + j - BP - N)
                ci[k] = T.if_then_else(j < BP, h * P + pb * BP + j, bc)
                tokv[k] = xBC[b, ci[k]]
                for i in T.unroll(W):
                    wv[k * W + i] = conv_weight[ci[k], i]
                if has_bias:
                    biasv[k] = conv_bias[ci[k]]
            if live:
                for k in T.unroll(KC):
                    for i in T.unroll(W - 1):
                        oldv[k * (W - 1) + i] = conv_state[slot, ci[k], i]
            for k in T.unroll(KC):
                j = k * TH + tx
                if live:
                    cacc[0] = conv_value(k, tokv, oldv, wv, biasv)
                    cacc[0] = cacc[0] / (T.float32(1) + T.exp(-cacc[0]))
                    cacc[0] = T.cast(T.cast(cacc[0], io_dtype), f32)
                    if k * TH < BP and j < BP:
                        if W > 2:
                            for i in T.unroll(W - 2):
                                conv_state[slot, ci[k], i] = oldv[k * (W - 1) + i + 1]
                        conv_state[slot, ci[k], W - 2] = tokv[k]
                else:
                    cacc[0] = T.cast(tokv[k], f32)
                if (k + 1) * TH <= CH:
                    chan[j] = cacc[0]
                elif j < CH:
                    chan[j] = cacc[0]
            T.sync_threads()
            for r in T.unroll(R):
                xv[r] = chan[r * RP + rg]
            for v in T.unroll(NV):
                n0 = (v * L + lane) * VEC
                for i in T.vectorized(VEC):
                    bv[v * VEC + i] = chan[BP + n0 + i]
                for i in T.vectorized(VEC):
                    cv[v * VEC + i] = chan[BP + N + n0 + i]
            # the SSU step (tied dt, A, D per head), each value narrowed back at once (as the SSU's pack_early)
            ops.apply_softplus(dtv, 1, FLAG_SOFTPLUS)
            ops.recur_and_reduce(raw, Av, acc, xv, dtv, bv, cv, tx, True)
            if live:
                ops.store_raw(raw, pool, slot, h, pb, tx)
            # y (rounded as the SSU's out), its row of the workspace, the CTA's partial sum of squares
            part = T.float32(0)
            if lane == 0:
                for r in T.unroll(R):
                    col = h * P + pb * BP + r * RP + rg
                    y = acc[r]
                    if has_D:
                        y = y + Av[1] * xv[r]
                    yq = T.cast(T.cast(y, io_dtype), f32)
                    y_ws[b, col] = yq
                    hv = yq * (zv[r] / (T.float32(1) + T.exp(-zv[r])))
                    part = part + hv * hv
                red[rg] = part
            T.sync_threads()
            if tx == 0:
                total = T.float32(0)
                for k in T.unroll(RP):
                    total = total + red[k]
                partials[(b * NG + ng) * CPG + (h % HPN) * NB + pb] = total
            # hand-over: every thread's writes are visible device-wide before the counters move
            T.call_extern("handle", "__threadfence")
            T.sync_threads()
            if tx == 0:
                prev = T.atomic_add(counters[b * NG + ng], 1, return_prev=True)
                flag[0] = T.if_then_else(prev == CPG - 1, 1, 0)
                prev2 = T.atomic_add(counters[Bt * NG + b * G + g], 1, return_prev=True)
                flag[1] = T.if_then_else(prev2 == CPS - 1, 1, 0)
            T.sync_threads()
            if flag[0] != 0:
                # the norm group's last CTA: its first FB features' loads issued with the partials' (one round
                # trip, not two); the group's sum in a fixed order (each thread's strided partials, then a
                # butterfly per warp, then the warps in order); then the features FB at a time per thread
                T.call_extern("handle", "__threadfence")
                load_features(yl, zl, wl, y_ws, z, norm_weight, b, ng, 0, tx)
                total = T.float32(0)
                for k in T.serial((CPG + TH - 1) // TH):
                    if k * TH + tx < CPG:
                        total = total + T.atomic_load(partials[(b * NG + ng) * CPG + k * TH + tx],
                                                      memory_order="relaxed")  # fmt: skip
                for j in T.unroll(5):
                    total = total + T.shfl_xor(total, 16 >> j)
                if tx % 32 == 0:
                    wsum[tx // 32] = total
                T.sync_threads()
                total = T.float32(0)
                for k in T.unroll(TH // 32):
                    total = total + wsum[k]
                rstd = T.rsqrt(total / T.float32(GS) + eps)
                for k in T.serial((NF + FB - 1) // FB):
                    if k > 0:
                        load_features(yl, zl, wl, y_ws, z, norm_weight, b, ng, k, tx)
                    for i in T.unroll(FB):
                        f = (k * FB + i) * TH + tx
                        if f < GS:
                            hv = yl[i] * (zl[i] / (T.float32(1) + T.exp(-zl[i])))
                            out[b, ng * GS + f] = T.cast(hv * rstd * wl[i], io_dtype)
                if tx == 0:
                    counters[b * NG + ng] = 0
            if flag[1] != 0:
                # the SSM group's last CTA: every CTA of the group has read the B and C conv rows
                if live:
                    for k in T.serial((2 * N + TH - 1) // TH):
                        n = k * TH + tx
                        if n < 2 * N:
                            c = T.if_then_else(n < N, hp + g * N + n, hp + G * N + g * N + n - N)
                            for i in T.unroll(W - 1):
                                old[i] = T.if_then_else(i < W - 2, conv_state[slot, c, T.min(i + 1, W - 2)],
                                                        xBC[b, c])  # fmt: skip
                            for i in T.unroll(W - 1):
                                conv_state[slot, c, i] = old[i]
                if tx == 0:
                    counters[Bt * NG + b * G + g] = 0

    return mamba2_decode_step


__all__ = ["decode_step_kernel"]
