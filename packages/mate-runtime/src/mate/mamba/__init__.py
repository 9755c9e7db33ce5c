"""``mate.mamba``: Mamba2 selective state update (decode) and packed SSD prefill.

Importing this module never imports TileLang: kernels are compiled lazily on CUDA/MUSA devices, and the
pure-PyTorch reference serves every other device.
"""

from .ssd import prewarm_ssd_combined_fwd_varlen, ssd_combined_fwd_varlen
from .ssu import prewarm_selective_state_update, selective_state_update

__all__ = [
    "prewarm_selective_state_update",
    "prewarm_ssd_combined_fwd_varlen",
    "selective_state_update",
    "ssd_combined_fwd_varlen",
]
