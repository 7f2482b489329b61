"""Ray actors in tests: the path their processes import test helpers from, and whether a
run left any actor behind."""

from __future__ import annotations

import os
import time
from typing import Any

from support import paths


def runtime_env_for_tests() -> dict[str, Any]:
    """A ``runtime_env`` for ``ray.init`` whose workers import ``support`` (and corral from
    this checkout) as the test process does."""
    path = [str(paths.TESTS), str(paths.SRC), os.environ.get("PYTHONPATH", "")]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in path if p)}}


def all_cpus_free_within(ray: Any, seconds: float) -> bool:
    """Whether every CPU of the Ray that ``ray`` joined is free within ``seconds`` (no actor
    of a run holds one)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ray.available_resources().get("CPU", 0) == ray.cluster_resources().get("CPU", 0):
            return True
        time.sleep(0.2)
    return False
