"""What the SSD prefill kernels (:mod:`.ssd_dt`, :mod:`.ssd_scan`, :mod:`.ssd_split`) agree on: the layout of the
per-tile records the dt pre-pass writes and the others read, and the tiling every tile-walking kernel accepts."""

LOG2E = 1.4426950408889634
# Rows per (tile, head) of the pre-pass output ``dtA``: 0 the inclusive cumsum of ``A dt'`` times log2(e) (so the
# scan's decays are ``exp2`` of differences), 1 ``dt'``, 2 ``exp(dA_last - dA_k) dt'_k`` (token k's end-state
# weight), 3 ``exp(dA_m)`` (the decay of the entering state at row m).
DT_ROWS = 4
# Per-tile record ``tmeta`` (first token, valid tokens, the sequence the tile opens or -1; then a 0): padded
# to 128 bytes because a TMA load's shared-memory destination (one per pipeline stage) must be 128-byte aligned.
META_WIDTH = 32


def check_tiling(*, heads: int, groups: int, dim: int, chunk_size: int, block_P: int, block_L: int) -> None:
    """ValueError naming the argument where the heads, the P block or the token tile cannot tile the shape."""
    if heads % groups:
        raise ValueError(f"heads ({heads}) must be a multiple of groups ({groups})")
    if dim % block_P:
        raise ValueError(f"block_P ({block_P}) must divide dim ({dim})")
    if chunk_size % block_L:
        raise ValueError(f"block_L ({block_L}) must divide chunk_size ({chunk_size})")
    if block_P % 16:
        raise ValueError(f"block_P ({block_P}) must be a multiple of 16")
