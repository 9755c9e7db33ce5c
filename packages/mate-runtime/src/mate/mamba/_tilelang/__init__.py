"""The TileLang backend: compiled-kernel cache, per-shape workspaces and the launchers that turn a
normalised call into kernel launches. Imported lazily: nothing here is loaded by ``import mate.mamba``."""
