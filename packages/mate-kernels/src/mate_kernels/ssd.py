"""TileLang kernel factories for the SSD varlen prefill (Mamba2 chunked scan over a packed batch): the public
names. Two kernels serve one call, in this order:

:func:`ssd_dt_kernel` (:mod:`.ssd_dt`)
    the dt pre-pass: every tile's ``dt'``, its cumsum and decay rows and its record, and the runs table (the
    chunks each CTA of the scan walks, and the state row each chunk end is written to);
:func:`ssd_fused_kernel` (:mod:`.ssd_scan`)
    the chunk scan: one CTA per (P block, head, run) walks its chunks with the state in registers and fuses the
    five stages of the contract per tile of ``block_L`` tokens; :func:`fused_smem_bytes` is its shared memory, to
    pick the tile.

With the split design (:mod:`.ssd_split`: a sequence's chunks over several scan CTAs) two more run between the
pre-pass and the scan: :func:`ssd_run_states_kernel` (each run's end state from the state recurrence alone) and
:func:`ssd_combine_kernel` (the hand-over of the fp32 states across the runs).

:mod:`.ssd_common` holds what they agree on (the pre-pass output's layout, the tiling, the P block's parts).
"""

from .ssd_common import DT_ROWS, LOG2E, META_WIDTH, p_parts
from .ssd_dt import dt_prime, ssd_dt_kernel
from .ssd_scan import FLAG_INIT, FLAG_Z, THREADS, fused_smem_bytes, ssd_fused_kernel
from .ssd_split import SPLIT_OPENED, ssd_combine_kernel, ssd_run_states_kernel, states_smem_bytes

__all__ = [
    "DT_ROWS",
    "FLAG_INIT",
    "FLAG_Z",
    "LOG2E",
    "META_WIDTH",
    "SPLIT_OPENED",
    "THREADS",
    "dt_prime",
    "ssd_combine_kernel",
    "ssd_run_states_kernel",
    "states_smem_bytes",
    "fused_smem_bytes",
    "p_parts",
    "ssd_dt_kernel",
    "ssd_fused_kernel",
]
