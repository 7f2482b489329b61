"""``mpe2/simple_tag_v3`` natively batched: slow adversaries chase fast prey among obstacles."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.batched_env import Array
from corral.envs.mpe.batched_mpe import BatchedMPE, Draws
from corral.envs.mpe.neighbors import flat, nearest, pick

_CATCH_REWARD = 10.0


class BatchedSimpleTag(BatchedMPE):
    """``num_envs`` copies of mpe2's ``simple_tag_v3`` (see :class:`BatchedMPE`), with all
    its arguments: ``num_good``, ``num_adversaries``, ``num_obstacles``, ``max_cycles``,
    ``continuous_actions``, ``dynamic_rescaling``, ``curriculum``, ``terminate_on_success``,
    ``num_agent_neighbors`` and ``num_landmark_neighbors``.

    With ``curriculum=True`` the prey move at the speed of the scenario's curriculum stage,
    which mpe2 1.1.1 keeps at 0 whatever is set (its base scenario's ``curriculum_stage``
    property ignores assignments); a stage that would change the prey's speed raises
    ``NotImplementedError`` at the next reset.
    """

    mpe2_module = "mpe2.simple_tag.simple_tag"

    def setup(self, raw: Any) -> None:
        adversary = np.array([a.adversary for a in raw.world.agents], bool)
        self.n = n = len(adversary)
        self.num_adversaries = a = int(adversary.sum())  # mpe2 puts them first
        others = [[j for j in range(n) if j != i] for i in range(n)]  # mpe2's order
        self._good_other = self.table(~adversary[np.array(others, np.int64)], bool)[..., None]
        self._good_others = self.table(
            [j for i in range(a, n) for j in range(a, n) if j != i], np.int64
        )  # each prey's fellow prey, whose velocities it sees
        size = self.bodies.size
        self._catch = self.table(size[:a, None] + size[None, a:n])  # [adversary, prey]
        self._prey_speed = (self.bodies.max_speed[a:n], self.bodies.accel[a:n])

    def reset_world(self, draw: Draws, where: Array | None) -> None:
        self._check_prey_speed()
        n, obstacles = self.n, self.bodies.num_entities - self.n
        agents = draw.uniform(-1, 1, 2 * n).reshape(self.num_envs, n, 2)
        obstacle = draw.uniform(-0.9, 0.9, 2 * obstacles).reshape(self.num_envs, obstacles, 2)
        self.place_entities(where, self.ops.concat([agents, obstacle], 1))

    def _check_prey_speed(self) -> None:
        """The prey's speed and acceleration the curriculum gives at a reset are those the
        world was built with (the physics holds one value per agent for every copy)."""
        scenario = self.scenario
        if not scenario.curriculum:
            return
        factor = scenario.CURRICULUM_STAGES[scenario.curriculum_stage]["prey_speed_factor"]
        speed = scenario._PREY_BASE_MAX_SPEED * factor
        accel = scenario._PREY_BASE_ACCEL * factor
        if not ((self._prey_speed[0] == speed).all() and (self._prey_speed[1] == accel).all()):
            raise NotImplementedError(
                f"{type(self).__name__}: curriculum stage {scenario.curriculum_stage} gives "
                f"the prey max_speed {speed} and accel {accel}, but this env was built with "
                f"{self._prey_speed[0].tolist()} and {self._prey_speed[1].tolist()}; the "
                "batched env cannot change them: make a new env"
            )

    def observe(self) -> dict[str, Array]:
        ops, world, n, a = self.ops, self.world, self.n, self.num_adversaries
        pos, vel = world.pos, world.vel
        e, agents = len(pos), pos[:, :n]
        to_landmarks, to_agents = self.relative_positions()
        scenario = self.scenario
        if scenario.num_landmark_neighbors is not None:
            to_landmarks, _ = nearest(ops, to_landmarks, scenario.num_landmark_neighbors)
        if scenario.num_agent_neighbors is not None:
            count = scenario.num_agent_neighbors
            to_agents, order = nearest(ops, to_agents, count)
            # The velocities of the prey among the nearest, zeros for adversaries.
            seen = ops.take(vel, self.others, 1).reshape(e, n, n - 1, 2)
            seen = pick(ops, ops.where(self._good_other, seen, 0.0), order, count)
            parts = [vel[:, :n], agents, flat(to_landmarks), flat(to_agents), flat(seen)]
            return self._by_group([p[:, :a] for p in parts], [p[:, a:] for p in parts])
        parts = [vel[:, :n], agents, flat(to_landmarks), flat(to_agents)]
        # Adversaries see every prey's velocity, a prey its fellow prey's.
        prey_vel = vel[:, None, a:n].reshape(e, 1, 2 * (n - a))
        prey_vel = ops.broadcast_to(prey_vel, (e, a, prey_vel.shape[2]))
        fellow_vel = ops.take(vel, self._good_others, 1).reshape(e, n - a, 2 * max(n - a - 1, 0))
        return self._by_group(
            [p[:, :a] for p in parts] + [prey_vel], [p[:, a:] for p in parts] + [fellow_vel]
        )

    def _by_group(self, adversary: list[Array], prey: list[Array]) -> dict[str, Array]:
        """The groups' observations from their parts (a group with no agent left out)."""
        groups = {"adversary": adversary, "agent": prey}
        return {g: self.assemble(parts) for g, parts in groups.items() if g in self._groups}

    def _caught(self) -> Array:
        """``[E, adversary, prey]``: which adversary touches which prey."""
        pos, n, a = self.world.pos, self.n, self.num_adversaries
        delta = pos[:, :a, None] - pos[:, None, a:n]
        dist = self.ops.sqrt(delta[..., 0] * delta[..., 0] + delta[..., 1] * delta[..., 1])
        return dist < self._catch

    def _bound(self, x: Array) -> Array:
        """mpe2's penalty for a prey at ``x = |coordinate|``: 0 below 0.9, then linear to 1,
        then ``min(exp(2x - 2), 10)``."""
        ops = self.ops
        # exp(2x - 2) passes 10 before x = 3: clip there to keep exp from overflowing.
        grown = ops.exp(2 * ops.where(x < 3.0, x, 3.0) - 2)
        outside = ops.where(grown > 10.0, 10.0, grown)
        return ops.where(x < 0.9, 0.0, ops.where(x < 1.0, (x - 0.9) * 10, outside))

    def reward(self) -> Array:
        ops, n, a = self.ops, self.n, self.num_adversaries
        hits = ops.astype(self._caught(), self.dtype)
        e = len(hits)
        # Every adversary: +10 for each touching (prey, adversary) pair.
        adversary = ops.broadcast_to(_CATCH_REWARD * hits.sum((1, 2))[:, None], (e, a))
        # Each prey: -10 for each adversary touching it, minus the bound of |x| and |y|.
        penalty = self._bound(abs(self.world.pos[:, a:n]))
        prey = 0.0 - _CATCH_REWARD * hits.sum(1) - penalty[..., 0] - penalty[..., 1]
        return ops.concat([adversary, prey], 1)

    def terminal(self) -> Array | None:
        if not self.scenario.terminate_on_success:
            return None
        return self._caught().any(1).all(1)  # every prey touched by some adversary
