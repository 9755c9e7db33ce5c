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
from mate.mamba import settings
from mate.mamba._contract.ssu import SSUCall
from mate.mamba._device import is_accelerator, sm_count
from mate.mamba._tilelang.specs import SSUSpec
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

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16", torch.int32: "int32",
               torch.int64: "int64", torch.int16: "int16", torch.int8: "int8",
               torch.float8_e4m3fn: "float8_e4m3fn"}  # fmt: skip
MAX_SEQUENCES = 65535  # the grid's z dimension
TWO_BYTE_STATES = (torch.bfloat16, torch.float16)
_MODES = {"none": 0, "final": 1, "per_token": 2, "intermediate": 3}


@dataclass(frozen=True)
class Tuning:
    per_thread: int  # 16-byte state chunks per thread (where P allows)
    pack_early: bool  # narrow each updated 2-byte value back into its load registers at once
    min_blocks: int  # __launch_bounds__ CTAs per SM: ptxas caps registers to fit them (0: no cap)


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
    ("int8", "one_token"): Tuning(per_thread=2, pack_early=False, min_blocks=8),
    ("int8", "packed"): Tuning(per_thread=2, pack_early=False, min_blocks=8),
    ("fp8", "one_token"): Tuning(per_thread=2, pack_early=False, min_blocks=8),
    ("fp8", "packed"): Tuning(per_thread=2, pack_early=False, min_blocks=8),
    ("fp16-sr", "one_token"): Tuning(per_thread=4, pack_early=False, min_blocks=5),
    ("fp16-sr", "packed"): Tuning(per_thread=2, pack_early=False, min_blocks=8),
}
SMALL_GRID_CTAS_PER_SM = 4
SCALED_STATES = (torch.int16, torch.int8, torch.float8_e4m3fn)  # block-scaled, with fp32 row scales


def tuning(state_dtype: torch.dtype, one_token: bool, small_grid: bool = False, rounds: int = 0) -> Tuning:
    if rounds:
        return TUNING[("fp16-sr", "one_token" if one_token else "packed")]
    if state_dtype in SCALED_STATES:
        fmt = {torch.int16: "int16", torch.int8: "int8", torch.float8_e4m3fn: "fp8"}[state_dtype]
        return TUNING[(fmt, "one_token" if one_token else "packed")]
    width = "2-byte" if state_dtype in TWO_BYTE_STATES else "fp32"
    kernel = "packed" if not one_token else ("one_token_small" if small_grid and width == "2-byte" else "one_token")
    return TUNING[(width, kernel)]


# ---------------------------------------------------------------------------------------------- hardware


@dataclass(frozen=True)
class Hardware:
    """What the planner reads of a device: its kind, compute-capability major and SM count."""

    kind: str
    major: int
    sms: int


# What a plan assumes for tensors that are not on an accelerator (``mate.mamba.plan_*`` on the CPU): an H200.
PLANNING_DEFAULT = Hardware("cuda", 9, 132)
_HW: dict = {}


def hardware(device: torch.device) -> Hardware:
    hw = _HW.get(device)
    if hw is None:
        if is_accelerator(device):
            major = torch.cuda.get_device_capability(device)[0] if device.type == "cuda" else 0
            hw = Hardware(device.type, major, sm_count(device))
        else:
            hw = PLANNING_DEFAULT
        _HW[device] = hw
    return hw


def pdl_for_capability(kind: str, major: int) -> bool:
    """Whether kernels for a device of this kind and compute-capability major build with programmatic dependent
    launch under ``MATE_SSU_PDL`` (NotImplementedError when it is forced on where it cannot run)."""
    setting = settings.get("MATE_SSU_PDL")
    supported = kind == "cuda" and major >= 9
    if setting == "auto":
        return supported
    if setting == "1" and not supported:
        raise NotImplementedError(
            f"MATE_SSU_PDL=1: programmatic dependent launch needs a CUDA device of compute capability 9.0 or "
            f"newer, got {kind} {major}.x"
        )
    return setting == "1"


def pdl_for_arch(arch: str) -> bool:
    """``pdl_for_capability`` for a CUDA compile target such as "sm_90a" (``mate-mamba prewarm --target``)."""
    digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
    if not digits:
        raise ValueError(f"target: expected a CUDA arch such as sm_90a, got {arch!r}")
    return pdl_for_capability("cuda", int(digits) // 10)


# ------------------------------------------------------------------------------------------------- specs

_SPECS: dict = {}  # the planner's static tuple -> spec (a call's host path builds no dataclass)
_SMALL_BLOCKS: dict = {}


def spec_for(one_token, P, N, ratio, state_dt, io_dt, dt_dt, d_dt, dtb_dt, src_dt, dst_dt, meta_dt, ibuf_dt, tied,
             vstate, vio, small_grid=False, pdl=False, rounds=0) -> SSUSpec:  # fmt: skip
    """The spec of one kernel (torch dtypes in, names in the spec; ``rounds``: Philox rounds of fp16 stochastic
    rounding, 0 for none)."""
    static = (one_token, P, N, ratio, state_dt, io_dt, dt_dt, d_dt, dtb_dt, src_dt, dst_dt, meta_dt, ibuf_dt, tied,
              vstate, vio, small_grid and one_token, pdl, rounds)  # fmt: skip
    spec = _SPECS.get(static)
    if spec is None:
        t = tuning(state_dt, one_token, small_grid, rounds)
        n = DTYPE_NAMES
        spec = _SPECS[static] = SSUSpec(
            dim=P, dstate=N, heads_per_group=ratio, state_dtype=n[state_dt], io_dtype=n[io_dt], dt_dtype=n[dt_dt],
            d_dtype=n[d_dt], dt_bias_dtype=n[dtb_dt], src_dtype=n[src_dt], dst_dtype=n[dst_dt],
            meta_dtype=n[meta_dt], ibuf_dtype=n[ibuf_dt], tied=tied, one_token=one_token, vector_state=vstate,
            vector_io=vio, tiling=choose_tiling(P, N, n[state_dt], t.per_thread), pack_early=t.pack_early,
            min_blocks=t.min_blocks, pdl=pdl, philox_rounds=rounds,
        )  # fmt: skip
    return spec


def small_grid(nseq: int, heads: int, P: int, N: int, state_dt: torch.dtype, hw: Hardware) -> bool:
    """Whether a one-token launch with a 2-byte state is a small grid: CTAs = sequences x heads x P blocks, at most
    SMALL_GRID_CTAS_PER_SM per SM, where the tiling holds its full chunks per thread (at P 80, two chunks, the
    capped kernel stays faster)."""
    if state_dt not in TWO_BYTE_STATES:
        return False
    key = (P, N, state_dt)
    blocks = _SMALL_BLOCKS.get(key)
    if blocks is None:
        per_thread = TUNING[("2-byte", "one_token")].per_thread
        t = choose_tiling(P, N, DTYPE_NAMES[state_dt], per_thread)
        blocks = _SMALL_BLOCKS[key] = P // t.block_p if t.vecs * t.rows_per_thread == per_thread else 0
    return 0 < nseq * heads * blocks <= SMALL_GRID_CTAS_PER_SM * hw.sms


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
    hw = _HW.get(dev) or hardware(dev)
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
        d_dt = D.dtype
    else:
        d_dt = torch.float32
        D = dummy("D", dev, d_dt, (1, 1))
    z = call.z
    if z is not None:
        flags |= FLAG_Z
    else:
        z = dummy("z", dev, io_dt, (1, 1, 1))
    dtb = call.dt_bias
    if dtb is not None:
        flags |= FLAG_DT_BIAS
        dtb_dt = dtb.dtype
    else:
        dtb_dt = torch.float32
        dtb = dummy("dtb", dev, dtb_dt, (1, 1))
    if call.dt_softplus:
        flags |= FLAG_SOFTPLUS

    src = call.src
    dst = call.dst
    if src is not None:
        flags |= FLAG_SRC
        src_t, src_sb, src_st, src_dt = src.base, src.stride_b, src.stride_t, src.base.dtype
    else:
        src_dt = dst.base.dtype if dst is not None else torch.int32
        src_t, src_sb, src_st = dummy("idx", dev, src_dt, (1,)), 0, 0
    if dst is not None:
        flags |= FLAG_DST
        dst_t, dst_sb, dst_st, dst_dt = dst.base, dst.stride_b, dst.stride_t, dst.base.dtype
    else:
        dst_dt = src_dt
        dst_t, dst_sb, dst_st = dummy("idx", dev, dst_dt, (1,)), 0, 0
    if src_t.numel() == 0 or dst_t.numel() == 0:
        raise ValueError("state_batch_indices / dst_state_batch_indices: an empty slot table with sequences to run")

    mode = _MODES[call.write_mode]
    tied = call.tie_hdim
    ratio = H // B.shape[1]
    pdl = pdl_for_capability(hw.kind, hw.major)
    if one_token:
        small = small_grid(nseq, H, P, N, state_dt, hw)
        spec = spec_for(True, P, N, ratio, state_dt, io_dt, call.dt.dtype, d_dt, dtb_dt, src_dt, dst_dt, torch.int32,
                        state_dt, tied, vstate, vio, small, pdl, rounds)  # fmt: skip
        args = (state, call.x, call.dt, call.A, B, C, D, z, dtb, call.out, src_t, dst_t,
                nseq, 1, src_sb, src_st, dst_sb, dst_st, call.pad_slot_id, flags, mode)  # fmt: skip
        if scaled:
            args += (call.state_scale,)
        elif rounds:
            args += (call.rand_seed.reshape(1),)
        return spec, args

    cu = call.cu_seqlens
    acc = call.num_accepted
    iidx = call.ibuf_indices
    parent = call.parent
    metas = [t for t in (cu, acc, iidx, parent) if t is not None]
    meta_dt = metas[0].dtype if metas else torch.int32
    if any(t.dtype != meta_dt for t in metas):
        # mixed int32/int64 metadata (SGLang's EAGLE verify: int64 parents beside int32 buffer indices): the
        # kernel reads one metadata dtype, so the small tables are widened to int64 (a copy each, per call)
        meta_dt = torch.int64
        cu, acc, iidx, parent = (None if t is None else t.to(meta_dt) for t in (cu, acc, iidx, parent))
    meta = []  # the 1-D tables, read with stride 1: given (a flag bit) or the dummy
    for t, bit in ((cu, FLAG_CU), (acc, FLAG_ACC), (iidx, FLAG_IIDX)):
        if t is not None:
            flags |= bit
            meta.append(_contiguous(t))
        else:
            meta.append(dummy("meta", dev, meta_dt, (1,)))
    cu, acc, iidx = meta
    if parent is not None:
        flags |= FLAG_PARENT
    else:
        parent = dummy("meta", dev, meta_dt, (1, 1))
    if ibuf is None:
        ibuf_dt = state_dt
        ibuf = dummy("ibuf", dev, state_dt, (1, 1, P, N))
    else:
        ibuf_dt = ibuf.dtype
    spec = spec_for(False, P, N, ratio, state_dt, io_dt, call.dt.dtype, d_dt, dtb_dt, src_dt, dst_dt, meta_dt, ibuf_dt,
                    tied, vstate, vio, False, pdl, rounds)  # fmt: skip
    seqlen = call.seqlen if call.seqlen is not None else 0
    args = (state, call.x, call.dt, call.A, B, C, D, z, dtb, call.out, src_t, dst_t, cu, acc, ibuf, iidx, parent,
            nseq, seqlen, src_sb, src_st, dst_sb, dst_st, call.pad_slot_id, flags, mode, call.cache_steps)  # fmt: skip
    if scaled:  # both scales (a quantised state's buffer is of its dtype): a dummy for the dummy buffer's
        iscale = call.ibuf_scale if call.ibuf_scale is not None else dummy("scale", dev, torch.float32, (1, 1, P))
        args += (call.state_scale, iscale)
    elif rounds:
        args += (call.rand_seed.reshape(1),)
    return spec, args


def serving_specs(*, state_dtype, io_dtype, heads, dim, dstate, groups, slot_dtype, packed, meta_dtype, tie_hdim,
                  pdl=False, philox_rounds=0) -> list[SSUSpec]:  # fmt: skip
    """The specs one serving configuration calls: the one-token kernel (and, for 2-byte states, its small-grid
    form), plus the packed one when ``packed``; dt as fp32 and in the io dtype (both occur in production);
    D / dt_bias fp32; aligned pools. ``pdl``: the specs of the PDL build; ``philox_rounds``: with fp16 stochastic
    rounding of that many Philox rounds."""
    ratio = heads // groups
    f32 = torch.float32
    small_form = state_dtype in TWO_BYTE_STATES and not philox_rounds  # (one tuning for every SR grid)
    forms = [(True, False)] + ([(True, True)] if small_form else []) + ([(False, False)] * packed)
    specs = []
    for one_token, small in forms:
        for dt_dt in dict.fromkeys((f32, io_dtype)):
            meta = meta_dtype if not one_token else torch.int32
            specs.append(spec_for(one_token, dim, dstate, ratio, state_dtype, io_dtype, dt_dt, f32, f32, slot_dtype,
                                  slot_dtype, meta, state_dtype, tie_hdim, True, True, small, pdl,
                                  philox_rounds))  # fmt: skip
    return specs


__all__ = [
    "TUNING", "Tuning", "SMALL_GRID_CTAS_PER_SM", "Hardware", "hardware", "PLANNING_DEFAULT", "plan", "spec_for",
    "serving_specs", "small_grid", "tuning", "pdl_for_capability", "pdl_for_arch", "vec_of", "vector_strides",
    "vector_pointers", "dummy", "dummies", "MAX_SEQUENCES", "DTYPE_NAMES", "SCALED_STATES",
]  # fmt: skip
