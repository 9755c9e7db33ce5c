"""The reference backend's entry point (``mate.mamba._dispatch`` calls it): every op in plain PyTorch. It leaves no
fast-path launcher: it checks the index tables' values on every call."""

from __future__ import annotations

from mate.mamba._reference import conv1d, decode_step, norm, replay, ssd, ssu


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
    if op == "materialize_layers":
        return replay.materialize_replayed_layers(call), None
    if op == "norm":
        return norm.rms_norm_gated(call), None
    if op == "conv1d_fn":
        return conv1d.causal_conv1d_fn(call), None
    if op == "conv1d_update":
        return conv1d.causal_conv1d_update(call), None
    if op == "decode_step":
        return decode_step.mamba2_decode_step(call), None
    raise ValueError(f"op: expected ssu, ssd, replay, materialize, materialize_layers, norm, conv1d_fn, "
                     f"conv1d_update or decode_step, got {op!r}")  # fmt: skip


__all__ = ["run"]
