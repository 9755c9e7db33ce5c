"""TileLang kernel factories for MATE (configuration in, ``T.prim_func`` out).

Modules import TileLang when a factory is called, so this package imports without TileLang.
"""

__version__ = "0.1.0"
