"""TileLang kernel factory for the gated RMSNorm of a Mamba2 mixer (``rms_norm_gated``): :func:`norm_kernel`.

Per row and group of ``group_size`` features, in fp32: ``g = z * sigmoid(z)``; ``h = x * g`` (norm after the gate)
or ``h = x``; ``y = h * rsqrt(sum(h^2) / group_size + eps) * weight (+ bias)``, ``y *= g`` (norm before the gate);
``y`` is stored in x's dtype, the only rounding.

CTA ``(row, group)`` owns one group of one row: ``threads`` threads, each holding ``chunks`` pieces of ``vec``
consecutive features (piece ``k`` of thread ``t`` at column ``(k * threads + t) * vec`` of the group, so a warp's
accesses are contiguous). With ``vec`` > 1 every access to x, z and out is 16 bytes of the wider of x and z (the
planner sets it only where the row strides, the group size and the pointers allow it). Every load is issued
before any arithmetic; the sum of squares is reduced by warp shuffles, then across warps through shared memory.
The kernel is memory-bound: it reads x (and z) once and writes out once, weight and bias being re-read from L2.

Runtime: the rows M, the features N (groups = N / group_size) and the row strides of x, z and out; ``eps``.
Compile-time: everything else (the spec).
"""

# no ``from __future__ import annotations``: TileLang evaluates the prim_func annotations (closure variables)

from .formats import BYTES

# The tuning space, as data (:func:`choose_tiling` walks it): a group is split into pieces of ``vec`` features,
# spread over at most MAX_THREADS threads holding at most MAX_VALUES features each; a group too wide for that takes
# up to WIDE_THREADS threads. Past WIDE_THREADS * MAX_VALUES features a group is not served.
MAX_THREADS = 256  # 8 CTAs per SM at full occupancy
WIDE_THREADS = 1024
MAX_VALUES = 64  # per thread: h and the gate held as 2 * MAX_VALUES fp32 registers
WARP = 32


def choose_tiling(group_size: int, vec: int) -> tuple[int, int] | None:
    """``(threads, chunks)`` for a group of ``group_size`` features in pieces of ``vec``: the fewest chunks per
    thread with at most MAX_THREADS threads (WIDE_THREADS for wide groups), threads a multiple of a warp; None
    when the group is too wide."""
    pieces = -(-group_size // vec)
    for cap in (MAX_THREADS, WIDE_THREADS):
        chunks = -(-pieces // cap)
        if chunks * vec <= MAX_VALUES:
            threads = -(-pieces // chunks)
            return -(-threads // WARP) * WARP, chunks
    return None


def norm_kernel(*, group_size: int, io_dtype: str, z_dtype: str, weight_dtype: str, bias_dtype: str, has_z: bool,
                has_bias: bool, norm_before_gate: bool, vec: int, threads: int, chunks: int):  # fmt: skip
    """Return the ``T.prim_func`` of one configuration. Arguments, positionally: ``x [M, N]`` (io_dtype, row
    stride free, last dim dense), ``z [M, N]`` (z_dtype, likewise; never read without ``has_z``), ``weight [N]``,
    ``bias [N]`` (never read without ``has_bias``), ``out [M, N]`` (io_dtype, row stride free), ``eps`` fp32;
    launched over the grid ``(M, N / group_size)``."""
    for name, dt in (("io_dtype", io_dtype), ("z_dtype", z_dtype), ("weight_dtype", weight_dtype),
                     ("bias_dtype", bias_dtype)):  # fmt: skip
        if dt not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"{name}: expected float32, bfloat16 or float16, got {dt!r}")
    if group_size % vec or threads % WARP or threads * chunks * vec < group_size:
        raise ValueError(f"tiling: vec={vec}, threads={threads}, chunks={chunks} do not cover group_size={group_size}")
    import tilelang.language as T

    f32, i64 = "float32", "int64"
    GS, VEC, TH, K = group_size, vec, threads, chunks
    WARPS = TH // WARP
    guard = TH * K * VEC != GS  # some pieces fall past the group's end
    M, N = T.dynamic("M, N")
    sx, sz, so = T.dynamic("sx, sz, so", i64)
    x_t = T.StridedTensor((M, N), (sx, 1), io_dtype)
    z_t = T.StridedTensor((M, N), (sz, 1), z_dtype)
    o_t = T.StridedTensor((M, N), (so, 1), io_dtype)

    def aligned(buf):
        """``buf`` with its row stride written as a multiple of ``vec`` (the planner guarantees it), so TileLang
        can prove the 16-byte accesses."""
        if VEC == 1:
            return buf
        return T.view(buf, strides=[T.floordiv(buf.strides[0], VEC) * VEC, 1])

    @T.prim_func
    def rms_norm_gated(x: x_t, z: z_t, weight: T.Tensor((N,), weight_dtype), bias: T.Tensor((N,), bias_dtype),
                       out: o_t, eps: T.float32):  # fmt: skip
        xa, za, oa = aligned(x), aligned(z), aligned(out)
        with T.Kernel(M, T.floordiv(N, GS), threads=TH) as (row, g):
            tx = T.get_thread_binding()
            h = T.alloc_local((K * VEC,), f32)
            gate = T.alloc_local((K * VEC,), f32)
            raw_x = T.alloc_local((K * VEC,), io_dtype)
            raw_z = T.alloc_local((K * VEC,), z_dtype)
            raw_w = T.alloc_local((K * VEC,), weight_dtype)
            raw_b = T.alloc_local((K * VEC,), bias_dtype)
            raw_o = T.alloc_local((VEC,), io_dtype)
            acc = T.alloc_var(f32)
            rstd = T.alloc_var(f32)
            zf = T.alloc_var(f32)
            y = T.alloc_var(f32)
            r = T.cast(row, i64)
            base = g * GS + tx * VEC
            # every load first (x, z, then weight and bias, so their round trip overlaps the reduction's instead of
            # following it), out-of-group pieces as zeros
            for k in T.unroll(K):
                c = base + k * TH * VEC
                if not guard or c < (g + 1) * GS:
                    for i in T.vectorized(VEC):
                        raw_x[k * VEC + i] = xa[r, c + i]
                    if has_z:
                        for i in T.vectorized(VEC):
                            raw_z[k * VEC + i] = za[r, c + i]
                    for i in T.vectorized(VEC):
                        raw_w[k * VEC + i] = weight[c + i]
                    if has_bias:
                        for i in T.vectorized(VEC):
                            raw_b[k * VEC + i] = bias[c + i]
                else:
                    for i in T.unroll(VEC):
                        raw_x[k * VEC + i] = T.cast(0, io_dtype)
                        raw_z[k * VEC + i] = T.cast(0, z_dtype)
            acc = T.float32(0)
            for j in T.unroll(K * VEC):
                h[j] = T.cast(raw_x[j], f32)
                if has_z:
                    zf = T.cast(raw_z[j], f32)
                    gate[j] = zf / (T.float32(1) + T.exp(-zf))
                    if not norm_before_gate:
                        h[j] = h[j] * gate[j]
                acc = acc + h[j] * h[j]
            for j in T.unroll(5):
                acc = acc + T.shfl_xor(acc, 16 >> j)
            if WARPS > 1:
                part = T.alloc_shared((WARPS,), f32)
                if tx % WARP == 0:
                    part[tx // WARP] = acc
                T.sync_threads()
                acc = T.float32(0)
                for w in T.unroll(WARPS):
                    acc = acc + part[w]
            rstd = T.rsqrt(acc / T.float32(GS) + eps)
            for k in T.unroll(K):
                c = base + k * TH * VEC
                if not guard or c < (g + 1) * GS:
                    for i in T.unroll(VEC):
                        y = h[k * VEC + i] * rstd * T.cast(raw_w[k * VEC + i], f32)
                        if has_bias:
                            y = y + T.cast(raw_b[k * VEC + i], f32)
                        if has_z and norm_before_gate:
                            y = y * gate[k * VEC + i]
                        raw_o[i] = T.cast(y, io_dtype)
                    for i in T.vectorized(VEC):
                        oa[r, c + i] = raw_o[i]

    return rms_norm_gated


def vector_width(io_dtype: str, z_dtype: str | None) -> int:
    """Features per 16-byte access of the wider of x and z."""
    return 16 // max(BYTES[io_dtype], BYTES[z_dtype or io_dtype])


__all__ = ["MAX_THREADS", "MAX_VALUES", "WIDE_THREADS", "choose_tiling", "norm_kernel", "vector_width"]
