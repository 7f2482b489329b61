"""Learning algorithms (PyTorch, the optional ``corral[torch]`` extra).

``ALGORITHMS`` names each algorithm's class; its module (and torch) is
imported only when the algorithm is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from corral.errors import MissingDependencyError

if TYPE_CHECKING:
    from corral.algos.base import Algorithm

ALGORITHMS = {
    "mappo": "corral.algos.mappo:MAPPO",
    "ippo": "corral.algos.mappo:IPPO",
    "maddpg": "corral.algos.maddpg:MADDPG",
    "dqn": "corral.algos.dqn:DQN",
    "vdn": "corral.algos.value_decomposition:VDN",
    "qmix": "corral.algos.value_decomposition:QMIX",
}


def algorithm_class(name: str) -> type[Algorithm]:
    """The algorithm class registered as ``name`` (``"mappo"``, ``"dqn"``...)."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose one of {sorted(ALGORITHMS)}")
    module, _, attr = ALGORITHMS[name].partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError as err:
        if err.name != "torch":
            raise
        raise MissingDependencyError(
            f"algorithm {name!r} needs PyTorch, which is not installed: pip install 'corral[torch]'"
        ) from err
