"""The SSU planner: one normalised :class:`SSUCall` -> one :class:`SSUSpec` and its launch arguments.

The call shape alone picks the kernel: one token per sequence without ``cu_seqlens`` / ``num_accepted_tokens`` /
intermediate buffer runs the one-token kernel, everything else the packed kernel. Optional inputs travel as a
bitmask plus small cached dummy tensors, so one compiled kernel per (P, N, heads per group, dtypes, tied/untied,
alignment) serves every combination of D / z / dt_bias / softplus / tables / write modes.

The tuning is data (:data:`TUNING`): per state width and kernel, how many 16-byte state chunks a thread holds,
whether updated values are narrowed back into their load registers at once, and the register cap
(``__launch_bounds__(threads, min_blocks)``). Why each entry is what it is: docs/ssu-kernels.md and
docs/design/decisions.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from mate.mamba._contract.dtypes import DTYPE_NAMES, STATE_FORMATS
from mate.mamba._contract.ssu import SSUCall
from mate.mamba._platform.device import Hardware, hardware, pdl_for_capability
from mate.mamba._tilelang.specs import SSUSpec
from mate_kernels.abi import ONE_TOKEN, PACKED, SSU_ARGS, args_of, launch_args
from mate_kernels.formats import FORMATS
from mate_kernels.ssu import (
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
    choose_tiling,
)

MAX_SEQUENCES = 65535  # the grid's z dimension
_MODES = {"none": 0, "final": 1, "per_token": 2, "intermediate": 3}


@dataclass(frozen=True)
class Tuning:
    per_thread: int  # 16-byte state chunks per thread (where P allows)
    pack_early: bool  # narrow each updated 2-byte value back into its load registers at once
    min_blocks: int  # __launch_bounds__ CTAs per SM: ptxas caps registers to fit them (0: no cap)
    staged: bool = False  # one-token int8 / fp8: the state staged in shared memory by cp.async, one row at a time


# (state width, kernel) -> tuning. Measured on the H200, same-run A/B (docs/design/decisions.md):
# - 2-byte one-token: 64 registers under an 8-CTA cap with early narrowing (96 and 5 CTAs/SM without): +8-11 %
#   TB/s at batch 8-64. A grid that fits in one wave anyway (at most SMALL_GRID_CTAS_PER_SM CTAs per SM) gains
#   nothing from the cap and runs 3-6 % faster uncapped with late narrowing ("one_token_small").
# - 2-byte packed: 2 chunks under an 8-CTA cap (64 registers, no spills; 4 chunks spill under the cap): twice the
#   warps per SM for the same bytes in flight, MTP 6 batch 64 3.22 -> 3.42 TB/s.
# - fp32 packed: a 6-CTA cap gives 80 registers without spilling (126 and 4 CTAs/SM without): MTP 6 batch 8
#   73.0 -> 67.4 us. fp32 one-token: no cap (every tried cap and tiling was slower).
# - block-scaled states (int16, int8, fp8-e4m3): a row is requantised from fp32 after its update (its new scale is
#   the row's max), so nothing is narrowed early and the rows stay in fp32 registers; the best of per_thread
#   {1, 2, 4, 8} x min_blocks {0, 6, 8, 12, 16} at batch 8-256 (2026-12-02, H200): int16 4 chunks under a 6-CTA cap
#   (one-token batch 64 105.5 -> 86.8 us against no cap), int8 / fp8 2 chunks under an 8-CTA cap (72.5 -> 67.7 us
#   against 4 chunks uncapped; 4 chunks under the cap spill, 224 us); packed MTP 6 likewise under an 8-CTA cap.
# - int8 / fp8 one-token, large grids: the staged design (the state copied into shared memory by cp.async, updated
#   one row at a time), 4 chunks (8 KB of state per CTA) under a 6-CTA cap (80 registers). Same-run sweep on an
#   H100 (2026-12-07, docs/design/decisions.md), int8 / fp8 at batch 64, 256, 1024: register design 68.2 / 260.0 /
#   1028.0 and 74.2 / 282.6 / 1117.3 us, staged under caps of 6, 7, 8 CTAs 67.1 / 249.6 / 977.8 and 66.9 / 251.3
#   / 986.4, 68.0 / 249.8 / 973.3 and 66.9 / 245.9 / 961.7, 73.2 / 271.2 / 1063.6 and 72.5 / 268.2 / 1051.3.
#   At batch 1 / 8 (128 / 1024 CTAs) the register design stays faster (4.1 / 11.4 against 4.8 / 13.0 us): a
#   grid of at most SMALL_GRID_CTAS_PER_SM CTAs per SM runs it ("one_token_small").
# - fp16 with stochastic rounding: the Philox draw keeps 16 more registers live (137 uncapped); of per_thread
#   {2, 4} x min_blocks {0, 5, 6, 8} (2026-12-03, H200), 4 chunks under a 5-CTA cap (96 registers, no spill):
#   one-token batch 64 127.9 -> 117.4 us against no cap, 134.2 us for 2 chunks under an 8-CTA cap; packed MTP 6
#   batch 64 2 chunks under an 8-CTA cap, 625.7 us (1 chunk: 841.0).
TUNING = {
    ("2-byte", "one_token"): Tuning(per_thread=4, pack_early=True, min_blocks=8),
    ("2-byte", "one_token_small"): Tuning(per_thread=4, pack_early=False, min_blocks=0),
    ("2-byte", "packed"): Tuning(per_thread=2, pack_early=True, min_blocks=8),
    ("fp32", "one_token"): Tuning(per_thread=4, pack_early=False, min_blocks=0),
    ("fp32", "packed"): Tuning(per_thread=4, pack_early=False, min_blocks=6),
    ("int16", "one_token"): Tuning(per_thread=4, pack_early=False, min_blocks=6),
    ("int16", "packed"): Tuning(per_thread=4, pack_early=False, min_blocks=8),
    ("int8", "one_token"): Tuning(per_thread=4, pack_early=False, min_blocks=6, staged=True),
    ("int8", "one_token_small"): Tuning(per_thread=2, pack_early=False, min_blocks=8),
    ("int8", "packed"): Tuning(per_thread=2, pack_early=False, min_blocks=8),
    ("fp8", "one_token"): Tuning(per_thread=4, pack_early=False, min_blocks=6, staged=True),
    ("fp8", "one_token_small"): Tuning(per_thread=2, pack_early=False, min_blocks=8),
    ("fp8", "packed"): Tuning(per_thread=2, pack_early=False, min_blocks=8),
    ("fp16-sr", "one_token"): Tuning(per_thread=4, pack_early=False, min_blocks=5),
    ("fp16-sr", "packed"): Tuning(per_thread=2, pack_early=False, min_blocks=8),
}
# (state width) -> CTAs per SM of the "one_token" tiling at or below which a one-token grid runs "one_token_small"
SMALL_GRID_CTAS_PER_SM = {"2-byte": 4, "int8": 8, "fp8": 8}


def tuning(state_dtype: torch.dtype, one_token: bool, small_grid: bool = False, rounds: int = 0) -> Tuning:
    fmt = STATE_FORMATS[state_dtype]
    key = fmt.sr_tuning_key if rounds else fmt.tuning_key
    kernel = "packed" if not one_token else "one_token"
    if one_token and small_grid and (key, "one_token_small") in TUNING:
        kernel = "one_token_small"
    return TUNING[(key, kernel)]


# ------------------------------------------------------------------------------------------------- specs

_SPECS: dict = {}  # the planner's static tuple -> spec (a call's host path builds no dataclass)
_SMALL_BLOCKS: dict = {}
# The one-token kernel takes no metadata tables and no intermediate buffer: the dtype fields of those arguments
# (mate_kernels.abi.SSU_ARGS' dtype_field) then hold these values (the state's dtype for the buffer).
ONE_TOKEN_DTYPES = {"meta_dtype": torch.int32}


def kernel_args(one_token: bool, variant: str | None) -> tuple:
    """The launch arguments (:class:`mate_kernels.abi.Arg`) of one SSU kernel and variant."""
    return args_of(SSU_ARGS, ONE_TOKEN if one_token else PACKED, variant)


DTYPE_FIELDS = tuple(a.dtype_field for a in SSU_ARGS if a.dtype_field is not None)  # the spec's, in ABI order


def variant_of(spec: SSUSpec) -> str | None:
    """The variant (trailing launch arguments) a spec's kernel takes: the scales of a block-scaled state or buffer,
    or the seed of stochastic rounding."""
    if FORMATS[spec.state_dtype].block_scaled or FORMATS[spec.ibuf_dtype].block_scaled:
        return "scaled"
    return "sr" if spec.philox_rounds else None


def arg_names(spec: SSUSpec) -> tuple[str, ...]:
    """The ABI names of a spec's launch arguments, in launch order."""
    return tuple(a.name for a in kernel_args(spec.one_token, variant_of(spec)))


def dtypes_of(args: tuple, values: dict) -> dict:
    """The spec's dtype fields (torch dtypes) from the named launch values: each argument's ``dtype_field``."""
    return {field: values[name].dtype for field, name in args.dtype_fields}


def spec_for(*, one_token: bool, dim: int, dstate: int, heads_per_group: int, dtypes: dict, tied: bool,
             vector_state: bool, vector_io: bool, small_grid: bool = False, pdl: bool = False,
             philox_rounds: int = 0) -> SSUSpec:  # fmt: skip
    """The spec of one kernel. ``dtypes``: the spec's dtype fields as torch dtypes (:func:`dtypes_of`; the
    one-token kernel's absent ones filled in here); ``philox_rounds``: Philox rounds of fp16 stochastic rounding,
    0 for none."""
    if one_token:
        dtypes = ONE_TOKEN_DTYPES | {"ibuf_dtype": dtypes["state_dtype"]} | dtypes
    small = small_grid and one_token
    static = (one_token, dim, dstate, heads_per_group, tuple(map(dtypes.__getitem__, DTYPE_FIELDS)), tied,
              vector_state, vector_io, small, pdl, philox_rounds)  # fmt: skip
    spec = _SPECS.get(static)
    if spec is None:
        state_dt = dtypes["state_dtype"]
        t = tuning(state_dt, one_token, small, philox_rounds)
        names = {field: DTYPE_NAMES[dt] for field, dt in dtypes.items()}
        spec = _SPECS[static] = SSUSpec(
            dim=dim, dstate=dstate, heads_per_group=heads_per_group, **names, tied=tied, one_token=one_token,
            vector_state=vector_state, vector_io=vector_io,
            tiling=choose_tiling(dim, dstate, names["state_dtype"], t.per_thread), pack_early=t.pack_early,
            min_blocks=t.min_blocks, pdl=pdl, philox_rounds=philox_rounds,
            staged=t.staged and one_token and vector_state,
        )  # fmt: skip
    return spec


def small_grid(nseq: int, heads: int, P: int, N: int, state_dt: torch.dtype, hw: Hardware) -> bool:
    """Whether a one-token launch is a small grid: CTAs = sequences x heads x P blocks of the "one_token" tiling,
    at most SMALL_GRID_CTAS_PER_SM of its state width per SM. A 2-byte state's tiling must hold its full chunks
    per thread (at P 80, two chunks, the capped kernel stays faster)."""
    width = STATE_FORMATS[state_dt].tuning_key
    limit = SMALL_GRID_CTAS_PER_SM.get(width)
    if limit is None:
        return False
    key = (P, N, state_dt)
    blocks = _SMALL_BLOCKS.get(key)
    if blocks is None:
        per_thread = TUNING[(width, "one_token")].per_thread
        t = choose_tiling(P, N, DTYPE_NAMES[state_dt], per_thread)
        full = t.vecs * t.rows_per_thread == per_thread or width != "2-byte"
        blocks = _SMALL_BLOCKS[key] = -(-P // t.block_p) if full else 0
    return 0 < nseq * heads * blocks <= limit * hw.sms


# --------------------------------------------------------------------------------------- vector accesses

_VEC: dict = {}


def vec_of(state_dtype: torch.dtype, dstate: int) -> int:
    """State values per 16-byte access of the tiling (the same for every chunk count)."""
    v = _VEC.get((state_dtype, dstate))
    if v is None:
        v = _VEC[(state_dtype, dstate)] = choose_tiling(1, dstate, DTYPE_NAMES[state_dtype]).vec
    return v


def vector_strides(vec: int, state, B, C, ibuf) -> tuple:
    """The data-pointer-independent half of the vector-access decision: whether the pool (and the intermediate
    buffer, when given) and the B/C rows have strides that allow 16-byte accesses of ``vec`` values, and the
    byte alignment each base pointer then needs."""
    s0, s1 = state.stride()[:2]
    vs = not (s0 % vec or s1 % vec)
    nb_ibuf = 0
    if ibuf is not None:
        i0, i1 = ibuf.stride()[:2]
        vs = vs and not (i0 % vec or i1 % vec)
        nb_ibuf = vec * ibuf.element_size()
    bs0, bs1 = B.stride()[:2]
    cs0, cs1 = C.stride()[:2]
    vio = not (bs0 % vec or bs1 % vec or cs0 % vec or cs1 % vec)
    return vs, vio, vec * state.element_size(), nb_ibuf, vec * B.element_size()


def vector_pointers(terms: tuple, state, B, C, ibuf) -> tuple[bool, bool]:
    """(vector state accesses, vector B/C row accesses) from :func:`vector_strides` and the data pointers (the
    part that changes from call to call, re-evaluated by the eager fast path every time)."""
    vs, vio, nb_state, nb_ibuf, nb_io = terms
    vstate = vs and not state.data_ptr() % nb_state and (ibuf is None or not ibuf.data_ptr() % nb_ibuf)
    vio = vio and not (B.data_ptr() % nb_io or C.data_ptr() % nb_io)
    return vstate, vio


# ------------------------------------------------------------------------------------------------- plan

_dummies: dict = {}


def dummy(kind: str, device, dtype, shape):
    """A small zero tensor standing in for an absent optional input (one per kind, device, dtype, shape)."""
    key = (kind, device, dtype, shape)
    t = _dummies.get(key)
    if t is None:
        t = _dummies[key] = torch.zeros(shape, dtype=dtype, device=device)
    return t


def dummies() -> tuple:
    return tuple(_dummies.values())


def _row_table(t):
    # the kernel reads B/C rows with a dense last dim; a strided last dim is rare (never in production)
    return t.contiguous() if t.stride(-1) != 1 else t


def _contiguous(t):
    return t.contiguous() if t.stride(0) != 1 else t


def plan(call: SSUCall):
    """(spec, launch arguments) of a call, or None when there is nothing to launch."""
    state = call.state
    rounds = call.philox_rounds if call.rand_seed is not None else 0  # (the normaliser: an fp16 state then)
    if rounds and call.dstate % 8:
        raise NotImplementedError(
            f"rand_seed (stochastic rounding) with dstate={call.dstate} in the TileLang SSU kernels (they draw eight "
            "values per Philox counter: a multiple of 8) is not supported by MATE; use backend='torch'"
        )
    scaled = call.state_scale is not None or call.ibuf_scale is not None
    if scaled and call.ibuf is not None and call.ibuf.dtype != state.dtype:
        raise NotImplementedError(
            f"intermediate_states_buffer: a {str(call.ibuf.dtype).removeprefix('torch.')} buffer beside a "
            f"{str(state.dtype).removeprefix('torch.')} state; the TileLang SSU kernels take a block-scaled buffer "
            "of the state's own dtype (use backend='torch' for a mix)"
        )
    dev = state.device
    nseq = call.nseq
    if nseq == 0 or call.rows == 0:
        return None
    if nseq > MAX_SEQUENCES:
        raise NotImplementedError(
            f"selective_state_update (tilelang): more than {MAX_SEQUENCES} sequences in one call ({nseq})"
        )
    hw = hardware(dev)
    _, H, P, N = state.shape
    one_token = (
        call.seqlen == 1
        and call.cu_seqlens is None
        and call.num_accepted is None
        and call.ibuf is None
        and call.parent is None
    )
    state_dt = state.dtype
    io_dt = call.x.dtype
    vec = _VEC.get((state_dt, N)) or vec_of(state_dt, N)
    ibuf = call.ibuf
    B = call.B
    C = call.C
    if B.dtype != io_dt:  # fp32 B/C beside a 2-byte x: the kernels read B/C in x's dtype (a cast per call)
        B, C = B.to(io_dt), C.to(io_dt)
    if B.stride(2) != 1 or C.stride(2) != 1:
        B = _row_table(B)
        C = _row_table(C)
    vstate, vio = vector_pointers(vector_strides(vec, state, B, C, ibuf), state, B, C, ibuf)

    flags = 0
    D = call.D
    if D is not None:
        flags |= FLAG_D
    else:
        D = dummy("D", dev, torch.float32, (1, 1))
    z = call.z
    if z is not None:
        flags |= FLAG_Z
    else:
        z = dummy("z", dev, io_dt, (1, 1, 1))
    dtb = call.dt_bias
    if dtb is not None:
        flags |= FLAG_DT_BIAS
    else:
        dtb = dummy("dtb", dev, torch.float32, (1, 1))
    if call.dt_softplus:
        flags |= FLAG_SOFTPLUS

    src = call.src
    dst = call.dst
    if src is not None:
        flags |= FLAG_SRC
        src_t, src_sb, src_st = src.base, src.stride_b, src.stride_t
    else:
        src_dt = dst.base.dtype if dst is not None else torch.int32
        src_t, src_sb, src_st = dummy("idx", dev, src_dt, (1,)), 0, 0
    if dst is not None:
        flags |= FLAG_DST
        dst_t, dst_sb, dst_st = dst.base, dst.stride_b, dst.stride_t
    else:
        dst_t, dst_sb, dst_st = dummy("idx", dev, src_t.dtype, (1,)), 0, 0
    if src_t.numel() == 0 or dst_t.numel() == 0:
        raise ValueError("state_batch_indices / dst_state_batch_indices: an empty slot table with sequences to run")

    variant = "scaled" if scaled else "sr" if rounds else None
    values = {
        "state": state, "x": call.x, "dt": call.dt, "A": call.A, "B": B, "C": C, "D": D, "z": z, "dt_bias": dtb,
        "out": call.out, "src": src_t, "dst": dst_t, "nseq": nseq, "src_sb": src_sb, "src_st": src_st,
        "dst_sb": dst_sb, "dst_st": dst_st, "pad": call.pad_slot_id, "mode": _MODES[call.write_mode],
    }  # fmt: skip
    if one_token:
        values["seqlen"] = 1
    else:
        values.update(_packed_values(call, dev, P, N, state_dt))
        flags |= values.pop("flags")
    values["flags"] = flags
    if scaled:  # both scales (a quantised state's buffer is of its dtype): a dummy for the dummy buffer's
        values["state_scale"] = call.state_scale
        values["ibuf_scale"] = (
            call.ibuf_scale if call.ibuf_scale is not None else dummy("scale", dev, torch.float32, (1, 1, P))
        )
    elif rounds:
        values["rand_seed"] = call.rand_seed.reshape(1)
    args = kernel_args(one_token, variant)
    spec = spec_for(
        one_token=one_token, dim=P, dstate=N, heads_per_group=H // B.shape[1], dtypes=dtypes_of(args, values),
        tied=call.tie_hdim, vector_state=vstate, vector_io=vio,
        small_grid=one_token and small_grid(nseq, H, P, N, state_dt, hw), pdl=pdl_for_capability(hw.kind, hw.major),
        philox_rounds=rounds,
    )  # fmt: skip
    return spec, launch_args(args, values)


def _packed_values(call: SSUCall, dev, P: int, N: int, state_dt) -> dict:
    """The packed kernel's own launch values: the metadata tables (one dtype: mixed int32/int64 ones are widened),
    the intermediate buffer, ``seqlen``, ``cache_steps``, and their ``flags`` bits."""
    cu, acc, iidx, parent = call.cu_seqlens, call.num_accepted, call.ibuf_indices, call.parent
    metas = [t for t in (cu, acc, iidx, parent) if t is not None]
    meta_dt = metas[0].dtype if metas else torch.int32
    if any(t.dtype != meta_dt for t in metas):
        # mixed int32/int64 metadata (SGLang's EAGLE verify: int64 parents beside int32 buffer indices): the
        # kernel reads one metadata dtype, so the small tables are widened to int64 (a copy each, per call)
        meta_dt = torch.int64
        cu, acc, iidx, parent = (None if t is None else t.to(meta_dt) for t in (cu, acc, iidx, parent))
    flags = 0
    meta = []  # the 1-D tables, read with stride 1: given (a flag bit) or the dummy
    for t, bit in ((cu, FLAG_CU), (acc, FLAG_ACC), (iidx, FLAG_IIDX)):
        if t is not None:
            flags |= bit
            meta.append(_contiguous(t))
        else:
            meta.append(dummy("meta", dev, meta_dt, (1,)))
    if parent is not None:
        flags |= FLAG_PARENT
    else:
        parent = dummy("meta", dev, meta_dt, (1, 1))
    ibuf = call.ibuf if call.ibuf is not None else dummy("ibuf", dev, state_dt, (1, 1, P, N))
    return {
        "cu": meta[0], "acc_tok": meta[1], "ibuf": ibuf, "iidx": meta[2], "parent": parent, "flags": flags,
        "seqlen": call.seqlen if call.seqlen is not None else 0, "cache_steps": call.cache_steps,
    }  # fmt: skip


def spec_dtypes(*, state, io, dt, src, dst, meta, ibuf=None, d=torch.float32, dt_bias=torch.float32) -> dict:
    """A spec's dtype fields from torch dtypes (``ibuf`` defaults to the state's): for the specs made without a
    call (serving configurations, the compile grid)."""
    return {
        "state_dtype": state, "io_dtype": io, "dt_dtype": dt, "d_dtype": d, "dt_bias_dtype": dt_bias,
        "src_dtype": src, "dst_dtype": dst, "meta_dtype": meta, "ibuf_dtype": state if ibuf is None else ibuf,
    }  # fmt: skip


def serving_specs(*, state_dtype, io_dtype, heads, dim, dstate, groups, slot_dtype, packed, meta_dtype, tie_hdim,
                  pdl=False, philox_rounds=0) -> list[SSUSpec]:  # fmt: skip
    """The specs one serving configuration calls: the one-token kernel (and, where the state width has one, its
    small-grid form), plus the packed one when ``packed``; dt as fp32 and in the io dtype (both occur in production);
    D / dt_bias fp32; aligned pools. ``pdl``: the specs of the PDL build; ``philox_rounds``: with fp16 stochastic
    rounding of that many Philox rounds."""
    # (one tuning for every SR grid)
    small_form = (STATE_FORMATS[state_dtype].tuning_key, "one_token_small") in TUNING and not philox_rounds
    forms = [(True, False)] + ([(True, True)] if small_form else []) + ([(False, False)] * packed)
    specs = []
    for one_token, small in forms:
        for dt_dt in dict.fromkeys((torch.float32, io_dtype)):
            dtypes = spec_dtypes(state=state_dtype, io=io_dtype, dt=dt_dt, src=slot_dtype, dst=slot_dtype,
                                 meta=meta_dtype if not one_token else torch.int32)  # fmt: skip
            specs.append(spec_for(one_token=one_token, dim=dim, dstate=dstate, heads_per_group=heads // groups,
                                  dtypes=dtypes, tied=tie_hdim, vector_state=True, vector_io=True, small_grid=small,
                                  pdl=pdl, philox_rounds=philox_rounds))  # fmt: skip
    return specs


__all__ = [
    "TUNING", "Tuning", "SMALL_GRID_CTAS_PER_SM", "plan", "spec_for", "spec_dtypes", "kernel_args", "dtypes_of",
    "arg_names", "variant_of", "serving_specs", "small_grid", "tuning", "vec_of", "vector_strides",
    "vector_pointers", "dummy", "dummies", "MAX_SEQUENCES",
]  # fmt: skip
