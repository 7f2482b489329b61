"""``mpe2/simple_adversary_v3`` natively batched: N agents hide which of N landmarks is the
goal from an adversary that must find it."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.arrays import to_numpy
from corral.batched_env import Array
from corral.envs.mpe.batched_mpe import BatchedMPE, Draws
from corral.envs.mpe.neighbors import flat, nearest

_LANDMARK_COLOR = (0.15, 0.15, 0.15)
_GOAL_COLOR = (0.15, 0.65, 0.15)


class BatchedSimpleAdversary(BatchedMPE):
    """``num_envs`` copies of mpe2's ``simple_adversary_v3`` (see :class:`BatchedMPE`), with
    all its arguments: ``N``, ``max_cycles``, ``continuous_actions``, ``dynamic_rescaling``,
    ``num_agent_neighbors`` and ``num_landmark_neighbors``. :attr:`goal` ``[E]`` is each
    copy's goal landmark (an index into the landmarks)."""

    mpe2_module = "mpe2.simple_adversary.simple_adversary"

    def setup(self, raw: Any) -> None:
        self.n = n = len(self.possible_agents)  # the adversary, then N agents
        self.num_landmarks = self.bodies.num_entities - n
        self.goal = self.place.zeros((self.num_envs,), np.int64)

    def reset_world(self, draw: Draws, where: Array | None) -> None:
        goal = draw.integers(self.num_landmarks)  # drawn first, as mpe2 does
        entities = self.bodies.num_entities
        self.place_entities(where, draw.uniform(-1, 1, 2 * entities).reshape(-1, entities, 2))
        self.goal = self.select(where, goal, self.goal)

    def _goal_pos(self) -> Array:
        """``[E, 1, 2]``: each copy's goal landmark's position."""
        pos, ops = self.world.pos, self.ops
        index = ops.broadcast_to((self.goal + self.n)[:, None, None], (len(pos), 1, 2))
        return ops.gather(pos, index, 1)

    def observe(self) -> dict[str, Array]:
        ops, agents = self.ops, self.world.pos[:, : self.n]
        to_landmarks, to_agents = self.relative_positions()
        scenario = self.scenario
        if scenario.num_landmark_neighbors is not None:
            to_landmarks, _ = nearest(ops, to_landmarks, scenario.num_landmark_neighbors)
        if scenario.num_agent_neighbors is not None:
            to_agents, _ = nearest(ops, to_agents, scenario.num_agent_neighbors)
        seen = [flat(to_landmarks), flat(to_agents)]
        # Only the agents know the goal: [goal - position, landmarks, others].
        to_goal = self._goal_pos() - agents[:, 1:]
        return {
            "adversary": self.assemble([part[:, :1] for part in seen]),
            "agent": self.assemble([to_goal] + [part[:, 1:] for part in seen]),
        }

    def reward(self) -> Array:
        ops = self.ops
        delta = self.world.pos[:, : self.n] - self._goal_pos()
        dist = ops.sqrt(delta[..., 0] * delta[..., 0] + delta[..., 1] * delta[..., 1])
        # The agents: minus the distance of the closest of them to the goal, plus the
        # adversary's distance to it (mpe2 adds pos_rew + adv_rew); the adversary: minus its.
        agents = -ops.amin(dist[:, 1:], 1) + dist[:, 0]
        shape = (len(dist), self.n - 1)
        return ops.concat([-dist[:, :1], ops.broadcast_to(agents[:, None], shape)], 1)

    def to_mpe2_extra(self, copy: int, env: Any) -> None:
        world = env.world
        goal = world.landmarks[int(to_numpy(self.goal[copy]))]
        for landmark in world.landmarks:
            landmark.color = np.array(_LANDMARK_COLOR)
        goal.color = np.array(_GOAL_COLOR)
        for agent in world.agents:
            agent.goal_a = goal

    def from_mpe2_extra(self, env: Any, copy: int) -> None:
        landmarks = env.world.landmarks
        goal = env.world.agents[0].goal_a
        self.goal[copy] = next(i for i, landmark in enumerate(landmarks) if landmark is goal)
