"""MATE behind FlashInfer's ``flashinfer.mamba`` import surface.

:mod:`mate_flashinfer_compat.mamba` is a package shaped like FlashInfer 0.7.2's ``flashinfer.mamba``, holding
the functions MATE serves (``selective_state_update``). ``MATE_FLASHINFER_COMPAT`` decides where else they
appear (see :mod:`mate_flashinfer_compat._alias`): ``auto`` (default) serves them inside a real FlashInfer's
``flashinfer.mamba`` and creates no ``flashinfer`` module without one; ``alias`` also provides a
``flashinfer`` package with only ``flashinfer.mamba`` where no real FlashInfer is installed; ``off`` never
touches ``flashinfer``. :func:`status` says where each name resolves.

:mod:`mate_flashinfer_compat.prefill` has the packed SSD prefill under ``mate.mamba``'s and vLLM's names (not
FlashInfer API). Importing this package is cheap: torch and MATE load on first use.
"""

from __future__ import annotations

from ._alias import install, install_from_env, status, uninstall

__version__ = "0.1.0"
_LAZY = {
    "selective_state_update": "mamba",
    "ssd_combined_fwd_varlen": "prefill",
    "mamba_chunk_scan_combined_varlen": "prefill",
}

install_from_env()


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'mate_flashinfer_compat' has no attribute {name!r}")


__all__ = [*_LAZY, "install", "install_from_env", "status", "uninstall"]
