"""A learner in one seat of a game, played by stepping the vector env directly: the loop that
:func:`corral.training.selfplay_eval.play_against` ran before it played through the one
collector, kept as its oracle."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.training.whole_episodes import whole_ended


def play_against_directly(
    learner: Any, venv: Any, games: int, seat: str, opponent: Any = None, *, seed: int = 0
) -> list[float]:
    """``play_against``'s returns of ``learner`` in ``seat`` (no fault counting)."""
    g, j = next((g, agents.index(seat)) for g, agents in venv.groups.items() if seat in agents)
    num_envs = venv.num_envs
    quota = games // num_envs + (np.arange(num_envs) < games % num_envs)
    rng = np.random.default_rng(seed)
    returns: list[float] = []
    played = np.zeros(num_envs, dtype=np.int64)
    batch = venv.reset(seed=seed)
    while (played < quota).any():
        actions = venv.sample_actions(batch, rng)
        if opponent is not None:
            theirs, _ = opponent.act(batch, explore=False)
            actions.update({group: np.array(a) for group, a in theirs.items()})
        mine, _ = learner.act(batch, explore=False)
        actions[g][:, j] = mine[g][:, j]
        batch = venv.step(actions)
        counted = whole_ended(batch) & (played < quota)
        returns.extend(batch.episode_return[g][counted, j].tolist())
        played += counted
    return returns
