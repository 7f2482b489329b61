"""The base of corral's natively batched mpe2 scenarios: ``E`` copies stepped as arrays.

:class:`BatchedMPE` does what mpe2's ``SimpleEnv`` does around a scenario:
decoding discrete and continuous actions (movement and communication), the
world step (:class:`~corral.envs.mpe.world.BatchedWorld`), mixing global and
local rewards, the step count and ``max_cycles``, observations and the global
state. A scenario subclass names its mpe2 module and supplies the scenario's
parts as array operations: the reset draws, the observations, the rewards, and
whatever state it keeps beside the world (goals, colours).

Each copy is exact to mpe2: in numpy float64, copy ``i`` of ``reset(seed=s)``
and the steps after it give bit-identically what mpe2's parallel env reset
with ``seed=s + i`` gives for the same actions (tests/envs/mpe/test_batched_mpe.py).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays import CopyStreams, Place, to_numpy
from corral.batched_env import Array, BatchedEnv, BatchedStep, Seed, copy_seeds
from corral.envs.mpe.arguments import check_arguments
from corral.envs.mpe.world import BatchedWorld, Bodies
from corral.envs.step_count import StepCount
from corral.errors import MissingDependencyError
from corral.groups import group_agents

DTYPES = ("float64", "float32")
# Discrete movement: 0 no-op, 1 -x, 2 +x, 3 -y, 4 +y.
_MOVES = np.array([[0.0, 0.0], [-1.0, 0.0], [1.0, 0.0], [0.0, -1.0], [0.0, 1.0]])
_MOVE_ACTIONS = 5


class BatchedMPE(BatchedEnv):
    """``num_envs`` copies of an mpe2 scenario (a subclass names which), stepped as arrays.

    Takes the mpe2 env's keyword arguments (checked by mpe2 itself) and has its
    agents, spaces, ``state_space`` and ``max_cycles``. ``dtype`` is what the
    physics computes in: ``"float64"`` (the default on the CPU) as mpe2 does,
    ``"float32"`` (the default on a GPU) for speed; observations and states are
    float32 either way, as mpe2's. ``compile=True`` (torch only) steps through
    ``torch.compile``: fused kernels, after a compilation of some seconds at the
    first step. A keyword argument the batched scenario cannot
    honour raises a ``ValueError`` naming it.

    Copy ``i`` of ``reset(seed=s)`` starts where mpe2's ``reset(seed=s + i)``
    does, and later unseeded resets of that copy draw what mpe2's do. Actions
    are not checked here (the vector layer checks them against the spaces).
    ``render(copy)`` draws one copy with mpe2's renderer.
    """

    mpe2_module: str = ""  # the scenario's module, e.g. "mpe2.simple_spread.simple_spread"
    # Keyword arguments the batched scenario supports only at one value: name -> that value.
    fixed_arguments: dict[str, Any] = {"benchmark_data": False}
    metadata: dict[str, Any] = {"render_modes": ["rgb_array"]}  # and mpe2's, once built
    simultaneous = True
    settable_attributes = ("max_cycles",)  # read at every step, as mpe2 reads it
    max_cycles = StepCount()

    def __init__(
        self,
        num_envs: int,
        *,
        array: str = "numpy",
        device: str = "cpu",
        dtype: str | None = None,
        render_mode: str | None = None,
        compile: bool = False,
        **kwargs: Any,
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)):
            raise TypeError(f"num_envs must be an int, got {num_envs!r}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self.num_envs = int(num_envs)
        self.place = Place(array, device)
        if dtype is None:
            dtype = "float32" if self.place.device.startswith("cuda") else "float64"
        if str(dtype) not in DTYPES:
            raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
        self.check_render_mode(render_mode, "render one copy with env.render(copy)")
        for name, value in self.fixed_arguments.items():
            if name in kwargs and kwargs[name] != value:
                raise ValueError(
                    f"{type(self).__name__} does not support {name}={kwargs[name]!r} (only "
                    f"{name}={value!r}); use the mpe2 env itself: make_vec(..., native=False)"
                )
        self.render_mode = render_mode
        self.kwargs = dict(kwargs)
        raw = self.mpe2_env(**kwargs)
        self.metadata = {**raw.metadata, "render_modes": BatchedMPE.metadata["render_modes"]}
        self.possible_agents = list(raw.possible_agents)
        self._obs_spaces = {a: raw.observation_space(a) for a in self.possible_agents}
        self._action_spaces = {a: raw.action_space(a) for a in self.possible_agents}
        self.state_space = raw.state_space
        self.max_cycles = raw.max_cycles
        self.continuous_actions = bool(raw.continuous_actions)
        self.local_ratio = raw.local_ratio
        self.dynamic_rescaling = raw.dynamic_rescaling
        grouped = group_agents(self.possible_agents, self.observation_space, self.action_space)
        self._groups = {name: tuple(agents) for name, agents in grouped.items()}
        index = {a: i for i, a in enumerate(self.possible_agents)}
        self._group_index = {g: [index[a] for a in agents] for g, agents in self._groups.items()}

        self.bodies = Bodies.of(raw.world)
        self.world = BatchedWorld(self.bodies, self.num_envs, self.place, dtype)
        self.dtype = self.world.dtype
        self.ops = self.world.ops
        na = self.bodies.num_agents
        # Every agent's other agents in mpe2's order (by index), laid end to end:
        # [na * (na - 1)], for a take along the entity or agent axis.
        self.others = self.table([j for i in range(na) for j in range(na) if j != i], np.int64)
        self._action_specs = [self._action_spec(g, index) for g, index in self._group_index.items()]
        order = [i for index in self._group_index.values() for i in index]
        self._action_order = (
            None if order == sorted(order) else self.table(np.argsort(order), np.int64)
        )
        self.streams = CopyStreams(self.num_envs, self.place)  # each copy's np_random
        self._seeded = False  # every copy has a stream
        zeros = self.place.zeros
        self.steps = zeros((self.num_envs,), np.int64)  # each copy's world steps
        self._alive = zeros((self.num_envs,), np.bool_)
        self._cam_range = zeros((self.num_envs,), np.float64)  # at reset, for rendering
        self._moves = self.table(_MOVES)
        self._eye = self.table(np.eye(max(self.bodies.dim_c, 1)))
        self._renderer: Any = None
        self.scenario = raw.scenario  # mpe2's: its options and curriculum stage
        self.setup(raw)
        self._advance = self._step_all
        if compile:
            if not self.place.is_torch:
                raise ValueError("compile=True compiles torch code: it needs array='torch'")
            self._advance = self.ops.torch.compile(self._step_all, dynamic=False)

    # -- what a scenario supplies -----------------------------------------------------------

    def setup(self, raw: Any) -> None:
        """Build the scenario's tables from the mpe2 env ``raw`` (built with the same
        arguments, freshly reset); called once at the end of ``__init__``."""

    def reset_world(self, draw: Draws, where: Array | None) -> None:
        """Draw the selected copies' new episode, in mpe2's order, from ``draw`` and write
        it into :attr:`world` (and the scenario's own state) where ``where`` holds (all
        copies for ``None``): see :meth:`select`."""
        raise NotImplementedError

    def observe(self) -> dict[str, Array]:
        """Every group's observations ``[E, n_g, obs_size]`` in the world's dtype."""
        raise NotImplementedError

    def reward(self) -> Array:
        """``[E, num_agents]``: each agent's reward (its local one where mpe2 mixes it with
        :meth:`global_reward` by ``local_ratio``)."""
        raise NotImplementedError

    def global_reward(self) -> Array:
        """``[E]``: the shared reward, for scenarios with ``local_ratio``."""
        raise NotImplementedError

    def terminal(self) -> Array | None:
        """``[E]`` bool: the copies whose episode ends now (``None``: the scenario never
        ends one)."""
        return None

    def post_step(self) -> None:
        """What the scenario does after the world step and before the rewards (only in the
        copies :attr:`live` selects: ``[E]`` bool, those whose episode was running when
        the step began; the others must not change)."""

    def to_mpe2_extra(self, copy: int, env: Any) -> None:
        """Write the scenario's own state of ``copy`` (goals, colours) into the mpe2 raw
        env ``env``."""

    def from_mpe2_extra(self, env: Any, copy: int) -> None:
        """Read the scenario's own state of ``copy`` from the mpe2 raw env ``env``."""

    # -- helpers for scenarios ---------------------------------------------------------------

    def mpe2_env(self, **kwargs: Any) -> Any:
        """A fresh mpe2 raw env of this scenario (its ``AssertionError`` on a bad argument
        raised as a ``ValueError``)."""
        try:
            module = importlib.import_module(self.mpe2_module)
        except ModuleNotFoundError as err:
            raise MissingDependencyError(
                f"{type(self).__name__} reads its scenario from mpe2, which is not installed: "
                "pip install 'corral[pettingzoo]'"
            ) from err
        check_arguments(kwargs)
        try:
            return module.raw_env(**kwargs)
        except AssertionError as err:
            raise ValueError(f"{self.mpe2_module}: {err}") from err

    def table(self, values: Any, dtype: Any = None) -> Array:
        """A constant array of the env's place, in the world's dtype unless ``dtype``."""
        dtype = dtype or getattr(self, "dtype", np.float64)
        return self.place.from_host(np.ascontiguousarray(values, dtype))

    def relative_positions(self) -> tuple[Array, Array]:
        """Where each agent sees the landmarks and the other agents, as mpe2's observations
        compute it: ``[E, agent, landmark, 2]`` (landmark - agent) and ``[E, agent, other,
        2]`` (other - agent, the others in :attr:`others`' order)."""
        pos, n = self.world.pos, self.bodies.num_agents
        agents = pos[:, :n, None]
        others = self.ops.take(pos, self.others, 1).reshape(len(pos), n, n - 1, 2)
        return pos[:, None, n:] - agents, others - agents

    def assemble(self, parts: list[Array]) -> Array:
        """An observation ``[E, n, sum of sizes]`` in float32 from ``parts`` (``[E, n, size]``
        each, in the world's dtype), rounded once as mpe2 rounds its float64 ones."""
        return self.ops.concat(parts, 2, np.float32)

    def select(self, where: Array | None, new: Array, old: Array) -> Array:
        """``new`` in the copies ``where`` selects (the first axis), ``old`` elsewhere."""
        if where is None:
            return new
        mask = where.reshape(-1, *([1] * (new.ndim - 1)))
        return self.ops.where(mask, new, old)

    def place_entities(self, where: Array | None, pos: Array, first: int = 0) -> None:
        """Put entities ``first, first + 1, ...`` of the selected copies at ``pos``
        (``[E, k, 2]``, float64 draws) with zero velocity, as a reset does."""
        world, k, ops = self.world, pos.shape[1], self.ops
        new_pos, new_vel = ops.copy(world.pos), ops.copy(world.vel)
        new_pos[:, first : first + k] = ops.astype(pos, self.dtype)
        new_vel[:, first : first + k] = 0
        world.pos = self.select(where, new_pos, world.pos)
        world.vel = self.select(where, new_vel, world.vel)

    # -- curriculum, as mpe2's envs have it -------------------------------------------------

    @property
    def curriculum_stage(self) -> int:
        """The scenario's curriculum stage (0 where it has none), shared by every copy."""
        return self.scenario.curriculum_stage

    def set_curriculum_stage(self, stage: int) -> None:
        """Set the curriculum stage of every copy (clamped), as mpe2's env does."""
        self.scenario.set_curriculum_stage(stage)

    def advance_curriculum(self) -> None:
        self.scenario.advance_curriculum()

    # -- the env -------------------------------------------------------------------------

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        return dict(self._groups)

    @property
    def max_episode_steps(self) -> int:  # type: ignore[override]
        """``max_cycles``: every copy is truncated then."""
        return self.max_cycles

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_spaces[agent]

    def reset(
        self, seed: Seed = None, where: Array | None = None, options: dict[str, Any] | None = None
    ) -> BatchedStep:
        """Start a new episode in the copies ``where`` selects (all for ``None``), drawn as
        mpe2 draws it from each copy's generator."""
        mask = None if where is None else self.ops.astype(self.place.asarray(where), np.bool_)
        if seed is not None or not self._seeded:  # (else no host copy of ``where``)
            host = None if where is None else to_numpy(where).astype(bool)
            self.streams.seed(copy_seeds(seed, self.num_envs), host)
            self._seeded = self._seeded or where is None
        self.reset_world(Draws(self.streams, mask), mask)
        ops, world = self.ops, self.world
        world.comm = self.select(mask, ops.zeros_like(world.comm), world.comm)
        self.steps = self.select(mask, ops.zeros_like(self.steps), self.steps)
        self._alive = self.select(mask, ops.zeros_like(self.steps) == 0, self._alive)
        # mpe2 draws a copy with its camera's range at reset (everything in view).
        cam = ops.amax(abs(ops.astype(world.pos, np.float64)).reshape(self.num_envs, -1), 1)
        self._cam_range = self.select(mask, cam, self._cam_range)
        return self._result()

    def step(self, actions: dict[str, Any]) -> BatchedStep:
        """Step every copy's world with ``actions[g]`` (``[E, n_g]`` ints, or
        ``[E, n_g, size]`` floats for continuous actions)."""
        missing = [g for g in self._groups if g not in actions]
        if missing:
            raise KeyError(
                f"actions has no entry for the groups {missing}; expected {{group: array}} for "
                f"the groups {list(self._groups)}"
            )
        return self._advance({g: self.place.asarray(actions[g]) for g in self._groups})

    def _step_all(self, actions: dict[str, Array]) -> BatchedStep:
        """:meth:`step` of valid actions of the env's place: what ``compile`` compiles."""
        # A copy whose episode ended stands still until it is reset, as a dict env
        # stepped after its end does: no move, no draw, no reward.
        world, self.live = self.world, self._alive
        before = world.pos, world.vel, world.comm
        u, c = self._decode(actions)
        world.step(u, c)
        self.post_step()
        live = self.live
        world.pos, world.vel, world.comm = (
            self.select(live, new, old)
            for new, old in zip((world.pos, world.vel, world.comm), before, strict=True)
        )
        self.steps = self.steps + self.ops.astype(live, np.int64)
        reward = self.reward()
        if self.local_ratio is not None:
            shared = self.global_reward()[:, None]
            reward = shared * (1 - self.local_ratio) + reward * self.local_ratio
        reward = self.ops.where(live[:, None], reward, 0.0)
        out_of_time = self.steps >= self.max_cycles
        ended = self.terminal()
        terminated = None if ended is None else ended & ~out_of_time
        self._alive = live & ~out_of_time
        if terminated is not None:
            self._alive = self._alive & ~terminated
        per_agent = (self.num_envs, len(self.possible_agents))
        truncated = self._broadcast(live & out_of_time, per_agent)
        terminated = (
            self.ops.zeros_like(truncated)
            if terminated is None
            else self._broadcast(live & terminated, per_agent)
        )
        return self._result(reward, terminated, truncated)

    def _broadcast(self, per_copy: Array, shape: tuple[int, int]) -> Array:
        return self.ops.copy(self.ops.broadcast_to(per_copy[:, None], shape))

    def _decode(self, actions: dict[str, Any]) -> tuple[Array, Array]:
        """Every agent's action force ``[E, num_agents, 2]`` (scaled by its ``accel``) and
        communication ``[E, num_agents, dim_c]``, as mpe2's ``_set_action`` makes them."""
        ops, dim_c, us, cs = self.ops, self.bodies.dim_c, [], []
        for spec in self._action_specs:
            action = actions[spec.group]
            u = comm = None
            if self.continuous_actions:
                if spec.movable:
                    # Subtracted in the action's dtype (float32), as mpe2 does.
                    x, y = action[..., 2] - action[..., 1], action[..., 4] - action[..., 3]
                    u = ops.astype(ops.stack([x, y], 2), self.dtype) * spec.accel
                    comm = action[..., _MOVE_ACTIONS:]
                else:
                    comm = action
            else:
                action = ops.astype(action, np.int64)
                if spec.movable:
                    u = self._moves[action % _MOVE_ACTIONS if not spec.silent else action]
                    u = u * spec.accel
                    comm = action // _MOVE_ACTIONS
                else:
                    comm = action
                comm = None if spec.silent else self._eye[comm][..., :dim_c]
            if spec.silent:
                comm = None
            us.append(spec.no_force if u is None else u)
            cs.append(spec.no_comm if comm is None else ops.astype(comm, self.dtype))
        u, c = ops.concat(us, 1), ops.concat(cs, 1)
        if self._action_order is not None:
            u, c = ops.take(u, self._action_order, 1), ops.take(c, self._action_order, 1)
        return u, c

    def _action_spec(self, group: str, index: list[int]) -> _ActionSpec:
        bodies, e, n = self.bodies, self.num_envs, len(index)
        movable, silent = bodies.movable[index], bodies.silent[index]
        if len(set(movable)) > 1 or len(set(silent)) > 1:
            raise NotImplementedError(
                f"group {group!r} mixes movable and immovable or silent and speaking agents"
            )
        return _ActionSpec(
            group,
            bool(movable[0]),
            bool(silent[0]),
            self.table(bodies.accel[index])[:, None],
            self.place.zeros((e, n, 2), self.dtype),
            self.place.zeros((e, n, bodies.dim_c), self.dtype),
        )

    def _result(self, *outcome: Array) -> BatchedStep:
        """The batch of every copy now, with ``outcome`` (reward, terminated, truncated:
        ``[E, num_agents]``) from a step."""
        ops = self.ops
        obs = {g: ops.astype(o, np.float32) for g, o in self.observe().items()}
        alive = self._broadcast(self._alive, (self.num_envs, len(self.possible_agents)))
        step = BatchedStep(obs=obs, alive={}, acting={})
        for group, index in self._group_index.items():
            step.alive[group] = self._agents(alive, index)
            step.acting[group] = self._agents(alive, index)
        e = self.num_envs
        if self._action_order is None:  # the groups hold the agents in order
            parts = [obs[g].reshape(e, -1) for g in self._groups]
            step.state = parts[0] if len(parts) == 1 else ops.concat(parts, 1)
        else:
            per_agent = [None] * len(self.possible_agents)
            for group, index in self._group_index.items():
                for k, i in enumerate(index):
                    per_agent[i] = obs[group][:, k]
            step.state = ops.concat(per_agent, 1)
        if outcome:
            step.reward, step.terminated, step.truncated = (
                {g: self._agents(value, index) for g, index in self._group_index.items()}
                for value in outcome
            )
        return step

    def _agents(self, per_agent: Array, index: list[int]) -> Array:
        """The columns ``index`` of ``[E, num_agents]``, as a fresh array."""
        if index == list(range(index[0], index[-1] + 1)):
            part = per_agent[:, index[0] : index[-1] + 1]
            return self.ops.copy(part)
        return per_agent[:, index]

    # -- mpe2 interop: the differential tests and rendering --------------------------------

    def to_mpe2(self, copy: int, env: Any) -> None:
        """Load copy ``copy``'s state (entities, communication, step count, the scenario's
        own state) into the mpe2 raw env ``env`` of the same arguments."""
        world = env.unwrapped.world if hasattr(env, "unwrapped") else env.world
        pos, vel = to_numpy(self.world.pos[copy]), to_numpy(self.world.vel[copy])
        comm = to_numpy(self.world.comm[copy])
        for i, entity in enumerate(world.entities):
            entity.state.p_pos = pos[i].astype(np.float64)
            entity.state.p_vel = vel[i].astype(np.float64)
        for i, agent in enumerate(world.agents):
            agent.state.c = comm[i].astype(np.float64)
        raw = env.unwrapped if hasattr(env, "unwrapped") else env
        raw.steps = int(to_numpy(self.steps[copy]))
        self.to_mpe2_extra(copy, raw)

    def from_mpe2(self, env: Any, copy: int) -> None:
        """Load the state of the mpe2 raw env ``env`` into copy ``copy``."""
        raw = env.unwrapped if hasattr(env, "unwrapped") else env
        world = raw.world
        pos = np.array([e.state.p_pos for e in world.entities], np.float64)
        vel = np.array([e.state.p_vel for e in world.entities], np.float64)
        comm = np.array([a.state.c for a in world.agents], np.float64).reshape(
            len(world.agents), -1
        )
        self.world.pos[copy] = self.place.asarray(pos.astype(self.dtype))
        self.world.vel[copy] = self.place.asarray(vel.astype(self.dtype))
        self.world.comm[copy] = self.place.asarray(comm.astype(self.dtype))
        self.steps[copy] = raw.steps
        self._alive[copy] = True
        self.from_mpe2_extra(raw, copy)

    def render(self, copy: int = 0) -> np.ndarray:
        """An RGB image ``[700, 700, 3]`` of copy ``copy``, drawn by mpe2."""
        if not float(to_numpy(self._cam_range[copy])):
            raise RuntimeError(f"copy {copy} has no episode to draw yet: reset it first")
        if self._renderer is None:
            self._renderer = self.mpe2_env(**self.kwargs, render_mode="rgb_array")
            self._renderer.reset(seed=0)
        self.to_mpe2(copy, self._renderer)
        self._renderer.original_cam_range = float(to_numpy(self._cam_range[copy]))
        return self._renderer.render()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None


@dataclass(frozen=True)
class _ActionSpec:
    """How a group's actions become forces and communication (read from its first agent:
    a group's agents have the same spaces, so the same kind)."""

    group: str
    movable: bool
    silent: bool
    accel: Array  # [n_g, 1]
    no_force: Array  # [E, n_g, 2] zeros, for immovable agents
    no_comm: Array  # [E, n_g, dim_c] zeros, for silent agents


@dataclass(frozen=True)
class Draws:
    """Random draws of the copies ``where`` selects (all for ``None``), from each copy's
    stream: each call returns an ``[E, ...]`` float64 or int64 array of the env's place
    whose rows of the selected copies hold what those copies' mpe2 generators would draw
    (the other rows are unspecified), and advances only the selected streams."""

    streams: CopyStreams
    where: Array | None

    def uniform(self, low: float, high: float, size: int) -> Array:
        """``Generator.uniform(low, high, size)`` of every selected copy: ``[E, size]``."""
        return self.streams.uniform(low, high, size, self.where)

    def integers(self, low: int, high: int | None = None) -> Array:
        """``Generator.integers(low, high)`` of every selected copy: ``[E]``."""
        return self.streams.integers(low, high, self.where)
