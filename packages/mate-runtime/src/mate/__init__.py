"""MATE: Mamba2 state-space kernels in TileLang (``mate.mamba``)."""

__version__ = "0.1.0"
