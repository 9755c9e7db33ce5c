"""``python -m mate``: the ``mate`` command line."""

import sys

from .cli import main

sys.exit(main())
