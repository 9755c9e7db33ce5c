"""MATE for SGLang: SGLang's Mamba2 op signatures (:mod:`mate_sglang.ops`) and the hook that registers MATE in
SGLang's SSU backend registry (:mod:`mate_sglang.hook`, armed by ``MATE_SGLANG_ENABLE=1``).

Importing this package imports neither SGLang nor torch; the ops load MATE on first use.
"""

from __future__ import annotations

__version__ = "0.1.0"
_LAZY = ("selective_state_update", "mamba_chunk_scan_combined")


def __getattr__(name):
    if name in _LAZY:
        from . import ops

        return getattr(ops, name)
    raise AttributeError(f"module 'mate_sglang' has no attribute {name!r}")


__all__ = list(_LAZY)
