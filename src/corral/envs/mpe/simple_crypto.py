"""``mpe2/simple_crypto_v3`` natively batched: a speaker (alice) sends a goal colour that a
listener (bob) must read with a shared key and an eavesdropper (eve) must not."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.batched_env import Array
from corral.envs.mpe.batched_mpe import BatchedMPE, Draws


class BatchedSimpleCrypto(BatchedMPE):
    """``num_envs`` copies of mpe2's ``simple_crypto_v3`` (see :class:`BatchedMPE`), with all
    its arguments: ``max_cycles``, ``continuous_actions`` and ``dynamic_rescaling``.

    Nobody moves: each copy keeps a goal landmark and a key landmark (:attr:`goal`,
    :attr:`key`, ``[E]`` indices), whose colours (one-hot, ``dim_c`` long) are what the
    agents observe and say."""

    mpe2_module = "mpe2.simple_crypto.simple_crypto"

    def setup(self, raw: Any) -> None:
        agents = raw.world.agents
        # mpe2's roles: the eavesdropper (eve), the listener (bob), the speaker (alice)
        self._eve = next(i for i, a in enumerate(agents) if a.adversary)
        self._bob = next(i for i, a in enumerate(agents) if not a.adversary and not a.speaker)
        self._alice = next(i for i, a in enumerate(agents) if a.speaker)
        self.num_landmarks = len(raw.world.landmarks)
        self._colors = self.table([landmark.color for landmark in raw.world.landmarks])
        self._zero = self.table(0.0)
        self.goal = self.place.zeros((self.num_envs,), np.int64)
        self.key = self.place.zeros((self.num_envs,), np.int64)

    def reset_world(self, draw: Draws, where: Array | None) -> None:
        self.goal = self.select(where, draw.integers(self.num_landmarks), self.goal)
        self.key = self.select(where, draw.integers(self.num_landmarks), self.key)
        count = self.bodies.num_entities
        self.place_entities(where, draw.uniform(-1, 1, 2 * count).reshape(-1, count, 2))

    def observe(self) -> dict[str, Array]:
        goal, key = self._colors[self.goal], self._colors[self.key]
        said = self.world.comm[:, self._alice]
        ops = self.ops
        per_agent = {
            self._eve: said,
            self._bob: ops.concat([key, said], 1),
            self._alice: ops.concat([goal, key], 1),
        }
        return {
            group: ops.stack([per_agent[i] for i in index], 1)
            for group, index in self._group_index.items()
        }

    def _missed(self, agent: int) -> tuple[Array, Array]:
        """``[E]``: whether ``agent`` said anything (not all zeros), and the squared
        distance of what it said from the goal colour (summed in mpe2's order)."""
        said = self.world.comm[:, agent]
        square = said - self._colors[self.goal]
        square = square * square
        total = square[:, 0]
        for k in range(1, square.shape[1]):
            total = total + square[:, k]
        return ~(said == 0).all(1), total

    def reward(self) -> Array:
        ops, zero = self.ops, self._zero
        eve_spoke, eve_miss = self._missed(self._eve)
        bob_spoke, bob_miss = self._missed(self._bob)
        eve = ops.where(eve_spoke, 0.0 - eve_miss, zero)
        # bob and alice: eve's miss plus (0 - bob's miss), each only where it spoke
        good = ops.where(eve_spoke, eve_miss, zero) + ops.where(bob_spoke, 0.0 - bob_miss, zero)
        per_agent = {self._eve: eve, self._bob: good, self._alice: good}
        return ops.stack([per_agent[i] for i in range(len(per_agent))], 1)

    def to_mpe2_extra(self, copy: int, env: Any) -> None:
        world = env.world
        goal = world.landmarks[int(self.goal[copy])]
        for agent in world.agents:
            agent.goal_a = goal
        world.agents[self._bob].color = goal.color
        world.agents[self._alice].key = world.landmarks[int(self.key[copy])].color

    def from_mpe2_extra(self, env: Any, copy: int) -> None:
        world = env.world
        self.goal[copy] = world.landmarks.index(world.agents[self._eve].goal_a)
        key = world.agents[self._alice].key
        self.key[copy] = next(
            i for i, landmark in enumerate(world.landmarks) if np.array_equal(landmark.color, key)
        )
