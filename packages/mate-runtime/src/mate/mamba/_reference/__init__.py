"""The reference backend: every op in plain PyTorch, on any device, consuming the same normalised calls as the
TileLang backend (``mate.mamba._tilelang``)."""
