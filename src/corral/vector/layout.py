"""The array layout of a vector batch: one flat array per field, per group.

Every field of a batch is one array whose first two axes are ``[env, agent]``
(or ``[env]`` for per-env fields). Arrays are named by path (``"obs/agent"``,
``"obs/agent/observation"`` for a Dict space's leaf, ``"reward/agent"``), so a
backend can allocate them anywhere (process memory, shared memory) and slice
them per worker without knowing what they hold.

How a space maps to arrays is registered per space type with
:func:`array_tree`; everything else works on the resulting tree.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, singledispatch
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays import Place, on_host
from corral.arrays.tree import (
    Mismatch,
    follow,
    leaves_of,
    map_paths,
    map_space,
    map_tree,
    tree_leaves,
)
from corral.errors import UnknownAgentError
from corral.groups import GroupMap, group_agents
from corral.returned_values import describe, finite_problem, is_finite, store_exactly


@dataclass(frozen=True)
class ArraySpec:
    """Shape (per agent) and dtype of one leaf array."""

    shape: tuple[int, ...]
    dtype: np.dtype


# A tree is an ArraySpec, or a dict / tuple of trees (for Dict / Tuple spaces).
Tree = Any


@singledispatch
def array_tree(space: spaces.Space) -> Tree:
    """The arrays that hold one value of ``space``."""
    raise TypeError(
        f"corral cannot lay out values of {type(space).__name__} spaces in arrays; "
        "register one with corral.vector.layout.array_tree.register"
    )


@array_tree.register
def _(space: spaces.Box) -> Tree:
    return ArraySpec(space.shape, space.dtype)


@array_tree.register
def _(space: spaces.Discrete) -> Tree:
    return ArraySpec((), np.dtype(np.int64))


@array_tree.register
def _(space: spaces.MultiDiscrete) -> Tree:
    return ArraySpec(space.shape, np.dtype(np.int64))


@array_tree.register
def _(space: spaces.MultiBinary) -> Tree:
    return ArraySpec(space.shape, np.dtype(np.int8))


@array_tree.register(spaces.Dict)
@array_tree.register(spaces.Tuple)
def _(space: spaces.Space) -> Tree:
    return map_space(array_tree, space)


def leaves(tree: Tree, path: str) -> list[tuple[str, ArraySpec]]:
    """``(path, spec)`` of every leaf of ``tree``, paths extending ``path``."""
    return tree_leaves(tree, path)


def assemble(tree: Tree, path: str, arrays: Mapping[str, np.ndarray]) -> Any:
    """The arrays of ``tree`` under ``path``, nested like the space they hold."""
    if isinstance(tree, ArraySpec):
        return arrays[path]  # the common case (one array), without a call
    return map_paths(lambda leaf_path, _: arrays[leaf_path], tree, path)


def store(tree: Tree, path: str, arrays: Mapping[str, Any], value: Any) -> None:
    """Put a batched ``value`` (nested like ``tree``) into the arrays under ``path``."""
    if isinstance(tree, ArraySpec):
        arrays[path][...] = value  # the common case (one array), without a call
        return
    for leaf_path, part in leaves_of(tree, value, path):
        arrays[leaf_path][...] = part


class WriteError(ValueError):
    """A value that does not fit the arrays it is written to.

    ``expected`` says what was expected and what came (``"shape (3,), got float 0.5"``);
    ``where`` is the path to the bad part of a Dict or Tuple value (``"['pos']"``), or ``""``.
    """

    def __init__(self, expected: str, where: str = "") -> None:
        super().__init__(f"{where}{': ' if where else ''}expected {expected}")
        self.expected = expected
        self.where = where


def writer(
    tree: Tree, path: str, arrays: Mapping[str, np.ndarray], check_finite: bool = False
) -> Callable[..., None]:
    """A function ``write(index, value)`` storing one value at ``index`` of the arrays.

    A value whose shape is not the space's (nothing is broadcast), or that the
    array's dtype cannot hold (``1e300`` in ``float32``, ``300`` in ``uint8``: see
    :func:`~corral.returned_values.store_exactly`), raises :class:`WriteError`; with
    ``check_finite``, so does NaN or inf in a float array. A value that raised may be
    partly written.
    """
    if isinstance(tree, ArraySpec):
        return _leaf_writer(arrays[path], tree, check_finite)
    writers = map_paths(
        lambda leaf_path, spec: _leaf_writer(arrays[leaf_path], spec, check_finite), tree, path
    )

    def write_tree(index: tuple[int, ...], value: Any) -> None:
        try:
            for keys, write, part in follow(writers, value):
                try:
                    write(index, part)
                except WriteError as err:
                    raise WriteError(err.expected, _where(keys)) from None
        except Mismatch as err:
            raise WriteError(_expected_node(err.tree, err.value), _where(err.keys)) from None

    return write_tree


def _where(keys: tuple[Any, ...]) -> str:
    """The path to a part of a Dict or Tuple value, ``"['pos'][0]"``."""
    return "".join(f"[{key!r}]" for key in keys)


def _expected_node(tree: Tree, value: Any) -> str:
    """What a Dict or Tuple space's value laid out as ``tree`` should have been."""
    if isinstance(tree, dict):
        return f"a dict with keys {list(tree)}, got {describe(value)}"
    return f"a tuple of {len(tree)} values, got {describe(value)}"


def _leaf_writer(array: np.ndarray, spec: ArraySpec, check_finite: bool) -> Callable[..., None]:
    shape, dtype = spec.shape, spec.dtype
    check_finite = check_finite and dtype.kind == "f"

    def write_leaf(index: tuple[int, ...], value: Any) -> None:
        try:
            got = value.shape
        except AttributeError:
            got = _shape_of(value)
        if got != shape:
            raise WriteError(f"shape {shape}, got {describe(value)}")
        try:
            store_exactly(
                array, index, value if isinstance(value, np.ndarray) else np.asarray(value)
            )
        except (TypeError, ValueError, OverflowError, RuntimeWarning):
            # RuntimeWarning: numpy's "overflow encountered in cast", where warnings are errors
            raise WriteError(_store_problem(value, dtype)) from None
        if check_finite:
            stored = array[index]
            # The sum of squares is finite when every value is, unless the sum overflows
            # (then the exact check clears it); one call, a third of isfinite().all()'s time.
            if not math.isfinite(np.vdot(stored, stored)) and not is_finite(stored):
                raise WriteError(finite_problem(value, dtype) or f"finite values, got {value}")

    return write_leaf


def _shape_of(value: Any) -> tuple[int, ...] | None:
    """The shape of a value that is not an array (``None`` for a ragged sequence)."""
    if isinstance(value, (int, float)):
        return ()
    try:
        return np.shape(value)
    except ValueError:
        return None


def _store_problem(value: Any, dtype: np.dtype) -> str:
    """Why numpy could not store ``value`` in an array of ``dtype``."""
    return finite_problem(value, dtype) or f"values of dtype {dtype}, got {describe(value)}"


def reader(tree: Tree, path: str, arrays: Mapping[str, np.ndarray]) -> Callable[..., Any]:
    """A function ``read(index)`` returning one value (as the space holds it) at ``index``."""
    readers = map_paths(lambda leaf_path, spec: _leaf_reader(arrays[leaf_path], spec), tree, path)
    if isinstance(tree, ArraySpec):
        return readers
    return lambda index: map_tree(lambda read: read(index), readers)


def _leaf_reader(array: np.ndarray, spec: ArraySpec) -> Callable[..., Any]:
    if spec.shape == () and np.issubdtype(spec.dtype, np.integer):
        return lambda index: int(array[index])
    return lambda index: array[index].copy()


@dataclass(frozen=True)
class Group:
    """Agents of identical spaces, stacked along one axis."""

    name: str
    agents: tuple[str, ...]
    observation_space: spaces.Space
    action_space: spaces.Space

    @cached_property
    def obs_tree(self) -> Tree:
        return array_tree(self.observation_space)

    @cached_property
    def action_tree(self) -> Tree:
        return array_tree(self.action_space)

    @cached_property
    def num_actions(self) -> int | None:
        """Number of discrete actions (the mask's length), or ``None`` if not discrete."""
        space = self.action_space
        return int(space.n) if isinstance(space, spaces.Discrete) else None


class Role(enum.Enum):
    """What a batch array is for, and so who writes it and whether the batch shows it."""

    ACTION = "action"
    """Written by the caller before a step, read by the envs."""
    STEP = "step"
    """What the envs return each call (``obs``, ``reward``, ``alive``...): in the batch."""
    EPISODE = "episode"
    """What the episode bookkeeping returns (``done``, ``final_obs``...): in the batch."""
    BOOKKEEPING = "bookkeeping"
    """Kept between steps by the bookkeeping (running returns): not in the batch."""


@dataclass(frozen=True)
class Field:
    """One array of a batch: its path, role, full shape and dtype. The axes are
    ``[env, agent, ...]`` for a group's field, ``[env, ...]`` for an env's."""

    path: str
    role: Role
    shape: tuple[int, ...]
    dtype: np.dtype


class Layout:
    """Groups, agent positions and the arrays of a batch of ``num_envs`` envs.

    ``groups`` maps each group to its agents in array order; ``place`` is where
    the arrays live (numpy, or torch on a device). ``check_finite``:
    observations, rewards and states must be finite (and fit their arrays'
    dtypes); it travels with the layout to every backend.
    """

    def __init__(
        self,
        groups: Mapping[str, Sequence[str]],
        observation_space: Callable[[str], spaces.Space],
        action_space: Callable[[str], spaces.Space],
        state_space: spaces.Space | None,
        num_envs: int,
        check_finite: bool = False,
        place: Place | None = None,
    ) -> None:
        self.num_envs = num_envs
        self.state_space = state_space
        self.check_finite = check_finite
        self.place = Place() if place is None else place
        self.groups = {
            name: Group(name, tuple(agents), observation_space(agents[0]), action_space(agents[0]))
            for name, agents in groups.items()
        }
        self.position = {
            agent: (group.name, j)
            for group in self.groups.values()
            for j, agent in enumerate(group.agents)
        }
        self.fields = self._fields()

    def group(self, key: str) -> Group:
        """The group named ``key``, else the group of the agent ``key``; an
        :class:`~corral.errors.UnknownAgentError` listing the groups for any other key."""
        group = self.groups.get(key)
        if group is None and key in self.position:
            group = self.groups[self.position[key][0]]
        if group is None:
            raise UnknownAgentError(f"no group or agent {key!r}; {self.describe_groups()}")
        return group

    def describe_groups(self) -> str:
        """The groups and their agents, for an error message."""
        listed = ", ".join(f"{name!r} ({', '.join(g.agents)})" for name, g in self.groups.items())
        return f"the groups, with their agents: {listed}"

    @classmethod
    def grouping(
        cls,
        possible_agents: list[str],
        observation_space: Callable[[str], spaces.Space],
        action_space: Callable[[str], spaces.Space],
        group_map: GroupMap = None,
    ) -> dict[str, tuple[str, ...]]:
        """The groups :func:`corral.group_agents` forms of ``possible_agents``."""
        groups = group_agents(possible_agents, observation_space, action_space, group_map)
        return {name: tuple(agents) for name, agents in groups.items()}

    def _fields(self) -> dict[str, Field]:
        E = self.num_envs
        out: dict[str, Field] = {}

        def add(path: str, role: Role, shape: tuple[int, ...], dtype: Any) -> None:
            out[path] = Field(path, role, shape, np.dtype(dtype))

        for g in self.groups.values():
            n = len(g.agents)
            for field, role in (("obs", Role.STEP), ("final_obs", Role.EPISODE)):
                for path, spec in leaves(g.obs_tree, f"{field}/{g.name}"):
                    add(path, role, (E, n, *spec.shape), spec.dtype)
            for path, spec in leaves(g.action_tree, f"action/{g.name}"):
                add(path, Role.ACTION, (E, n, *spec.shape), spec.dtype)
            for field, (role, dtype) in _AGENT_FIELDS.items():
                add(f"{field}/{g.name}", role, (E, n), dtype)
            if g.num_actions is not None:
                add(f"action_mask/{g.name}", Role.STEP, (E, n, g.num_actions), bool)
        if self.state_space is not None:
            for field, role in (("state", Role.STEP), ("final_state", Role.EPISODE)):
                for path, spec in leaves(array_tree(self.state_space), field):
                    add(path, role, (E, *spec.shape), spec.dtype)
        for field, (role, dtype) in _ENV_FIELDS.items():
            add(field, role, (E,), dtype)
        return out

    def paths(self, *roles: Role) -> list[str]:
        """The paths of the fields of ``roles``, in layout order."""
        return [path for path, f in self.fields.items() if f.role in roles]

    def array_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Full shape and dtype of every array of the batch and of the actions."""
        return {path: (f.shape, f.dtype) for path, f in self.fields.items()}

    def allocate(self, num_envs: int | None = None) -> dict[str, Any]:
        """Zeroed arrays of every field in the layout's place (``num_envs`` rows each)."""
        rows = self.num_envs if num_envs is None else num_envs
        if self.place.is_torch and self.place.device == "cpu":
            # Tensors over numpy's memory: the numpy views that the bookkeeping (and a
            # native env computing in numpy) work through run faster there than on torch's
            # own allocations (measured: benchmarks/JOURNAL.md, "Native `corral/tag`").
            shapes = {path: ((rows, *f.shape[1:]), f.dtype) for path, f in self.fields.items()}
            return on_host(self.place, {p: np.zeros(*shape) for p, shape in shapes.items()})
        return {
            path: self.place.zeros((rows, *f.shape[1:]), f.dtype) for path, f in self.fields.items()
        }


# Per-agent fields of shape [E, n]: their roles and dtypes.
_AGENT_FIELDS = {
    "reward": (Role.STEP, np.float64),
    "terminated": (Role.STEP, bool),
    "truncated": (Role.STEP, bool),
    "alive": (Role.STEP, bool),
    "acting": (Role.STEP, bool),
    "episode_return": (Role.EPISODE, np.float64),
    # The index in its episode of the decision an agent acting at this batch makes (the
    # decisions it made so far there), and the decisions it made in the episode that ended.
    "decision": (Role.EPISODE, np.int64),
    "episode_decisions": (Role.EPISODE, np.int64),
    # The return so far of each running episode: kept with the batch (not in a worker) so
    # that a worker's replacement can report the episode its death cut short.
    "running_return": (Role.BOOKKEEPING, np.float64),
}

# Per-env fields of shape [E].
_ENV_FIELDS = {
    "done": (Role.EPISODE, bool),
    "episode_length": (Role.EPISODE, np.int64),
    "worker_restarts": (Role.EPISODE, np.int64),
    # The episode that ended in this step was cut by a fault, not ended by its env.
    "episode_cut": (Role.EPISODE, bool),
    "running_length": (Role.BOOKKEEPING, np.int64),
}
