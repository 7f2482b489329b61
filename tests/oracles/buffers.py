"""Rollout storage of per-agent transitions, and GAE over each agent's own decisions, row by
row: the oracle of :func:`corral.data.rollouts.masked_gae`.

A buffer stores whatever fields the transitions carry (``obs``, ``action``,
``reward``, ``state``, ``action_mask``, a policy's ``log_prob``...). The
replay memory of the off-policy learners is :class:`corral.data.replay.Replay`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from oracles.transitions import Transitions


class RolloutBuffer:
    """On-policy storage: transitions in the order they completed, until ``clear()``."""

    def __init__(self) -> None:
        self._chunks: list[Transitions] = []
        self._size = 0

    def add(self, t: Transitions) -> None:
        self._chunks.append(t)
        self._size += len(t["reward"])

    def __len__(self) -> int:
        return self._size

    def data(self) -> Transitions:
        """Every stored field as one array, rows in completion order."""
        if not self._chunks:
            return {}
        names = self._chunks[0].keys()
        return {name: np.concatenate([c[name] for c in self._chunks]) for name in names}

    def clear(self) -> None:
        self._chunks.clear()
        self._size = 0


def gae(
    t: Mapping[str, np.ndarray],
    value: np.ndarray,
    next_value: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns by GAE over each agent's own decision sequence.

    Rows of ``t`` are transitions in completion order; those of one agent in
    one env (``t["env"]``, ``t["agent"]``) form its sequence, one decision per
    row, discounted by ``gamma`` per decision. ``next_value`` is the value of
    each row's ``next_obs`` (or ``next_state``): it bootstraps truncated
    episodes and the end of the rollout; terminated rows bootstrap nothing.
    """
    reward = t["reward"].astype(np.float64)
    terminated = t["terminated"].astype(bool)
    ended = terminated | t["truncated"].astype(bool)
    delta = reward + gamma * np.where(terminated, 0.0, next_value) - value
    advantage = np.zeros_like(delta)
    later: dict[tuple[int, int], float] = {}  # the advantage of each sequence's next row
    for k in range(len(delta) - 1, -1, -1):
        key = (int(t["env"][k]), int(t["agent"][k]))
        carry = 0.0 if ended[k] else later.get(key, 0.0)
        advantage[k] = delta[k] + gamma * lam * carry
        later[key] = advantage[k]
    return advantage, advantage + value
