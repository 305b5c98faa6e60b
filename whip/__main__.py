"""``python -m whip``."""

import sys

from whip.cli import main

sys.exit(main())
