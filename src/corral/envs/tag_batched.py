"""``corral/tag`` natively batched: ``E`` copies of :class:`~corral.envs.tag.Tag` as arrays.

Every copy steps in one array operation, in numpy or in torch on any device,
with exactly the results of ``E`` dict ``Tag`` envs packed by the vector layer
(same seeds and actions: bit-identical observations and states).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays import CopyStreams, Place, import_torch, ops_in, place_of, to_numpy
from corral.batched_env import Array, BatchedEnv, BatchedStep, CopyGenerators, Seed, copy_seeds
from corral.batched_env import selected as selected_copies
from corral.envs.choices import Choices, StreamChoices
from corral.envs.step_count import StepCount
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
    on the CPU with ``host_views`` off), the copies draw from
    :class:`~corral.arrays.CopyStreams` on the device and a reset blends its
    rows in by ``where``: neither a step nor an unseeded reset reads the host
    or copies from it. Every array returned is fresh: the caller may
    keep or change it; or, after :meth:`write_into`, the vector layer's own.
    The env cannot render: render the dict env (``make_vec(...,
    native=False)``), hence no ``render_modes``.

    Torch tensors on the CPU are computed on by numpy, through views of their
    memory (bit for bit the same values, at a fraction of torch's cost per
    call at these sizes), where its place's :attr:`~corral.Place.host_views`
    says so; ``host_views=False`` computes by torch, as on a GPU, whatever the
    place says (``True`` by numpy; ``None`` follows the place; meaningless for
    numpy and other devices). The tests run both.

    Examples:
        >>> env = BatchedTag(4, num_prey=1)
        >>> first = env.reset(seed=0)
        >>> first.obs["predator"].shape, first.action_mask["prey"].shape
        ((4, 2, 7), (4, 1, 9))
        >>> step = env.step({"predator": np.zeros((4, 2), int), "prey": np.zeros((4, 1), int)})
        >>> step.reward["predator"].dtype, step.alive["prey"].shape
        (dtype('float64'), (4, 1))
    """

    state_space: spaces.Box  # the dict env's
    metadata = {**Tag.metadata, "render_modes": []}
    simultaneous = True
    settable_attributes = ("max_cycles",)  # read at every step, as the dict env reads it
    max_cycles = StepCount()
    keeps_masks = True  # an agent not alive (not acting) has every action legal

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
        host_views: bool | None = None,
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
        computing = self.place if host_views is None else replace(self.place, host_views=host_views)
        by_numpy = computing.computes_on_host
        self._compute = Place() if by_numpy else self.place
        self._ops = ops_in(self._compute)
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
        return self.max_cycles

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
        cell = ops.take(self._free_cells, self._compute.from_host(draws), 0)
        ops.put(self._cell, rows, cell, -1)
        ops.put(self._flag, rows, True, -1)
        ops.put(self._alive, rows, True, -1)
        ops.put(self._t, rows, 0, -1)
        values = self._evaluate(cell, True)
        return self._result(values, None if where is None else rows)

    def _reset_by_streams(self, seed: Seed, where: Array | None) -> BatchedStep:
        """:meth:`reset` in torch: every copy draws from its stream (only the selected ones
        advance it) and the selected copies' new state and rows are blended in by
        ``where``, with no host read (but for a reseed, which reads ``where``)."""
        ops, streams = self._ops, self._streams
        assert ops.torch is not None and streams is not None  # a torch env's
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
        cell = ops.take(self._free_cells, draws, 0)
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
            ops.write_transposed(action[g.agents].T, self._actions(actions, g.name).T, None)
        # An agent not alive "stays" (action 0), whatever its entry holds.
        self._cell = cell = ops.take(
            self._moves, old * self._width + action * was_alive + self._move_base, 0
        )
        prey_was_alive = was_alive[p:]
        # Compared faster as int16, where every cell is one.
        small = (old, cell)
        if self._narrow:
            small = (ops.astype(old, np.int16), ops.astype(cell, np.int16))
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
                "predator": ops.broadcast_to(catches, predators_were_alive.shape),
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
        pos[:, 0] = ops.take(self._row_coord, cell, 0)
        pos[:, 1] = ops.take(self._col_coord, cell, 0)
        relative = features[2 * n : 2 * n + 2 * n * n].reshape(n, n, 2, k)
        alive = features[2 * n + 2 * n * n : 3 * n + 2 * n * n]
        alive[...] = flag
        ops.subtract(pos[None], pos[:, None], out=relative)
        # Times the flags: a predator's is always 1 (x * 1 is x, bit for bit), so only the
        # prey's are multiplied.
        p = self.num_predators
        ops.multiply(relative[:, p:], alive[None, p:, None], out=relative[:, p:])
        if "state" not in self._out:
            return ops.take(features, self._observed_rows, 0)
        shown = features[3 * n + 2 * n * n :].reshape(n, 2, k)[p:]
        ops.multiply(pos[p:], alive[p:, None], out=shown)
        return ops.take(features, self._value_rows, 0)

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
        return self._ops.astype(value, np.int64)

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
            cell, alive = ops.take(cell, copies, -1), ops.take(alive, copies, -1)
        # An agent not alive reads its mask table's all-legal rows below its cell.
        below = ops.multiply(~alive, num_cells)
        for g in self._group_list:
            name = g.name
            ops.write_transposed(ops.flat(out[f"obs/{name}"]), values[g.values], copies)
            ops.write_transposed(out[f"alive/{name}"], alive[g.agents], copies)
            ops.assign(out[f"acting/{name}"], out[f"alive/{name}"])  # acting is alive here
            key = ops.copy_major_sum(cell[g.agents], below[g.agents])
            ops.write_masks(out[f"action_mask/{name}"], g.masks, key, copies)
        if "state" in out:
            ops.write_transposed(out["state"], values[self._state_rows], copies)
        for field, per_group in (outcome or {}).items():
            for name, value in per_group.items():
                ops.write_transposed(out[f"{field}/{name}"], value, None)

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
