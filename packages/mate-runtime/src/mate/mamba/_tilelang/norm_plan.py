"""The one planner of ``rms_norm_gated`` on the TileLang backend: a normalised :class:`NormCall` -> its kernel spec
(:class:`~mate.mamba._tilelang.specs.NormSpec`) and launch arguments.

The choice: 16-byte accesses (``vec`` features of the wider of x and z) where the group size, the row strides and
every pointer allow them, else one feature per access; then the tiling of one group over a CTA
(:func:`mate_kernels.norm.choose_tiling`, the tuning space beside the kernel). Absent z and bias are passed as x
and weight (the kernel never reads them): no dummy tensors.
"""

from __future__ import annotations

from mate.mamba._contract.dtypes import DTYPE_NAMES
from mate.mamba._contract.norm import NormCall
from mate.mamba._tilelang.specs import NormSpec
from mate_kernels.norm import MAX_VALUES, WIDE_THREADS, choose_tiling, vector_width

ALIGN = 16  # bytes: a vector access's alignment


def spec_for(*, group_size: int, io_dtype: str, z_dtype: str | None, weight_dtype: str, bias_dtype: str | None,
             norm_before_gate: bool, vector: bool) -> NormSpec:  # fmt: skip
    """The spec of one configuration (``z_dtype`` / ``bias_dtype`` None: no gate / no bias); ``vector``: 16-byte
    accesses are allowed. ``NotImplementedError`` for a group too wide for the kernel."""
    vec = vector_width(io_dtype, z_dtype) if vector else 1
    if group_size % vec:
        vec = 1
    tiling = choose_tiling(group_size, vec)
    if tiling is None:
        raise NotImplementedError(
            f"group_size={group_size} in rms_norm_gated is not supported by MATE's TileLang kernel: it serves groups "
            f"of at most {WIDE_THREADS * MAX_VALUES} features (backend='torch' serves any)"
        )
    threads, chunks = tiling
    return NormSpec(
        group_size=group_size, io_dtype=io_dtype, z_dtype=z_dtype or io_dtype, weight_dtype=weight_dtype,
        bias_dtype=bias_dtype or weight_dtype, has_z=z_dtype is not None, has_bias=bias_dtype is not None,
        norm_before_gate=norm_before_gate, vec=vec, threads=threads, chunks=chunks,
    )  # fmt: skip


def vector_ok(call: NormCall) -> bool:
    """Whether the call's tensors allow 16-byte accesses: row strides in whole vectors, every pointer aligned (the
    group size is checked by :func:`spec_for`). Pointers change between calls of equal metadata: the launcher asks
    on every call."""
    vec = vector_width(DTYPE_NAMES[call.x.dtype], None if call.z is None else DTYPE_NAMES[call.z.dtype])
    for t in (call.x, call.z, call.out):
        if t is not None and (t.stride(0) % vec or t.data_ptr() % ALIGN):
            return False
    return all(t is None or t.data_ptr() % ALIGN == 0 for t in (call.weight, call.bias))


def call_spec(call: NormCall, vector: bool) -> NormSpec:
    name = DTYPE_NAMES.__getitem__
    return spec_for(
        group_size=call.group_size, io_dtype=name(call.x.dtype), z_dtype=None if call.z is None else name(call.z.dtype),
        weight_dtype=name(call.weight.dtype), bias_dtype=None if call.bias is None else name(call.bias.dtype),
        norm_before_gate=call.norm_before_gate, vector=vector,
    )  # fmt: skip


def launch_args(call: NormCall) -> tuple:
    """The kernel's arguments, in the prim_func's order."""
    z = call.x if call.z is None else call.z
    bias = call.weight if call.bias is None else call.bias
    return call.x, z, call.weight, bias, call.out, call.eps


def plan(call: NormCall):
    """``(spec, args)`` of a call, or None for a call with no rows (nothing to launch)."""
    if call.rows == 0:
        return None
    return call_spec(call, vector_ok(call)), launch_args(call)


__all__ = ["call_spec", "launch_args", "plan", "spec_for", "vector_ok"]
