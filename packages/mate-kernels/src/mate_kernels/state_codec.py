"""TileLang kernel factory for the conversion of whole states between a block-scaled quantised pool and fp32:
:func:`state_codec_kernel`. The SSD prefill's chunk scan carries its states in fp32; a quantised pool (int16, int8,
fp8-e4m3 with fp32 row scales ``[rows, H, P]``, :data:`.formats.QMAX`) meets it through these two kernels:

``decode``
    ``dst[b] = src[b] * src_scale[b]`` (per row): the call's quantised ``initial_states`` into the fp32 rows the
    scan reads.
``encode``
    ``dst[index[b]], dst_scale[index[b]] = quantise(src[b])``: the scan's fp32 final states into the pool slots
    ``final_state_indices`` names, each row with its new scale (max|row| / QMAX, 1 for an all-zero row; the rule
    and the register code are the SSU kernels', :func:`.ssu_parts.row_ops`' ``quant_ops``). A slot outside the
    pool is skipped: nothing is written outside ``dst`` whatever ``index`` holds.

Both move a state once each way (fp32 rows: 4 bytes per value; the quantised ones 1-2), a few microseconds beside
the prefill that produces or consumes it. CTA ``(pb, h, b)`` owns ``block_p`` rows of head ``h`` of row ``b``
under the SSU kernels' tiling of the quantised dtype (:func:`.ssu_common.choose_tiling`): 16-byte chunks of the
quantised row per lane, the row's maximum a warp shuffle.

Runtime: the rows of both tensors, heads, the pool's outer strides. Compile-time: P, N, the quantised dtype, the
direction, the index dtype, whether the pool's outer strides are multiples of a chunk (vector accesses).
"""

# no ``from __future__ import annotations``: TileLang evaluates the prim_func annotations (closure variables)

from .formats import QMAX
from .ssu_common import choose_tiling

DIRECTIONS = ("decode", "encode")


def state_codec_kernel(*, dim: int, dstate: int, qdtype: str, direction: str, index_dtype: str = "int32",
                       vector_state: bool = True, per_thread: int = 4):  # fmt: skip
    """Return the ``T.prim_func`` of one conversion (see the module docstring). Arguments, positionally:

    * ``decode``: ``src [rows, H, P, N]`` qdtype (outer strides any), ``src_scale [rows, H, P]`` fp32,
      ``dst [rows, H, P, N]`` fp32 (dense);
    * ``encode``: ``src [rows, H, P, N]`` fp32 (dense), ``index [rows]`` (``index_dtype``), ``dst [slots, H, P,
      N]`` qdtype (outer strides any), ``dst_scale [slots, H, P]`` fp32.
    """
    if qdtype not in QMAX:
        raise ValueError(f"qdtype: expected one of {tuple(QMAX)}, got {qdtype!r}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: expected one of {DIRECTIONS}, got {direction!r}")
    import tilelang.language as T

    from .ssu_parts import row_ops

    tiling = choose_tiling(dim, dstate, qdtype, per_thread)
    ops = row_ops(
        T, dim=dim, dstate=dstate, tiling=tiling, state_dtype=qdtype, io_dtype="float32", tied=True,
        vector_state=vector_state, transposed=False,
    )  # fmt: skip
    q = ops.quant_ops(qdtype)
    P, N, VEC, NV, L, R, TH, NB, NS, RP, BP = (
        ops.P, ops.N, ops.VEC, ops.NV, ops.L, ops.R, ops.TH, ops.NB, ops.NS, ops.RP, ops.BP
    )  # fmt: skip
    f32, i64 = "float32", "int64"
    rows, H, slots = T.dynamic("rows, H, slots")
    q0, q1, c0, c1 = T.dynamic("q0, q1, c0, c1", i64)
    pool_t = T.StridedTensor((slots, H, P, N), (q0, q1, N, 1), qdtype)
    scale_t = T.StridedTensor((slots, H, P), (c0, c1, 1), f32)
    dense_t = T.Tensor((rows, H, P, N), f32)

    if direction == "decode":

        @T.prim_func
        def state_decode(src: pool_t, src_scale: scale_t, dst: dense_t):
            pool = ops.aligned(src, vector_state)
            with T.Kernel(NB, H, rows, threads=TH) as (pb, h, b):
                tx = T.get_thread_binding()
                raw = T.alloc_local((NS,), qdtype)
                s = T.alloc_local((NS,), f32)
                qs = T.alloc_local((R,), f32)
                lane = tx % L
                rg = tx // L
                ops.fetch_state(raw, pool, b, h, pb, tx)
                q.fetch_scales(qs, src_scale, b, h, pb, tx)
                q.dequantize(s, raw, qs, True)
                for r in T.unroll(R):
                    p = pb * BP + r * RP + rg
                    for v in T.unroll(NV):
                        n0 = (v * L + lane) * VEC
                        if ops.guard_p:
                            if p < P:
                                for i in T.vectorized(VEC):
                                    dst[b, h, p, n0 + i] = s[(r * NV + v) * VEC + i]
                        else:
                            for i in T.vectorized(VEC):
                                dst[b, h, p, n0 + i] = s[(r * NV + v) * VEC + i]

        return state_decode

    @T.prim_func
    def state_encode(src: dense_t, index: T.Tensor((rows,), index_dtype), dst: pool_t, dst_scale: scale_t):
        pool = ops.aligned(dst, vector_state)
        with T.Kernel(NB, H, rows, threads=TH) as (pb, h, b):
            tx = T.get_thread_binding()
            s = T.alloc_local((NS,), f32)
            buf = T.alloc_local((VEC,), qdtype)
            qs = T.alloc_local((R,), f32)
            slot = T.alloc_var(i64)
            lane = tx % L
            rg = tx // L
            slot = T.cast(index[b], i64)
            # a slot outside the pool writes nothing (the whole CTA skips it: the row max is a warp shuffle)
            if slot >= 0 and slot < T.cast(slots, i64):
                for r in T.unroll(R):
                    p = ops.prow(pb, r, rg)
                    for v in T.unroll(NV):
                        n0 = (v * L + lane) * VEC
                        for i in T.vectorized(VEC):
                            s[(r * NV + v) * VEC + i] = src[b, h, p, n0 + i]
                q.store(s, buf, pool, dst_scale, qs, slot, h, pb, tx)

    return state_encode


__all__ = ["DIRECTIONS", "state_codec_kernel"]
