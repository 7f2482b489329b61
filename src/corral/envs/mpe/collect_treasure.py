"""``mpe2/collect_treasure_v1`` natively batched: collectors carry treasures to deposits."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.arrays import CopyStreams, to_numpy
from corral.batched_env import Array
from corral.envs.mpe.batched_mpe import BatchedMPE, Draws
from corral.envs.mpe.numerics import norm

_GREY = np.array([0.85, 0.85, 0.85])  # an empty-handed collector's colour


class BatchedCollectTreasure(BatchedMPE):
    """``num_envs`` copies of mpe2's ``collect_treasure_v1`` (see :class:`BatchedMPE`), with
    all its arguments: ``num_collectors``, ``num_deposits``, ``num_treasures``,
    ``max_cycles``, ``continuous_actions`` and ``dynamic_rescaling``.

    After each world step, as mpe2's ``post_step``: an empty-handed collector touching a
    live treasure picks it up (treasures in order, each by the first such collector);
    a treasure picked up in an earlier step respawns at a random place with a random
    type; a collector touching the deposit of the type it holds delivers it. Each pickup
    and delivery adds 5 to every agent's reward. The respawn draws come, as in mpe2,
    from a copy of the copy's generator taken at its reset (so they repeat that reset's
    draws) and leave the generator of later resets alone.
    """

    mpe2_module = "mpe2.collect_treasure.collect_treasure"
    GONE = -999.0  # where a picked-up treasure waits to respawn
    BOUND = 0.95  # treasures appear in [-BOUND, BOUND]^2
    BONUS = 5.0  # per pickup, per delivery, and minus per touching pair of collectors
    SHAPING = 0.1  # times the distance to where an agent should head
    DEAD_LAST = 1e6  # the sort key that puts picked-up treasures last in observations

    def setup(self, raw: Any) -> None:
        world = raw.world
        self.num_collectors = c = world.num_collectors
        self.num_deposits = d = world.num_deposits
        self.num_agents = a = c + d
        self.num_treasures = t = len(world.landmarks)
        self.num_types = len(world.treasure_types)
        self.colors = np.array(world.treasure_colors, np.float64)
        names = list(self._groups)
        if [self._group_index[g] for g in names] != [list(range(c)), list(range(c, a))]:
            raise NotImplementedError(f"collectors and deposits grouped as {self._groups}")
        self._names = names
        size = self.bodies.size  # agents, then treasures
        self._reach_treasure = float(size[a] + size[0])
        self._reach_deposit = float(size[0] + size[c])
        self._reach_collector = float(size[0] + size[0])
        others = [[j for j in range(a) if j != i] for i in range(a)]
        self._others = self.table(others, np.int64)  # [agent, other] in mpe2's order
        self._other_pairs = self.table([i * a + j for i in range(a) for j in others[i]], np.int64)
        self._not_self = self.table(~np.eye(c, dtype=bool), bool)
        self._deposit_types = self.table(np.arange(d), np.int64)
        self._one_hot = self.table(np.eye(self.num_types))
        # [deposit type one-hot, held type one-hot] of each deposit: constant.
        self._deposit_code = self.table(np.concatenate([np.eye(d), np.zeros((d, d))], 1))
        # each copy's first row in _views' flattened tables of a rows (agents) or t (treasures)
        starts = np.arange(self.num_envs)[:, None, None]
        self._row_starts = {rows: self.table(starts * rows, np.int64) for rows in {a, t}}
        zeros = self.place.zeros
        self.holding = zeros((self.num_envs, c), np.int64) - 1  # each collector's type, -1: none
        self.kind = zeros((self.num_envs, t), np.int64)  # each treasure's type
        self.alive = zeros((self.num_envs, t), np.bool_)  # not picked up
        self.bonus = zeros((self.num_envs,), self.dtype)  # this step's pickups and deliveries
        # Each copy's respawn stream: mpe2's world keeps a copy of np_random from its reset.
        self._respawns = CopyStreams(self.num_envs, self.place)

    # -- reset and the step after the physics -----------------------------------------------

    def reset_world(self, draw: Draws, where: Array | None) -> None:
        self._respawns.copy_from(draw.streams, where)  # as the generator is before the draws
        ops, e, t = self.ops, self.num_envs, self.num_treasures
        agents = draw.uniform(-1, 1, 2 * self.num_agents).reshape(e, -1, 2)
        kinds, spots = [], []
        for _ in range(t):
            kinds.append(draw.integers(0, self.num_types))
            spots.append(draw.uniform(-self.BOUND, self.BOUND, 2))
        self.place_entities(where, ops.concat([agents, ops.stack(spots, 1)], 1))
        self.kind = self.select(where, ops.stack(kinds, 1), self.kind)
        self.holding = self.select(where, ops.zeros_like(self.holding) - 1, self.holding)
        self.alive = self.select(where, ops.zeros_like(self.kind) == 0, self.alive)

    def post_step(self) -> None:
        ops, pos, a, live = self.ops, self.world.pos, self.num_agents, self.live
        collectors = pos[:, : self.num_collectors]
        spots = [pos[:, a + k] for k in range(self.num_treasures)]
        kinds = [self.kind[:, k] for k in range(self.num_treasures)]
        alive = [self.alive[:, k] for k in range(self.num_treasures)]
        holding, picked = self.holding, ops.zeros_like(self.bonus)
        for k in range(self.num_treasures):  # in order: a collector takes one treasure
            delta = spots[k][:, None] - collectors
            dist = ops.sqrt(delta[..., 0] * delta[..., 0] + delta[..., 1] * delta[..., 1])
            touching = alive[k][:, None] & (holding < 0) & (dist < self._reach_treasure)
            first = touching & (touching.cumsum(1) == 1)
            took = touching.any(1)
            holding = ops.where(first, kinds[k][:, None], holding)
            spots[k] = ops.where(took[:, None], self.GONE + ops.zeros_like(spots[k]), spots[k])
            picked = picked + ops.astype(took, self.dtype)
            # A treasure picked up in an earlier step comes back (if the episode runs on).
            dead = ~alive[k]
            alive[k] = alive[k] & ~took
            self._respawn(k, dead & live, spots, kinds, alive)
        delivered = self._deliver(holding, pos)
        holding = ops.where(delivered, ops.zeros_like(holding) - 1, holding)
        # Copies whose episode had ended keep their state (the core keeps their world's).
        self.holding = self.select(live, holding, self.holding)
        self.alive = self.select(live, ops.stack(alive, 1), self.alive)
        self.kind = self.select(live, ops.stack(kinds, 1), self.kind)
        self.world.pos = ops.concat([pos[:, :a], ops.stack(spots, 1)], 1)
        count = ops.astype(delivered, self.dtype).sum(1)
        self.bonus = picked * self.BONUS + count * self.BONUS

    def _respawn(self, k: int, dead: Array, spots: list, kinds: list, alive: list) -> None:
        """Treasure ``k`` of the copies ``dead`` selects reappears: a new place and type,
        drawn from their respawn streams."""
        draw = Draws(self._respawns, dead)
        draw.uniform(0.0, 1.0, 1)  # mpe2's respawn chance; its probability is 1
        spot = self.ops.astype(draw.uniform(-self.BOUND, self.BOUND, 2), self.dtype)
        kind = draw.integers(0, self.num_types)
        spots[k] = self.ops.where(dead[:, None], spot, spots[k])
        kinds[k] = self.ops.where(dead, kind, kinds[k])
        alive[k] = alive[k] | dead

    def _deliver(self, holding: Array, pos: Array) -> Array:
        """``[E, collector]``: the collectors touching the deposit of the type they hold."""
        delta = pos[:, : self.num_collectors] - self._deposit_of(holding, pos)
        dist = self.ops.sqrt(delta[..., 0] * delta[..., 0] + delta[..., 1] * delta[..., 1])
        return (holding >= 0) & (dist < self._reach_deposit)

    def _deposit_of(self, holding: Array, pos: Array) -> Array:
        """``[E, collector, 2]``: where the deposit of each collector's type is (deposit 0's
        for an empty hand)."""
        c, a = self.num_collectors, self.num_agents
        index = self.ops.broadcast_to(holding.clip(0, None)[..., None], (*holding.shape, 2))
        return self.ops.gather(pos[:, c:a], index, 1)

    # -- rewards and observations ---------------------------------------------------------

    def reward(self) -> Array:
        return self.ops.concat([self._collector_reward(), self._deposit_reward()], 1)

    def _distances(self, to: Array, of: Array) -> Array:
        """``[E, i, j]``: the distance from ``of[:, i]`` to ``to[:, j]``, as mpe2's
        ``sqrt(sum(square(to - of)))``."""
        delta = to[:, None] - of[:, :, None]
        return self.ops.sqrt(delta[..., 0] * delta[..., 0] + delta[..., 1] * delta[..., 1])

    def _collector_reward(self) -> Array:
        ops, pos, c, a = self.ops, self.world.pos, self.num_collectors, self.num_agents
        collectors = pos[:, :c]
        touching = (self._distances(collectors, collectors) < self._reach_collector) & (
            self._not_self
        )
        reward = 0.0 - self.BONUS * ops.astype(touching.sum(2), self.dtype)
        inf = ops.zeros_like(pos[:, a:, 0])[:, None] + np.inf
        to_treasure = ops.where(self.alive[:, None], self._distances(pos[:, a:], collectors), inf)
        treasure = ops.amin(to_treasure, 2)
        delta = self._deposit_of(self.holding, pos) - collectors
        deposit = ops.sqrt(delta[..., 0] * delta[..., 0] + delta[..., 1] * delta[..., 1])
        empty = self.holding < 0
        heading = ops.where(
            empty, reward - self.SHAPING * treasure, reward - self.SHAPING * deposit
        )
        some_alive = self.alive.any(1)[:, None]
        reward = ops.where(empty & ~some_alive, reward, heading)
        return reward + self.bonus[:, None]

    def _deposit_reward(self) -> Array:
        ops, pos, c, a = self.ops, self.world.pos, self.num_collectors, self.num_agents
        deposits, collectors = pos[:, c:a], pos[:, :c]
        carrying = self.holding[:, :, None] == self._deposit_types  # [E, collector, deposit]
        # The distance from each deposit to each collector, as c.pos - deposit.pos.
        delta = collectors[:, :, None] - deposits[:, None]
        dist = ops.sqrt(delta[..., 0] * delta[..., 0] + delta[..., 1] * delta[..., 1])
        carrier = ops.amin(ops.where(carrying, dist, ops.zeros_like(dist) + np.inf), 1)
        centroid = collectors[:, 0]
        for k in range(1, c):  # np.mean along the collectors: added in order
            centroid = centroid + collectors[:, k]
        centroid = centroid / c
        crowd = norm(centroid[:, None] - deposits)
        shaped = ops.where(
            carrying.any(1), 0.0 - self.SHAPING * carrier, 0.0 - self.SHAPING * crowd
        )
        return shaped + self.bonus[:, None]

    def observe(self) -> dict[str, Array]:
        world, c, a = self.world, self.num_collectors, self.num_agents
        pos, vel = world.pos[:, :a], world.vel[:, :a]
        held = self._held()
        others = self._sorted_others(pos, vel, held)  # [E, agent, (a - 1) * size]
        treasures = self._sorted_treasures(pos)  # [E, agent, t * size]
        collectors = [pos[:, :c], vel[:, :c], held, others[:, :c], treasures[:, :c]]
        deposits = [pos[:, c:], vel[:, c:], others[:, c:], treasures[:, c:]]
        obs = (self.assemble(collectors), self.assemble(deposits))
        return dict(zip(self._names, obs, strict=True))

    def _held(self) -> Array:
        """``[E, collector, types]``: one-hot of the type each collector holds (zeros for
        none)."""
        held = self._one_hot[self.holding.clip(0, None)]
        return self.ops.where((self.holding >= 0)[..., None], held, self.ops.zeros_like(held))

    def _sorted_others(self, pos: Array, vel: Array, held: Array) -> Array:
        """Each agent's view of the others, nearest first: [their position - its own,
        their velocity, deposit type one-hot, held type one-hot]."""
        ops, e, a = self.ops, self.num_envs, self.num_agents
        deposits = ops.broadcast_to(self._deposit_code[None], (e, *self._deposit_code.shape))
        code = ops.concat([ops.concat([ops.zeros_like(held), held], 2), deposits], 1)
        relative = pos[:, None] - pos[:, :, None]  # [E, agent, other]: other - agent
        dist = ops.sqrt(relative[..., 0] * relative[..., 0] + relative[..., 1] * relative[..., 1])
        dist = ops.take(dist.reshape(e, a * a), self._other_pairs, 1).reshape(e, a, a - 1)
        others = ops.broadcast_to(self._others[None], dist.shape)
        order = ops.gather(others, ops.argsort(dist, 2), 2)
        return self._views(ops.concat([pos, vel, code], 2), order, pos)

    def _sorted_treasures(self, pos: Array) -> Array:
        """Each agent's view of the treasures, live ones nearest first, then the picked-up
        ones as zeros: [position - its own, type one-hot]."""
        ops, a = self.ops, self.num_agents
        treasures = self.world.pos[:, a:]
        relative = treasures[:, None] - pos[:, :, None]  # [E, agent, treasure, 2]
        dist = ops.sqrt(relative[..., 0] * relative[..., 0] + relative[..., 1] * relative[..., 1])
        alive = self.alive[:, None]
        key = ops.where(alive, dist, ops.zeros_like(dist) + self.DEAD_LAST)
        live = ops.astype(self.alive, self.dtype)[..., None]
        table = ops.concat([treasures, self._one_hot[self.kind], live], 2)
        view = self._views(table, ops.argsort(key, 2), pos)
        view = view.reshape(*key.shape, -1)
        view = ops.where(view[..., -1:] > 0, view[..., :-1], ops.zeros_like(view[..., :-1]))
        return view.reshape(*key.shape[:2], -1)

    def _views(self, table: Array, order: Array, pos: Array) -> Array:
        """``[E, agent, k * size]``: the rows ``order`` ``[E, agent, k]`` of ``table``
        ``[E, rows, size]`` (its first two columns positions, made relative to each
        agent's own ``pos``)."""
        e, rows, size = table.shape
        flat = order + self._row_starts[rows]
        view = self.ops.take(table.reshape(1, e * rows, size), flat.reshape(-1), 1)
        view = view.reshape(*order.shape, size)  # a fresh array: made relative in place
        view[..., :2] = view[..., :2] - pos[:, :, None]
        return view.reshape(*order.shape[:2], -1)

    # -- mpe2 interop ------------------------------------------------------------------------

    def to_mpe2_extra(self, copy: int, env: Any) -> None:
        world = env.world
        holding = to_numpy(self.holding[copy]).tolist()
        for agent, held in zip(world.agents, holding, strict=False):
            agent.holding = None if held < 0 else held
            agent.color = _GREY.copy() if held < 0 else 0.85 * self.colors[held]
        kinds, alive = to_numpy(self.kind[copy]).tolist(), to_numpy(self.alive[copy]).tolist()
        for landmark, kind, live in zip(world.landmarks, kinds, alive, strict=True):
            landmark.type, landmark.alive = kind, live
            landmark.color = self.colors[kind].copy()
        world.np_random = self._respawns.generator(copy)

    def from_mpe2_extra(self, env: Any, copy: int) -> None:
        world, c = env.world, self.num_collectors
        holding = [-1 if a.holding is None else a.holding for a in world.agents[:c]]
        self.holding[copy] = self.place.asarray(np.array(holding, np.int64))
        kinds = np.array([lm.type for lm in world.landmarks], np.int64)
        self.kind[copy] = self.place.asarray(kinds)
        self.alive[copy] = self.place.asarray(np.array([lm.alive for lm in world.landmarks]))
        self._respawns.set_generator(copy, world.np_random)
