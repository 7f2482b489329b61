"""``corral/tag`` natively batched: ``E`` copies of :class:`~corral.envs.tag.Tag` as arrays.

Every copy steps in one array operation, in numpy or in torch on any device,
with exactly the results of ``E`` dict ``Tag`` envs packed by the vector layer
(same seeds and actions: bit-identical observations and states).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays import Place, import_torch, torch_dtype
from corral.batched_env import Array, BatchedEnv, BatchedStep, CopyGenerators, Seed, copy_seeds
from corral.batched_env import selected as selected_copies
from corral.envs.tag import CATCH_REWARD, PREDATOR_MOVES, PREY_MOVES, Tag, _mask_table
from corral.groups import group_agents


class BatchedTag(BatchedEnv):
    """``num_envs`` copies of :class:`~corral.envs.tag.Tag`, stepped as arrays.

    Takes the dict env's keyword arguments and has its agents, spaces,
    ``state_space`` and ``max_episode_steps``; its groups are ``"predator"``
    (``[E, num_predators]``) and ``"prey"`` (``[E, num_prey]``). Copy ``i`` of
    ``reset(seed=s)`` starts where ``Tag.reset(seed=s + i)`` does, and a later
    unseeded reset of that copy draws what the dict env's unseeded ``reset()``
    draws. Actions are not checked here (the vector layer checks them against
    ``action_mask``; an illegal move leaves the agent where it is); those of
    agents that are not acting are ignored.

    ``reset(where=...)`` fills only the rows of the selected copies (the
    others are zeros and not to be read). Every array returned is fresh: the
    caller may keep or change it. A step's ``obs`` and ``state`` are views of
    one array laid out copy-minor (not C-contiguous): the vector layer copies
    them into its own arrays, and that one copy also transposes them. The env
    cannot render: render the dict env (``make_vec(..., native=False)``), hence
    no ``render_modes``.

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
        self._ops = _TorchOps(self.place.device) if self.place.is_torch else _NumpyOps()
        self._generators = CopyGenerators(self.num_envs)
        self._draws = Choices(self.num_envs, len(tag._free_cells), len(self.possible_agents))
        self._build_tables(tag)

        # Every copy's state, agent-major ([agent, copy]) so that each operation runs
        # along the copies: every agent's cell (row * size + col), the dict env's alive
        # flags (False for caught prey), who is in the episode, and the step count.
        e, n, zeros = self.num_envs, len(self.possible_agents), self.place.zeros
        self._cell = zeros((n, e), np.int64)
        self._flag = zeros((n, e), np.bool_)
        self._alive = zeros((n, e), np.bool_)
        self._t = zeros((e,), np.int64)
        # Each group's last observations, then the state, one row per value ([R, copy]).
        # The prey's observations after the last step, for those caught before the next.
        prey = self._group_list[1].values
        self._last_prey = zeros((prey.stop - prey.start, e), np.float32)
        self._features = zeros((5 * n + 2 * n * n, e), np.float32)  # a step's scratch

    def _build_tables(self, tag: Tag) -> None:
        """What steps read, as arrays of the env's place: each cell's scaled row and column,
        the free cells agents start on, where each move leads from each cell (illegal moves
        stay), each group's legal moves, and which features are observed and which make
        the state."""
        size, cells = tag.size, np.arange(tag.size * tag.size)
        host = self.place.from_host
        # Scaled as the dict env scales its float32 (row, col) pairs.
        self._row_coord, self._col_coord = (
            host(np.asarray(x, np.float32) * tag._scale) for x in np.divmod(cells, size)
        )
        self._free_cells = host(np.array([r * size + c for r, c in tag._free_cells], np.int64))
        # Both groups' moves in one table [group, cell, action], as wide as the prey's.
        p, n = tag.num_predators, len(tag.possible_agents)
        self._width = width = len(PREY_MOVES)
        moves = np.broadcast_to(cells[:, None], (2, len(cells), width)).copy()  # all stay
        self._group_list: list[_Group] = []
        features, start = [], 0
        for k, (name, agents, kind) in enumerate(
            (("predator", slice(0, p), PREDATOR_MOVES), ("prey", slice(p, n), PREY_MOVES))
        ):
            legal = np.array(_mask_table(tag._free, kind), bool).reshape(len(cells), -1)
            target = cells[:, None] + np.array([dr * size + dc for dr, dc in kind])
            moves[k, :, : len(kind)] = np.where(legal, target, cells[:, None])
            gather = np.stack(tag._gather[agents])
            values = slice(start, start + gather.size)
            masks = host(np.concatenate([legal, np.ones_like(legal)]))
            self._group_list.append(_Group(name, agents, values, gather.shape, masks))
            features.append(gather.ravel())
            start += gather.size
        self._moves = host(moves.ravel())
        self._move_base = host(np.array([0] * p + [size * size * width] * (n - p))[:, None])
        # The values: each group's observations, then the state, as rows of the features
        # that _evaluate computes (the dict env's features, each alive flag once).
        self._state_rows = slice(start, start + 3 * n)
        flags = 2 * n + 2 * n * n
        observed = _feature_rows(np.concatenate(features), n)
        state = [np.arange(flags + n, flags + 3 * n), np.arange(flags, flags + n)]
        self._value_rows = host(np.concatenate([observed, *state]))
        # The prey whose observation each prey value is.
        self._prey_owner = host(np.repeat(np.arange(p, n), self._group_list[1].obs_shape[1]))
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
        draws = self._draws.choose(generators, rows)
        ops, rows = self._ops, self.place.from_host(rows)
        cell = ops.take(self._free_cells, self.place.from_host(draws))
        ops.put_columns(self._cell, rows, cell)
        ops.put_columns(self._flag, rows, True)
        ops.put_columns(self._alive, rows, True)
        ops.put_columns(self._t, rows, 0)
        values = self._evaluate(cell, True)
        return self._result(values, None if where is None else rows)

    def step(self, actions: dict[str, Any]) -> BatchedStep:
        """Move every live agent of every copy, then remove the prey that were caught."""
        ops, p = self._ops, self.num_predators
        was_alive, old = self._alive, self._cell
        action = ops.concatenate([self._actions(actions, g.name).T for g in self._group_list])
        # An agent not alive "stays" (action 0), whatever its entry holds.
        self._cell = cell = ops.take(
            self._moves, old * self._width + action * was_alive + self._move_base
        )
        prey_was_alive = was_alive[p:]
        caught = self._caught(old[:p], old[p:], cell[:p], cell[p:]) & prey_was_alive
        free = ~caught
        self._flag[p:] &= free
        self._t += 1
        all_caught = ~self._flag[p:].any(0)
        out_of_time = (self._t >= self.max_cycles) & ~all_caught
        self._alive = alive = was_alive & ~(all_caught | out_of_time)
        alive[p:] &= free
        # A prey caught before this step keeps its last observation (predators are in
        # every running episode).
        values, prey = self._evaluate(cell, self._flag, scratch=True), self._group_list[1].values
        ops.keep(values[prey], ops.take(was_alive, self._prey_owner), self._last_prey)
        self._last_prey = ops.copy(values[prey])  # the step's obs are views of values

        # Only an agent alive when the step began can end in it (a copy stepped after its
        # episode ended, like the dict env, ends nobody).
        predators_were_alive = was_alive[:p]
        reward = {
            "predator": ops.broadcast(caught.sum(0) * self._catch, predators_were_alive.shape),
            "prey": ops.where(caught, -self._catch, self._zero),
        }
        terminated = {
            "predator": predators_were_alive & all_caught,
            "prey": prey_was_alive & (caught | all_caught),
        }
        truncated = {
            "predator": predators_were_alive & out_of_time,
            "prey": prey_was_alive & free & out_of_time,
        }
        return self._result(values, None, reward, terminated, truncated)

    def _caught(self, old_pred: Array, old_prey: Array, new_pred: Array, new_prey: Array) -> Array:
        """``[Y, E]``: a predator reached the prey's cell or the two swapped cells."""
        to, was = new_pred[:, None], old_pred[:, None]
        reached = to == new_prey[None]
        swapped = (to == old_prey[None]) & (was == new_prey[None])
        return (reached | swapped).any(0)

    def _evaluate(self, cell: Array, flag: Array | bool, scratch: bool = False) -> Array:
        """``[R, K]``: every observed and state value of ``K`` copies from their cells and
        flags (``[n, K]``, or one for all), with the dict env's float32 operations, so
        bit-identical: a gather from the features (scaled positions, each agent's position
        relative to each agent, zero once caught, the flags, the positions times the flags),
        built in the env's scratch if ``scratch`` (all copies: a step)."""
        ops, (n, k) = self._ops, cell.shape
        features = self._features if scratch else ops.empty((5 * n + 2 * n * n, k), np.float32)
        pos = features[: 2 * n].reshape(n, 2, k)
        pos[:, 0] = ops.take(self._row_coord, cell)
        pos[:, 1] = ops.take(self._col_coord, cell)
        relative = features[2 * n : 2 * n + 2 * n * n].reshape(n, n, 2, k)
        alive = features[2 * n + 2 * n * n : 3 * n + 2 * n * n]
        alive[...] = flag
        ops.subtract(pos[None], pos[:, None], out=relative)
        ops.multiply(relative, alive[None, :, None], out=relative)
        ops.multiply(pos, alive[:, None], out=features[3 * n + 2 * n * n :].reshape(n, 2, k))
        return ops.take(features, self._value_rows)

    def _actions(self, actions: dict[str, Any], group: str) -> Array:
        """``actions[group]`` as an int64 array ``[E, n_g]`` of the env's place."""
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
        return self._ops.int64(value)

    def _result(
        self, values: Array, copies: Array | None = None, *outcome: dict[str, Array]
    ) -> BatchedStep:
        """The view of the copies ``copies`` (all for ``None``) from their ``values`` (a
        fresh array ``[R, K]``) and the env's state, and ``outcome`` (reward, terminated,
        truncated; agent-major), as fresh arrays ``[E, ...]``, zeros in the rows of the
        other copies."""
        ops, num_cells = self._ops, self.size * self.size
        cell, alive = self._cell, self._alive
        if copies is not None:
            cell, alive = ops.columns(cell, copies), ops.columns(alive, copies)

        def fresh(per_agent: Array) -> Array:
            part = ops.transposed(per_agent)
            return part if copies is None else ops.embed(part, copies, self.num_envs)

        def view(rows: slice) -> Array:
            """``values[rows]`` copy-major: a view (the caller copies them, a step's copy
            would be a second one), or of the selected copies in zeros."""
            part = values[rows].T
            return part if copies is None else ops.embed(part, copies, self.num_envs)

        step = BatchedStep(obs={}, alive={}, acting={}, action_mask={})
        for g in self._group_list:
            step.obs[g.name] = view(g.values).reshape(-1, *g.obs_shape)
            step.alive[g.name] = fresh(alive[g.agents])
            step.acting[g.name] = ops.copy(step.alive[g.name])
            # An agent not alive reads the table's all-legal rows below its cell.
            key = ops.transposed(cell[g.agents] + num_cells * ~alive[g.agents])
            masks = ops.masks(g.masks, key)
            step.action_mask[g.name] = (
                masks if copies is None else ops.embed(masks, copies, self.num_envs)
            )
        step.state = view(self._state_rows)
        if outcome:
            step.reward, step.terminated, step.truncated = (
                {g: fresh(a) for g, a in field.items()} for field in outcome
            )
        return step


def _feature_rows(index: np.ndarray, n: int) -> np.ndarray:
    """The rows of :meth:`BatchedTag._evaluate`'s features that hold entries ``index`` of
    the dict env's feature vector: ``2 * n`` scaled positions, then for each pair of
    agents ``(i, j)`` j's relative position and j's flag (here the flags come once, after
    all the relative positions)."""
    pair, entry = np.divmod(index - 2 * n, 3)
    row = np.where(entry < 2, 2 * n + 2 * pair + entry, 2 * n + 2 * n * n + pair % n)
    return np.where(index < 2 * n, index, row)


@dataclass(frozen=True)
class _Group:
    """A group's place among the agents and the values, and its mask table."""

    name: str
    agents: slice
    values: slice  # its observations' rows among the values
    obs_shape: tuple[int, ...]  # (n_g, obs_size)
    masks: Array  # [2 * cells, n_actions]: legal moves from each cell, then every move


class _NumpyOps:
    """The operations whose numpy and torch spellings differ; arrays are agent-major."""

    concatenate, where = staticmethod(np.concatenate), staticmethod(np.where)
    subtract, multiply = staticmethod(np.subtract), staticmethod(np.multiply)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.empty(shape, dtype)

    def int64(self, array: np.ndarray) -> np.ndarray:
        return array.astype(np.int64, copy=False)

    def copy(self, array: np.ndarray) -> np.ndarray:
        return array.copy()

    def broadcast(self, row: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.broadcast_to(row, shape)

    def take(self, table: np.ndarray, index: np.ndarray) -> np.ndarray:
        """``table``'s entries (rows) at ``index``: ``[*index.shape, *table.shape[1:]]``."""
        return np.take(table, index, axis=0)

    def masks(self, table: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``[K, n_g, n_actions]``: the rows of a mask table at ``rows`` (``[K, n_g]``)."""
        # One item of n_actions bytes per mask: one copy per item, not n_actions.
        items = table.view(f"V{table.shape[1]}")[:, 0]
        return np.take(items, rows).view(np.bool_).reshape(*rows.shape, table.shape[1])

    def columns(self, array: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """``array[..., columns]``: the entries of some copies."""
        return array[..., columns]

    def put_columns(self, array: np.ndarray, columns: np.ndarray, value: Any) -> None:
        """``array[..., columns] = value``."""
        array[..., columns] = value

    def keep(self, values: np.ndarray, keep: np.ndarray, last: np.ndarray) -> None:
        """``last`` in place of ``values`` where ``keep`` is false."""
        np.putmask(values, ~keep, last)

    def transposed(self, array: np.ndarray) -> np.ndarray:
        """A fresh contiguous copy of ``array.T`` (``[E, rows]``)."""
        if len(array) <= 4:  # a copy whose inner loop is a few agents long is slow
            return np.stack(tuple(array), axis=1)
        return array.T.copy()

    def embed(self, part: np.ndarray, rows: np.ndarray, num_rows: int) -> np.ndarray:
        """``part`` in the ``rows`` of ``num_rows`` zero rows."""
        out = np.zeros((num_rows, *part.shape[1:]), part.dtype)
        out[rows] = part
        return out


class _TorchOps:
    """:class:`_NumpyOps` in torch, on ``device``."""

    def __init__(self, device: str) -> None:
        self.torch = torch = import_torch()
        self.device = torch.device(device)
        self.concatenate, self.where = torch.cat, torch.where
        self.subtract, self.multiply = torch.sub, torch.mul

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.torch.empty(shape, dtype=torch_dtype(dtype), device=self.device)

    def int64(self, array: Any) -> Any:
        return array.long()

    def copy(self, array: Any) -> Any:
        return array.clone()

    def broadcast(self, row: Any, shape: tuple[int, ...]) -> Any:
        return row.expand(shape)

    def take(self, table: Any, index: Any) -> Any:
        flat = self.torch.index_select(table, 0, index.reshape(-1))
        return flat.view(*index.shape, *table.shape[1:])

    def masks(self, table: Any, rows: Any) -> Any:
        return self.take(table, rows)

    def columns(self, array: Any, columns: Any) -> Any:
        return self.torch.index_select(array, array.dim() - 1, columns)

    def put_columns(self, array: Any, columns: Any, value: Any) -> None:
        if isinstance(value, (bool, int, float)):
            array.index_fill_(array.dim() - 1, columns, value)
        else:
            array.index_copy_(array.dim() - 1, columns, value)

    def keep(self, values: Any, keep: Any, last: Any) -> None:
        self.torch.where(keep, values, last, out=values)

    def transposed(self, array: Any) -> Any:
        if len(array) <= 4:
            return self.torch.stack(tuple(array), 1)
        return array.T.clone(memory_format=self.torch.contiguous_format)

    def embed(self, part: Any, rows: Any, num_rows: int) -> Any:
        out = self.torch.zeros((num_rows, *part.shape[1:]), dtype=part.dtype, device=self.device)
        return out.index_copy_(0, rows, part)


class Choices:
    """``generator.choice(m, size=n, replace=False)`` of many copies' generators at once,
    bit for bit, without a Python call per copy where it can.

    numpy draws it (for ``m <= 10000``, and larger ``m`` with small ``n``) with Floyd's
    algorithm, then shuffles the ``n`` values, each step a bounded integer (Lemire's
    method) from the 32-bit words of the generator's 64-bit outputs (the low half first).
    Each copy's words are read ahead from its generator's ``random_raw`` and the draws of
    all copies are computed as array operations. Where this numpy draws differently
    (checked once per ``(m, n)``), or for other sizes, each copy calls ``choice``.
    """

    WORDS = 256  # words read ahead per copy: 36 draws of 4 agents' cells

    def __init__(self, num_copies: int, m: int, n: int, *, check: bool = True) -> None:
        self.m, self.n = m, n
        # The bound of each bounded integer of a draw: Floyd's, then the shuffle's.
        self.bounds = np.array([*range(max(m - n, 1), m), *range(n - 1, 0, -1)], np.uint64)
        span = self.bounds + np.uint64(1)
        self.spans, self.thresholds = span, (np.uint64(2**32) - span) % span
        self.size = max(self.WORDS, 2 * len(self.bounds))
        self.words = np.zeros((num_copies, self.size), np.uint32)
        self.next = np.zeros(num_copies, np.int64)  # each copy's next unread word
        self.end = np.zeros(num_copies, np.int64)  # and the end of its words
        self.sources: list[np.random.Generator | None] = [None] * num_copies
        # Floyd's algorithm on 32-bit words is numpy's way for these sizes.
        floyd = 0 < n <= m < 2**32 and not (m > 10000 and n > m // 50)
        self.exact = floyd and (not check or _emulation_matches(m, n))

    def choose(self, generators: Sequence[np.random.Generator], rows: np.ndarray) -> np.ndarray:
        """``[n, K]``: copy ``rows[k]``'s draw from its generator ``generators[k]``."""
        if not self.exact:
            out = np.empty((len(rows), self.n), np.int64)
            for k, generator in enumerate(generators):
                out[k] = generator.choice(self.m, size=self.n, replace=False)
            return out.T
        for i, generator in zip(rows.tolist(), generators, strict=True):
            if generator is not self.sources[i]:  # a new generator: forget the old words
                self.sources[i], self.next[i], self.end[i] = generator, 0, 0
        d = len(self.bounds)
        for i in rows[self.end[rows] - self.next[rows] < d].tolist():
            self._refill(i)
        at = self.next[rows]
        scaled = self.words[rows[:, None], at[:, None] + np.arange(d)] * self.spans
        self.next[rows] = at + d
        out = self._arrange((scaled >> np.uint64(32)).astype(np.int64))
        # A word that Lemire's method rejects (rare for small bounds) shifts the rest.
        again = np.flatnonzero(((scaled & np.uint64(0xFFFFFFFF)) < self.thresholds).any(1))
        if len(again):
            self.next[rows[again]] = at[again]
            out[:, again] = self._arrange(self._one_by_one(rows[again]))
        return out

    def _arrange(self, values: np.ndarray) -> np.ndarray:
        """``[n, K]``: the draws, from each copy's bounded integers ``[K, len(bounds)]``."""
        m, n, k = self.m, self.n, len(values)
        out, columns, d = np.empty((n, k), np.int64), np.arange(k), 0
        for t, j in enumerate(range(m - n, m)):  # Floyd: a value in [0, j], or j if taken
            value = values[:, d] if j else np.zeros(k, np.int64)
            d += j > 0
            out[t] = np.where((out[:t] == value).any(0), j, value) if t else value
        for i in range(n - 1, 0, -1):  # the shuffle: swap value i with value [0, i]
            other = values[:, d]
            d += 1
            out[i], out[other, columns] = out[other, columns], out[i].copy()
        return out

    def _one_by_one(self, rows: np.ndarray) -> np.ndarray:
        """The bounded integers of the copies ``rows``, drawing again after a rejection."""
        values = np.empty((len(rows), len(self.bounds)), np.int64)
        for d, (span, threshold) in enumerate(zip(self.spans, self.thresholds, strict=True)):
            scaled = self._next_words(rows) * span
            redraw = np.flatnonzero((scaled & np.uint64(0xFFFFFFFF)) < threshold)
            while len(redraw):
                scaled[redraw] = self._next_words(rows[redraw]) * span
                redraw = redraw[(scaled[redraw] & np.uint64(0xFFFFFFFF)) < threshold]
            values[:, d] = scaled >> np.uint64(32)
        return values

    def _next_words(self, rows: np.ndarray) -> np.ndarray:
        """The next 32-bit word of each copy in ``rows`` (as uint64)."""
        for i in rows[self.next[rows] >= self.end[rows]].tolist():
            self._refill(i)
        at = self.next[rows]
        self.next[rows] = at + 1
        return self.words[rows, at].astype(np.uint64)

    def _refill(self, i: int) -> None:
        left = self.words[i, self.next[i] : self.end[i]].copy()
        raw = self.sources[i].bit_generator.random_raw((self.size - len(left)) // 2)
        end = len(left) + 2 * len(raw)
        self.words[i, : len(left)] = left
        self.words[i, len(left) : end : 2] = raw & np.uint64(0xFFFFFFFF)
        self.words[i, len(left) + 1 : end : 2] = raw >> np.uint64(32)
        self.next[i], self.end[i] = 0, end


def _emulation_matches(m: int, n: int) -> bool:
    """Whether :class:`Choices` draws what this numpy's ``Generator.choice`` draws."""
    return _EMULATION_MATCHES.setdefault((m, n), _compare_with_numpy(m, n))


def _compare_with_numpy(m: int, n: int, copies: int = 3, draws: int = 40) -> bool:
    probe = Choices(copies, m, n, check=False)
    ours = [np.random.default_rng(seed) for seed in range(copies)]
    theirs = [np.random.default_rng(seed) for seed in range(copies)]
    for _ in range(draws):
        expected = np.stack([g.choice(m, size=n, replace=False) for g in theirs], 1)
        if not np.array_equal(probe.choose(ours, np.arange(copies)), expected):
            return False
    return True


_EMULATION_MATCHES: dict[tuple[int, int], bool] = {}
