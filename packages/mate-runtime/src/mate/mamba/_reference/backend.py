"""The reference backend's entry point (``mate.mamba._dispatch`` calls it): every op in plain PyTorch. It leaves no
fast-path launcher: it checks the index tables' values on every call."""

from __future__ import annotations

from mate.mamba._reference import norm, replay, ssd, ssu


def run(op: str, call, sources: dict | None = None):
    """``(result, None)`` of a normalised call."""
    if op == "ssu":
        return ssu.selective_state_update(call), None
    if op == "ssd":
        return ssd.ssd_combined_fwd_varlen(call), None
    if op == "replay":
        return replay.replay_state_update(call), None
    if op == "materialize":
        return replay.materialize_replayed_state(call), None
    if op == "norm":
        return norm.rms_norm_gated(call), None
    raise ValueError(f"op: expected ssu, ssd, replay, materialize or norm, got {op!r}")


__all__ = ["run"]
