"""The physics of ``E`` copies of an mpe2 world, as arrays: exactly ``World.step``.

mpe2's world moves agents and landmarks ("entities", agents first) in one step:
each movable agent's action force, a soft contact force for every pair of
colliding entities, then damped Euler integration (position with the old
velocity first) with a speed limit. :class:`BatchedWorld` does the same for
every copy with array operations, in the same order of floating-point
operations, so that in numpy float64 every copy's state is bit-identical to
mpe2's (torch differs only where its elementary functions round differently).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from corral.arrays import Array, Place, ops_in


@dataclass(frozen=True)
class Bodies:
    """What the physics reads of each entity (agents first, then landmarks) and of the
    world; read once from an mpe2 ``World``."""

    size: np.ndarray  # [n] float64
    movable: np.ndarray  # [n] bool
    collide: np.ndarray  # [n] bool
    mass: np.ndarray  # [n] float64
    max_speed: np.ndarray  # [n] float64, inf where there is none
    accel: np.ndarray  # [num_agents] float64: the action's scale (5 where None)
    silent: np.ndarray  # [num_agents] bool
    num_agents: int
    dim_c: int
    dt: float
    damping: float
    contact_force: float
    contact_margin: float

    @classmethod
    def of(cls, world: Any) -> Bodies:
        """The bodies of an mpe2 ``World`` (its current entity lists)."""
        entities = list(world.agents) + list(world.landmarks)
        scripted = [a.name for a in world.agents if a.action_callback is not None]
        if scripted:
            raise NotImplementedError(f"scripted agents are not supported: {scripted}")
        noisy = [a.name for a in world.agents if a.u_noise or a.c_noise]
        if noisy:
            raise NotImplementedError(f"action noise (u_noise, c_noise) is not supported: {noisy}")
        return cls(
            size=np.array([e.size for e in entities], np.float64),
            movable=np.array([e.movable for e in entities], bool),
            collide=np.array([e.collide for e in entities], bool),
            mass=np.array([e.mass for e in entities], np.float64),
            max_speed=np.array(
                [np.inf if e.max_speed is None else e.max_speed for e in entities], np.float64
            ),
            accel=np.array([5.0 if a.accel is None else a.accel for a in world.agents]),
            silent=np.array([a.silent for a in world.agents], bool),
            num_agents=len(world.agents),
            dim_c=world.dim_c,
            dt=world.dt,
            damping=world.damping,
            contact_force=world.contact_force,
            contact_margin=world.contact_margin,
        )

    @property
    def num_entities(self) -> int:
        return len(self.size)


class BatchedWorld:
    """The state of ``num_envs`` copies of a world and its step.

    ``pos`` and ``vel`` are ``[E, n, 2]`` (every entity), ``comm`` is
    ``[E, num_agents, dim_c]``, all in ``dtype`` in ``place``. Scenarios read and
    write them directly; :meth:`step` replaces them with new arrays.
    """

    def __init__(self, bodies: Bodies, num_envs: int, place: Place, dtype: Any) -> None:
        self.bodies, self.num_envs, self.place = bodies, num_envs, place
        self.dtype = np.dtype(dtype)
        self.ops = ops_in(place)
        n, na = bodies.num_entities, bodies.num_agents
        self.pos = place.zeros((num_envs, n, 2), self.dtype)
        self.vel = place.zeros((num_envs, n, 2), self.dtype)
        self.comm = place.zeros((num_envs, na, bodies.dim_c), self.dtype)

        def table(values: Any, dtype: Any = None) -> Array:
            return place.from_host(np.ascontiguousarray(values, dtype or self.dtype))

        self.size = table(bodies.size)
        # The movable entities, and the pairs of colliding entities in mpe2's order
        # (a < b), whose forces count for a movable one.
        self.moving = np.flatnonzero(bodies.movable)
        pairs = [
            (a, b)
            for a in range(n)
            for b in range(a + 1, n)
            if bodies.collide[a] and bodies.collide[b] and (bodies.movable[[a, b]].any())
        ]
        self._pair_a = table([a for a, _ in pairs], np.int64)
        self._pair_b = table([b for _, b in pairs], np.int64)
        self._pair_size = table([bodies.size[a] + bodies.size[b] for a, b in pairs])
        # Each movable entity's contact forces in the order mpe2 adds them: at slot k, the
        # pair (an index into the pairs' forces, a zero row past the end where it has
        # fewer) and its sign (+ for a, - for b).
        terms = [
            [(p, 1.0 if a == i else -1.0) for p, (a, b) in enumerate(pairs) if i in (a, b)]
            for i in self.moving
        ]
        slots = max((len(t) for t in terms), default=0)
        pad = [(len(pairs), 1.0)]
        self._slot_pair = [
            table([(t + pad * slots)[k][0] for t in terms], np.int64) for k in range(slots)
        ]
        self._slot_sign = [
            table([(t + pad * slots)[k][1] for t in terms])[:, None] for k in range(slots)
        ]
        moving = self.moving
        self._moving_index = table(moving, np.int64)
        self._agent_moves = bool(bodies.movable[:na].all()) and len(moving) == na
        self._mass = table(bodies.mass[moving])[:, None]
        limited = np.isfinite(bodies.max_speed[moving])
        self._limited = table(limited, bool)
        self._max_speed = table(np.where(limited, bodies.max_speed[moving], 1.0))[:, None]
        self._any_limit = bool(limited.any())
        self._silent = table(bodies.silent, bool)[:, None]
        self._dt = table(bodies.dt)
        self._keep = table(1 - bodies.damping)
        self._cf = table(bodies.contact_force)
        self._k = table(bodies.contact_margin)
        self._movable_agent = table(np.flatnonzero(bodies.movable[:na]), np.int64)
        self._zero = table(0.0)

    def step(self, u: Array, c: Array) -> None:
        """One world step of every copy: ``u`` ``[E, num_agents, 2]`` is each agent's
        action force (already scaled by its ``accel``; ignored for immovable agents),
        ``c`` ``[E, num_agents, dim_c]`` its communication action (ignored if silent)."""
        ops, b = self.ops, self.bodies
        pos, vel = self.pos, self.vel
        force = self._forces(pos, u)
        moving = self.moving
        if len(moving):
            m = self._moving_index
            p, v = ops.take(pos, m, 1), ops.take(vel, m, 1)
            p = p + v * self._dt
            v = v * self._keep
            v = v + (force / self._mass) * self._dt
            if self._any_limit:
                speed = ops.sqrt(v[..., 0] * v[..., 0] + v[..., 1] * v[..., 1])
                over = (speed > self._max_speed[:, 0]) & self._limited
                # (divided by 1 where unused: a standing entity's speed 0 would warn)
                scaled = v / ops.where(over, speed, 1.0)[..., None] * self._max_speed
                v = ops.where(over[..., None], scaled, v)
            if len(moving) == b.num_entities:
                pos, vel = p, v
            else:
                pos, vel = ops.replaced(pos, m, p, 1), ops.replaced(vel, m, v, 1)
        self.pos, self.vel = pos, vel
        self.comm = ops.where(self._silent, self._zero, c)

    def _forces(self, pos: Array, u: Array) -> Array:
        """``[E, moving, 2]``: each movable entity's force, summed in mpe2's order."""
        ops, b = self.ops, self.bodies
        na = b.num_agents
        # The action force of movable agents, zero for movable landmarks (mpe2 has no
        # force for them until a contact adds one: the same sums).
        if self._agent_moves:
            force = u
        else:
            base = ops.zeros_like(pos)[:, :na]
            base[:, self._movable_agent] = u[:, self._movable_agent]
            moving = self._moving_index
            force = ops.take(ops.concat([base, ops.zeros_like(pos)[:, na:]], 1), moving, 1)
        if not self._slot_pair:
            return force
        delta = ops.take(pos, self._pair_a, 1) - ops.take(pos, self._pair_b, 1)
        dist = ops.sqrt(delta[..., 0] * delta[..., 0] + delta[..., 1] * delta[..., 1])
        k = self._k
        penetration = ops.softplus(-(dist - self._pair_size) / k) * k
        pair_force = self._cf * delta / dist[..., None] * penetration[..., None]
        pair_force = ops.concat([pair_force, ops.zeros_like(pair_force[:, :1])], 1)
        for pair, sign in zip(self._slot_pair, self._slot_sign, strict=True):
            force = force + ops.take(pair_force, pair, 1) * sign
        return force
