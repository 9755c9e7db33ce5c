"""What the two SSD prefill kernels (:mod:`.ssd_dt`, :mod:`.ssd_scan`) agree on: the layout of the per-tile
records the dt pre-pass writes and the chunk scan reads."""

LOG2E = 1.4426950408889634
# Rows per (tile, head) of the pre-pass output ``dtA``: 0 the inclusive cumsum of ``A dt'`` times log2(e) (so the
# scan's decays are ``exp2`` of differences), 1 ``dt'``, 2 ``exp(dA_last - dA_k) dt'_k`` (token k's end-state
# weight), 3 ``exp(dA_m)`` (the decay of the entering state at row m).
DT_ROWS = 4
# Per-tile record ``tmeta`` (first token, valid tokens, the sequence the tile opens or -1; then a 0): padded
# to 128 bytes because a TMA load's shared-memory destination (one per pipeline stage) must be 128-byte aligned.
META_WIDTH = 32
