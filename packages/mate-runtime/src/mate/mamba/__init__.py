"""``mate.mamba``: Mamba2 selective state update (decode), ReplaySSM decode and packed SSD prefill.

Importing this module never imports TileLang: kernels are compiled lazily on CUDA/MUSA devices, and the
pure-PyTorch reference serves every other device.

The names below are loaded on first use. The package also holds layers below its public functions (the
call contract ``_ssu_call`` / ``_ssd_call``, the reference backend ``naive_*``, ``chunking``), which the
dispatch and the TileLang backend import; an eager import of the public functions here would make each of
those imports pull the public API back in, a cycle through this file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# public name -> the submodule defining it
_PUBLIC = {
    "advance_replay_ring": "replay",
    "materialize_replayed_state": "replay",
    "plan_selective_state_update": "planning",
    "plan_ssd_combined_fwd_varlen": "planning",
    "plan_replay_state_update": "planning",
    "prewarm_replay_state_update": "replay",
    "prewarm_selective_state_update": "ssu",
    "prewarm_ssd_combined_fwd_varlen": "ssd",
    "replay_state_update": "replay",
    "selective_state_update": "ssu",
    "ssd_combined_fwd_varlen": "ssd",
}

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time ``__getattr__`` loads them
    from .planning import plan_replay_state_update, plan_selective_state_update, plan_ssd_combined_fwd_varlen
    from .replay import (
        advance_replay_ring,
        materialize_replayed_state,
        prewarm_replay_state_update,
        replay_state_update,
    )
    from .ssd import prewarm_ssd_combined_fwd_varlen, ssd_combined_fwd_varlen
    from .ssu import prewarm_selective_state_update, selective_state_update


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'mate.mamba' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


__all__ = [  # = _PUBLIC's names
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
