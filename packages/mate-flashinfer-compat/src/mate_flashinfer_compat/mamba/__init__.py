"""MATE's ``flashinfer.mamba``: a package shaped like FlashInfer 0.7.2's, holding the functions MATE serves.

As in FlashInfer's, the package attributes ``selective_state_update``, ``checkpointing_ssu`` and
``replayssm_materialize`` are functions that shadow the submodules of the same names
(:mod:`mate_flashinfer_compat.mamba.selective_state_update`, :mod:`mate_flashinfer_compat.mamba.checkpointing_ssu`
and :mod:`mate_flashinfer_compat.mamba.replayssm_materialize`, which define them). Code written against FlashInfer
imports them from here where no real FlashInfer is installed (``MATE_FLASHINFER_COMPAT=alias`` also makes this
package ``flashinfer.mamba``); beside a real FlashInfer, the default ``auto`` puts :data:`SERVED` into
FlashInfer's own ``flashinfer.mamba`` instead, and :data:`STANDALONE` (the ReplaySSM names) stay FlashInfer's.

:data:`NOT_SERVED` names FlashInfer 0.7.2's other ``flashinfer.mamba`` functions, which MATE does not implement;
asking for one raises ``AttributeError`` saying so.
"""

from __future__ import annotations

from .._names import NOT_SERVED as NOT_SERVED
from .._names import SERVED as SERVED
from .._names import STANDALONE as STANDALONE
from .._names import SUBMODULES as SUBMODULES
from .._names import not_served_message
from .checkpointing_ssu import allocate_checkpointing_ssu_scratch, checkpointing_ssu
from .replayssm_materialize import replayssm_materialize
from .selective_state_update import selective_state_update


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    raise AttributeError(not_served_message(f"{__name__}.{name}"))


__all__ = ["selective_state_update", "checkpointing_ssu", "allocate_checkpointing_ssu_scratch", "replayssm_materialize"]
