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

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property, singledispatch
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.groups import GroupMap, group_agents
from corral.values import describe, finite_problem


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


@array_tree.register
def _(space: spaces.Dict) -> Tree:
    return {key: array_tree(sub) for key, sub in space.spaces.items()}


@array_tree.register
def _(space: spaces.Tuple) -> Tree:
    return tuple(array_tree(sub) for sub in space.spaces)


def leaves(tree: Tree, path: str) -> Iterator[tuple[str, ArraySpec]]:
    """``(path, spec)`` of every leaf of ``tree``, paths extending ``path``."""
    if isinstance(tree, ArraySpec):
        yield path, tree
    elif isinstance(tree, dict):
        for key, sub in tree.items():
            yield from leaves(sub, f"{path}/{key}")
    else:
        for i, sub in enumerate(tree):
            yield from leaves(sub, f"{path}/{i}")


def assemble(tree: Tree, path: str, arrays: Mapping[str, np.ndarray]) -> Any:
    """The arrays of ``tree`` under ``path``, nested like the space they hold."""
    if isinstance(tree, ArraySpec):
        return arrays[path]
    if isinstance(tree, dict):
        return {key: assemble(sub, f"{path}/{key}", arrays) for key, sub in tree.items()}
    return tuple(assemble(sub, f"{path}/{i}", arrays) for i, sub in enumerate(tree))


class WriteError(ValueError):
    """A value that does not fit the arrays it is written to.

    ``expected`` says what was expected and what came (``"shape (3,), got float 0.5"``);
    ``where`` is the path to the bad part of a Dict or Tuple value (``"['pos']"``), or ``""``.
    """

    def __init__(self, expected: str, where: str = "") -> None:
        super().__init__(f"{where}{': ' if where else ''}expected {expected}")
        self.expected = expected
        self.where = where

    def inside(self, key: Any) -> WriteError:
        """This error, seen from the Dict or Tuple value that holds the bad part at ``key``."""
        return WriteError(self.expected, f"[{key!r}]{self.where}")


def writer(
    tree: Tree, path: str, arrays: Mapping[str, np.ndarray], check_finite: bool = False
) -> Callable[..., None]:
    """A function ``write(index, value)`` storing one value at ``index`` of the arrays.

    A value whose shape is not the space's (nothing is broadcast), or that the
    array's dtype cannot hold, raises :class:`WriteError`; with ``check_finite``, so
    does NaN or inf in a float array, or a value that overflows it (``1e300`` in
    ``float32``). A value that raised may be partly written.
    """
    if isinstance(tree, ArraySpec):
        return _leaf_writer(arrays[path], tree, check_finite)
    if isinstance(tree, dict):
        parts = {
            key: writer(sub, f"{path}/{key}", arrays, check_finite) for key, sub in tree.items()
        }

        def write_dict(index: tuple[int, ...], value: Mapping[str, Any]) -> None:
            for key, write in parts.items():
                try:
                    part = value[key]
                except (KeyError, TypeError, IndexError):
                    raise WriteError(
                        f"a dict with keys {list(parts)}, got {describe(value)}"
                    ) from None
                try:
                    write(index, part)
                except WriteError as err:
                    raise err.inside(key) from None

        return write_dict
    items = [writer(sub, f"{path}/{i}", arrays, check_finite) for i, sub in enumerate(tree)]

    def write_tuple(index: tuple[int, ...], value: Any) -> None:
        if not isinstance(value, (tuple, list)) or len(value) != len(items):
            raise WriteError(f"a tuple of {len(items)} values, got {describe(value)}")
        for k, (write, part) in enumerate(zip(items, value, strict=True)):
            try:
                write(index, part)
            except WriteError as err:
                raise err.inside(k) from None

    return write_tuple


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
            array[index] = value
        except (TypeError, ValueError, OverflowError, RuntimeWarning):
            # RuntimeWarning: numpy's "overflow encountered in cast", where warnings are errors
            raise WriteError(_store_problem(value, dtype)) from None
        if check_finite:
            stored = array[index]
            # The sum of squares is finite when every value is, unless the sum overflows
            # (then the exact check clears it); one call, a third of isfinite().all()'s time.
            if not math.isfinite(np.vdot(stored, stored)) and not np.isfinite(stored).all():
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
    if isinstance(tree, ArraySpec):
        array = arrays[path]
        if tree.shape == () and np.issubdtype(tree.dtype, np.integer):
            return lambda index: int(array[index])
        return lambda index: array[index].copy()
    if isinstance(tree, dict):
        parts = {key: reader(sub, f"{path}/{key}", arrays) for key, sub in tree.items()}
        return lambda index: {key: read(index) for key, read in parts.items()}
    items = [reader(sub, f"{path}/{i}", arrays) for i, sub in enumerate(tree)]
    return lambda index: tuple(read(index) for read in items)


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


class Layout:
    """Groups, agent positions and the arrays of a batch of ``num_envs`` envs.

    ``check_finite``: observations, rewards and states must be finite (and fit
    their arrays' dtypes); it travels with the layout to every backend's runners.
    """

    def __init__(
        self,
        possible_agents: list[str],
        observation_space: Callable[[str], spaces.Space],
        action_space: Callable[[str], spaces.Space],
        state_space: spaces.Space | None,
        num_envs: int,
        group_map: GroupMap = None,
        check_finite: bool = False,
    ) -> None:
        self.num_envs = num_envs
        self.state_space = state_space
        self.check_finite = check_finite
        groups = group_agents(possible_agents, observation_space, action_space, group_map)
        self.groups = {
            name: Group(name, tuple(agents), observation_space(agents[0]), action_space(agents[0]))
            for name, agents in groups.items()
        }
        self.position = {
            agent: (group.name, j)
            for group in self.groups.values()
            for j, agent in enumerate(group.agents)
        }

    def array_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Full shape and dtype of every array of the batch and of the actions."""
        E = self.num_envs
        out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        for g in self.groups.values():
            n = len(g.agents)
            for field in ("obs", "final_obs"):
                for path, spec in leaves(g.obs_tree, f"{field}/{g.name}"):
                    out[path] = ((E, n, *spec.shape), spec.dtype)
            for path, spec in leaves(g.action_tree, f"action/{g.name}"):
                out[path] = ((E, n, *spec.shape), spec.dtype)
            for field, dtype in _AGENT_FIELDS.items():
                out[f"{field}/{g.name}"] = ((E, n), np.dtype(dtype))
            if g.num_actions is not None:
                out[f"action_mask/{g.name}"] = ((E, n, g.num_actions), np.dtype(bool))
        if self.state_space is not None:
            for field in ("state", "final_state"):
                for path, spec in leaves(array_tree(self.state_space), field):
                    out[path] = ((E, *spec.shape), spec.dtype)
        out["done"] = ((E,), np.dtype(bool))
        out["episode_length"] = ((E,), np.dtype(np.int64))
        out["running_length"] = ((E,), np.dtype(np.int64))
        out["worker_restarts"] = ((E,), np.dtype(np.int64))
        return out


# Per-agent fields of shape [E, n] and their dtypes.
_AGENT_FIELDS = {
    "reward": np.float64,
    "terminated": bool,
    "truncated": bool,
    "alive": bool,
    "acting": bool,
    "episode_return": np.float64,
    # The return so far of each running episode: kept with the batch (not in a worker) so
    # that a worker's replacement can report the episode its death cut short.
    "running_return": np.float64,
}
