"""The TileLang backend's entry points, the same for every op (``mate.mamba._dispatch`` calls them): run, plan,
prewarm. Each op's launcher module (:mod:`.ssu`, :mod:`.ssd`, :mod:`.replay`, :mod:`.norm`,
:mod:`.conv1d`) plans with its planner and launches
on the current stream."""

from __future__ import annotations

from mate.mamba._platform.device import hardware
from mate.mamba._tilelang import (
    conv1d,
    conv1d_plan,
    decode_step,
    decode_step_plan,
    norm,
    norm_plan,
    replay,
    replay_plan,
    ssd,
    ssd_plan,
    ssu,
    ssu_plan,
)


def run(op: str, call, sources: dict | None = None):
    """``(result, launcher)`` of a normalised call (see ``mate.mamba._dispatch``)."""
    if op == "ssu":
        return ssu.run(call, sources)
    if op == "ssd":
        return ssd.run(call, sources)
    if op == "replay":
        return replay.run(call, sources)
    if op == "materialize":
        return replay.materialize_replayed_state(call), None
    if op == "materialize_layers":
        return replay.materialize_replayed_layers(call), None
    if op == "norm":
        return norm.run(call, sources)
    if op == "conv1d_fn":
        return conv1d.run_fn(call, sources)
    if op == "conv1d_update":
        return conv1d.run_update(call, sources)
    if op == "decode_step":
        return decode_step.run(call, sources)
    raise ValueError(f"op: expected ssu, ssd, replay, materialize, materialize_layers, norm, conv1d_fn, "
                     f"conv1d_update or decode_step, got {op!r}")  # fmt: skip


def plan(op: str, call) -> tuple:
    """The kernel specs a normalised call launches, in launch order (the SSU: one, or none for a call with nothing
    to run; the ReplaySSM: the fused kernel, or the table design's table and rows kernels; the SSD: the dt pre-pass,
    then the scan, with the split design's state pass and hand-over between them, and a quantised pool's
    conversions)."""
    if op == "ssd":
        return ssd_plan.plan(call, hardware(call.x.device)).specs()
    if op == "norm":
        planned = norm_plan.plan(call)
        return () if planned is None else (planned[0],)
    if op in ("conv1d_fn", "conv1d_update"):
        planned = (conv1d_plan.plan_fn if op == "conv1d_fn" else conv1d_plan.plan_update)(call)
        return () if planned is None else (planned[0],)
    if op == "materialize_layers":
        return (replay_plan.plan_materialize_layers(call)[0],)
    if op == "materialize":
        planned = replay_plan.plan_materialize(call)
        return () if planned is None else (planned[0],)
    if op == "decode_step":
        return decode_step_plan.plan(call)
    if op == "replay":
        planned = replay_plan.plan(call)
        return () if planned is None else tuple(spec for spec, _ in planned)
    planned = ssu_plan.plan(call)
    return () if planned is None else (planned[0],)


def prewarm(op: str, device, config: dict) -> None:
    """Compile (without launching) every kernel one serving configuration of ``op`` uses on ``device``."""
    prewarms = {"ssu": ssu.prewarm, "ssd": ssd.prewarm, "replay": replay.prewarm, "norm": norm.prewarm,
                "conv1d": conv1d.prewarm, "decode_step": decode_step.prewarm}  # fmt: skip
    prewarms[op](device, **config)


__all__ = ["plan", "prewarm", "run"]
