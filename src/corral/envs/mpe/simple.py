"""``mpe2/simple_v3`` natively batched: one agent goes to one landmark."""

from __future__ import annotations

from corral.batched_env import Array
from corral.envs.mpe.batched_mpe import BatchedMPE, Draws


class BatchedSimple(BatchedMPE):
    """``num_envs`` copies of mpe2's ``simple_v3`` (see :class:`BatchedMPE`)."""

    mpe2_module = "mpe2.simple.simple"

    def reset_world(self, draw: Draws, where: Array | None) -> None:
        self.place_entities(where, draw.uniform(-1, 1, 4).reshape(-1, 2, 2))

    def observe(self) -> dict[str, Array]:
        pos, vel = self.world.pos, self.world.vel
        # [velocity, landmark - position]
        return {"agent": self.assemble([vel[:, :1], pos[:, 1:] - pos[:, :1]])}

    def reward(self) -> Array:
        delta = self.world.pos[:, :1] - self.world.pos[:, 1:]
        return -(delta[..., 0] * delta[..., 0] + delta[..., 1] * delta[..., 1])
