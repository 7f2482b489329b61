"""``mpe2/simple_formation_v1`` natively batched: N agents form a circle around a landmark."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.batched_env import Array
from corral.envs.mpe.assignment import BatchedTargetMatching
from corral.envs.mpe.batched_mpe import Draws


class BatchedSimpleFormation(BatchedTargetMatching):
    """``num_envs`` copies of mpe2's ``simple_formation_v1`` (see :class:`BatchedMPE`), with
    all its arguments: ``N``, ``max_cycles``, ``continuous_actions``,
    ``dynamic_rescaling`` and ``terminate_on_success``. The targets are ``N`` points
    evenly spaced on the circle of radius 0.5 around the landmark, the first one in
    the direction of the agent at the smallest angle (counterclockwise from +x)."""

    mpe2_module = "mpe2.simple_formation.simple_formation"
    TARGET_RADIUS = 0.5

    def setup(self, raw: Any) -> None:
        super().setup(raw)
        separation = (2 * np.pi) / self.n
        self._turns = self.table([i * separation for i in range(self.n)])

    def reset_world(self, draw: Draws, where: Array | None) -> None:
        agents = draw.uniform(-1, 1, 2 * self.n).reshape(-1, self.n, 2)
        landmark = draw.uniform(-0.5, 0.5, 2).reshape(-1, 1, 2)
        self.place_entities(where, self.ops.concat([agents, landmark], 1))

    def targets(self) -> Array:
        pos, ops = self.world.pos, self.ops
        landmark = pos[:, self.n :]  # [E, 1, 2]
        relative = pos[:, : self.n] - landmark
        angle = ops.arctan2(relative[..., 1], relative[..., 0])
        angle = ops.where(angle < 0, angle + 2 * np.pi, angle)
        theta = ops.amin(angle, 1)[:, None] + self._turns  # [E, target]
        circle = ops.stack([ops.cos(theta), ops.sin(theta)], 2)
        return landmark + self.TARGET_RADIUS * circle
