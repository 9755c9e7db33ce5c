"""Which kernels a call runs: the TileLang planners' answer for a call, without running it.

``plan_selective_state_update(...)``, ``plan_ssd_combined_fwd_varlen(...)`` and ``plan_replay_state_update(...)``
take exactly the arguments of the op they describe, validate them as the op does (the same ``ValueError`` /
``NotImplementedError``), and return the kernel specs the TileLang backend would launch, in launch order. A spec is
a frozen record of one kernel factory's arguments (``print(spec)`` shows them); it is also the compiled-kernel cache
key, so two calls with equal specs share one compiled kernel. Nothing is compiled or launched, and TileLang need not
be installed.

Tensors on a GPU are planned for that device; tensors anywhere else (CPU, ``meta``) are planned as for an H200
(compute capability 9.0, 132 SMs), the choices that depend on the device being the small-grid one-token SSU
kernel, programmatic dependent launch (``MATE_SSU_PDL=auto``) and the SSD's sequences per CTA.
"""

from __future__ import annotations

from mate.mamba._contract.conv1d import normalize_conv1d_fn, normalize_conv1d_update
from mate.mamba._contract.decode_step import normalize_decode_step
from mate.mamba._contract.norm import normalize_norm
from mate.mamba._contract.replay import normalize_replay
from mate.mamba._contract.ssd import normalize_ssd
from mate.mamba._contract.ssu import normalize_ssu
from mate.mamba._dispatch import plan


def plan_selective_state_update(*args, backend: str = "auto", **kwargs) -> tuple:
    """The kernel specs ``selective_state_update(*args, **kwargs)`` launches on the TileLang backend (one, or
    none for a call with nothing to run). Nothing is written to the arguments."""
    del backend  # the TileLang backend's plan whatever the call would pick
    return plan("ssu", normalize_ssu(*args, **kwargs))


def plan_ssd_combined_fwd_varlen(*args, backend: str = "auto", **kwargs) -> tuple:
    """The kernel specs ``ssd_combined_fwd_varlen(*args, **kwargs)`` launches on the TileLang backend, in order:
    the dt pre-pass, then the chunk scan (which also reads ``bounds[::seqs_per_cta]``, a launch-time choice that is
    the same compiled kernel for every value); with the split design (few heads per rank on long sequences) the
    scan over even runs of chunks, then the hand-over and the fix-up."""
    del backend
    return plan("ssd", normalize_ssd(*args, **kwargs))


def plan_replay_state_update(*args, backend: str = "auto", **kwargs) -> tuple:
    """The kernel specs ``replay_state_update(*args, **kwargs)`` launches on the TileLang backend (one, or none for
    a call with nothing to run). Nothing is written to the arguments."""
    del backend
    return plan("replay", normalize_replay(*args, **kwargs))


def plan_rms_norm_gated(*args, backend: str = "auto", **kwargs) -> tuple:
    """The kernel spec ``rms_norm_gated(*args, **kwargs)`` launches on the TileLang backend (one, or none for a
    call with no rows). Nothing is written to the arguments."""
    del backend
    return plan("norm", normalize_norm(*args, **kwargs))


def plan_causal_conv1d_fn(*args, backend: str = "auto", metadata=None, validate_data: bool = False, **kwargs):
    """The kernel spec ``causal_conv1d_fn(*args, **kwargs)`` launches on the TileLang backend (one, or none for a
    call without tokens). Nothing is written to the arguments."""
    del backend, metadata, validate_data
    return plan("conv1d_fn", normalize_conv1d_fn(*args, **kwargs))


def plan_causal_conv1d_update(*args, backend: str = "auto", validate_data: bool = False, **kwargs):
    """The kernel spec ``causal_conv1d_update(*args, **kwargs)`` launches on the TileLang backend (one, or none for
    a call without sequences). Nothing is written to the arguments."""
    del backend, validate_data
    return plan("conv1d_update", normalize_conv1d_update(*args, **kwargs))


def plan_mamba2_decode_step(*args, backend: str = "auto", **kwargs) -> tuple:
    """The kernel spec ``mamba2_decode_step(*args, **kwargs)`` launches on the TileLang backend (one, or none for a
    call without sequences). Nothing is written to the arguments."""
    del backend
    return plan("decode_step", normalize_decode_step(*args, **kwargs))


__all__ = ["plan_selective_state_update", "plan_ssd_combined_fwd_varlen", "plan_replay_state_update",
           "plan_rms_norm_gated", "plan_causal_conv1d_fn", "plan_causal_conv1d_update"]  # fmt: skip
__all__ += ["plan_mamba2_decode_step"]
