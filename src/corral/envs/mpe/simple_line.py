"""``mpe2/simple_line_v1`` natively batched: N agents line up between two landmarks."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.arrays import to_numpy
from corral.batched_env import Array
from corral.envs.mpe.assignment import BatchedTargetMatching
from corral.envs.mpe.batched_mpe import Draws


class BatchedSimpleLine(BatchedTargetMatching):
    """``num_envs`` copies of mpe2's ``simple_line_v1`` (see :class:`BatchedMPE`), with all
    its arguments: ``N``, ``max_cycles``, ``continuous_actions``, ``dynamic_rescaling``
    and ``terminate_on_success``. The second landmark lies 1.25 from the first in a
    random direction (turned by 5 degrees until it is inside the square); the targets,
    drawn at reset, are ``N`` points evenly spaced from the first landmark along that
    direction."""

    mpe2_module = "mpe2.simple_line.simple_line"
    TOTAL_SEP = 1.25

    def setup(self, raw: Any) -> None:
        super().setup(raw)
        separation = self.TOTAL_SEP / (self.n - 1) if self.n > 1 else 0.0
        self._steps = self.table([i * separation for i in range(self.n)], np.float64)[:, None]
        self._targets = self.place.zeros((self.num_envs, self.n, 2), self.dtype)

    def reset_world(self, draw: Draws, where: Array | None) -> None:
        ops = self.ops
        agents = draw.uniform(-1, 1, 2 * self.n).reshape(-1, self.n, 2)
        first = draw.uniform(-0.25, 0.25, 2)
        theta = draw.uniform(0, 2 * np.pi, 1)[:, 0]
        direction, second = self._second(first, theta, where)
        self.place_entities(where, ops.concat([agents, first[:, None], second[:, None]], 1))
        targets = first[:, None] + self._steps * direction[:, None]  # [E, agent, 2]
        self._targets = self.select(where, ops.astype(targets, self.dtype), self._targets)

    def _second(self, first: Array, theta: Array, where: Array | None) -> tuple[Array, Array]:
        """The direction and position of the second landmark, as mpe2 turns ``theta``, in
        the copies ``where`` selects."""
        if not self.place.computes_on_host:  # on a device: every turn at once, no read
            return self._second_on_device(first, theta)
        ops, step = self.ops, np.radians(5)
        while True:
            direction = ops.stack([ops.cos(theta), ops.sin(theta)], 1)
            second = first + self.TOTAL_SEP * direction
            outside = ~(abs(second) < 1.0).all(1)
            if where is not None:
                outside = outside & where
            if not bool(to_numpy(outside).any()):
                return direction, second
            theta = ops.where(outside, theta + step, theta)

    MAX_TURNS = 40
    """The most turns mpe2 may need: around a first landmark in ``[-0.25, 0.25]^2`` the
    second lies outside the square on an arc of at most 196.3 degrees (at a corner, where
    its cosine or sine is at least 0.6), passed in 40 turns of 5 degrees."""

    def _second_on_device(self, first: Array, theta: Array) -> tuple[Array, Array]:
        """:meth:`_second` by trying ``theta`` and its :data:`MAX_TURNS` turns (added one by
        one, as mpe2 does) in every copy, and taking each copy's first inside."""
        torch, step = self.ops.torch, np.radians(5)
        turns = [theta]
        for _ in range(self.MAX_TURNS):
            turns.append(turns[-1] + step)
        thetas = torch.stack(turns, 1)  # [E, turn]
        direction = torch.stack([torch.cos(thetas), torch.sin(thetas)], 2)  # [E, turn, 2]
        second = first[:, None] + self.TOTAL_SEP * direction
        inside = (abs(second) < 1.0).all(2)
        chosen = inside.to(torch.uint8).argmax(1)[:, None, None].expand(-1, 1, 2)
        return direction.gather(1, chosen)[:, 0], second.gather(1, chosen)[:, 0]

    def targets(self) -> Array:
        return self._targets

    def to_mpe2_extra(self, copy: int, env: Any) -> None:
        targets = to_numpy(self._targets[copy]).astype(np.float64)
        env.scenario._expected_positions = list(targets)

    def from_mpe2_extra(self, env: Any, copy: int) -> None:
        targets = np.array(env.scenario._expected_positions, np.float64)
        self._targets[copy] = self.place.asarray(targets.astype(self.dtype))
