"""Policies and policy maps that tests name as ``module:attr`` (importable in Ray's workers,
which import them by name)."""

from __future__ import annotations

from typing import Any

import numpy as np


def first_legal(obs: Any, mask: Any, rng: np.random.Generator) -> np.ndarray:
    """A :data:`~corral.algos.base.FixedPolicy`: each agent's first legal action."""
    return np.asarray(mask).argmax(-1)


def seats(agent: str, episode: int) -> str:
    """A policy map of tic-tac-toe: ``learner`` moves first in even episodes, second in odd
    ones; ``opponent`` plays the other seat."""
    return "learner" if agent == f"player_{episode % 2 + 1}" else "opponent"
