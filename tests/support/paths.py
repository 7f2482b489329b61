"""Where the repository's parts are, for tests that read files or start processes."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
"""``tests/``: on the path of a child process that imports a helper of this package."""
ROOT = TESTS.parent
SRC = ROOT / "src"
BENCHMARKS = ROOT / "benchmarks"
