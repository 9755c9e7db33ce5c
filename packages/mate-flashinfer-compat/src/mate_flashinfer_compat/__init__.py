"""MATE behind FlashInfer's ``flashinfer.mamba`` import surface.

``import flashinfer.mamba`` resolves to :mod:`mate_flashinfer_compat.mamba` through an import alias (see
:mod:`mate_flashinfer_compat._alias`), never through files that would overwrite a real FlashInfer. The
names are importable from here too. Importing this package is cheap: torch and MATE load on first use.

``MATE_FLASHINFER_COMPAT`` chooses: ``auto`` (default) provides ``flashinfer.mamba`` only where no real
FlashInfer is installed, and warns once when one is; ``force`` routes ``flashinfer.mamba`` to MATE even beside a
real FlashInfer (the rest of FlashInfer stays FlashInfer's); ``off`` never aliases.
"""

from __future__ import annotations

from ._alias import alias_status, install, install_from_env, uninstall

__version__ = "0.1.0"
_LAZY = ("selective_state_update", "ssd_combined_fwd_varlen", "mamba_chunk_scan_combined_varlen")

install_from_env()


def __getattr__(name):
    if name in _LAZY:
        from . import mamba

        return getattr(mamba, name)
    raise AttributeError(f"module 'mate_flashinfer_compat' has no attribute {name!r}")


__all__ = [*_LAZY, "alias_status", "install", "install_from_env", "uninstall"]
