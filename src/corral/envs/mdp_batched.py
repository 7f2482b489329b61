"""Natively batched ``mdp/...`` envs: E copies of a :mod:`corral.envs.mdp` env as arrays.

Each class is built from a dict env's tables (:meth:`BatchedTabularMDP.of`,
:meth:`BatchedMatrixGame.of`), so the two never disagree: copy ``i`` of
``reset(seed=s)`` and its steps give exactly what the dict env gives after
``reset(seed=s + i)`` with the same actions, on numpy or on torch on any
device.

Chance events are drawn the dict env's way, from one numpy generator per copy
(:class:`~corral.batched_env.CopyGenerators`): a dict :class:`TabularMDP`
draws one uniform at reset and one per step and samples by a cumulative
table. Each copy keeps the next stretch of its generator's stream in a row of
one array (several episodes long: an episode lasts at most
``max_episode_steps`` steps) and a position in it; a step reads every copy's
next uniform with one indexing operation. The env counts on the host how few
uniforms any row may have left; only a reset where that may be fewer than an
episode's (or that reseeds a copy) looks at the rows, and tops up each row
that is half used (or that starts with too few) from its copy's generator, in
the generator's order. On a device (where the place does not compute on the
host, see :attr:`corral.Place.computes_on_host`) the copies draw instead from
:class:`~corral.arrays.CopyStreams` there (numpy's generators as arrays): no
step or unseeded reset reads the host or copies from it. Envs without chance
events have no generators.

These envs trust their actions (``0 <= action < n`` for every acting agent):
the vector layer checks them before they arrive.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays import Array, CopyStreams, Place, ops_in, to_numpy
from corral.batched_env import BatchedEnv, BatchedStep, CopyGenerators, Seed, copy_seeds
from corral.envs.mdp import MatrixGame, TabularMDP

# How many of its longest episodes a copy's row of uniforms holds: a copy draws from its
# generator (a Python call) about once in this many episodes.
_EPISODES_PER_DRAW = 16


class _Tables(BatchedEnv):
    """What both classes share: the dict env's spaces, metadata and place."""

    state_space: spaces.Box  # both dict envs have one

    def __init__(self, env: Any, num_envs: int, array: str, device: str) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self.num_envs = num_envs
        self.place = Place(array, device)
        self._ops = ops_in(self.place)
        self.possible_agents = list(env.possible_agents)
        self._obs_spaces = {a: env.observation_space(a) for a in self.possible_agents}
        self._action_spaces = {a: env.action_space(a) for a in self.possible_agents}
        self.state_space = env.state_space
        self.metadata = {**env.metadata, "render_modes": []}  # no render(): the dict env draws
        self.max_episode_steps = env.max_episode_steps
        self.optimal_return = env.optimal_return
        self._groups = super().groups
        self._started = False

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """Group name -> its agents, in array order (:func:`corral.group_agents`)."""
        return self._groups

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_spaces[agent]

    def _mask(self, where: Array | None) -> Array:
        """``where`` as a bool array ``[E]`` of this env's place (all True for ``None``)."""
        if where is None:
            mask = self.place.zeros((self.num_envs,), np.bool_)
            mask[...] = True
            return mask
        mask = self.place.asarray(where, np.bool_)
        if tuple(mask.shape) != (self.num_envs,):
            raise ValueError(
                f"where must be a bool array of shape ({self.num_envs},) (one entry per copy), "
                f"got shape {tuple(mask.shape)}"
            )
        return mask

    def _check_started(self) -> None:
        if not self._started:
            raise RuntimeError(f"{type(self).__name__}.step() before reset(): call reset() first")

    def _per_agent(self, flags: Array) -> dict[str, Array]:
        """Bool ``flags`` ``[E]`` (one per copy) repeated for every agent of each group."""
        return {
            g: flags[:, None] | self.place.zeros((self.num_envs, len(agents)), np.bool_)
            for g, agents in self._groups.items()
        }

    def _all_legal(self) -> dict[str, Array]:
        masks = {}
        for g, agents in self._groups.items():
            n = int(self._action_spaces[agents[0]].n)
            mask = self.place.zeros((self.num_envs, len(agents), n), np.bool_)
            mask[...] = True
            masks[g] = mask
        return masks


class BatchedTabularMDP(_Tables):
    """``num_envs`` copies of a :class:`~corral.envs.mdp.TabularMDP`, stepped as arrays.

    Examples:
        >>> import numpy as np
        >>> from corral.envs.mdp import two_round_nmdp
        >>> env = BatchedTabularMDP.of(two_round_nmdp(), num_envs=4)
        >>> out = env.reset(seed=0)
        >>> out = env.step({"agent": np.zeros((4, 1), dtype=np.int64)})
        >>> out.obs["agent"].shape, out.alive["agent"].tolist()
        ((4, 1, 4), [[True], [True], [True], [True]])
    """

    def __init__(self, env: TabularMDP, num_envs: int, array: str, device: str) -> None:
        super().__init__(env, num_envs, array, device)
        (self._group,) = self._groups
        put = self.place.from_host
        num_states = len(env.terminal)
        self._one_hots = put(
            np.eye(num_states, dtype=env.observation_space(self.possible_agents[0]).dtype)
        )
        self._rewards = put(env.rewards.copy())
        self._terminal = put(env.terminal.copy())
        initial, transitions = env.sampling_tables
        self._initial_cumulative = put(initial.copy())
        self._cumulative = put(transitions.copy())
        chance = (env.transitions[~env.terminal] > 0).sum(axis=-1).max() > 1
        chance = chance or (env.initial > 0).sum() > 1
        # One uniform at reset and one per step: an episode draws at most this many.
        self._episode_draws = 1 + env.max_episode_steps
        # On a device: the copies' generators as streams there (no rows of uniforms).
        on_device = chance and not self.place.computes_on_host
        self._streams = CopyStreams(num_envs, self.place) if on_device else None
        self._seeded = False  # whether every copy's stream was seeded
        rows = chance and not on_device  # else no rows of uniforms drawn ahead on the host
        width = _EPISODES_PER_DRAW * self._episode_draws if rows else 1
        self._generators = CopyGenerators(num_envs) if rows else None
        # Each copy's coming uniforms, and the position of its next one (past the end: none).
        self._uniforms = self.place.zeros((num_envs, width), np.float64)
        self._next = put(np.full(num_envs, width, dtype=np.int64))
        self._has_row = np.zeros(num_envs, np.bool_)  # copies whose row comes from a generator
        self._spare = 0  # on the host: no row holds fewer uniforms than this
        first_terminal = int(np.flatnonzero(env.terminal)[0])
        self._state = put(np.full(num_envs, first_terminal, dtype=np.int64))
        self._copies = put(np.arange(num_envs))

    @classmethod
    def of(
        cls, env: TabularMDP, num_envs: int, array: str = "numpy", device: str = "cpu"
    ) -> BatchedTabularMDP:
        """``num_envs`` copies of ``env`` (its tables; its own state is not shared)."""
        return cls(env, num_envs, array, device)

    def reset(
        self, seed: Seed = None, where: Array | None = None, options: dict[str, Any] | None = None
    ) -> BatchedStep:
        """Draw the initial state of each selected copy from its generator."""
        seeds = copy_seeds(seed, self.num_envs)
        mask = self._mask(where)
        if self._generators is not None:
            self._refill(seeds, mask)
        elif self._streams is not None and (seed is not None or not self._seeded):
            self._streams.seed(seeds, None if where is None else to_numpy(mask))
            self._seeded = self._seeded or where is None
        start = _sample(self._initial_cumulative, self._draw(mask))
        self._state = self._ops.where(mask, start, self._state)
        self._started = True
        return self._result()

    def step(self, actions: dict[str, Any]) -> BatchedStep:
        """Draw each live copy's next state; a copy that entered a terminal state is done."""
        self._check_started()
        ops, state = self._ops, self._state
        live = ~self._terminal[state]
        action = self.place.asarray(actions[self._group][:, 0], np.int64)
        action = ops.where(live, action, 0)
        following = _sample(self._cumulative[state, action], self._draw(live))
        following = ops.where(live, following, state)
        reward = ops.where(live, self._rewards[state, action, following], 0.0)
        self._state = following
        done = live & self._terminal[following]
        return self._result(
            reward={self._group: reward[:, None]},
            terminated={self._group: done[:, None]},
            truncated={self._group: self.place.zeros((self.num_envs, 1), np.bool_)},
        )

    def _draw(self, copies: Array) -> Array:
        """The next uniform of each of ``copies`` (a bool array ``[E]``), as the dict env's
        ``rng.random()`` gives it; zeros where the env has no chance events."""
        if self._streams is not None:
            return self._streams.uniform(0.0, 1.0, 1, copies)[:, 0]
        if self._generators is None:
            return self.place.zeros((self.num_envs,), np.float64)
        position = self._ops.where(copies, self._next, 0)
        self._next = self._next + copies
        self._spare -= 1
        return self._uniforms[self._copies, position]

    def _refill(self, seeds: list[int | None], starting: Array) -> None:
        """Give every copy that starts an episode enough uniforms for it: a reseeded copy a
        row from its new generator, a copy short of them its leftovers followed by the next
        draws of its generator. Where some row may hold too few (by :attr:`_spare`), every
        row at least half used is topped up the same way (the copy draws the same
        uniforms), so that the rows are looked at on the host only every few episodes."""
        assert self._generators is not None
        width = self._uniforms.shape[1]
        seeded = seeds.count(None) < len(seeds)
        if not seeded and self._spare >= self._episode_draws and self._has_row.all():
            return  # every row holds an episode's uniforms: nothing to read
        start, left = to_numpy(starting), width - to_numpy(self._next)
        refill = (start | self._has_row) & (left < max(width // 2, self._episode_draws))
        if seeded:
            refill = refill | (np.array([s is not None for s in seeds]) & start)
        indices = np.flatnonzero(refill)
        left[indices] = width
        self._spare = int(left[start | self._has_row].min(initial=width))
        self._has_row |= refill
        if len(indices) == 0:
            return
        at = self.place.asarray(indices)
        rows, positions = to_numpy(self._uniforms[at]).copy(), to_numpy(self._next[at])
        # a copy topped up as its episode goes on keeps its generator, whatever the seeds
        seeds = [s if start[i] else None for i, s in enumerate(seeds)]
        generators = self._generators.at_reset(seeds, indices.tolist())
        for k, (i, generator) in enumerate(zip(indices, generators, strict=True)):
            kept = rows[k, positions[k] :] if seeds[i] is None else rows[k, :0]
            rows[k] = np.concatenate([kept, generator.random(width - len(kept))])
        self._uniforms[at] = self.place.from_host(rows)
        self._next[at] = 0

    def _result(self, **step: Any) -> BatchedStep:
        g, state = self._group, self._state
        return BatchedStep(
            obs={g: self._one_hots[state][:, None]},
            alive={g: ~self._terminal[state][:, None]},
            acting={g: ~self._terminal[state][:, None]},
            action_mask=self._all_legal(),
            state=self._one_hots[state],
            **step,
        )


class BatchedMatrixGame(_Tables):
    """``num_envs`` copies of a :class:`~corral.envs.mdp.MatrixGame`, stepped as arrays.

    Examples:
        >>> import numpy as np
        >>> from corral.envs.mdp import climbing_game
        >>> env = BatchedMatrixGame.of(climbing_game(), num_envs=2)
        >>> out = env.reset(seed=0)
        >>> out = env.step({"player": np.array([[0, 0], [0, 1]])})
        >>> out.reward["player"].tolist()
        [[11.0, 11.0], [-30.0, -30.0]]
    """

    def __init__(self, env: MatrixGame, num_envs: int, array: str, device: str) -> None:
        super().__init__(env, num_envs, array, device)
        payoffs = env.payoffs
        num_players = payoffs.shape[0]
        # Payoffs of every player for each joint action, by its flat index: [joint, player].
        self._payoffs = self.place.from_host(payoffs.reshape(num_players, -1).T.copy())
        strides = np.cumprod((*payoffs.shape[2:], 1)[::-1])[::-1]
        self._stride = {a: int(s) for a, s in zip(self.possible_agents, strides, strict=True)}
        player = {a: k for k, a in enumerate(self.possible_agents)}
        # each group's columns, as arrays of the place (a list would be copied there per step)
        self._players = {
            g: self.place.from_host(np.array([player[a] for a in agents], np.int64))
            for g, agents in self._groups.items()
        }
        self._live = self.place.zeros((num_envs,), np.bool_)

    @classmethod
    def of(
        cls, env: MatrixGame, num_envs: int, array: str = "numpy", device: str = "cpu"
    ) -> BatchedMatrixGame:
        """``num_envs`` copies of ``env`` (its payoff table)."""
        return cls(env, num_envs, array, device)

    def reset(
        self, seed: Seed = None, where: Array | None = None, options: dict[str, Any] | None = None
    ) -> BatchedStep:
        """Every player of each selected copy is asked to act. The game has no chance events."""
        copy_seeds(seed, self.num_envs)  # the same checks as an env with chance events
        self._live = self._live | self._mask(where)
        self._started = True
        return self._result()

    def step(self, actions: dict[str, Any]) -> BatchedStep:
        """Pay every player of each live copy from the table; those games are over."""
        self._check_started()
        live = self._live
        joint = self.place.zeros((self.num_envs,), np.int64)
        for g, agents in self._groups.items():
            group_actions = self.place.asarray(actions[g], np.int64)
            for j, agent in enumerate(agents):
                joint = joint + group_actions[:, j] * self._stride[agent]
        joint = self._ops.where(live, joint, 0)
        paid = self._ops.where(live[:, None], self._payoffs[joint], 0.0)
        reward = {g: paid[:, players] for g, players in self._players.items()}
        done = self._per_agent(live)
        self._live = self.place.zeros((self.num_envs,), np.bool_)
        return self._result(
            reward=reward,
            terminated=done,
            truncated={g: self.place.zeros(d.shape, np.bool_) for g, d in done.items()},
        )

    def _result(self, **step: Any) -> BatchedStep:
        obs = {}
        for g, agents in self._groups.items():
            space = self._obs_spaces[agents[0]]
            obs[g] = self.place.zeros((self.num_envs, len(agents), *space.shape), space.dtype)
        state_space = self.state_space
        return BatchedStep(
            obs=obs,
            alive=self._per_agent(self._live),
            acting=self._per_agent(self._live),
            action_mask=self._all_legal(),
            state=self.place.zeros((self.num_envs, *state_space.shape), state_space.dtype),
            **step,
        )


_BATCHED: dict[type, type[_Tables]] = {
    TabularMDP: BatchedTabularMDP,
    MatrixGame: BatchedMatrixGame,
}


def batch(
    env: TabularMDP | MatrixGame, num_envs: int, array: str = "numpy", device: str = "cpu"
) -> BatchedEnv:
    """The natively batched version of a dict ``mdp`` env: ``num_envs`` copies of it."""
    for kind, batched in _BATCHED.items():
        if isinstance(env, kind):
            return batched(env, num_envs, array, device)
    raise TypeError(
        f"no batched version of {type(env).__name__}; expected a TabularMDP or a MatrixGame"
    )


def _sample(cumulative: Array, uniform: Array) -> Array:
    """``searchsorted(cumulative[..., :], uniform, side="right")`` along the last axis, per row:
    how the dict env samples from a cumulative table."""
    return (cumulative <= uniform[..., None]).sum(-1)
