"""``mate.mamba``: Mamba2 selective state update (decode), ReplaySSM decode, packed SSD prefill, causal conv1d and
gated RMSNorm, and a Mamba2 layer's fused decode step.

The Mamba module of MATE. It ships no ``mate/__init__.py``: beside Moore Threads' MATE it is that package's
``mate.mamba``; alone, ``mate`` is a namespace package. Importing it never imports TileLang: kernels are
compiled lazily on CUDA/MUSA devices, and the pure-PyTorch reference serves every other device.

Layers, top to bottom (calls only go down): the public functions here -> the custom ops (``_ops``) -> the
dispatcher (``_dispatch``: run, prewarm, plan) -> the backends (``_reference``, ``_tilelang``) -> the call
contract (``_contract``: validation, canonical calls, dtype tables) and the kernel factories (``mate_kernels``).

The public names load on first use: the adapters' start-up hooks (``.pth`` lines, run in every interpreter of an
environment) import ``mate.mamba.settings`` and ``mate.mamba.adapters``, which must cost no torch import. Nothing
below imports this package's names (``tests/test_layers.py`` checks the graph as if they loaded eagerly).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mate.mamba._platform.version import __version__  # noqa: F401  (mate.mamba.__version__)

# public name -> the submodule defining it
_PUBLIC = {
    "advance_replay_ring": "replay",
    "causal_conv1d_fn": "conv1d",
    "causal_conv1d_update": "conv1d",
    "mamba2_decode_step": "decode_step",
    "materialize_replayed_layers": "replay",
    "materialize_replayed_state": "replay",
    "plan_causal_conv1d_fn": "planning",
    "plan_causal_conv1d_update": "planning",
    "plan_mamba2_decode_step": "planning",
    "plan_replay_state_update": "planning",
    "plan_rms_norm_gated": "planning",
    "plan_selective_state_update": "planning",
    "plan_ssd_combined_fwd_varlen": "planning",
    "prewarm_causal_conv1d": "conv1d",
    "prewarm_mamba2_decode_step": "decode_step",
    "prewarm_replay_state_update": "replay",
    "prewarm_rms_norm_gated": "norm",
    "prewarm_selective_state_update": "ssu",
    "prewarm_ssd_combined_fwd_varlen": "ssd",
    "replay_state_update": "replay",
    "rms_norm_gated": "norm",
    "selective_state_update": "ssu",
    "ssd_combined_fwd_varlen": "ssd",
}

if TYPE_CHECKING:  # what type checkers and IDEs see
    from mate.mamba.conv1d import causal_conv1d_fn, causal_conv1d_update, prewarm_causal_conv1d
    from mate.mamba.decode_step import mamba2_decode_step, prewarm_mamba2_decode_step
    from mate.mamba.norm import prewarm_rms_norm_gated, rms_norm_gated
    from mate.mamba.planning import (
        plan_causal_conv1d_fn,
        plan_causal_conv1d_update,
        plan_mamba2_decode_step,
        plan_replay_state_update,
        plan_rms_norm_gated,
        plan_selective_state_update,
        plan_ssd_combined_fwd_varlen,
    )
    from mate.mamba.replay import (
        advance_replay_ring,
        materialize_replayed_layers,
        materialize_replayed_state,
        prewarm_replay_state_update,
        replay_state_update,
    )
    from mate.mamba.ssd import prewarm_ssd_combined_fwd_varlen, ssd_combined_fwd_varlen
    from mate.mamba.ssu import prewarm_selective_state_update, selective_state_update


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'mate.mamba' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"mate.mamba.{module}"), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


__all__ = [  # = _PUBLIC's names
    "advance_replay_ring",
    "causal_conv1d_fn",
    "causal_conv1d_update",
    "mamba2_decode_step",
    "materialize_replayed_layers",
    "materialize_replayed_state",
    "plan_causal_conv1d_fn",
    "plan_causal_conv1d_update",
    "plan_mamba2_decode_step",
    "plan_replay_state_update",
    "plan_rms_norm_gated",
    "plan_selective_state_update",
    "plan_ssd_combined_fwd_varlen",
    "prewarm_causal_conv1d",
    "prewarm_mamba2_decode_step",
    "prewarm_replay_state_update",
    "prewarm_rms_norm_gated",
    "prewarm_selective_state_update",
    "prewarm_ssd_combined_fwd_varlen",
    "replay_state_update",
    "rms_norm_gated",
    "selective_state_update",
    "ssd_combined_fwd_varlen",
]
