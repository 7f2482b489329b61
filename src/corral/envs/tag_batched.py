"""``corral/tag`` natively batched: ``E`` copies of :class:`~corral.envs.tag.Tag` as arrays.

Every copy steps in one array operation, in numpy or in torch on any device,
with exactly the results of ``E`` dict ``Tag`` envs packed by the vector layer
(same seeds and actions: bit-identical observations and states).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays import CopyStreams, Place, import_torch, place_of, to_numpy, torch_dtype
from corral.batched_env import Array, BatchedEnv, BatchedStep, CopyGenerators, Seed, copy_seeds
from corral.batched_env import selected as selected_copies
from corral.envs.tag import CATCH_REWARD, PREDATOR_MOVES, PREY_MOVES, Tag, mask_table
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
    others are not to be read). Where the env computes in torch (on a GPU, or
    on the CPU with ``numpy_on_cpu`` off), the copies draw from
    :class:`~corral.arrays.CopyStreams` on the device and a reset blends its
    rows in by ``where``: neither a step nor an unseeded reset reads the host
    or copies from it. Every array returned is fresh: the caller may
    keep or change it; or, after :meth:`write_into`, the vector layer's own.
    The env cannot render: render the dict env (``make_vec(...,
    native=False)``), hence no ``render_modes``.

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
    settable_attributes = ("max_cycles",)  # read at every step, as the dict env reads it
    keeps_masks = True  # an agent not alive (not acting) has every action legal
    # Torch tensors on the CPU are computed on by numpy, through views of their memory:
    # bit for bit the same values, at a fraction of torch's cost per call at these sizes.
    # (False, or Place.numpy_on_cpu False: by torch, as on a GPU; the tests run both.)
    numpy_on_cpu = True

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
        self.check_render_mode(
            render_mode,
            "render the dict env: corral.make('corral/tag', render_mode=...) or "
            "corral.make_vec(..., native=False)",
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
        self.num_predators, self.num_prey = num_predators, num_prey
        self.size, self.max_cycles = size, max_cycles
        self._narrow = size * size <= np.iinfo(np.int16).max
        self._obs_spaces = {a: tag.observation_space(a) for a in self.possible_agents}
        self._action_spaces = {a: tag.action_space(a) for a in self.possible_agents}
        grouped = group_agents(self.possible_agents, self.observation_space, self.action_space)
        self._groups = {name: tuple(agents) for name, agents in grouped.items()}
        # Where the env computes: the place, or numpy on a torch CPU place.
        by_numpy = not self.place.is_torch or (self.numpy_on_cpu and self.place.computes_on_host)
        self._compute = Place() if by_numpy else self.place
        self._ops = _NumpyOps() if by_numpy else _TorchOps(self.place.device)
        # The arrays given out: the computed ones (fresh copies of them), as the place's.
        self._give = self.place.from_host if by_numpy else (lambda array: array)
        # The batch's tensors given to write_into, by id: (tensor, its numpy view). A step
        # gets the same action tensors (and a reset the same ``where``) every time; a torch
        # call costs several numpy ones, so each is viewed once.
        self._views_of_tensors = by_numpy and self.place.is_torch
        self._known: dict[int, tuple[Any, np.ndarray]] = {}
        self._generators = CopyGenerators(self.num_envs)
        self._draws = Choices(self.num_envs, len(tag._free_cells), len(self.possible_agents))
        self._drawing = np.zeros(self.num_envs, bool)  # copies whose generator _draws holds
        # In torch: the copies' generators as streams of the place, drawn with no host read.
        self._streams = None
        if not by_numpy and self._draws.exact:
            self._streams = CopyStreams(self.num_envs, self._compute)
            m, n, on_host = self._draws.m, self._draws.n, self._compute.computes_on_host
            self._choose = StreamChoices(self._streams, m, n, check=on_host)
        self._seeded = False  # whether every copy's stream was seeded
        self._build_tables(tag)

        # Every copy's state, agent-major ([agent, copy]) so that each operation runs
        # along the copies: every agent's cell (row * size + col), the dict env's alive
        # flags (False for caught prey), who is in the episode, and the step count.
        e, n, zeros = self.num_envs, len(self.possible_agents), self._compute.zeros
        self._cell = zeros((n, e), np.int64)
        self._flag = zeros((n, e), np.bool_)
        self._alive = zeros((n, e), np.bool_)
        self._t = zeros((e,), np.int64)
        self._features = zeros((5 * n + 2 * n * n, e), np.float32)  # a step's scratch
        # The prey's observations after the last step, for those caught before the next,
        # and each agent's action in a step.
        prey = self._group_list[1].values
        self._last_prey = zeros((prey.stop - prey.start, e), np.float32)
        self._bits = zeros((prey.stop - prey.start, e), np.int32)
        self._action = zeros((n, e), np.int64)
        # What steps and resets write, copy-major ([E, ...], by batch path): fresh copies of
        # them are returned, or after write_into the vector layer's own arrays are these.
        # The observations are also the env's memory: a caught prey keeps its last one.
        self._out = {
            path: zeros((e, *shape), dtype) for path, (shape, dtype) in self._out_fields().items()
        }
        self._shared = False

    def _build_tables(self, tag: Tag) -> None:
        """What steps read, as arrays of the env's place: each cell's scaled row and column,
        the free cells agents start on, where each move leads from each cell (illegal moves
        stay), each group's legal moves, and which features are observed and which make
        the state."""
        size, cells = tag.size, np.arange(tag.size * tag.size)
        host = self._compute.from_host
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
            legal = np.array(mask_table(tag._free, kind), bool).reshape(len(cells), -1)
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
        # (A predator's flag is always 1: its position times it is its position.)
        state = [np.arange(2 * p), np.arange(flags + n + 2 * p, flags + 3 * n)]
        state.append(np.arange(flags, flags + n))
        self._value_rows = host(np.concatenate([observed, *state]))
        self._observed_rows = host(observed)  # where no state is asked for (write_into)
        # The prey whose observation each prey value is.
        self._prey_owner = host(np.repeat(np.arange(p, n), self._group_list[1].obs_shape[1]))
        self._catch = host(np.array(CATCH_REWARD, np.float64))
        self._zero = host(np.array(0.0, np.float64))

    def _out_fields(self) -> dict[str, tuple[tuple[int, ...], Any]]:
        """The shape (after the copy axis) and dtype of each array a step writes, by the
        batch path the vector layer names it with."""
        fields: dict[str, tuple[tuple[int, ...], Any]] = {}
        for g in self._group_list:
            n = g.obs_shape[0]
            fields[f"obs/{g.name}"] = (g.obs_shape, np.float32)
            for name, dtype in _AGENT_FIELDS:
                fields[f"{name}/{g.name}"] = ((n,), dtype)
            fields[f"action_mask/{g.name}"] = ((n, g.masks.shape[1]), np.bool_)
        fields["state"] = (self.state_space.shape, np.float32)
        return fields

    def write_into(self, arrays: Mapping[str, Any]) -> bool:
        """Write every later reset and step straight into ``arrays`` (a vector env's batch:
        ``obs/<group>``, ``alive/<group>``... ``[E, ...]``, C-contiguous, of the env's place)
        and return them instead of fresh arrays: one copy less of every value per step.
        Called before the first reset: the env reads its observations there again (a caught
        prey keeps its last one). Whether it does: not where an array is missing or differs
        in shape, dtype or place; where ``arrays`` hold no ``state``, none is computed."""
        own, views = self._out, {}
        for path, mine in own.items():
            theirs = arrays.get(path)
            if theirs is None and path == "state":
                continue
            if not _in_place(theirs, self.place):
                return False
            views[path] = to_numpy(theirs) if self._compute != self.place else theirs
            if not self._ops.fits(views[path], mine):
                return False
        self._out, self._given = views, {path: arrays[path] for path in views}
        if self._views_of_tensors:
            self._known = {
                id(a): (a, to_numpy(a)) for a in arrays.values() if _in_place(a, self.place)
            }
        self._shared = True
        return True

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """``{"predator": ("predator_0", ...), "prey": ("prey_0", ...)}``."""
        return dict(self._groups)

    @property
    def max_episode_steps(self) -> int:  # type: ignore[override]
        """``max_cycles``: every live agent is truncated then."""
        return int(self.max_cycles)

    def observation_space(self, agent: str) -> spaces.Box:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> spaces.Discrete:
        return self._action_spaces[agent]

    def reset(
        self, seed: Seed = None, where: Array | None = None, options: dict[str, Any] | None = None
    ) -> BatchedStep:
        """Place every agent of the selected copies on distinct free cells drawn from the
        copy's generator; the other copies' episodes go on."""
        if self._streams is not None:
            return self._reset_by_streams(seed, where)
        rows = selected_copies(None if where is None else self._computed(where), self.num_envs)
        if seed is None and self._draws.exact and self._drawing[rows].all():
            # Each copy keeps drawing from the generator its last draw came from.
            draws = self._draws.choose(None, rows)
        else:
            generators = self._generators.at_reset(copy_seeds(seed, self.num_envs), rows)
            draws = self._draws.choose(generators, rows)
            self._drawing[rows] = True
        ops, rows = self._ops, self._compute.from_host(rows)
        cell = ops.take(self._free_cells, self._compute.from_host(draws))
        ops.put_columns(self._cell, rows, cell)
        ops.put_columns(self._flag, rows, True)
        ops.put_columns(self._alive, rows, True)
        ops.put_columns(self._t, rows, 0)
        values = self._evaluate(cell, True)
        return self._result(values, None if where is None else rows)

    def _reset_by_streams(self, seed: Seed, where: Array | None) -> BatchedStep:
        """:meth:`reset` in torch: every copy draws from its stream (only the selected ones
        advance it) and the selected copies' new state and rows are blended in by
        ``where``, with no host read (but for a reseed, which reads ``where``)."""
        ops, streams = self._ops, self._streams
        mask = None
        if where is not None:
            mask = self._compute.asarray(where, np.bool_)
            if tuple(mask.shape) != (self.num_envs,):
                raise ValueError(
                    f"where must be a bool array of shape ({self.num_envs},) (one entry per "
                    f"copy), got shape {tuple(mask.shape)}"
                )
        if seed is not None or not self._seeded:
            host = None if where is None else to_numpy(where).astype(bool)
            streams.seed(copy_seeds(seed, self.num_envs), host)
            self._seeded = self._seeded or where is None
        draws = self._choose(mask)
        cell = ops.take(self._free_cells, draws)
        if mask is None:
            self._cell = cell
            self._flag.fill_(True)
            self._alive.fill_(True)
            self._t.zero_()
        else:
            torch = ops.torch
            self._cell = torch.where(mask, cell, self._cell)
            self._flag |= mask
            self._alive = self._alive | mask
            self._t = torch.where(mask, 0, self._t)
        return self._result(self._evaluate(cell, True), mask)

    def step(self, actions: dict[str, Any]) -> BatchedStep:
        """Move every live agent of every copy, then remove the prey that were caught."""
        ops, p = self._ops, self.num_predators
        was_alive, old, action = self._alive, self._cell, self._action
        for g in self._group_list:
            ops.put_rows(action[g.agents].T, self._actions(actions, g.name).T, None)
        # An agent not alive "stays" (action 0), whatever its entry holds.
        self._cell = cell = ops.take(
            self._moves, old * self._width + action * was_alive + self._move_base
        )
        prey_was_alive = was_alive[p:]
        # Compared faster as int16, where every cell is one.
        small = (ops.int16(old), ops.int16(cell)) if self._narrow else (old, cell)
        caught = self._caught(small[0][:p], small[0][p:], small[1][:p], small[1][p:])
        caught &= prey_was_alive
        free = ~caught
        self._flag[p:] &= free
        self._t += 1
        all_caught = ~self._flag[p:].any(0)
        out_of_time = (self._t >= self.max_cycles) & ~all_caught
        self._alive = alive = was_alive & ~(all_caught | out_of_time)
        alive[p:] &= free
        values = self._evaluate(cell, self._flag, scratch=True)
        # A prey caught before this step keeps its last observation (predators are in
        # every running episode).
        prey = values[self._group_list[1].values]
        ops.keep(prey, prey_was_alive, self._last_prey, self._bits)
        self._last_prey = prey  # values are fresh at every step: no copy needed

        # Only an agent alive when the step began can end in it (a copy stepped after its
        # episode ended, like the dict env, ends nobody).
        predators_were_alive = was_alive[:p]
        catches = ops.count(caught) * self._catch
        outcome = {
            "reward": {
                "predator": ops.broadcast(catches, predators_were_alive.shape),
                "prey": ops.where(caught, -self._catch, self._zero),
            },
            "terminated": {
                "predator": predators_were_alive & all_caught,
                "prey": prey_was_alive & (caught | all_caught),
            },
            "truncated": {
                "predator": predators_were_alive & out_of_time,
                "prey": prey_was_alive & free & out_of_time,
            },
        }
        return self._result(values, None, outcome)

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
        # Times the flags: a predator's is always 1 (x * 1 is x, bit for bit), so only the
        # prey's are multiplied.
        p = self.num_predators
        ops.multiply(relative[:, p:], alive[None, p:, None], out=relative[:, p:])
        if "state" not in self._out:
            return ops.take(features, self._observed_rows)
        shown = features[3 * n + 2 * n * n :].reshape(n, 2, k)[p:]
        ops.multiply(pos[p:], alive[p:, None], out=shown)
        return ops.take(features, self._value_rows)

    def _actions(self, actions: dict[str, Any], group: str) -> Array:
        """``actions[group]`` as an int64 array ``[E, n_g]`` of the env's place."""
        if group not in actions:
            raise KeyError(
                f"actions has no entry for group {group!r}; expected {{group: [E, n_g]}} "
                f"for the groups {list(self._groups)}"
            )
        value = actions[group]
        value = self._compute.asarray(self._computed(value))
        shape = (self.num_envs, len(self._groups[group]))
        if tuple(value.shape) != shape:
            raise ValueError(
                f"actions[{group!r}] has shape {tuple(value.shape)}, expected {shape} "
                "(one action per copy and agent of the group)"
            )
        return self._ops.int64(value)

    def _computed(self, array: Array) -> Array:
        """An array of the env's place as one of where it computes (a numpy view of a CPU
        tensor)."""
        if not self._views_of_tensors:
            return array
        known = self._known.get(id(array))
        if known is not None and known[0] is array:
            return known[1]
        return to_numpy(array)

    def _result(
        self,
        values: Array,
        copies: Array | None = None,
        outcome: dict[str, dict[str, Array]] | None = None,
    ) -> BatchedStep:
        """Write the copies ``copies`` (all for ``None``; indices, or in torch a bool array
        ``[E]`` whose copies' ``values`` of all ``E`` are blended in) into the output
        arrays: their ``values`` (``[R, K]``), the env's state, and ``outcome`` (reward,
        terminated, truncated; agent-major ``[n_g, E]``). Then the arrays, or fresh copies
        of them."""
        ops, out, num_cells = self._ops, self._out, self.size * self.size
        cell, alive = self._cell, self._alive
        if copies is not None and not ops.is_mask(copies):
            cell, alive = ops.columns(cell, copies), ops.columns(alive, copies)
        # An agent not alive reads its mask table's all-legal rows below its cell.
        below = ops.multiply(~alive, num_cells)
        for g in self._group_list:
            name = g.name
            ops.put_rows(ops.flat(out[f"obs/{name}"]), values[g.values], copies)
            ops.put_rows(out[f"alive/{name}"], alive[g.agents], copies)
            ops.assign(out[f"acting/{name}"], out[f"alive/{name}"])  # acting is alive here
            key = ops.copy_major_sum(cell[g.agents], below[g.agents])
            ops.put_masks(out[f"action_mask/{name}"], g.masks, key, copies)
        if "state" in out:
            ops.put_rows(out["state"], values[self._state_rows], copies)
        for field, per_group in (outcome or {}).items():
            for name, value in per_group.items():
                ops.put_rows(out[f"{field}/{name}"], value, None)

        def given(path: str) -> Array:
            return self._given[path] if self._shared else self._give(ops.copy(out[path]))

        names = [g.name for g in self._group_list]
        step = BatchedStep(
            obs={g: given(f"obs/{g}") for g in names},
            alive={g: given(f"alive/{g}") for g in names},
            acting={g: given(f"acting/{g}") for g in names},
            action_mask={g: given(f"action_mask/{g}") for g in names},
            state=given("state") if "state" in out else None,
        )
        if outcome is not None:
            step.reward, step.terminated, step.truncated = (
                {g: given(f"{field}/{g}") for g in names}
                for field in ("reward", "terminated", "truncated")
            )
        return step


def _in_place(array: Any, place: Place) -> bool:
    """Whether ``array`` is an array of ``place`` (``"cuda"`` holds ``"cuda:0"``'s)."""
    if place_of(array).array != place.array:
        return False
    if not place.is_torch:
        return isinstance(array, np.ndarray)
    device = import_torch().device(place.device)
    return array.device.type == device.type and device.index in (None, array.device.index)


# The per-agent arrays ``[E, n_g]`` a step writes, with their dtypes.
_AGENT_FIELDS = (
    ("alive", np.bool_),
    ("acting", np.bool_),
    ("reward", np.float64),
    ("terminated", np.bool_),
    ("truncated", np.bool_),
)


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

    def __init__(self) -> None:
        self._columns: dict[int, tuple[np.ndarray, list]] = {}

    concatenate, where = staticmethod(np.concatenate), staticmethod(np.where)
    subtract, multiply = staticmethod(np.subtract), staticmethod(np.multiply)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.empty(shape, dtype)

    def int64(self, array: np.ndarray) -> np.ndarray:
        return array.astype(np.int64, copy=False)

    def is_mask(self, copies: np.ndarray) -> bool:
        """Whether ``copies`` selects copies by a bool array ``[E]`` (else: indices)."""
        return copies.dtype == np.bool_

    def int16(self, array: np.ndarray) -> np.ndarray:
        return array.astype(np.int16)

    def copy(self, array: np.ndarray) -> np.ndarray:
        return array.copy()

    def broadcast(self, row: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        return np.broadcast_to(row, shape)

    def take(self, table: np.ndarray, index: np.ndarray) -> np.ndarray:
        """``table``'s entries (rows) at ``index``: ``[*index.shape, *table.shape[1:]]``."""
        return np.take(table, index, axis=0)

    def columns(self, array: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """``array[..., columns]``: the entries of some copies."""
        return array[..., columns]

    def put_columns(self, array: np.ndarray, columns: np.ndarray, value: Any) -> None:
        """``array[..., columns] = value``."""
        array[..., columns] = value

    def fits(self, array: Any, like: np.ndarray) -> bool:
        """Whether ``array`` can stand for ``like``: same shape and dtype, C-contiguous."""
        return (
            isinstance(array, np.ndarray)
            and (array.shape, array.dtype) == (like.shape, like.dtype)
            and array.flags.c_contiguous
        )

    def flat(self, array: np.ndarray) -> np.ndarray:
        """``[E, *shape]`` as ``[E, prod(shape)]`` (a view)."""
        return array.reshape(len(array), -1)

    def assign(self, out: np.ndarray, value: np.ndarray) -> None:
        """``out[...] = value``."""
        np.copyto(out, value)

    def put_rows(self, out: np.ndarray, rows: np.ndarray, copies: np.ndarray | None) -> None:
        """``out[copies] = rows.T`` (all of ``out`` for ``None``): ``out`` ``[E, R]``."""
        if copies is not None:
            out[copies] = rows.T
        elif len(rows) <= 4:  # a transposing copy whose inner loop is a few values is slow
            for j, row in enumerate(rows):
                out[:, j] = row
        else:
            out[...] = rows.T

    def keep(self, values: np.ndarray, keep: np.ndarray, last: np.ndarray, bits: np.ndarray):
        """``values`` (each agent's rows, ``[n * S, E]``) where ``keep`` (``[n, E]``)
        holds, else ``last``, in place (``bits``: scratch like ``values``, as int32).
        Blended as bits, ``last ^ ((values ^ last) & -keep)``: no branch per value."""
        n, size = len(keep), len(values) // len(keep)
        new, old = values.view(np.int32), last.view(np.int32)
        np.bitwise_xor(new, old, out=bits)
        mask = np.negative(keep, dtype=np.int32)[:, None]  # all bits set where kept
        np.bitwise_and(bits.reshape(n, size, -1), mask, out=bits.reshape(n, size, -1))
        np.bitwise_xor(old, bits, out=new)

    def count(self, flags: np.ndarray) -> np.ndarray:
        """How many of ``flags`` (``[Y, E]``) hold in each copy, as float64."""
        return flags.sum(0, dtype=np.float64)

    def copy_major_sum(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """``(a + b).T`` as a new C-contiguous array, for ``a``, ``b`` ``[n, K]`` (a few ``n``):
        one strided write per row (a transposing copy of a few values per item is slow)."""
        out = np.empty(a.shape[::-1], np.result_type(a, b))
        for j in range(len(a)):
            np.add(a[j], b[j], out=out[:, j])
        return out

    def put_masks(
        self, out: np.ndarray, table: np.ndarray, key: np.ndarray, copies: np.ndarray | None
    ) -> None:
        """``out[copies]`` (all for ``None``): the rows ``key`` (``[K, n]``, C-contiguous) of a
        mask table ``[*, n_actions]`` of bool, ``out`` being ``[E, n, n_actions]``."""
        if copies is not None:  # one item of n_actions bytes per mask
            item = f"V{table.shape[1]}"
            out.view(item)[copies, :, 0] = np.take(table.view(item)[:, 0], key)
            return
        # Each mask's bytes as a few unsigned integers (9: 8 + 1) read from tables of them,
        # written through strided views of out: numpy takes such items at C speed, where
        # it copies other sizes one call each.
        e, n, width = out.shape
        for offset, column in self._mask_columns(table):
            part = np.ndarray((e, n), column.dtype, out, offset, (n * width, width))
            np.take(column, key, out=part, mode="clip")

    def _mask_columns(self, table: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """``table``'s rows cut into unsigned integers of 8, 4, 2, 1 bytes: (offset, the
        column of them), kept for the table."""
        kept = self._columns.get(id(table))
        if kept is not None and kept[0] is table:
            return kept[1]
        columns, offset, width = [], 0, table.shape[1]
        for size in (8, 4, 2, 1):
            while width - offset >= size:
                part = np.ascontiguousarray(table[:, offset : offset + size])
                columns.append((offset, part.view(f"u{size}")[:, 0]))
                offset += size
        self._columns[id(table)] = (table, columns)
        return columns


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

    def is_mask(self, copies: Any) -> bool:
        return copies.dtype == self.torch.bool

    def int16(self, array: Any) -> Any:
        return array.short()

    def copy(self, array: Any) -> Any:
        return array.clone()

    def broadcast(self, row: Any, shape: tuple[int, ...]) -> Any:
        return row.expand(shape)

    def take(self, table: Any, index: Any) -> Any:
        flat = self.torch.index_select(table, 0, index.reshape(-1))
        return flat.view(*index.shape, *table.shape[1:])

    def columns(self, array: Any, columns: Any) -> Any:
        return self.torch.index_select(array, array.dim() - 1, columns)

    def put_columns(self, array: Any, columns: Any, value: Any) -> None:
        if isinstance(value, (bool, int, float)):
            array.index_fill_(array.dim() - 1, columns, value)
        else:
            array.index_copy_(array.dim() - 1, columns, value)

    def fits(self, array: Any, like: Any) -> bool:
        return (
            isinstance(array, self.torch.Tensor)
            and (array.shape, array.dtype, array.device) == (like.shape, like.dtype, like.device)
            and array.is_contiguous()
        )

    def flat(self, array: Any) -> Any:
        return array.view(len(array), -1)

    def assign(self, out: Any, value: Any) -> None:
        out.copy_(value)

    def put_rows(self, out: Any, rows: Any, copies: Any | None) -> None:
        if copies is not None and copies.dtype == self.torch.bool:
            out.copy_(self.torch.where(copies[:, None], rows.T, out))
        elif copies is not None:
            out.index_copy_(0, copies, rows.T)
        elif len(rows) <= 4:
            for j, row in enumerate(rows):
                out[:, j].copy_(row)
        else:
            out.copy_(rows.T)

    def keep(self, values: Any, keep: Any, last: Any, bits: Any) -> None:
        torch = self.torch
        n, size = len(keep), len(values) // len(keep)
        new, old = values.view(torch.int32), last.view(torch.int32)
        torch.bitwise_xor(new, old, out=bits)
        mask = keep.to(torch.int32).neg_()[:, None]
        bits.view(n, size, -1).bitwise_and_(mask)
        torch.bitwise_xor(old, bits, out=new)

    def count(self, flags: Any) -> Any:
        return flags.sum(0, dtype=self.torch.float64)

    def copy_major_sum(self, a: Any, b: Any) -> Any:
        return (a + b).T.contiguous()

    def put_masks(self, out: Any, table: Any, key: Any, copies: Any | None) -> None:
        masks = self.take(table, key)
        if copies is None:
            out.copy_(masks)
        elif copies.dtype == self.torch.bool:
            out.copy_(self.torch.where(copies[:, None, None], masks, out))
        else:
            out.index_copy_(0, copies, masks)


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
        self.sourced = np.zeros(num_copies, bool)
        # Draws computed ahead from the words, for many copies at once (a reset of a few
        # copies then reads theirs): [copy, draw, value], each copy's next and end.
        self.ahead = self.size // max(len(self.bounds), 1)
        dtype = np.int16 if m <= np.iinfo(np.int16).max else np.int64
        self.ready = np.zeros((num_copies, self.ahead, n), dtype)
        self.ready_at = np.zeros(num_copies, np.int64)
        self.ready_end = np.zeros(num_copies, np.int64)
        # Floyd's algorithm on 32-bit words is numpy's way for these sizes.
        floyd = 0 < n <= m < 2**32 and not (m > 10000 and n > m // 50)
        self.exact = floyd and (not check or _emulation_matches(m, n))

    def choose(
        self, generators: Sequence[np.random.Generator] | None, rows: np.ndarray
    ) -> np.ndarray:
        """``[n, K]``: copy ``rows[k]``'s draw from its generator ``generators[k]`` (for
        ``None``: the generator of its last draw, where ``exact``)."""
        if not self.exact:
            out = np.empty((len(rows), self.n), np.int64)
            for k, generator in enumerate(generators or ()):
                out[k] = generator.choice(self.m, size=self.n, replace=False)
            return out.T
        for i, generator in zip(rows.tolist(), generators or (), strict=generators is not None):
            if generator is not self.sources[i]:  # a new generator: forget what was read
                self.sources[i], self.next[i], self.end[i] = generator, 0, 0
                self.ready_at[i] = self.ready_end[i] = 0
                self.sourced[i] = True
        at = self.ready_at[rows]
        if (at >= self.ready_end[rows]).any():
            self._prepare()
            at = self.ready_at[rows]
        have = at < self.ready_end[rows]
        out = self.ready[rows, at].T.astype(np.int64)
        self.ready_at[rows] = at + have
        if not have.all():  # a copy whose next draw has a word that Lemire's method rejects
            lacking = np.flatnonzero(~have)
            out[:, lacking] = self._direct(rows[lacking])
        return out

    def _prepare(self) -> None:
        """Compute ahead the draws of every copy (with a generator) that has half of them or
        fewer left, those with none among them: one read of words per copy for many draws,
        and the copies' draws computed together, so that most calls only read draws. A
        copy's draws stop before one that has a word that Lemire's method rejects
        (:meth:`_direct` draws that one)."""
        ahead, d, n = self.ahead, len(self.bounds), self.n
        left = self.ready_end - self.ready_at
        batch = np.flatnonzero((left <= ahead // 2) & self.sourced)
        count = len(batch)
        kept = left[batch]
        moved = np.flatnonzero(kept)
        if len(moved):  # the draws a copy has left, to the front
            copies = batch[moved]
            index = np.minimum(self.ready_at[copies][:, None] + np.arange(ahead), ahead - 1)
            self.ready[copies] = self.ready[copies[:, None], index]
        for i in batch.tolist():  # every copy's words from its first
            self._refill(i)
        room = ahead - kept
        if d:
            room = np.minimum(room, self.end[batch] // d)
        # Each word times its bound's span: the low 32 bits say whether Lemire's method
        # rejects the word, the high 32 bits are the bounded integer.
        scaled = self.words[batch, : ahead * d] * np.tile(self.spans, ahead)
        halves = scaled.astype("<u8", copy=False).view("<u4").reshape(count, ahead, d, 2)
        rejected = (halves[..., 0] < self.thresholds.astype(np.uint32)).any(2)
        room = np.minimum(room, np.where(rejected.any(1), rejected.argmax(1), ahead))
        values = halves[..., 1].astype(np.int64).reshape(count * ahead, d)
        draws = self._arrange(values).T.reshape(count, ahead, n)
        b, k = np.nonzero(np.arange(ahead) < room[:, None])
        self.ready[batch[b], kept[b] + k] = draws[b, k]
        self.ready_at[batch] = 0
        self.ready_end[batch] = kept + room
        self.next[batch] = room * d

    def _direct(self, rows: np.ndarray) -> np.ndarray:
        """``[n, K]``: the next draw of each copy of ``rows``, read from its words."""
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
        out, d = np.empty((n, k), np.int64), 0
        for t, j in enumerate(range(m - n, m)):  # Floyd: a value in [0, j], or j if taken
            value = values[:, d] if j else np.zeros(k, np.int64)
            d += j > 0
            if t:
                taken = out[0] == value
                for s in range(1, t):  # (numpy's any() along a short axis is slow)
                    taken |= out[s] == value
                value = np.where(taken, j, value)
            out[t] = value
        flat, columns = out.reshape(-1), np.arange(k)
        for i in range(n - 1, 0, -1):  # the shuffle: swap value i with value [0, i]
            other = values[:, d] * k + columns  # its place in out, flat
            d += 1
            picked = flat[other]
            flat[other] = out[i]
            out[i] = picked
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
        self.words[i, len(left) : end] = raw.astype("<u8", copy=False).view("<u4")  # low first
        self.next[i], self.end[i] = 0, end


class StreamChoices:
    """``Generator.choice(m, size=n, replace=False)`` of every copy's stream at once, in
    torch, where numpy draws it with Floyd's algorithm and a shuffle (see :class:`Choices`;
    ``Choices(...).exact`` says where), with no host read or copy.

    The bounded integers of a draw come from words read ahead
    (:meth:`CopyStreams.peek_words`): as many as make the chance that Lemire's method
    skips too many of them for some copy in a call fall below ``2**-64``, as
    :class:`CopyStreams` draws on a device. With ``check`` (on the host), whether they
    sufficed is read, and more words are read ahead where not; without, nothing is read."""

    def __init__(self, streams: CopyStreams, m: int, n: int, check: bool = True) -> None:
        torch = self.torch = import_torch()
        self.streams, self.m, self.n, self.check = streams, m, n, check
        # Each bounded integer's range [0, bound]: Floyd's (none for 0), then the shuffle's.
        bounds = [j for j in range(m - n, m) if j] + list(range(n - 1, 0, -1))
        sizes = np.array(bounds, np.int64) + 1
        thresholds = (1 << 32) % sizes  # a word whose low half falls below is skipped
        chance = float(thresholds.max(initial=0)) / 2**32
        self.extra = _extra_words(streams.num_envs, len(bounds), chance)
        place, e = streams.place, streams.num_envs
        self.sizes, self.thresholds = place.from_host(sizes), place.from_host(thresholds)
        self.zero = place.zeros((e,), np.int64)
        self.before = torch.full((e,), -1, dtype=torch.int64, device=self.zero.device)

    def __call__(self, where: Array | None = None) -> Array:
        """``[n, E]``: each copy's draw; the copies ``where`` selects (a bool tensor
        ``[E]``, all for ``None``) advance their streams, the others' values are
        unspecified (in ``[0, m)``)."""
        torch, m, n = self.torch, self.m, self.n
        values = self._bounded(where)
        out: list[Array] = []
        for t, j in enumerate(range(m - n, m)):  # Floyd: a value in [0, j], or j if taken
            value = values.pop(0) if j else self.zero
            if t:
                taken = out[0] == value
                for s in range(1, t):
                    taken |= out[s] == value
                value = torch.where(taken, j, value)
            out.append(value)
        drawn = torch.stack(out)
        for i in range(n - 1, 0, -1):  # the shuffle: swap value i with value [0, i]
            other = values.pop(0)[None]
            picked = drawn.gather(0, other)
            drawn.scatter_(0, other, drawn[i : i + 1].clone())
            drawn[i] = picked[0]
        return drawn

    def _bounded(self, where: Array | None) -> list[Array]:
        """Each copy's next bounded integers, ``[E]`` int64 each, as numpy's
        ``random_bounded_uint64`` draws them one after the other (Lemire's method on 32-bit
        words: the high half of a word times the range's size, a word whose low half falls
        below ``2**32 % size`` skipped); the copies ``where`` selects draw the words used."""
        torch, d, extra = self.torch, len(self.sizes), self.extra
        if not d:
            return []
        while True:
            words = self.streams.peek_words(d + extra)
            scaled = words[:, :, None] * self.sizes  # the bits of the 64-bit products
            kept = (scaled & 0xFFFFFFFF) >= self.thresholds
            positions = torch.arange(d + extra, device=words.device)
            at, found, out = self.before, None, []
            for k in range(d):  # the first kept word past the last one used
                usable = kept[:, :, k] & (positions > at[:, None])
                if self.check:
                    found = usable.any(1) if found is None else found & usable.any(1)
                at = usable.to(torch.int8).argmax(1)
                out.append((scaled[:, :, k].gather(1, at[:, None])[:, 0] >> 32) & 0xFFFFFFFF)
            if not self.check or bool(found.all()):
                break
            extra = 2 * extra + 1
        self.streams.skip_words(at + 1, where)
        return out


def _extra_words(copies: int, d: int, chance: float) -> int:
    """How many words past ``d`` to read ahead so that ``d`` bounded integers of
    ``copies`` copies, each word skipped with a chance at most ``chance``, need more with
    a chance below 2**-64 (more than ``x`` skipped among ``d + x`` words: at most
    ``C(d + x, x + 1) * chance**(x + 1)`` per copy)."""
    x = 0
    while chance and copies * math.comb(d + x, x + 1) * chance ** (x + 1) >= 2.0**-64:
        x += 1
    return x


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
