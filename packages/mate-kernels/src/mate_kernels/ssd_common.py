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


MN_TAILS = (16, 32)  # tail widths whose MN-major tiles TileLang 0.1.15 lays out for wgmma (32- and 64-byte swizzle)


def p_parts(block_P: int) -> tuple[int, int]:
    """The P block of the MN-major tiling as ``(main, tail)``: a main part of a multiple of 64 columns and a tail
    of 0, 16 or 32 (80 = 64 + 16, 96 = 64 + 32). TileLang 0.1.15 lays out an MN-major wgmma operand canonically
    only where its width is one swizzle atom or a multiple of the 128-byte one, so an 80-wide tile is two GEMM
    operands; ValueError for a block with no such split (e.g. 112 = 64 + 48: the K-major tiling serves it)."""
    main, tail = block_P - block_P % 64, block_P % 64
    if main == 0 or tail not in (0, *MN_TAILS):
        raise ValueError(f"block_P ({block_P}) is not a multiple of 64 plus a tail of 0, 16 or 32")
    return main, tail
