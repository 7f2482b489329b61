"""``mpe2/simple_spread_v3`` natively batched: N agents cover N landmarks without colliding."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.batched_env import Array
from corral.envs.mpe.batched_mpe import BatchedMPE, Draws
from corral.envs.mpe.neighbors import nearest, pick


class BatchedSimpleSpread(BatchedMPE):
    """``num_envs`` copies of mpe2's ``simple_spread_v3`` (see :class:`BatchedMPE`), with all
    its arguments: ``N``, ``local_ratio``, ``max_cycles``, ``continuous_actions``,
    ``dynamic_rescaling``, ``curriculum`` (its stage set with :meth:`set_curriculum_stage`),
    ``terminate_on_success``, ``num_agent_neighbors`` and ``num_landmark_neighbors``."""

    mpe2_module = "mpe2.simple_spread.simple_spread"

    def setup(self, raw: Any) -> None:
        self.n = n = len(self.possible_agents)
        self._agents_collide = bool(self.bodies.collide[0])
        self._not_self = self.table(~np.eye(n, dtype=bool), bool)
        self._agent_sizes = self.table(
            self.bodies.size[:n, None] + self.bodies.size[None, :n]
        )  # is_collision's dist_min: size of the other + size of the agent

    def reset_world(self, draw: Draws, where: Array | None) -> None:
        self.place_entities(where, draw.uniform(-1, 1, 4 * self.n).reshape(-1, 2 * self.n, 2))

    def observe(self) -> dict[str, Array]:
        ops, world, n = self.ops, self.world, self.n
        to_landmarks, to_agents = self.relative_positions()
        comm = ops.astype(ops.take(world.comm, self.others, 1), self.dtype)
        comm = comm.reshape(len(world.comm), n, n - 1, self.bodies.dim_c)
        scenario = self.scenario
        if scenario.num_landmark_neighbors is not None:
            to_landmarks, _ = nearest(ops, to_landmarks, scenario.num_landmark_neighbors)
        if scenario.num_agent_neighbors is not None:
            to_agents, order = nearest(ops, to_agents, scenario.num_agent_neighbors)
            comm = pick(ops, comm, order, scenario.num_agent_neighbors)
        e = len(world.pos)
        parts = [
            world.vel[:, :n],
            world.pos[:, :n],
            to_landmarks.reshape(e, n, -1),
            to_agents.reshape(e, n, -1),
            comm.reshape(e, n, -1),
        ]
        return {"agent": self.assemble(parts)}

    def _distances(self) -> Array:
        """``[E, agent, landmark]``: each agent's distance to each landmark."""
        pos, n = self.world.pos, self.n
        delta = pos[:, :n, None] - pos[:, None, n:]
        return self.ops.sqrt(delta[..., 0] * delta[..., 0] + delta[..., 1] * delta[..., 1])

    def reward(self) -> Array:
        stage = self.scenario.CURRICULUM_STAGES[self.scenario.curriculum_stage]
        penalised = (not self.scenario.curriculum) or stage["collision_penalty"]
        pos, n = self.world.pos, self.n
        if not penalised or not self._agents_collide:
            return self.ops.zeros_like(pos[:, :n, 0])
        delta = pos[:, None, :n] - pos[:, :n, None]  # [E, agent, other]
        dist = self.ops.sqrt(delta[..., 0] * delta[..., 0] + delta[..., 1] * delta[..., 1])
        colliding = (dist < self._agent_sizes) & self._not_self
        return 0.0 - self.ops.astype(colliding.sum(2), self.dtype)

    def global_reward(self) -> Array:
        nearest = self.ops.amin(self._distances(), 1)  # [E, landmark]
        total = 0.0 - nearest[:, 0]
        for landmark in range(1, self.n):
            total = total - nearest[:, landmark]
        return total

    def terminal(self) -> Array | None:
        if not self.scenario.terminate_on_success:
            return None
        covered = self.ops.amin(self._distances(), 1) < self.scenario.CAPTURE_RADIUS
        return covered.all(1)
