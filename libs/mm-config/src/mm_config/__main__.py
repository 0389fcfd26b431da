"""``python -m mm_config check CONFIG ...``."""

import sys

from .cli import main

sys.exit(main())
