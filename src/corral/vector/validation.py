"""Clipping of batched actions, and checks of the arrays a natively batched env returns,
before anything of them is stored.

``clip_to_space`` (for ``clip_actions=True``) clips a group's actions into its space
(registered per space type; whether an action is legal is the rule of its space, in
:mod:`corral.spaces`).

:class:`ReturnedArrays` checks what a natively batched env returns (packed dict
envs judge each value themselves, naming the agent).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import singledispatch
from typing import Any, NoReturn

import numpy as np
from gymnasium import spaces

from corral.arrays import to_numpy
from corral.arrays.tree import leaf_keys
from corral.batched_env import BatchedStep
from corral.errors import EnvError
from corral.returned_values import (
    describe,
    finite_problem,
    holds_numbers,
    is_flag_array,
    nonflag_flags,
    overflow_flags,
)
from corral.vector.layout import ArraySpec, Layout, Tree, array_tree


@singledispatch
def clip_to_space(space: spaces.Space, array: Any, acting: np.ndarray) -> tuple[Any, np.ndarray]:
    """``array`` clipped into ``space``, and how many entries of each acting ``[env, agent]``
    were outside it. Only ``Box`` actions are clipped; NaN stays NaN (an error later)."""
    return array, np.zeros(acting.shape, np.int64)


@clip_to_space.register
def _(space: spaces.Box, array: Any, acting: np.ndarray) -> tuple[Any, np.ndarray]:
    array = np.asarray(array)
    if array.shape != (*acting.shape, *space.shape) or array.dtype.kind not in "iuf":
        return array, np.zeros(acting.shape, np.int64)  # the checks name what is wrong
    outside = (array < space.low) | (array > space.high)
    counts = outside.reshape(*acting.shape, -1).sum(axis=-1) * acting
    return (np.clip(array, space.low, space.high) if outside.any() else array), counts


class ReturnedArrays:
    """Checks each array a natively batched env returns against the batch rows it fills.

    Always (a few comparisons per array and call): every array has the shape of its rows
    (``[copies, agents of the group, ...]``: nothing is broadcast, so a scalar or one
    agent's row cannot fill a whole group), and an array of another dtype than its rows
    holds numbers that their dtype holds (``1e300`` would be stored in ``float32`` as
    inf, ``300`` in ``uint8`` as 44). ``arrays`` are the rows this env fills (a worker's
    shard of the batch), ``offset`` the index of its first copy; a problem raises an
    :class:`~corral.errors.EnvError` naming the copy (the env's first copy where the
    whole array is wrong), the field and, where one is at fault, the agent.
    """

    def __init__(self, layout: Layout, arrays: Mapping[str, Any], offset: int = 0) -> None:
        self.offset = offset
        self.num_envs = len(next(iter(arrays.values())))
        # Per array: the BatchedStep attribute, its group (None: state), the keys down to
        # it (Dict and Tuple spaces), its label, its rows, and the agents of its group.
        self._plan: list[tuple[str, str | None, tuple, str, Any, tuple[str, ...]]] = []
        for g, group in layout.groups.items():
            self._add("obs", g, group.obs_tree, f"obs/{g}", arrays, group.agents)
            for name in ("alive", "acting", "reward", "terminated", "truncated"):
                self._add(name, g, _LEAF, f"{name}/{g}", arrays, group.agents)
            if group.num_actions is not None:
                self._add("action_mask", g, _LEAF, f"action_mask/{g}", arrays, group.agents)
        if layout.state_space is not None:
            self._add("state", None, array_tree(layout.state_space), "state", arrays, ())

    def _add(
        self,
        name: str,
        group: str | None,
        tree: Tree,
        path: str,
        arrays: Mapping[str, Any],
        agents: tuple[str, ...],
    ) -> None:
        for keys in leaf_keys(tree):
            rows = arrays["/".join((path, *map(str, keys)))]
            label = name if group is None else f"{name}[{group!r}]"
            label += "".join(f"[{k!r}]" for k in keys)
            self._plan.append((name, group, keys, label, rows, agents))

    def check(self, out: BatchedStep, step: bool = False) -> None:
        """Raise an :class:`~corral.errors.EnvError` for the first array of ``out`` that
        does not fit its rows (``reward``, ``terminated``, ``truncated``: owed by a
        ``step``, checked where a reset returns them)."""
        for name, group, keys, label, rows, agents in self._plan:
            values = getattr(out, name)
            if values is None:
                if step and name in _STEP_ONLY:
                    self._fail(0, self._missing(values, group, keys, label, agents))
                continue
            try:
                value = values if group is None else values[group]
                for key in keys:
                    value = value[key]
                if value is rows:  # the env wrote into the batch's own array
                    continue
            except (KeyError, IndexError, TypeError):
                if name == "action_mask" and isinstance(values, Mapping):
                    continue  # a group left out has every action legal
                self._fail(0, self._missing(values, group, keys, label, agents))
            shape = getattr(value, "shape", None)
            if shape == rows.shape:
                if value.dtype != rows.dtype:
                    self._check_dtype(value, rows, label, agents)
                continue
            self._fail(
                0,
                f"{label}: expected an array of shape {tuple(rows.shape)} ([copies, agents of "
                f"the group, ...] for its {self.num_envs} copies; nothing is broadcast), "
                f"got {_array_text(value)}",
            )

    def _missing(
        self, values: Any, group: str | None, keys: tuple, label: str, agents: tuple[str, ...]
    ) -> str:
        """What is missing on the way to the array ``label`` in ``values``."""
        name = label.partition("[")[0]
        if group is not None:
            if not isinstance(values, Mapping) or group not in values:
                return (
                    f"{name}: expected a dict with an array for group {group!r} (agents "
                    f"{', '.join(map(repr, agents))}), got {describe(values)}"
                )
            values = values[group]
        for key in keys:
            try:
                values = values[key]
            except (KeyError, IndexError, TypeError):
                return f"{label}: expected the value at [{key!r}], got {describe(values)}"
        return f"{label}: expected an array, got {describe(values)}"

    def _check_dtype(self, value: Any, rows: Any, label: str, agents: tuple[str, ...]) -> None:
        """An array of another dtype than its rows: numbers, none of which the rows' dtype
        would change beyond rounding (``1e300`` as ``float32`` is inf, ``300`` as ``uint8``
        is 44)."""
        if isinstance(value, np.ndarray) and not holds_numbers(value):
            self._fail(0, f"{label}: expected an array of numbers, got {_array_text(value)}")
        if is_flag_array(rows):  # alive, acting, ends, masks: a number other than 0 or 1
            self._check_flags(value, label, agents)
            return
        over = overflow_flags(value, rows)
        if over is None or not bool(over.any()):
            return
        hit = tuple(int(k) for k in np.argwhere(to_numpy(over))[0])
        who = f" of agent {agents[hit[1]]!r}" if agents else ""
        row = to_numpy(value[hit[0], hit[1]] if agents else value[hit[0]])
        dtype = to_numpy(rows[:0]).dtype
        self._fail(hit[0], f"{label}{who}: expected {finite_problem(row, dtype)}")

    def _check_flags(self, value: Any, label: str, agents: tuple[str, ...]) -> None:
        """Flags given in another dtype than bool: each 0 or 1 (``0.5`` is not ``True``)."""
        other = nonflag_flags(value)
        if not bool(other.any()):
            return
        hit = tuple(int(k) for k in np.argwhere(to_numpy(other))[0])
        at = hit[:2] if agents else hit[:1]
        who = f" of agent {agents[hit[1]]!r}" if agents else ""
        got = to_numpy(value[at]).tolist()
        self._fail(
            hit[0],
            f"{label}{who}: expected a bool (True or False, or 0 or 1), got {got!r} (an "
            f"array of dtype {value.dtype})",
        )

    def _fail(self, copy: int, text: str) -> NoReturn:
        raise EnvError(self.offset + copy, text)


_STEP_ONLY = ("reward", "terminated", "truncated")  # fields a step owes and a reset does not
_LEAF = ArraySpec((), np.dtype(bool))  # the per-agent fields: one leaf each (rows say more)


def _array_text(value: Any) -> str:
    if getattr(value, "shape", None) is None:
        return describe(value)
    return f"an array of shape {tuple(value.shape)} and dtype {value.dtype}"
