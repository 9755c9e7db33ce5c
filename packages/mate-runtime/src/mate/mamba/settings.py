"""MATE's settings, for users and adapters: every environment variable MATE reads, typed and read once
(``get``), changed within a block by ``override(NAME="value")``, listed by ``mate-mamba info``.

The table itself lives below every layer (:mod:`mate.mamba._platform.settings`, standard library only), where
the backends read it; this is its public face.
"""

from mate.mamba._platform import settings as _table
from mate.mamba._platform.settings import *  # noqa: F403  (the table's public names, __all__ below)

__all__ = _table.__all__
