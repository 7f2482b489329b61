"""``mpe2/simple_reference_v3`` natively batched: two agents that move and talk, each
knowing the landmark the other must reach."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.arrays import to_numpy
from corral.batched_env import Array
from corral.envs.mpe.batched_mpe import BatchedMPE, Draws

# mpe2's landmark colours (fixed); an agent takes the colour of the landmark the other
# agent must send it to.
LANDMARK_COLOURS = np.array([[0.75, 0.25, 0.25], [0.25, 0.75, 0.25], [0.25, 0.25, 0.75]])


class BatchedSimpleReference(BatchedMPE):
    """``num_envs`` copies of mpe2's ``simple_reference_v3`` (see :class:`BatchedMPE`), with
    all its arguments: ``local_ratio``, ``max_cycles``, ``continuous_actions`` and
    ``dynamic_rescaling``.

    :attr:`goals` ``[E, 2]`` holds each agent's goal landmark (``goal_b``): agent ``i``
    is rewarded for the other agent reaching it and sees its colour.
    """

    mpe2_module = "mpe2.simple_reference.simple_reference"

    def setup(self, raw: Any) -> None:
        self.n = n = len(self.possible_agents)
        self.goals = self.place.zeros((self.num_envs, n), np.int64)
        self._rows = self.table(np.arange(self.num_envs)[:, None], np.int64)
        self._other = self.table([1, 0], np.int64)  # goal_a: the other agent
        self._colours = self.table(LANDMARK_COLOURS)

    def reset_world(self, draw: Draws, where: Array | None) -> None:
        goals = self.ops.stack([draw.integers(3), draw.integers(3)], 1)
        self.goals = self.select(where, goals, self.goals)
        self.place_entities(where, draw.uniform(-1, 1, 10).reshape(-1, 5, 2))

    def observe(self) -> dict[str, Array]:
        world, n = self.world, self.n
        pos, e = world.pos, self.num_envs
        to_landmarks = pos[:, None, n:] - pos[:, :n, None]  # [E, agent, landmark, 2]
        parts = [
            world.vel[:, :n],
            to_landmarks.reshape(e, n, -1),
            self._colours[self.goals],
            self.ops.take(world.comm, self._other, 1),
        ]
        return {"agent": self.assemble(parts)}

    def reward(self) -> Array:
        pos = self.world.pos
        delta = self.ops.take(pos, self._other, 1) - pos[self._rows, self.n + self.goals]
        return -self.ops.sqrt(delta[..., 0] * delta[..., 0] + delta[..., 1] * delta[..., 1])

    def global_reward(self) -> Array:
        reward = self.reward()
        return (0.0 + reward[:, 0] + reward[:, 1]) / self.n  # Python's sum starts at 0

    def to_mpe2_extra(self, copy: int, env: Any) -> None:
        world = env.world
        goals = to_numpy(self.goals[copy])
        for i, agent in enumerate(world.agents):
            agent.goal_a = world.agents[1 - i]
            agent.goal_b = world.landmarks[int(goals[i])]
        for landmark, colour in zip(world.landmarks, LANDMARK_COLOURS, strict=True):
            landmark.color = colour.copy()
        for agent in world.agents:
            agent.goal_a.color = agent.goal_b.color

    def from_mpe2_extra(self, env: Any, copy: int) -> None:
        world = env.world
        goals = [world.landmarks.index(agent.goal_b) for agent in world.agents]
        self.goals[copy] = self.place.asarray(np.array(goals, np.int64))
