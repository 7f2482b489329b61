"""``python -m corral``: the corral command line."""

from corral.cli import main

raise SystemExit(main())
