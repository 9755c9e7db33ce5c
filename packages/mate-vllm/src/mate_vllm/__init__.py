"""MATE for vLLM: vLLM's native Mamba2 op signatures (:mod:`mate_vllm.ops`) and the vLLM plugin
(:mod:`mate_vllm.plugin`, entry point group ``vllm.general_plugins``, enabled by ``MATE_VLLM_ENABLE=1``).

Importing this package imports neither vLLM nor torch; the ops load MATE on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"
_LAZY = ("selective_state_update", "mamba_chunk_scan_combined_varlen")


def __getattr__(name):
    if name in _LAZY:
        from . import ops

        return getattr(ops, name)
    raise AttributeError(f"module 'mate_vllm' has no attribute {name!r}")


__all__ = list(_LAZY)
