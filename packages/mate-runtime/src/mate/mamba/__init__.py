"""``mate.mamba``: Mamba2 selective state update (decode), ReplaySSM decode and packed SSD prefill.

The Mamba module of MATE. It ships no ``mate/__init__.py``: beside Moore Threads' MATE it is that package's
``mate.mamba``; alone, ``mate`` is a namespace package. Importing it never imports TileLang: kernels are
compiled lazily on CUDA/MUSA devices, and the pure-PyTorch reference serves every other device.

Layers, top to bottom (calls only go down): the public functions here -> the custom ops (``_ops``) -> the
dispatcher (``_dispatch``: run, prewarm, plan) -> the backends (``_reference``, ``_tilelang``) -> the call
contract (``_contract``: validation, canonical calls, dtype tables) and the kernel factories (``mate_kernels``).
"""

from __future__ import annotations

from mate.mamba._version import __version__
from mate.mamba.planning import plan_replay_state_update, plan_selective_state_update, plan_ssd_combined_fwd_varlen
from mate.mamba.replay import (
    advance_replay_ring,
    materialize_replayed_state,
    prewarm_replay_state_update,
    replay_state_update,
)
from mate.mamba.ssd import prewarm_ssd_combined_fwd_varlen, ssd_combined_fwd_varlen
from mate.mamba.ssu import prewarm_selective_state_update, selective_state_update

__all__ = [
    "__version__",
    "advance_replay_ring",
    "materialize_replayed_state",
    "plan_selective_state_update",
    "plan_ssd_combined_fwd_varlen",
    "plan_replay_state_update",
    "prewarm_replay_state_update",
    "prewarm_selective_state_update",
    "prewarm_ssd_combined_fwd_varlen",
    "replay_state_update",
    "selective_state_update",
    "ssd_combined_fwd_varlen",
]
