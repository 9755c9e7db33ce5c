"""The ReplaySSM planner: one normalised :class:`~mate.mamba._contract.replay.ReplayCall` -> one
:class:`~mate.mamba._tilelang.specs.ReplaySpec` and its launch arguments; a
:class:`~mate.mamba._contract.replay.MaterializeCall` -> one :class:`~mate.mamba._tilelang.specs.MaterializeSpec`.

One kernel serves every call form (one-token, MTP, packed varlen; with or without a flush): optional inputs
travel as a bitmask plus small dummies, as for the SSU kernels (:mod:`.ssu_plan`). The tuning is data
(:data:`TUNING`): per state format, the 16-byte state chunks a thread holds and the register cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter

import torch
from mate.mamba._contract.dtypes import DTYPE_NAMES, QUANT_STATE_DTYPES
from mate.mamba._contract.errors import unsupported
from mate.mamba._contract.replay import MaterializeCall, MaterializeLayersCall, ReplayCall
from mate.mamba._tilelang.specs import MaterializeLayersSpec, MaterializeSpec, ReplaySpec
from mate.mamba._tilelang.ssu_plan import MAX_SEQUENCES, dtypes_of, dummy
from mate_kernels.abi import (
    MATERIALIZE,
    MATERIALIZE_ARGS,
    MATERIALIZE_LAYERS,
    MATERIALIZE_LAYERS_ARGS,
    REPLAY,
    REPLAY_ARGS,
    args_of,
    launch_args,
)
from mate_kernels.ssu_common import FLAG_CU, FLAG_D, FLAG_DT_BIAS, FLAG_SOFTPLUS, FLAG_SRC, FLAG_Z, choose_tiling
from mate_kernels.ssu_ring import checkpoint_variant


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


def tuning(state_dt: torch.dtype, rounds: int) -> Tuning:
    if state_dt in QUANT_STATE_DTYPES:
        return TUNING["scaled-sr" if rounds else "scaled"]
    if rounds:
        return TUNING["fp16-sr"]
    return TUNING["fp32" if state_dt == torch.float32 else "2-byte"]


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
    """(spec, launch arguments) of a call, or None when there is nothing to launch."""
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
    args = args_of(REPLAY_ARGS, REPLAY, checkpoint_variant(DTYPE_NAMES[state.dtype], rounds))
    spec = spec_for(
        dim=P, dstate=N, heads_per_group=H // B.shape[2], dtypes=dtypes_of(args, values), vector_state=vstate,
        vector_io=_vector_rings(bc, xc), ring_rows=ring_rows, new_rows=new_rows, philox_rounds=rounds,
    )  # fmt: skip
    return spec, launch_args(args, values)


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
                  tokens=1) -> list:  # fmt: skip
    """The specs one serving configuration calls: the decode step with dt fp32 and in the io dtype, and the
    materialisation with ``slot_dtype`` tables (rounding to nearest, and stochastically with ``philox_rounds`` >
    0), on aligned pools and rings of a ``window`` plus ``tokens`` rows
    (vLLM 0.33: ``--replayssm-buffer-len``, 16 by default, and 1 + the speculative tokens per step)."""
    ring_rows, new_rows = staged_rows(window + tokens, tokens)
    shape = {"dim": dim, "dstate": dstate, "heads_per_group": heads // groups, "ring_rows": ring_rows,
             "vector_state": True, "vector_io": True}  # fmt: skip
    specs = [spec_for(**shape, dtypes={"state_dtype": state_dtype, "io_dtype": io_dtype, "dt_dtype": dt_dt,
                                       "slot_dtype": slot_dtype}, new_rows=new_rows, philox_rounds=philox_rounds)
             for dt_dt in dict.fromkeys((torch.float32, io_dtype))]  # fmt: skip
    tables = {"state_dtype": state_dtype, "io_dtype": io_dtype, "index_dtype": slot_dtype}
    return specs + [
        materialize_spec_for(**shape, dtypes=tables, philox_rounds=r) for r in dict.fromkeys((0, philox_rounds))
    ]


__all__ = ["MAX_RING", "TUNING", "Tuning", "plan", "plan_materialize", "materialize_spec_for",
           "plan_materialize_layers", "materialize_layers_spec_for", "spec_for",
           "staged_rows", "serving_specs", "tuning"]  # fmt: skip
