"""A custom corral env: two players take turns removing sticks; whoever takes the last one wins.

Run it from the repository root:

    python examples/custom_env.py

It registers the env as ``mine/nim-v0``, plays one episode with random legal
actions, and runs the conformance checker on it. ``docs/custom_env.md`` walks
through this file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

import corral
from corral.env import MultiAgentEnv, validate_actions


class Nim(MultiAgentEnv):
    """Turn-based Nim: take 1 to ``max_take`` sticks from one pile; taking the last one wins.

    Observation: the number of sticks left. Action ``a`` takes ``a + 1`` sticks;
    ``infos[agent]["action_mask"]`` forbids taking more sticks than are left.
    The winner gets +1 and the loser -1 at the last step. Who moves first is
    drawn at random at reset, from the seed.
    """

    # zero_sum: the two players' returns sum to 0 (self-play and eval_vs_opponent read it)
    metadata = {"render_modes": ["ansi"], "name": "nim_v0", "zero_sum": True}

    def __init__(self, sticks: int = 10, max_take: int = 3, render_mode: str | None = None):
        self.sticks = sticks
        self.max_take = max_take
        self.render_mode = render_mode
        self.possible_agents = ["player_0", "player_1"]
        self.agents = []
        self._obs_space = spaces.Discrete(sticks + 1)
        self._action_space = spaces.Discrete(max_take)
        self._left = sticks
        self._turn = 0
        self._step = 0
        self._rng = np.random.default_rng()

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_space

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict, dict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._left = self.sticks
        self._turn = int(self._rng.integers(2))
        self._step = 0
        player = self.agents[self._turn]
        return {player: self._left}, {player: {"action_mask": self._mask()}}

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        acting = [self.possible_agents[self._turn]] if self.agents else []
        # Rejects a bad action dict before any state changes, so the env stays usable.
        masks = {agent: self._mask() for agent in acting}
        validate_actions(actions, acting, self.action_space, masks, self._step)
        player = acting[0]
        self._left -= int(actions[player]) + 1
        self._step += 1

        done = self._left == 0
        rewards = {agent: 0.0 for agent in self.agents}
        if done:
            rewards[player] = 1.0
            rewards[self.possible_agents[1 - self._turn]] = -1.0
        terminations = {agent: done for agent in self.agents}
        truncations = {agent: False for agent in self.agents}
        if done:
            infos = {agent: {"final_obs": self._left} for agent in self.agents}
            self.agents = []
            return {}, rewards, terminations, truncations, infos

        self._turn = 1 - self._turn
        player = self.possible_agents[self._turn]
        obs = {player: self._left}
        infos = {player: {"action_mask": self._mask()}}
        return obs, rewards, terminations, truncations, infos

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return f"{'|' * self._left} ({self._left} left)"

    def _mask(self) -> np.ndarray:
        return (np.arange(1, self.max_take + 1) <= self._left).astype(np.int8)


def main() -> None:
    corral.register("mine/nim-v0", Nim, sticks=10)

    env = corral.make("mine/nim-v0", max_take=2)
    obs, infos = env.reset(seed=0)
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(i)  # the random moves below: the same in every run
    returns = dict.fromkeys(env.possible_agents, 0.0)
    while env.agents:
        actions = {a: env.action_space(a).sample(mask=infos[a].get("action_mask")) for a in obs}
        obs, rewards, _, _, infos = env.step(actions)
        for agent, reward in rewards.items():
            returns[agent] += reward
    print("returns:", returns)

    print(corral.check_env("mine/nim-v0"))


if __name__ == "__main__":
    main()
