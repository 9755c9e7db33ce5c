"""TileLang kernel factory for the Mamba2 selective state update (SSU): :func:`ssu_kernel` builds both kernels of
the decode entry point, the one-token kernel (:mod:`.ssu_one_token`) and the packed kernel (:mod:`.ssu_packed`),
from the same parts (:mod:`.ssu_parts`); :mod:`.ssu_common` holds the flag bits, write modes and the tiling the
launcher shares with them.

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

Block-scaled quantised states (int16, int8, fp8-e4m3: :data:`.formats.QMAX`) are the state dtype (and the
intermediate buffer's) of a kernel: it then takes their fp32 row scales as trailing arguments (see
:mod:`.ssu_parts`), dequantises each row it reads and requantises each row it writes, in registers.

This module imports nothing from the runtime; TileLang is imported lazily inside the factory.
"""

# no ``from __future__ import annotations``: TileLang evaluates the prim_func annotations (closure variables)

from .formats import FORMATS
from .ssu_common import (
    FLAG_ACC,
    FLAG_CU,
    FLAG_D,
    FLAG_DST,
    FLAG_DT_BIAS,
    FLAG_IIDX,
    FLAG_PARENT,
    FLAG_SOFTPLUS,
    FLAG_SRC,
    FLAG_Z,
    MODE_FINAL,
    MODE_INTERMEDIATE,
    MODE_NONE,
    MODE_PER_TOKEN,
    SSUTiling,
    choose_tiling,
)


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
    pdl: bool = False,
    philox_rounds: int = 0,
    staged: bool = False,
):
    """Return the ``T.prim_func`` of one SSU kernel configuration (see the module docstring).

    Argument order of the returned function (the launcher passes them positionally):
    ``state, x, dt, A, B, C, D, z, dt_bias, out, src, dst, [cu, acc, ibuf, iidx, parent,]``
    ``nseq, seqlen, src_sb, src_st, dst_sb, dst_st, pad, flags, mode, [cache_steps]``
    (bracketed arguments only for the packed kernel, ``one_token=False``), then, with a quantised state or
    intermediate buffer, ``state_scale`` (one-token) or ``state_scale, ibuf_scale`` (packed; a dummy for the
    float one), or with ``philox_rounds`` > 0, ``rand_seed`` (one int64).

    Tuning (the launcher's tuning table picks these per state dtype and kernel):

    * ``tiling``: default :func:`choose_tiling` ``(dim, dstate, state_dtype)``.
    * ``pack_early`` (one-token kernel, 2-byte float states; ignored elsewhere): see :mod:`.ssu_one_token`.
    * ``min_blocks``: > 0 emits ``__launch_bounds__(threads, min_blocks)`` (ptxas caps the registers so that
      many CTAs fit on an SM; it may spill).
    * ``philox_rounds`` (fp16 states): > 0 rounds every fp16 value written (pool, and an fp16 intermediate
      buffer) stochastically with Philox-4x32 of that many rounds, seeded by the trailing ``rand_seed``
      (:func:`.ssu_parts.row_ops`' ``sr_ops``); the one-token kernel then narrows nothing early.
    * ``staged`` (one-token kernel, block-scaled states with 16-byte accesses): the state is copied into shared
      memory asynchronously and updated one row at a time (``ssu_parts.row_ops``' ``stage_state`` and
      ``quant_ops``' ``staged_rows``), so the bytes in flight do not depend on the registers a thread holds.
    * ``pdl``: programmatic dependent launch (CUDA sm_90+): every CTA first allows the next kernel on the stream
      to launch (``T.pdl_trigger()``), then waits for the previous one to complete (``T.pdl_sync()``) before its
      first global read. TileLang then drops ``__restrict__`` from the pointer parameters.
    """
    import tilelang.language as T

    from .ssu_one_token import one_token_kernel
    from .ssu_packed import packed_kernel
    from .ssu_parts import row_ops, tensor_types

    if philox_rounds < 0 or (philox_rounds and state_dtype != "float16"):
        raise ValueError(f"philox_rounds: stochastic rounding (> 0) serves a float16 state, got {philox_rounds!r} "
                         f"with {state_dtype!r}")  # fmt: skip
    tiling = tiling or choose_tiling(dim, dstate, state_dtype)
    ibuf_dtype = ibuf_dtype or state_dtype
    ty = tensor_types(
        T, dim=dim, dstate=dstate, state_dtype=state_dtype, io_dtype=io_dtype, dt_dtype=dt_dtype, d_dtype=d_dtype,
        dt_bias_dtype=dt_bias_dtype, src_dtype=src_dtype, dst_dtype=dst_dtype, meta_dtype=meta_dtype,
        ibuf_dtype=ibuf_dtype,
    )  # fmt: skip
    # the row reduction: transposed in the packed kernel, plain in the one-token kernel (see their modules)
    ops = row_ops(
        T, dim=dim, dstate=dstate, tiling=tiling, state_dtype=state_dtype, io_dtype=io_dtype, tied=tied,
        vector_state=vector_state, transposed=not one_token,
    )  # fmt: skip
    common = dict(
        heads_per_group=int(heads_per_group), state_dtype=state_dtype, io_dtype=io_dtype, tied=tied,
        vector_state=vector_state, vector_io=vector_io, min_blocks=min_blocks, pdl=pdl, philox_rounds=philox_rounds,
    )  # fmt: skip
    if one_token:
        # a float of 2 bytes, rounded to nearest (stochastic rounding needs the fp32 value where it is stored)
        fmt = FORMATS[state_dtype]
        early = bool(pack_early) and fmt.bytes == 2 and not fmt.block_scaled and not philox_rounds
        return one_token_kernel(T, ops, ty, pack_early=early, staged=staged, **common)
    return packed_kernel(T, ops, ty, ibuf_dtype=ibuf_dtype, **common)


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
