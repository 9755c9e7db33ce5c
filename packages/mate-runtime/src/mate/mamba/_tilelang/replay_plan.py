"""The ReplaySSM planner: one normalised :class:`~mate.mamba._contract.replay.ReplayCall` -> one
:class:`~mate.mamba._tilelang.specs.ReplaySpec` and its launch arguments; a
:class:`~mate.mamba._contract.replay.MaterializeCall` -> one :class:`~mate.mamba._tilelang.specs.MaterializeSpec`.

Two designs serve every call form (one-token, MTP, packed varlen; with or without a flush; every state format):
the fused kernel (``mate_kernels.ssu_replay.replay_kernel``: each CTA computes its head's token table before its
state rows' work) and the table design (``mate_kernels.ssu_replay_table``, then ``ssu_replay.replay_rows_kernel``:
the table once per sequence and group into a workspace, then CTAs that only do the state rows' work, more of them).
:func:`uses_table` picks one (:data:`TABLE_MAX_SEQUENCES`). Optional inputs travel as a bitmask plus small dummies,
as for the SSU kernels (:mod:`.ssu_plan`). The tuning is data (:data:`TUNING`, :data:`ROWS_TUNING`): per state
format, the 16-byte state chunks a thread holds and the register cap.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from operator import itemgetter

import torch
from mate.mamba._contract.dtypes import DTYPE_NAMES, QUANT_STATE_DTYPES
from mate.mamba._contract.errors import unsupported
from mate.mamba._contract.replay import MaterializeCall, MaterializeLayersCall, ReplayCall
from mate.mamba._platform.device import Hardware, hardware
from mate.mamba._tilelang.specs import (
    MaterializeLayersSpec,
    MaterializeSpec,
    ReplayRowsSpec,
    ReplaySpec,
    ReplayTableSpec,
)
from mate.mamba._tilelang.ssu_plan import MAX_SEQUENCES, dtypes_of, dummy
from mate.mamba._tilelang.workspace import WORKSPACE
from mate_kernels.abi import (
    MATERIALIZE,
    MATERIALIZE_ARGS,
    MATERIALIZE_LAYERS,
    MATERIALIZE_LAYERS_ARGS,
    REPLAY,
    REPLAY_ARGS,
    REPLAY_ROWS,
    REPLAY_ROWS_ARGS,
    REPLAY_TABLE,
    REPLAY_TABLE_ARGS,
    args_of,
    launch_args,
)
from mate_kernels.ssu_common import FLAG_CU, FLAG_D, FLAG_DT_BIAS, FLAG_SOFTPLUS, FLAG_SRC, FLAG_Z, choose_tiling
from mate_kernels.ssu_ring import checkpoint_variant, table_layout


@dataclass(frozen=True)
class Tuning:
    per_thread: int  # 16-byte state chunks per thread (where P allows)
    min_blocks: int  # __launch_bounds__ CTAs per SM (0: no cap)


MAX_RING = 64  # ring rows the kernel stages in shared memory at most (vLLM 0.33: 16 + T)

# state format -> tuning (H200 measurements: docs/ssu-kernels.md "ReplaySSM decode"). "scaled-sr" (an int8 / fp8
# checkpoint rounded stochastically) is "scaled"'s, not measured: its Philox words are drawn per chunk at the
# flush (8 registers), and a flush is one call in a window's
TUNING = {
    "fp32": Tuning(per_thread=8, min_blocks=8),
    "2-byte": Tuning(per_thread=8, min_blocks=6),
    "scaled": Tuning(per_thread=2, min_blocks=0),
    "scaled-sr": Tuning(per_thread=2, min_blocks=0),
    "fp16-sr": Tuning(per_thread=4, min_blocks=0),
}


# The table design where the fused kernel's per-CTA table work (staging the group's B rows, the B . C dot products,
# the prefix scan, the table: ~1300 serial instructions per warp before the state work) is the critical path: small
# batches, where the CTAs are few and each SM runs about one. Not yet timed on a GPU: batch 1-8 are the cells the
# fused kernel loses most (FlashInfer's split, 0.45-0.60x MATE's time at batch 1 / 8, H200 2026-12-07); at 64 and
# above the fused kernel's CTAs fill the GPU and the table's round trip through L2 is not known to pay.
TABLE_MAX_SEQUENCES = 8
TABLE_HEADS_PER_CTA = 16  # heads of a group per table CTA at most (the dot products are computed once per CTA)
TABLE_WARPS = 8  # the table CTA's warps: 16 dot products and 8 head scans at a time
# state format -> the rows kernel's tuning: 2 chunks per thread (a quarter head of P 64 per CTA at a 2-byte state),
# 4x the fused kernel's CTAs at batch 1 (its registers hold no table work). Not measured
ROWS_TUNING = {
    "fp32": Tuning(per_thread=2, min_blocks=0),
    "2-byte": Tuning(per_thread=2, min_blocks=0),
    "scaled": Tuning(per_thread=2, min_blocks=0),
    "scaled-sr": Tuning(per_thread=2, min_blocks=0),
    "fp16-sr": Tuning(per_thread=2, min_blocks=0),
}


def _format(state_dt: torch.dtype, rounds: int) -> str:
    if state_dt in QUANT_STATE_DTYPES:
        return "scaled-sr" if rounds else "scaled"
    if rounds:
        return "fp16-sr"
    return "fp32" if state_dt == torch.float32 else "2-byte"


def tuning(state_dt: torch.dtype, rounds: int, rows: bool = False) -> Tuning:
    """The tuning of the fused kernel, or with ``rows`` of the table design's rows kernel."""
    return (ROWS_TUNING if rows else TUNING)[_format(state_dt, rounds)]


DESIGNS = ("fused", "table")
_forced: contextvars.ContextVar = contextvars.ContextVar("mate_replay_design", default=None)


@contextlib.contextmanager
def forcing(design: str):
    """Plan every ReplaySSM call in this context with ``design`` (one of :data:`DESIGNS`) instead of
    :func:`uses_table`'s choice: for tests of each design and benchmarks that show both."""
    if design not in DESIGNS:
        raise ValueError(f"design must be one of {', '.join(DESIGNS)}; got {design!r}")
    token = _forced.set(design)
    try:
        yield
    finally:
        _forced.reset(token)


def uses_table(nseq: int) -> bool:
    """Whether a call of ``nseq`` sequences runs the table design (:data:`TABLE_MAX_SEQUENCES`, or :func:`forcing`)."""
    forced = _forced.get()
    return nseq <= TABLE_MAX_SEQUENCES if forced is None else forced == "table"


def table_heads_per_cta(heads_per_group: int) -> int:
    """The largest divisor of ``heads_per_group`` up to :data:`TABLE_HEADS_PER_CTA`."""
    return max(d for d in range(1, min(heads_per_group, TABLE_HEADS_PER_CTA) + 1) if heads_per_group % d == 0)


def table_workspace(device, heads: int, ring_rows: int, new_rows: int, nseq: int = 0) -> torch.Tensor:
    """The table design's workspace, fp32 ``[max(TABLE_MAX_SEQUENCES, nseq), heads, rec]``
    (:func:`mate_kernels.ssu_ring.table_layout`): allocated at the rule's largest batch on the first call (or by
    ``prewarm``), so no later call allocates, under graph capture neither (a call :func:`forcing` the design on
    more sequences grows it). Calls with the same record share it (one stream runs them in order: the table kernel
    of a call starts once the previous call's rows kernel is done)."""
    rec = table_layout(ring_rows, new_rows).rec
    rows = max(TABLE_MAX_SEQUENCES, nseq)
    return WORKSPACE.get(("replay-table", heads, rec), "table", (rows, heads, rec), torch.float32, device)


def table_pdl(hw: Hardware) -> bool:
    """Programmatic dependent launch between the table design's kernels: CUDA sm_90 and newer."""
    return hw.kind == "cuda" and hw.major >= 9


_SPECS: dict = {}
_FIELD = itemgetter(0)  # (dtype fields sorted by name into the spec cache's key)


def _pow2(n: int, least: int) -> int:
    rows = least
    while rows < n:
        rows *= 2
    return rows


def staged_rows(L: int, tokens: int) -> tuple[int, int]:
    """The rows the kernel stages per step: ``(ring, new)``, powers of two >= the ring length ``L`` (at least 16)
    and >= the tokens per sequence. A ring longer than :data:`MAX_RING` rows is not served."""
    if L > MAX_RING:
        unsupported(f"a ring of L={L} rows in the TileLang ReplaySSM kernel (it stages at most {MAX_RING} rows)",
                    "use backend='torch'")  # fmt: skip
    ring = _pow2(L, 16)
    return ring, min(_pow2(tokens, 1), ring)


def spec_for(*, dim: int, dstate: int, heads_per_group: int, dtypes: dict, vector_state: bool, vector_io: bool,
             ring_rows: int = 32, new_rows: int = 1, philox_rounds: int = 0) -> ReplaySpec:  # fmt: skip
    """The spec of one decode kernel. ``dtypes``: the spec's dtype fields as torch dtypes (:func:`dtypes_of` of
    the launch values); ``ring_rows`` / ``new_rows``: :func:`staged_rows`; ``philox_rounds``: Philox rounds of
    the flush's stochastic rounding, 0 for none."""
    static = (dim, dstate, heads_per_group, tuple(sorted(dtypes.items(), key=_FIELD)), vector_state, vector_io,
              ring_rows, new_rows, philox_rounds)  # fmt: skip
    spec = _SPECS.get(static)
    if spec is None:
        state_dt = dtypes["state_dtype"]
        t = tuning(state_dt, philox_rounds)
        names = {field: DTYPE_NAMES[dt] for field, dt in dtypes.items()}
        spec = _SPECS[static] = ReplaySpec(
            dim=dim, dstate=dstate, heads_per_group=heads_per_group, **names, ring_rows=ring_rows, new_rows=new_rows,
            tiling=choose_tiling(dim, dstate, names["state_dtype"], t.per_thread), min_blocks=t.min_blocks,
            philox_rounds=philox_rounds, vector_state=vector_state, vector_io=vector_io,
        )  # fmt: skip
    return spec


def table_specs_for(*, dim: int, dstate: int, heads_per_group: int, dtypes: dict, vector_state: bool, vector_io: bool,
                    ring_rows: int, new_rows: int, philox_rounds: int = 0,
                    pdl: bool = True) -> tuple[ReplayTableSpec, ReplayRowsSpec]:  # fmt: skip
    """The specs of the table design's two kernels (arguments as for :func:`spec_for`; ``dtypes`` also names
    ``dt_dtype``, which only the table kernel reads); ``pdl``: :func:`table_pdl`."""
    static = ("table", dim, dstate, heads_per_group, tuple(sorted(dtypes.items(), key=_FIELD)), vector_state,
              vector_io, ring_rows, new_rows, philox_rounds, pdl)  # fmt: skip
    specs = _SPECS.get(static)
    if specs is None:
        state_dt = dtypes["state_dtype"]
        t = tuning(state_dt, philox_rounds, rows=True)
        names = {field: DTYPE_NAMES[dt] for field, dt in dtypes.items()}
        table = ReplayTableSpec(
            dstate=dstate, heads_per_group=heads_per_group, io_dtype=names["io_dtype"], dt_dtype=names["dt_dtype"],
            slot_dtype=names["slot_dtype"], ring_rows=ring_rows, new_rows=new_rows,
            heads_per_cta=table_heads_per_cta(heads_per_group), warps=TABLE_WARPS, vector_io=vector_io, pdl=pdl,
        )  # fmt: skip
        rows = ReplayRowsSpec(
            dim=dim, dstate=dstate, heads_per_group=heads_per_group, state_dtype=names["state_dtype"],
            io_dtype=names["io_dtype"], slot_dtype=names["slot_dtype"], ring_rows=ring_rows, new_rows=new_rows,
            tiling=choose_tiling(dim, dstate, names["state_dtype"], t.per_thread), min_blocks=t.min_blocks,
            philox_rounds=philox_rounds, vector_state=vector_state, vector_io=vector_io, pdl=pdl,
        )  # fmt: skip
        specs = _SPECS[static] = (table, rows)
    return specs


def grid(spec, call: ReplayCall) -> tuple[tuple[int, int, int], int]:
    """(launch grid, threads per CTA) of one of a call's kernels: ``(groups * heads_per_group / heads_per_cta,
    sequences, 1)`` for the table kernel, ``(P / block_p, heads, sequences)`` for the others."""
    if isinstance(spec, ReplayTableSpec):
        groups = call.B.shape[2]
        return (groups * spec.heads_per_group // spec.heads_per_cta, call.nseq, 1), 32 * spec.warps
    t = spec.tiling
    return (-(-call.state.shape[2] // t.block_p), call.state.shape[1], call.nseq), t.threads


def _dense_rows(name: str, t: torch.Tensor, what: str) -> None:
    if t.stride(-1) != 1:
        unsupported(f"{name} with a strided last dim in the TileLang ReplaySSM kernel", f"pass {what}")


def _pool_layout(kernel: str, state, x_cache, B_cache, state_scale) -> bool:
    """The pool and ring layouts both ReplaySSM kernels need (``NotImplementedError`` naming the tensor
    otherwise); returns whether the state's rows go in 16-byte chunks (its slot and head strides and base on the
    grid)."""
    N = state.shape[3]
    if state.stride(3) != 1 or state.stride(2) != N:
        unsupported(f"state with strided inner dims in the TileLang ReplaySSM {kernel}",
                    "a pool whose [P, N] rows are dense (slot and head strides are free)")  # fmt: skip
    _dense_rows("x_cache", x_cache, "x_cache with a dense last dim")
    _dense_rows("B_cache", B_cache, "B_cache with a dense last dim")
    if state_scale is not None:
        _dense_rows("state_scale", state_scale, "state_scale with a dense last dim")
    vec = choose_tiling(1, N, DTYPE_NAMES[state.dtype]).vec
    return not (state.stride(0) % vec or state.stride(1) % vec or state.data_ptr() % (vec * state.element_size()))


def _vector_rings(bc: torch.Tensor, xc: torch.Tensor) -> bool:
    """Whether the rings' rows go in 16-byte pieces: outer strides and base addresses of both on the 16-byte
    grid."""
    iob = 16 // bc.element_size()
    return all(t.stride(d) % iob == 0 for t in (bc, xc) for d in range(3)) and not (
        bc.data_ptr() % 16 or xc.data_ptr() % 16)  # fmt: skip


def plan(call: ReplayCall):
    """The (spec, launch arguments) pairs of a call in launch order (the fused kernel, or the table design's two
    kernels: :func:`uses_table`), or None when there is nothing to launch."""
    state = call.state
    S, H, P, N = state.shape
    dev = state.device
    vstate = _pool_layout("kernel", state, call.x_cache, call.B_cache, call.state_scale)
    nseq = call.nseq
    if nseq == 0 or call.x.shape[1] == 0:
        return None
    if nseq > MAX_SEQUENCES:
        unsupported(f"replay_state_update (tilelang) with more than {MAX_SEQUENCES} sequences in one call ({nseq})")
    rounds = call.philox_rounds if call.rand_seed is not None else 0
    _check_rounding(rounds, N, "kernel")
    io_dt = call.x.dtype
    B, C = call.B, call.C
    if B.stride(-1) != 1:
        B = B.contiguous()
    if C.stride(-1) != 1:
        C = C.contiguous()
    bc, xc = call.B_cache, call.x_cache
    ring_rows, new_rows = staged_rows(bc.shape[2], call.npredicted)

    flags = 0
    f32 = torch.float32
    D = call.D
    if D is not None:
        flags |= FLAG_D
    else:
        D = dummy("D1", dev, f32, (1,))
    z = call.z
    if z is not None:
        flags |= FLAG_Z
    else:
        z = dummy("z4", dev, io_dt, (1, 1, 1, 1))
    dtb = call.dt_bias
    if dtb is not None:
        flags |= FLAG_DT_BIAS
    else:
        dtb = dummy("D1", dev, f32, (1,))
    if call.dt_softplus:
        flags |= FLAG_SOFTPLUS
    slots = call.slots
    if slots is not None:
        flags |= FLAG_SRC
        slots = slots if slots.stride(0) == 1 else slots.contiguous()
    else:
        slots = dummy("idx", dev, torch.int32, (1,))
    cu = call.cu_seqlens
    if cu is not None:
        flags |= FLAG_CU
        cu = cu if cu.stride(0) == 1 else cu.contiguous()
    else:
        cu = dummy("idx", dev, torch.int32, (1,))
    values = {
        "state": state, "x_cache": xc, "B_cache": bc, "dt_cache": call.dt_cache, "ring_start": call.ring_start,
        "pnat": call.pnat, "x": call.x, "dt": call.dt, "A": call.A, "B": B, "C": C, "D": D, "z": z, "dt_bias": dtb,
        "out": call.out, "slots": slots, "cu": cu, "nseq": nseq, "ntok": call.npredicted, "window": call.window,
        "pad": call.pad_slot_id, "flags": flags,
    }  # fmt: skip
    _rounding_values(values, call.state_scale, call.rand_seed, rounds)
    variant = checkpoint_variant(DTYPE_NAMES[state.dtype], rounds)
    shape = dict(dim=P, dstate=N, heads_per_group=H // B.shape[2], vector_state=vstate, vector_io=_vector_rings(bc, xc),
                 ring_rows=ring_rows, new_rows=new_rows, philox_rounds=rounds)  # fmt: skip
    if not uses_table(nseq):
        args = args_of(REPLAY_ARGS, REPLAY, variant)
        return ((spec_for(**shape, dtypes=dtypes_of(args, values)), launch_args(args, values)),)
    values["table"] = table_workspace(dev, H, ring_rows, new_rows, nseq)
    targs = args_of(REPLAY_TABLE_ARGS, REPLAY_TABLE)
    rargs = args_of(REPLAY_ROWS_ARGS, REPLAY_ROWS, variant)
    table, rows = table_specs_for(**shape, dtypes={**dtypes_of(rargs, values), **dtypes_of(targs, values)},
                                  pdl=table_pdl(hardware(dev)))  # fmt: skip
    return (table, launch_args(targs, values)), (rows, launch_args(rargs, values))


def materialize_spec_for(*, dim: int, dstate: int, heads_per_group: int, dtypes: dict, ring_rows: int,
                         vector_state: bool, vector_io: bool, philox_rounds: int = 0) -> MaterializeSpec:  # fmt: skip
    """The spec of one materialisation kernel (``dtypes`` and ``philox_rounds`` as for :func:`spec_for`)."""
    names = {field: DTYPE_NAMES[dt] for field, dt in dtypes.items()}
    per_thread = tuning(dtypes["state_dtype"], philox_rounds).per_thread
    return MaterializeSpec(
        dim=dim, dstate=dstate, heads_per_group=heads_per_group, **names, ring_rows=ring_rows,
        tiling=choose_tiling(dim, dstate, names["state_dtype"], per_thread), vector_state=vector_state,
        vector_io=vector_io, philox_rounds=philox_rounds,
    )  # fmt: skip


def _check_rounding(rounds: int, N: int, kernel: str) -> None:
    if rounds and N % 8:
        unsupported(f"rand_seed (stochastic rounding) with dstate={N} in the TileLang ReplaySSM {kernel} (eight "
                    "values per Philox counter: a multiple of 8)", "use backend='torch'")  # fmt: skip


def _rounding_values(values: dict, state_scale, rand_seed, rounds: int) -> None:
    """The trailing launch values of the kernel's variant (:func:`mate_kernels.ssu_ring.checkpoint_variant`)."""
    if state_scale is not None:
        values["state_scale"] = state_scale
    if rounds:
        values["rand_seed"] = rand_seed.reshape(1)


def plan_materialize(call: MaterializeCall):
    """(spec, launch arguments) of a ``materialize_replayed_state`` call, or None when there is nothing to launch.
    The four request tables are passed in their dtype when they share one, else each widened to int64."""
    state = call.state
    S, H, P, N = state.shape
    vstate = _pool_layout("materialisation kernel", state, call.x_cache, call.B_cache, call.state_scale)
    batch = call.src.shape[0]
    if batch == 0:
        return None
    if batch > MAX_SEQUENCES:
        unsupported(f"materialize_replayed_state (tilelang) with more than {MAX_SEQUENCES} requests in one call "
                    f"({batch})")  # fmt: skip
    rounds = call.philox_rounds
    _check_rounding(rounds, N, "materialisation kernel")
    ring_rows, _ = staged_rows(call.x_cache.shape[2], 1)
    tables = (call.ring_start, call.prefix, call.src, call.dst)
    index_dt = tables[0].dtype if all(t.dtype == tables[0].dtype for t in tables) else torch.int64
    ring_start, prefix, src, dst = (t.to(index_dt).contiguous() for t in tables)
    values = {
        "state": state, "x_cache": call.x_cache, "B_cache": call.B_cache, "dt_cache": call.dt_cache, "A": call.A,
        "ring_start": ring_start, "prefix": prefix, "src": src, "dst": dst, "batch": batch, "pad": call.pad_slot_id,
    }  # fmt: skip
    _rounding_values(values, call.state_scale, call.rand_seed, rounds)
    args = args_of(MATERIALIZE_ARGS, MATERIALIZE, checkpoint_variant(DTYPE_NAMES[state.dtype], rounds))
    spec = materialize_spec_for(
        dim=P, dstate=N, heads_per_group=H // call.B_cache.shape[1], dtypes=dtypes_of(args, values),
        ring_rows=ring_rows, vector_state=vstate, vector_io=_vector_rings(call.B_cache, call.x_cache),
        philox_rounds=rounds,
    )  # fmt: skip
    return spec, launch_args(args, values)


def materialize_layers_spec_for(*, dim: int, dstate: int, heads_per_group: int, state_dtype: torch.dtype,
                                a_dtype: torch.dtype, ring_len: int,
                                philox_rounds: int = 0) -> MaterializeLayersSpec:  # fmt: skip
    """The spec of one multi-layer materialisation kernel (bf16 rings; a ring of ``ring_len`` rows;
    ``philox_rounds`` as for :func:`spec_for`)."""
    ring_rows, _ = staged_rows(ring_len, 1)
    per_thread = tuning(state_dtype, philox_rounds).per_thread
    name = DTYPE_NAMES[state_dtype]
    return MaterializeLayersSpec(
        dim=dim, dstate=dstate, heads_per_group=heads_per_group, state_dtype=name, io_dtype="bfloat16",
        a_dtype=str(a_dtype).removeprefix("torch."), ring_rows=ring_rows,
        tiling=choose_tiling(dim, dstate, name, per_thread), philox_rounds=philox_rounds,
    )  # fmt: skip


def plan_materialize_layers(call: MaterializeLayersCall):
    """(spec, launch arguments) of a ``materialize_replayed_layers`` call: one launch over every layer and request,
    grid ``(P blocks, layers * heads, batch)``."""
    layers, batch = call.src.shape
    if batch > MAX_SEQUENCES:
        unsupported(f"materialize_replayed_layers (tilelang) with more than {MAX_SEQUENCES} requests ({batch})")
    if layers * call.heads > MAX_SEQUENCES:
        unsupported(f"materialize_replayed_layers (tilelang) with layers x num_heads above {MAX_SEQUENCES} "
                    f"({layers} x {call.heads})")  # fmt: skip
    rounds = call.philox_rounds
    _check_rounding(rounds, call.dstate, "multi-layer materialisation kernel")
    spec = materialize_layers_spec_for(dim=call.dim, dstate=call.dstate, heads_per_group=call.heads_per_group,
                                       state_dtype=call.state_dtype, a_dtype=call.a_dtype, ring_len=call.ring_len,
                                       philox_rounds=rounds)  # fmt: skip
    names = ("state_ptrs", "state_strides", "x_ptrs", "x_strides", "B_ptrs", "B_strides", "dt_ptrs", "dt_strides",
             "A_ptrs", "scale_ptrs", "scale_strides")  # fmt: skip
    values = dict(zip(names, call.tables, strict=True))
    values.update(src=call.src, dst=call.dst, ring_start=call.ring_start, prefix=call.prefix, active=call.active,
                  heads=call.heads, ring_len=call.ring_len, pad=call.pad_slot_id)  # fmt: skip
    _rounding_values(values, None, call.rand_seed, rounds)
    args = args_of(MATERIALIZE_LAYERS_ARGS, MATERIALIZE_LAYERS, "sr" if rounds else None)
    return spec, launch_args(args, values)


def serving_specs(*, state_dtype, io_dtype, heads, dim, dstate, groups, slot_dtype, philox_rounds=0, window=16,
                  tokens=1, pdl=True) -> list:  # fmt: skip
    """The specs one serving configuration calls: the decode step's fused kernel and the table design's two (small
    batches: :func:`uses_table`) with dt fp32 and in the io dtype, and the materialisation with ``slot_dtype``
    tables (rounding to nearest, and stochastically with ``philox_rounds`` > 0), on aligned pools and rings of a
    ``window`` plus ``tokens`` rows (vLLM 0.33: ``--replayssm-buffer-len``, 16 by default, and 1 + the speculative
    tokens per step). ``pdl``: the table design's kernels for a device that launches them as programmatic
    dependents (:func:`table_pdl`)."""
    ring_rows, new_rows = staged_rows(window + tokens, tokens)
    shape = {"dim": dim, "dstate": dstate, "heads_per_group": heads // groups, "ring_rows": ring_rows,
             "vector_state": True, "vector_io": True}  # fmt: skip
    specs = []
    for dt_dt in dict.fromkeys((torch.float32, io_dtype)):
        dtypes = {"state_dtype": state_dtype, "io_dtype": io_dtype, "dt_dtype": dt_dt, "slot_dtype": slot_dtype}
        specs.append(spec_for(**shape, dtypes=dtypes, new_rows=new_rows, philox_rounds=philox_rounds))
        specs += table_specs_for(**shape, dtypes=dtypes, new_rows=new_rows, philox_rounds=philox_rounds, pdl=pdl)
    specs = list(dict.fromkeys(specs))  # (the rows kernel reads no dt: one for both)
    tables = {"state_dtype": state_dtype, "io_dtype": io_dtype, "index_dtype": slot_dtype}
    return specs + [
        materialize_spec_for(**shape, dtypes=tables, philox_rounds=r) for r in dict.fromkeys((0, philox_rounds))
    ]


__all__ = ["DESIGNS", "MAX_RING", "ROWS_TUNING", "TABLE_HEADS_PER_CTA", "TABLE_MAX_SEQUENCES", "TABLE_WARPS", "TUNING",
           "Tuning", "forcing", "grid", "plan", "plan_materialize", "materialize_spec_for", "plan_materialize_layers",
           "materialize_layers_spec_for", "spec_for", "staged_rows", "serving_specs", "table_heads_per_cta",
           "table_pdl", "table_specs_for", "table_workspace", "tuning", "uses_table"]  # fmt: skip
