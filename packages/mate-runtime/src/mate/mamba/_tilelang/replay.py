"""TileLang launchers for ``replay_state_update`` (ReplaySSM decode) and ``materialize_replayed_state``: one
normalised call -> one kernel launch.

:mod:`.replay_plan` decides the kernels (the fused one, or the table design's two) and their arguments; this module
compiles them on first use through the kernel cache and launches them on the current stream, with no
host<->device synchronisation (with ``MATE_CHECK_INPUTS=1`` the tables are read back and checked first, outside
graph capture).
"""

from __future__ import annotations

import torch
from mate.mamba._contract.replay import (
    MaterializeCall,
    MaterializeLayersCall,
    ReplayCall,
    check_materialize_data,
    check_replay_data,
)
from mate.mamba._contract.template import CallTemplate
from mate.mamba._platform import settings
from mate.mamba._platform.device import hardware, is_capturing, tilelang_target
from mate.mamba._tilelang.cache import compile_missing, kernel_lookup
from mate.mamba._tilelang.replay_plan import (
    materialize_layers_spec_for,
    materialize_spec_for,
    plan,
    plan_materialize,
    plan_materialize_layers,
    serving_specs,
    spec_for,
    staged_rows,
    table_pdl,
    table_specs_for,
    table_workspace,
)
from mate.mamba._tilelang.specs import (
    MaterializeLayersSpec,
    MaterializeSpec,
    ReplayRowsSpec,
    ReplaySpec,
    ReplayTableSpec,
)

PREWARM_HINT = (
    "mate.mamba.prewarm_replay_state_update(state_dtype=..., io_dtype=..., heads=..., dim=..., dstate=..., "
    "groups=..., slot_dtype=..., window=..., tokens=...)"
)
kernel, _kernels = kernel_lookup(PREWARM_HINT)  # kernel(spec, device), and its memo (spec -> kernel)


def run(call: ReplayCall, sources: dict | None = None):
    """Run one normalised call: ``(out, launcher)``. The launcher (None without ``sources``, with
    ``MATE_CHECK_INPUTS=1`` or for a call whose fields are not the caller's tensors or views of them) runs a call
    of the same metadata from the caller's tensors, the call rebuilt without validation
    (:class:`~mate.mamba._contract.template.CallTemplate`); its plan is made per call (it reads the pointers'
    alignment, and building the launch arguments is most of it)."""
    checked = settings.get("MATE_CHECK_INPUTS")
    if checked and not is_capturing(call.state.device):
        check_replay_data(call)
    return _launch(call), CallTemplate.launcher(call, None if checked else sources, _launch)


def _launch(call: ReplayCall) -> torch.Tensor:
    planned = plan(call)
    if planned is not None:
        for spec, args in planned:
            kernel(spec, call.state.device)(*args)
    return call.out


def materialize_replayed_state(call: MaterializeCall) -> None:
    if settings.get("MATE_CHECK_INPUTS") and not is_capturing(call.state.device):
        check_materialize_data(call)
    planned = plan_materialize(call)
    if planned is not None:
        spec, args = planned
        kernel(spec, call.state.device)(*args)


def materialize_replayed_layers(call: MaterializeLayersCall) -> None:
    """One launch over every layer and request: the kernel reads the pointer tables on the device, so the call
    reads nothing back and can be captured in a graph (``MATE_CHECK_INPUTS`` has no tables it could check without
    the pools' sizes)."""
    spec, args = plan_materialize_layers(call)
    kernel(spec, call.state.device)(*args)


def prewarm(device, *, state_dtype, io_dtype, heads, dim, dstate, groups, slot_dtype, philox_rounds=0, window=16,
            tokens=1, jobs=1):  # fmt: skip
    specs = serving_specs(state_dtype=state_dtype, io_dtype=io_dtype, heads=heads, dim=dim, dstate=dstate,
                          groups=groups, slot_dtype=slot_dtype, philox_rounds=philox_rounds, window=window,
                          tokens=tokens, pdl=table_pdl(hardware(device)))  # fmt: skip
    compile_missing(specs, target=tilelang_target(device), jobs=jobs)
    for spec in specs:
        kernel(spec, device)
    table_workspace(device, heads, *staged_rows(window + tokens, tokens))  # (nothing allocated under capture)


def compile_grid() -> list[ReplaySpec | ReplayTableSpec | ReplayRowsSpec | MaterializeSpec | MaterializeLayersSpec]:
    """Every state format at the Nemotron-H shape (P 64, N 128, 16 heads per group, bf16 io, one token per step
    on vLLM's default ring of 16 + 1 rows), MTP 6 on a ring of 16 + 6, fp16 / int8 / fp8 with stochastic
    rounding, bf16 dt with int64 slots, and P 80 / N 256 untied groups with an fp16 state on a ring of 64 rows;
    the table design's kernels at a few of these; the multi-layer materialisation at a few of these (below)."""
    f32, bf16, f16, i32, i64 = torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64
    formats = (f32, bf16, f16, torch.int16, torch.int8, torch.float8_e4m3fn)

    def decode(state, *, rows=(32, 1), dim=64, dstate=128, ratio=16, io=bf16, dt=f32, slot=i32, rounds=0):
        dtypes = {"state_dtype": state, "io_dtype": io, "dt_dtype": dt, "slot_dtype": slot}
        return spec_for(dim=dim, dstate=dstate, heads_per_group=ratio, dtypes=dtypes, vector_state=True,
                        vector_io=True, ring_rows=rows[0], new_rows=rows[1], philox_rounds=rounds)  # fmt: skip

    def materialize(state, *, ring_rows=32, dim=64, dstate=128, ratio=16, io=bf16, index=i32, vector_io=True,
                    rounds=0):  # fmt: skip
        dtypes = {"state_dtype": state, "io_dtype": io, "index_dtype": index}
        return materialize_spec_for(dim=dim, dstate=dstate, heads_per_group=ratio, dtypes=dtypes,
                                    ring_rows=ring_rows, vector_state=True, vector_io=vector_io,
                                    philox_rounds=rounds)  # fmt: skip

    mtp = (32, 8)
    specs = [decode(sdt) for sdt in formats]
    specs += [decode(bf16, rows=mtp), decode(f32, rows=mtp), decode(f16, rounds=10), decode(bf16, dt=bf16, slot=i64),
              decode(f16, rows=(64, 4), dim=80, dstate=256, ratio=1, io=f16, dt=f16)]  # fmt: skip
    specs += [decode(sdt, rounds=10) for sdt in (torch.int8, torch.float8_e4m3fn)]

    def table(state, *, rows=(32, 1), dim=64, dstate=128, ratio=16, io=bf16, dt=f32, slot=i32, rounds=0, pdl=True):
        dtypes = {"state_dtype": state, "io_dtype": io, "dt_dtype": dt, "slot_dtype": slot}
        return list(table_specs_for(dim=dim, dstate=dstate, heads_per_group=ratio, dtypes=dtypes, vector_state=True,
                                    vector_io=True, ring_rows=rows[0], new_rows=rows[1], philox_rounds=rounds,
                                    pdl=pdl))  # fmt: skip

    # the table design: bf16 and fp32 one-token and MTP 6 at the Nemotron-H shape, int8 and fp16 with stochastic
    # rounding, bf16 dt with int64 slots, P 80 / N 256 untied groups on a ring of 64 rows, and a build without PDL
    designed = []
    for sdt in (bf16, f32):
        designed += table(sdt) + table(sdt, rows=mtp)
    designed += table(torch.int8) + table(f16, rounds=10) + table(bf16, dt=bf16, slot=i64)
    designed += table(f16, rows=(64, 4), dim=80, dstate=256, ratio=1, io=f16, dt=f16) + table(bf16, pdl=False)
    specs += dict.fromkeys(designed)  # (the table kernel does not depend on the state format)
    # the materialisation kernel: every state format at the Nemotron-H shape, int64 tables (with rings off the
    # 16-byte grid), P 80 / N 256 fp16, fp16 / int8 / fp8 with stochastic rounding
    specs += [materialize(sdt) for sdt in formats]
    specs += [materialize(bf16, index=i64, vector_io=False),
              materialize(f16, ring_rows=64, dim=80, dstate=256, ratio=1, io=f16)]  # fmt: skip
    specs += [materialize(sdt, rounds=10) for sdt in (f16, torch.int8, torch.float8_e4m3fn)]
    # FlashInfer's replayssm_materialize over layers: bf16 and fp8 states at the Nemotron-H shape, fp32 A, and int8
    # with stochastic rounding; fp16 with a bf16 A at P 80 / N 256 on a ring of 64 rows, and rounded stochastically
    layers = dict(dim=64, dstate=128, heads_per_group=16, a_dtype=f32, ring_len=17)
    specs += [materialize_layers_spec_for(**layers, state_dtype=sdt) for sdt in (bf16, torch.float8_e4m3fn)]
    specs += [materialize_layers_spec_for(**layers, state_dtype=torch.int8, philox_rounds=10)]
    specs += [materialize_layers_spec_for(dim=80, dstate=256, heads_per_group=1, state_dtype=f16, a_dtype=bf16,
                                          ring_len=64, philox_rounds=r) for r in (0, 10)]  # fmt: skip
    return specs


__all__ = ["run", "materialize_replayed_state", "materialize_replayed_layers", "kernel", "prewarm", "compile_grid",
           "PREWARM_HINT"]  # fmt: skip
