"""``python -m mate.mamba``: the ``mate-mamba`` command line."""

import sys

from mate.mamba.cli import main

sys.exit(main())
