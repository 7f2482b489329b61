"""``mpe2/simple_push_v3`` natively batched: an adversary keeps the agent away from the goal
landmark that only the agent knows, pushing it."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.arrays import to_numpy
from corral.batched_env import Array
from corral.envs.mpe.batched_mpe import BatchedMPE, Draws

ADVERSARY, AGENT, FIRST_LANDMARK = 0, 1, 2
ADVERSARY_COLOUR = np.array([0.75, 0.25, 0.25])


def landmark_colours(count: int) -> np.ndarray:
    """``[count, 3]``: mpe2's landmark colours, grey with one channel raised (added in
    float64 as mpe2 adds them)."""
    colours = np.full((count, 3), 0.1)
    colours[np.arange(count), np.arange(count) + 1] += 0.8
    return colours


def agent_colours(count: int) -> np.ndarray:
    """``[goal, 3]``: the agent's colour for each goal landmark."""
    colours = np.full((count, 3), 0.25)
    colours[np.arange(count), np.arange(count) + 1] += 0.5
    return colours


class BatchedSimplePush(BatchedMPE):
    """``num_envs`` copies of mpe2's ``simple_push_v3`` (see :class:`BatchedMPE`), with all
    its arguments: ``max_cycles``, ``continuous_actions`` and ``dynamic_rescaling``.

    :attr:`goal` ``[E]`` holds the goal landmark of both agents; the (good) agent wears
    its colour and sees it.
    """

    mpe2_module = "mpe2.simple_push.simple_push"

    def setup(self, raw: Any) -> None:
        self._landmarks = count = len(raw.world.landmarks)
        self.goal = self.place.zeros((self.num_envs,), np.int64)
        self._rows = self.table(np.arange(self.num_envs), np.int64)
        self._landmark_colours = self.table(landmark_colours(count).reshape(-1))
        self._agent_colours = self.table(agent_colours(count))

    def reset_world(self, draw: Draws, where: Array | None) -> None:
        self.goal = self.select(where, draw.integers(self._landmarks), self.goal)
        entities = FIRST_LANDMARK + self._landmarks
        self.place_entities(where, draw.uniform(-1, 1, 2 * entities).reshape(-1, entities, 2))

    def _goal_pos(self) -> Array:
        """``[E, 2]``: the goal landmark's position."""
        return self.world.pos[self._rows, FIRST_LANDMARK + self.goal]

    def observe(self) -> dict[str, Array]:
        world, e = self.world, self.num_envs
        pos, vel = world.pos, world.vel
        landmarks = pos[:, FIRST_LANDMARK:]
        adversary = [
            vel[:, ADVERSARY],
            (landmarks - pos[:, ADVERSARY : ADVERSARY + 1]).reshape(e, -1),
            pos[:, AGENT] - pos[:, ADVERSARY],
        ]
        agent = [
            vel[:, AGENT],
            self._goal_pos() - pos[:, AGENT],
            self._agent_colours[self.goal],
            (landmarks - pos[:, AGENT : AGENT + 1]).reshape(e, -1),
            self.ops.broadcast_to(self._landmark_colours, (e, len(self._landmark_colours))),
            pos[:, ADVERSARY] - pos[:, AGENT],
        ]
        return {
            "adversary": self.assemble([part[:, None] for part in adversary]),
            "agent": self.assemble([part[:, None] for part in agent]),
        }

    def reward(self) -> Array:
        ops, pos = self.ops, self.world.pos
        goal = self._goal_pos()
        away = pos[:, AGENT] - goal
        agent_distance = ops.sqrt(away[:, 0] * away[:, 0] + away[:, 1] * away[:, 1])
        near = goal - pos[:, ADVERSARY]
        adversary_distance = ops.sqrt(near[:, 0] * near[:, 0] + near[:, 1] * near[:, 1])
        return ops.stack([agent_distance - adversary_distance, -agent_distance], 1)

    def to_mpe2_extra(self, copy: int, env: Any) -> None:
        world = env.world
        goal = world.landmarks[int(to_numpy(self.goal[copy]))]
        for i, (landmark, colour) in enumerate(
            zip(world.landmarks, landmark_colours(self._landmarks), strict=True)
        ):
            landmark.color, landmark.index = colour, i
        for agent in world.agents:
            agent.goal_a = goal
        world.agents[ADVERSARY].color = ADVERSARY_COLOUR.copy()
        world.agents[AGENT].color = agent_colours(self._landmarks)[goal.index]

    def from_mpe2_extra(self, env: Any, copy: int) -> None:
        world = env.world
        self.goal[copy] = world.landmarks.index(world.agents[AGENT].goal_a)
