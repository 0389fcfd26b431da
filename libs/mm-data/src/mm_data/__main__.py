"""``python -m mm_data``: the ``mm-data`` command line."""

import sys

from .cli import main

sys.exit(main())
