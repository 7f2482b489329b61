"""The collector's evaluation (corral.training.collector.evaluate): each env plays its share
of the episodes, so that episodes that end early are not favoured."""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

import corral
from corral.algos.policy import Policy
from corral.env import MultiAgentEnv
from corral.training.collector import evaluate
from corral.training.policy_map import FixedPlayer
from corral.training.whole_episodes import episode_quota


class Uneven(MultiAgentEnv):
    """One agent; each episode lasts 1 or 9 steps (drawn at reset) and scores its length."""

    possible_agents = ["a"]
    simultaneous = True

    def __init__(self) -> None:
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(0, 9, (1,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t, self.length = ["a"], 0, int(self.rng.choice([1, 9]))
        return {"a": np.zeros(1, np.float32)}, {}

    def step(self, actions: dict) -> tuple:
        self.t += 1
        ended = self.t >= self.length
        if ended:
            self.agents = []
        obs = {"a": np.full(1, self.t, np.float32)}
        return obs, {"a": 1.0}, {"a": ended}, {"a": False}, {}


class Still(Policy):
    def act(self, batch: Any, *, explore: bool = True, decisions: Any = None) -> tuple:
        return {"a": np.zeros(batch.acting["a"].shape, dtype=np.int64)}, {}


def first_returns(venv: Any, quota: np.ndarray, seed: int) -> list[float]:
    """The reference: each env's first ``quota`` episodes, played out env by env."""
    batch, found = venv.reset(seed=seed), [[] for _ in range(venv.num_envs)]
    while any(len(f) < q for f, q in zip(found, quota, strict=True)):
        batch = venv.step({"a": np.zeros((venv.num_envs, 1), np.int64)})
        for e in np.flatnonzero(batch.done):
            found[e].append(float(batch.episode_return["a"][e, 0]))
    return sorted(r for f, q in zip(found, quota, strict=True) for r in f[:q])


def test_an_evaluation_plays_each_env_s_share_not_the_episodes_that_end_first() -> None:
    venv = corral.VectorEnv([Uneven] * 16)
    try:
        still = {"still": FixedPlayer(Still(venv.groups), {"a": np.ones(1, dtype=bool)})}
        for episodes in (6, 16, 40):
            quota = episode_quota(episodes, 16)
            assert quota.sum() == episodes and quota.max() - quota.min() <= 1
            played = evaluate(venv, {}, episodes, still, seed=3)
            expected = first_returns(venv, quota, seed=3)
            assert 9.0 in expected and 1.0 in expected  # both lengths, or the test is void
            assert sorted(played.episode_returns) == expected
            assert sorted(played.episode_lengths) == [int(r) for r in expected]
    finally:
        venv.close()
