"""``mpe2/simple_world_comm_v3`` natively batched: adversaries led by a speaking leader chase
good agents that eat food and hide in forests."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.batched_env import Array
from corral.envs.mpe.batched_mpe import BatchedMPE, Draws

# The good agents' boundary penalty: bound(x) = 0 below 0.9, (x - 0.9) * 10 below 1, else
# min(exp(2x - 2), 10); the exponent is capped where exp(cap) > 10 already, to never overflow.
_BOUND_START, _BOUND_WALL, _EXP_CAP = 0.9, 1.0, 50.0


class BatchedSimpleWorldComm(BatchedMPE):
    """``num_envs`` copies of mpe2's ``simple_world_comm_v3`` (see :class:`BatchedMPE`), with
    all its arguments: ``num_good``, ``num_adversaries``, ``num_obstacles``, ``num_food``,
    ``num_forests``, ``max_cycles``, ``continuous_actions`` and ``dynamic_rescaling``.

    ``num_good`` and (with good agents) ``num_food`` must be at least 1: mpe2's rewards
    take a minimum over the good agents and over the food."""

    mpe2_module = "mpe2.simple_world_comm.simple_world_comm"

    def setup(self, raw: Any) -> None:
        world = raw.world
        agents = world.agents
        self.n = n = len(agents)
        adversary = np.array([agent.adversary for agent in agents], bool)
        self.num_adversaries = a = int(adversary.sum())
        if n - a < 1:
            raise ValueError(
                f"{type(self).__name__}: num_good must be at least 1 (mpe2's adversary reward "
                "is the distance to the nearest good agent), got 0"
            )
        if not world.food:
            raise ValueError(
                f"{type(self).__name__}: num_food must be at least 1 (mpe2's good-agent reward "
                "is the distance to the nearest food), got 0"
            )
        # mpe2's agents are the adversaries (the leader first), then the good agents; its
        # landmarks the obstacles, then the food, then the forests.
        num_food, num_forests = len(world.food), len(world.forests)
        self.num_landmarks = len(world.landmarks)
        self.num_obstacles = self.num_landmarks - num_food - num_forests
        self._food = slice(self.num_obstacles, self.num_obstacles + num_food)  # of the landmarks
        self._forests = slice(self._food.stop, self.num_landmarks)
        # slices of the entity axis
        self._agent_axis, self._landmark_axis = slice(0, n), slice(n, None)
        self._adversary_axis, self._good_axis = slice(0, a), slice(a, n)
        self._food_axis = slice(n + self._food.start, n + self._food.stop)
        size, landmark_size = self.bodies.size, self.bodies.size[n:]
        self._food_reach = self.table(size[a:n, None] + landmark_size[self._food])  # [good, food]
        self._forest_reach = self.table(size[:n, None] + landmark_size[self._forests])
        self._catch_reach = self.table(size[:a, None] + size[None, a:n])  # [adversary, good]
        self._leader = self.table([[agent.leader] for agent in agents], bool)  # [agent, 1]
        self._true = self.table(True, bool)
        self._zero, self._one, self._two = self.table(0.0), self.table(1.0), self.table(2.0)
        self._minus_one, self._ten = self.table(-1.0), self.table(10.0)
        self._exp_cap = self.table(_EXP_CAP)
        self._observation_tables(world, adversary)

    def _observation_tables(self, world: Any, adversary: np.ndarray) -> None:
        """For each group, where its agents' observation entries lie in the per-copy
        features that :meth:`observe` concatenates (flattened, in this order)."""
        n, a, num_landmarks = self.n, self.num_adversaries, self.num_landmarks
        blocks = {  # name: the shape of its [E, ...] array
            "vel": (n, 2),
            "pos": (n, 2),
            "landmark_x": (n, num_landmarks),  # landmark - agent
            "landmark_y": (n, num_landmarks),
            "other_x": (n, n),  # other - agent, zero where hidden
            "other_y": (n, n),
            "good_vel_x": (n, n - a),  # the good agents' velocities, zero where hidden
            "good_vel_y": (n, n - a),
            "forests": (n, len(world.forests)),  # +1 inside, -1 outside
            "comm": (self.bodies.dim_c,),  # the leader's
        }
        offset, first = {}, 0
        for name, shape in blocks.items():
            offset[name] = np.arange(first, first + int(np.prod(shape))).reshape(shape)
            first += int(np.prod(shape))

        def xy(x: str, y: str, i: int, columns: list[int]) -> list[int]:
            return [int(o) for c in columns for o in (offset[x][i, c], offset[y][i, c])]

        def columns(i: int) -> list[int]:
            """Agent i's observation, as columns of the features."""
            others = [j for j in range(n) if j != i]
            good_others = [j - a for j in others if not adversary[j]]
            head = [
                *offset["vel"][i],
                *offset["pos"][i],
                *xy("landmark_x", "landmark_y", i, list(range(num_landmarks))),
                *xy("other_x", "other_y", i, others),
            ]
            velocities = xy("good_vel_x", "good_vel_y", i, good_others)
            forests = list(offset["forests"][i])
            if adversary[i] or world.agents[i].leader:
                return head + velocities + forests + list(offset["comm"])
            return head + forests + velocities

        self._columns = {
            group: (len(index), self.table([columns(i) for i in index], np.int64).reshape(-1))
            for group, index in self._group_index.items()
        }

    def reset_world(self, draw: Draws, where: Array | None) -> None:
        # mpe2 draws every landmark (obstacles, food, forests), then the food again, then the
        # forests again: the later draws are where food and forests stay.
        n, num_landmarks = self.n, self.num_landmarks
        agents = draw.uniform(-1, 1, 2 * n).reshape(-1, n, 2)
        food_and_forests = num_landmarks - self.num_obstacles
        landmarks = draw.uniform(-0.9, 0.9, 2 * (num_landmarks + food_and_forests))
        landmarks = landmarks.reshape(-1, num_landmarks + food_and_forests, 2)
        obstacles = landmarks[:, : self.num_obstacles]
        redrawn = landmarks[:, num_landmarks:]
        self.place_entities(where, self.ops.concat([agents, obstacles, redrawn], 1))

    def _offsets(self, agents: slice, entities: slice) -> tuple[Array, Array]:
        """Entity - agent in x and in y, ``[E, agent, entity]`` each, for the ``agents`` and
        ``entities`` (slices of the entity axis)."""
        pos = self.world.pos
        x, y = pos[..., 0], pos[..., 1]
        return x[:, None, entities] - x[:, agents, None], y[:, None, entities] - y[:, agents, None]

    def _length(self, x: Array, y: Array) -> Array:
        """The distance of an offset (as mpe2's ``is_collision`` computes it)."""
        return self.ops.sqrt(x * x + y * y)

    def observe(self) -> dict[str, Array]:
        """Every group's observations, already cast to float32 (in one pass with their
        concatenation)."""
        ops, world, n, a = self.ops, self.world, self.n, self.num_adversaries
        other_x, other_y = self._offsets(self._agent_axis, self._agent_axis)
        landmark_x, landmark_y = self._offsets(self._agent_axis, self._landmark_axis)
        forests = self._forests
        in_forest = self._length(landmark_x[:, :, forests], landmark_y[:, :, forests])
        in_forest = in_forest < self._forest_reach  # [E, agent, forest]
        # mpe2's for/else: agent i sees agent j if they share a forest, if neither is in
        # one, or if i is the leader.
        shared, outside = self._leader, None
        for f in range(in_forest.shape[2]):
            inside = in_forest[:, :, f]
            shared = shared | (inside[:, :, None] & inside[:, None, :])
            outside = ~inside if outside is None else outside & ~inside
        both_outside = self._true if outside is None else outside[:, :, None] & outside[:, None, :]
        seen = ops.broadcast_to(shared | both_outside, other_x.shape)
        e, zero = len(other_x), self._zero
        vel = world.vel[:, :n]
        good_seen = seen[:, :, a:]
        features = [
            vel,
            world.pos[:, :n],
            landmark_x,
            landmark_y,
            ops.where(seen, other_x, zero),
            ops.where(seen, other_y, zero),
            ops.where(good_seen, vel[:, None, a:, 0], zero),
            ops.where(good_seen, vel[:, None, a:, 1], zero),
            ops.where(in_forest, self._one, self._minus_one),
            world.comm[:, 0],
        ]
        flat = ops.concat([f.reshape(e, -1) for f in features], 1, np.float32)
        return {
            group: ops.take(flat, columns, 1).reshape(e, size, -1)
            for group, (size, columns) in self._columns.items()
        }

    def reward(self) -> Array:
        to_good = self._length(*self._offsets(self._adversary_axis, self._good_axis))
        caught = to_good < self._catch_reach  # [E, adversary, good]
        to_food = self._length(*self._offsets(self._good_axis, self._food_axis))
        good = self._good_reward(self.world.pos[:, self._good_axis], to_food, caught)
        if not self.num_adversaries:
            return good
        return self.ops.concat([self._adversary_reward(to_good, caught), good], 1)

    def _adversary_reward(self, to_good: Array, caught: Array) -> Array:
        """``[E, adversary]``: -0.1 x the distance to the nearest good agent, then + 5 for
        every (good, adversary) pair in contact, added one at a time as mpe2 does."""
        ops = self.ops
        reward = 0.0 - 0.1 * self._nearest(to_good)
        count = ops.astype(caught, np.int64).sum((1, 2))[:, None]
        for k in range(caught.shape[1] * caught.shape[2]):
            reward = ops.where(count > k, reward + 5, reward)
        return reward

    def _good_reward(self, pos: Array, to_food: Array, caught: Array) -> Array:
        """``[E, good]``: -5 per adversary in contact, -2 x bound(|x|) per coordinate, + 2
        per food in reach (one at a time), -0.05 x the distance to the nearest food."""
        ops = self.ops
        reward = 0.0 - 5.0 * ops.astype(caught.sum(1), self.dtype)
        for p in range(2):
            reward = reward - 2 * self._bound(abs(pos[..., p]))
        fed = to_food < self._food_reach
        for f in range(fed.shape[2]):
            reward = reward + ops.where(fed[..., f], self._two, self._zero)
        return reward - 0.05 * self._nearest(to_food)

    def _nearest(self, dist: Array) -> Array:
        """The minimum over the last axis (a few entries: faster than a reduction)."""
        nearest = dist[..., 0]
        for k in range(1, dist.shape[-1]):
            nearest = self.ops.where(dist[..., k] < nearest, dist[..., k], nearest)
        return nearest

    def _bound(self, x: Array) -> Array:
        ops = self.ops
        exponent = 2 * x - 2
        wall = ops.exp(ops.where(exponent > _EXP_CAP, self._exp_cap, exponent))
        wall = ops.where(wall > 10, self._ten, wall)  # Python's min(wall, 10)
        near = ops.where(x < _BOUND_WALL, (x - _BOUND_START) * 10, wall)
        return ops.where(x < _BOUND_START, self._zero, near)
