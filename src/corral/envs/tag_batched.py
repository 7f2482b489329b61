"""``corral/tag`` natively batched: ``E`` copies of :class:`~corral.envs.tag.Tag` as arrays.

Every copy steps in one array operation, in numpy or in torch on any device,
with exactly the results of ``E`` dict ``Tag`` envs packed by the vector layer
(same seeds and actions: bit-identical observations and states).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays import Place, import_torch
from corral.batched_env import Array, BatchedEnv, BatchedStep, CopyGenerators, Seed, copy_seeds
from corral.batched_env import selected as selected_copies
from corral.envs.tag import CATCH_REWARD, PREDATOR_MOVES, PREY_MOVES, Tag, _mask_table
from corral.groups import group_agents

GROUPS = ("predator", "prey")


class BatchedTag(BatchedEnv):
    """``num_envs`` copies of :class:`~corral.envs.tag.Tag`, stepped as arrays.

    Takes the dict env's keyword arguments and has its agents, spaces,
    ``state_space`` and ``max_episode_steps``; its groups are ``"predator"``
    (``[E, num_predators]``) and ``"prey"`` (``[E, num_prey]``). Copy ``i`` of
    ``reset(seed=s)`` starts where ``Tag.reset(seed=s + i)`` does, and a later
    unseeded reset of that copy draws what the dict env's unseeded ``reset()``
    draws. Actions are taken as legal (the vector layer checks them against
    ``action_mask``); those of agents that are not acting are ignored.

    ``reset`` returns every copy's current view (obs, masks, state), the
    selected copies at the start of their new episode. Every array returned
    is fresh: the caller may keep or change it. The env cannot render:
    render the dict env (``make_vec(..., native=False)``).

    Examples:
        >>> env = BatchedTag(4, num_prey=1)
        >>> first = env.reset(seed=0)
        >>> first.obs["predator"].shape, first.action_mask["prey"].shape
        ((4, 2, 7), (4, 1, 9))
        >>> step = env.step({"predator": np.zeros((4, 2), int), "prey": np.zeros((4, 1), int)})
        >>> step.reward["predator"].dtype, step.alive["prey"].shape
        (dtype('float64'), (4, 1))
    """

    metadata = {**Tag.metadata, "render_modes": []}
    simultaneous = True

    def __init__(
        self,
        num_envs: int,
        *,
        array: str = "numpy",
        device: str = "cpu",
        num_predators: int = 2,
        num_prey: int = 2,
        size: int = 7,
        max_cycles: int = 50,
        walls: Sequence[tuple[int, int]] | None = None,
        render_mode: str | None = None,
    ) -> None:
        if render_mode is not None:
            raise ValueError(
                f"the natively batched corral/tag cannot render (render_mode={render_mode!r}); "
                "render the dict env: corral.make('corral/tag', render_mode=...) or "
                "corral.make_vec(..., native=False)"
            )
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)):
            raise TypeError(f"num_envs must be an int, got {num_envs!r}")
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        # The dict env checks the arguments and is the one place for the grid, its walls,
        # the spaces and the observation layout.
        tag = Tag(num_predators, num_prey, size, max_cycles, walls)
        self.num_envs = int(num_envs)
        self.place = Place(array, device)
        self.possible_agents = list(tag.possible_agents)
        self.state_space = tag.state_space
        self.max_episode_steps = tag.max_episode_steps
        self.num_predators, self.num_prey = num_predators, num_prey
        self.size, self.max_cycles = size, max_cycles
        self._obs_spaces = {a: tag.observation_space(a) for a in self.possible_agents}
        self._action_spaces = {a: tag.action_space(a) for a in self.possible_agents}
        grouped = group_agents(self.possible_agents, self.observation_space, self.action_space)
        self._groups = {name: tuple(agents) for name, agents in grouped.items()}

        self._xp = import_torch() if self.place.is_torch else np
        self._generators = CopyGenerators(self.num_envs)
        self._build_tables(tag)
        # Each copy: every agent's cell (row * size + col), the dict env's alive flags
        # (1.0 but for caught prey), who is in the episode, the step count and every
        # group's last observations, masks and the state, as the last call left them.
        e, n = self.num_envs, len(self.possible_agents)
        zeros = self.place.zeros
        self._cell = zeros((e, n), np.int64)
        self._flag = zeros((e, n), np.float32)
        self._alive = zeros((e, n), np.bool_)
        self._t = zeros((e,), np.int64)
        self._obs = [
            zeros((e, len(gather), gather.shape[1]), np.float32) for gather in self._gather
        ]
        self._mask = self._masks(self._cell, self._alive)
        self._state = self._global_state(self._cell, self._flag)

    def _build_tables(self, tag: Tag) -> None:
        """What steps read, as arrays of the env's place: where each move leads from each
        cell (illegal moves stay), which moves are legal, each cell's scaled (row, col), the
        free cells agents start on and where each observation lies among the features."""
        size, cells = tag.size, np.arange(tag.size * tag.size)
        rows, cols = np.divmod(cells, size)
        # Scaled as the dict env scales its float32 (row, col) pairs.
        coord = np.stack([rows, cols], 1).astype(np.float32) * tag._scale
        free = np.array([r * size + c for r, c in tag._free_cells], np.int64)
        host = self.place.from_host
        self._coord, self._free_cells, self._moves, self._legal = host(coord), host(free), [], []
        for moves in (PREDATOR_MOVES, PREY_MOVES):
            legal = np.array(_mask_table(tag._free, moves), bool).reshape(len(cells), -1)
            target = cells[:, None] + np.array([dr * size + dc for dr, dc in moves])
            self._moves.append(host(np.where(legal, target, cells[:, None]).astype(np.int64)))
            self._legal.append(host(legal))
        p, n = tag.num_predators, len(tag.possible_agents)
        self._gather = [host(np.stack(tag._gather[lo:hi])) for lo, hi in ((0, p), (p, n))]
        self._catch = host(np.array(CATCH_REWARD, np.float64))
        self._zero = host(np.array(0.0, np.float64))

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """``{"predator": ("predator_0", ...), "prey": ("prey_0", ...)}``."""
        return dict(self._groups)

    def observation_space(self, agent: str) -> spaces.Box:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> spaces.Discrete:
        return self._action_spaces[agent]

    def reset(
        self, seed: Seed = None, where: Array | None = None, options: dict[str, Any] | None = None
    ) -> BatchedStep:
        """Place every agent of the selected copies on distinct free cells drawn from the
        copy's generator; the other copies' episodes go on."""
        rows = selected_copies(where, self.num_envs)
        generators = self._generators.at_reset(copy_seeds(seed, self.num_envs), rows)
        n = len(self.possible_agents)
        draws = np.empty((len(rows), n), np.int64)
        for k, generator in enumerate(generators):
            draws[k] = generator.choice(len(self._free_cells), size=n, replace=False)
        rows = self.place.from_host(rows)
        cell = self._free_cells[self.place.from_host(draws)]
        self._cell[rows] = cell
        self._flag[rows] = 1.0
        self._alive[rows] = True
        self._t[rows] = 0
        for last, obs in zip(self._obs, self._observe(cell, self._flag[rows]), strict=True):
            last[rows] = obs
        self._mask = self._masks(self._cell, self._alive)
        self._state = self._global_state(self._cell, self._flag)
        return self._result()

    def step(self, actions: dict[str, Any]) -> BatchedStep:
        """Move every live agent of every copy, then remove the prey that were caught."""
        xp, p = self._xp, self.num_predators
        was_alive = self._alive
        old = self._split(self._cell)
        moved = [
            # An agent not alive "stays" (action 0), whatever its entry holds.
            moves[cell, self._actions(actions, g) * alive]
            for moves, cell, g, alive in zip(
                self._moves, old, GROUPS, self._split(was_alive), strict=True
            )
        ]
        caught = self._caught(*old, *moved) & was_alive[:, p:]
        flag = self._flag
        flag[:, p:] *= ~caught
        self._t += 1
        all_caught = ~flag[:, p:].any(1)
        out_of_time = (self._t >= self.max_cycles) & ~all_caught
        going_on = ~(all_caught | out_of_time)[:, None]

        self._cell = cell = xp.concatenate(moved, 1)
        self._alive = alive = was_alive & going_on
        alive[:, p:] &= ~caught
        self._obs = [
            xp.where(was[..., None], obs, last)
            for was, obs, last in zip(
                self._split(was_alive), self._observe(cell, flag), self._obs, strict=True
            )
        ]
        self._mask = self._masks(cell, alive)
        self._state = self._global_state(cell, flag)

        predators = old[0].shape
        prey_was_alive = was_alive[:, p:]
        reward = {
            "predator": xp.broadcast_to(caught.sum(1)[:, None] * self._catch, predators)
            + self._zero,
            "prey": xp.where(caught, -self._catch, self._zero),
        }
        terminated = {
            "predator": xp.broadcast_to(all_caught[:, None], predators) & True,
            "prey": prey_was_alive & (caught | all_caught[:, None]),
        }
        truncated = {
            "predator": xp.broadcast_to(out_of_time[:, None], predators) & True,
            "prey": prey_was_alive & ~caught & out_of_time[:, None],
        }
        return self._result(reward, terminated, truncated)

    def _caught(self, old_pred: Array, old_prey: Array, new_pred: Array, new_prey: Array) -> Array:
        """``[E, Y]``: a predator reached the prey's cell or the two swapped cells."""
        to, was = new_pred[:, :, None], old_pred[:, :, None]
        reached = to == new_prey[:, None, :]
        swapped = (to == old_prey[:, None, :]) & (was == new_prey[:, None, :])
        return (reached | swapped).any(1)

    def _observe(self, cell: Array, flag: Array) -> list[Array]:
        """Each group's observations ``[K, n_g, d_g]`` for ``K`` copies' cells and flags,
        computed as the dict env computes them: a gather from the scaled positions and, for
        each pair of agents, the relative position and alive flag."""
        xp = self._xp
        k, n = cell.shape
        pos = self._coord[cell]
        rel = (pos[:, None, :, :] - pos[:, :, None, :]) * flag[:, None, :, None]
        pairs = xp.concatenate([rel, xp.broadcast_to(flag[:, None, :, None], (k, n, n, 1))], 3)
        features = xp.concatenate([pos.reshape(k, 2 * n), pairs.reshape(k, 3 * n * n)], 1)
        return [features[:, gather] for gather in self._gather]

    def _masks(self, cell: Array, alive: Array) -> list[Array]:
        """Each group's legal moves from its cells; every move for agents not alive."""
        return [
            legal[c] | ~a[..., None]
            for legal, c, a in zip(self._legal, self._split(cell), self._split(alive), strict=True)
        ]

    def _global_state(self, cell: Array, flag: Array) -> Array:
        """Every agent's scaled (row, col) times its alive flag, then the flags."""
        pos = self._coord[cell] * flag[:, :, None]
        return self._xp.concatenate([pos.reshape(cell.shape[0], -1), flag], 1)

    def _split(self, per_agent: Array) -> tuple[Array, Array]:
        """``[E, n, ...]`` as the predators' and the prey's."""
        p = self.num_predators
        return per_agent[:, :p], per_agent[:, p:]

    def _actions(self, actions: dict[str, Any], group: str) -> Array:
        if group not in actions:
            raise KeyError(
                f"actions has no entry for group {group!r}; expected {{group: [E, n_g]}} "
                f"for the groups {list(self._groups)}"
            )
        value = self.place.asarray(actions[group])
        shape = (self.num_envs, len(self._groups[group]))
        if tuple(value.shape) != shape:
            raise ValueError(
                f"actions[{group!r}] has shape {tuple(value.shape)}, expected {shape} "
                "(one action per copy and agent of the group)"
            )
        return value.long() if self.place.is_torch else value.astype(np.int64, copy=False)

    def _result(self, *outcome: dict[str, Array]) -> BatchedStep:
        """The current view of every copy, as fresh arrays."""
        copy = _clone if self.place.is_torch else np.copy
        alive = self._split(self._alive)
        step = BatchedStep(
            obs={g: copy(o) for g, o in zip(GROUPS, self._obs, strict=True)},
            alive={g: copy(a) for g, a in zip(GROUPS, alive, strict=True)},
            acting={g: copy(a) for g, a in zip(GROUPS, alive, strict=True)},
            action_mask={g: copy(m) for g, m in zip(GROUPS, self._mask, strict=True)},
            state=copy(self._state),
        )
        if outcome:
            step.reward, step.terminated, step.truncated = outcome
        return step


def _clone(tensor: Any) -> Any:
    return tensor.clone()
