"""``python -m corral``: the same command line as ``corral``."""

import sys

from corral.cli import main

sys.exit(main())
