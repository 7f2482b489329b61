"""Checks of batched actions, before anything reaches an env, and of the arrays a natively
batched env returns, before anything of them is stored.

``action_array_problem(space, array, acting)`` looks at a whole group's
actions ``[E, n, *shape]`` at once and returns the first problem among the
acting entries as ``(env, agent_index, text)``, or ``None``. It is registered
per space type, like the single-action checks in :mod:`corral.spaces`;
``clip_to_space`` (for ``clip_actions=True``) likewise.

:class:`ReturnedArrays` checks what a natively batched env returns (packed dict
envs judge each value themselves, naming the agent).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import singledispatch
from typing import Any, NoReturn

import numpy as np
from gymnasium import spaces

from corral.arrays import Place, import_torch, is_tensor, to_numpy, torch_dtype, tree_to_numpy
from corral.batched_env import BatchedStep
from corral.checks.values import describe, finite_problem
from corral.errors import EnvError
from corral.vector.layout import ArraySpec, Layout, Tree, array_tree

Problem = tuple[int, int, str] | None
FineCheck = Callable[[Any, Any], bool]


def _first(bad: np.ndarray, text: str) -> Problem:
    """The first ``[env, agent]`` where ``bad`` holds (reduced over trailing axes)."""
    if bad.ndim > 2:
        bad = bad.reshape(*bad.shape[:2], -1).any(axis=-1)
    hits = np.argwhere(bad)
    if len(hits) == 0:
        return None
    env, agent = (int(x) for x in hits[0])
    return env, agent, text


def _shape_problem(space_shape: tuple[int, ...], array: np.ndarray, lead: tuple[int, int]) -> str:
    expected = (*lead, *space_shape)
    if array.shape != expected:
        return f"an array of shape {expected} ([env, agent, *action_shape]), got {array.shape}"
    return ""


@singledispatch
def action_array_problem(space: spaces.Space, array: Any, acting: np.ndarray) -> Problem:
    """The first invalid acting entry of a group's action array, or ``None``."""
    raise TypeError(f"corral has no batched action check for {type(space).__name__} spaces")


@action_array_problem.register
def _(space: spaces.Discrete, array: Any, acting: np.ndarray) -> Problem:
    array = np.asarray(array)
    shape = _shape_problem((), array, acting.shape)
    if shape:
        return -1, -1, shape
    if array.dtype.kind not in "iub":
        return -1, -1, f"integer actions, got dtype {array.dtype}"
    low, high = int(space.start), int(space.start + space.n - 1)
    if array.size == 0 or (array.min() >= low and array.max() <= high):
        return None
    return _first(acting & ((array < low) | (array > high)), f"an integer in [{low}, {high}]")


@action_array_problem.register
def _(space: spaces.Box, array: Any, acting: np.ndarray) -> Problem:
    array = np.asarray(array)
    shape = _shape_problem(space.shape, array, acting.shape)
    if shape:
        return -1, -1, shape
    if not np.can_cast(array.dtype, space.dtype, casting="same_kind"):
        return -1, -1, f"actions castable to {space.dtype}, got dtype {array.dtype}"
    live = acting.reshape(*acting.shape, *([1] * len(space.shape)))
    if not np.isfinite(array).all():
        return _first(live & ~np.isfinite(array), "finite values (got NaN or inf)")
    outside = (array < space.low) | (array > space.high)
    if outside.any():
        problem = _first(live & outside, f"values within [{space.low.min()}, {space.high.max()}]")
        if problem is not None:
            return problem
    if space.dtype.kind == "f" and not np.can_cast(array.dtype, space.dtype):
        # only a wider input can hold values beyond the space's dtype (an unbounded Box)
        limit = np.finfo(space.dtype).max
        over = np.abs(array) > limit
        if over.any():
            return _first(
                live & over, f"values that {space.dtype} holds (|x| <= {limit:.6g}; more is inf)"
            )
    return None


@action_array_problem.register
def _(space: spaces.MultiDiscrete, array: Any, acting: np.ndarray) -> Problem:
    array = np.asarray(array)
    shape = _shape_problem(space.shape, array, acting.shape)
    if shape:
        return -1, -1, shape
    if not np.issubdtype(array.dtype, np.integer):
        return -1, -1, f"integer actions, got dtype {array.dtype}"
    live = acting.reshape(*acting.shape, *([1] * len(space.shape)))
    outside = (array < space.start) | (array >= space.start + space.nvec)
    return _first(live & outside, f"integers in [{space.start}, {space.start + space.nvec})")


@action_array_problem.register
def _(space: spaces.MultiBinary, array: Any, acting: np.ndarray) -> Problem:
    array = np.asarray(array)
    shape = _shape_problem(space.shape, array, acting.shape)
    if shape:
        return -1, -1, shape
    live = acting.reshape(*acting.shape, *([1] * len(space.shape)))
    return _first(live & (array != 0) & (array != 1), "values 0 or 1")


@action_array_problem.register
def _(space: spaces.Dict, array: Any, acting: np.ndarray) -> Problem:
    if not isinstance(array, dict) or set(array) != set(space.spaces):
        return -1, -1, f"a dict of arrays with keys {sorted(space.spaces)}"
    for key, sub in space.spaces.items():
        problem = action_array_problem(sub, array[key], acting)
        if problem is not None:
            return problem[0], problem[1], f"[{key!r}]: {problem[2]}"
    return None


@action_array_problem.register
def _(space: spaces.Tuple, array: Any, acting: np.ndarray) -> Problem:
    if not isinstance(array, (tuple, list)) or len(array) != len(space.spaces):
        return -1, -1, f"a tuple of {len(space.spaces)} arrays"
    for i, sub in enumerate(space.spaces):
        problem = action_array_problem(sub, array[i], acting)
        if problem is not None:
            return problem[0], problem[1], f"[{i}]: {problem[2]}"
    return None


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


def mask_problem(
    space: spaces.Discrete, array: Any, acting: np.ndarray, mask: np.ndarray
) -> Problem:
    """The first acting entry whose (in-range) discrete action its mask forbids."""
    if mask.all():
        return None
    index = np.clip(np.asarray(array, dtype=np.int64) - space.start, 0, space.n - 1)
    picked = np.take_along_axis(mask, index[..., None], axis=-1)[..., 0]
    return _first(acting & ~picked, "a legal action (its action mask forbids this one)")


def group_problem(space: spaces.Space, array: Any, acting: Any, mask: Any | None) -> Problem:
    """The first invalid acting entry of a group's actions (its mask included), or ``None``;
    on numpy arrays, or on torch tensors (checked on their device, read back only to name
    a problem)."""
    tensor = _is_tensor(acting)
    if tensor and acting.device.type == "cpu" and Place.numpy_on_cpu:  # cheaper
        acting = to_numpy(acting)
        mask = None if mask is None else to_numpy(mask)
        tensor = False
    if not tensor and type(array) is not np.ndarray:
        array = tree_to_numpy(array)
    if isinstance(space, spaces.Discrete) and _discrete_fine(space, array, acting, mask):
        return None
    if tensor:
        if not _tensor_suspect(space, array, acting, mask):
            return None
        array = tree_to_numpy(array)
        acting = to_numpy(acting)
        mask = None if mask is None else to_numpy(mask)
    problem = action_array_problem(space, array, acting)
    if problem is None and mask is not None:
        problem = mask_problem(space, array, acting, mask)
    return problem


# Up to this many actions in a group, they are range-checked as Python integers.
_FEW_ACTIONS = 16


def _discrete_fine(space: spaces.Discrete, array: Any, acting: Any, mask: Any | None) -> bool:
    """Whether integer discrete actions (numpy, or a tensor beside tensors) are all in range
    and legal under ``mask``: one look at the whole group, no closer one where every entry,
    acting or not, holds a legal action. ``False``: some entry may not (the checks above
    look closer, at the acting ones)."""
    if isinstance(array, np.ndarray):
        if not isinstance(acting, np.ndarray) or array.shape != acting.shape:
            return False
    elif not (_is_tensor(array) and _is_tensor(acting)) or array.shape != acting.shape:
        return False
    low, n = int(space.start), int(space.n)
    if isinstance(array, np.ndarray) and array.dtype.kind == "i" and array.size:
        if array.size <= _FEW_ACTIONS and (mask is None or isinstance(mask, np.ndarray)):
            return _few_legal(array.ravel().tolist(), low, n, mask)
        # In range in one pass: below low, as unsigned, is beyond every bound.
        if (array - low if low else array).view(f"u{array.dtype.itemsize}").max() >= n:
            return False
        if mask is None:
            return True
        shifted = array - low if low else array
        return bool(mask.reshape(-1).take(_mask_rows(mask, n) + shifted.reshape(-1)).all())
    if _is_tensor(array):
        if array.is_floating_point() or array.is_complex() or array.dtype == acting.dtype:
            return False  # float, complex or bool: the checks above say what is wrong
        if array.numel() == 0:
            return True
        least, most = import_torch().stack(import_torch().aminmax(array)).tolist()
    else:
        if array.dtype.kind not in "iu":
            return False
        if array.size == 0:
            return True
        least, most = int(array.min()), int(array.max())
    if least < low or most >= low + n:
        return False
    if mask is None:
        return True
    # Each entry's flat index in the mask: its row of n actions, then the action.
    index = _mask_rows(mask, n) + (array - low if low else array).reshape(-1)
    return bool(mask.reshape(-1)[index].all())


def few_discrete_check(space: spaces.Space, shape: tuple[int, ...]) -> FineCheck | None:
    """For a group of a few discrete actions (``shape``: ``[E, n]``) checked on numpy,
    :func:`group_problem`'s first look at less cost per call: ``fine(array, mask)`` says
    whether every entry, acting or not, holds a legal action (``False``: some may not,
    and ``group_problem`` looks closer); ``None`` for other groups."""
    size = math.prod(shape)
    if not isinstance(space, spaces.Discrete) or not 0 < size <= _FEW_ACTIONS:
        return None
    low, n = int(space.start), int(space.n)

    def fine(array: Any, mask: np.ndarray | None) -> bool:
        if type(array) is not np.ndarray or array.shape != shape or array.dtype.kind != "i":
            return False
        return _few_legal(array.ravel().tolist(), low, n, mask)

    return fine


def _few_legal(values: list[int], low: int, n: int, mask: np.ndarray | None) -> bool:
    """Whether a few discrete actions (Python integers, in C order) are all in range
    ``[low, low + n)`` and legal under ``mask`` (numpy): less per call than numpy's."""
    if min(values) < low or max(values) >= low + n:
        return False
    if mask is not None:
        legal = mask.item  # by flat index, in C order: each entry's row of n, then its action
        for r, v in enumerate(values):
            if not legal(r * n + v - low):
                return False
    return True


def _mask_rows(mask: Any, n: int) -> Any:
    """``arange(rows) * n`` for a mask of ``rows * n`` entries, in its namespace (kept)."""
    key = (type(mask), mask.shape, str(getattr(mask, "device", "")))
    rows = _MASK_ROWS.get(key)
    if rows is None:
        rows = np.arange(0, mask.shape[0] * mask.shape[1] * n, n)
        if _is_tensor(mask):
            rows = import_torch().as_tensor(rows, device=mask.device)
        if len(_MASK_ROWS) >= 64:  # a few batch shapes in practice
            _MASK_ROWS.clear()
        _MASK_ROWS[key] = rows
    return rows


_MASK_ROWS: dict[tuple, Any] = {}


def _is_tensor(value: Any) -> bool:
    return not isinstance(value, np.ndarray) and hasattr(value, "is_floating_point")


def _tensor_suspect(space: spaces.Space, array: Any, acting: Any, mask: Any | None) -> bool:
    """Whether a group's tensor of actions may hold a problem (checked on its device; the
    numpy checks then name it). Spaces other than Discrete and Box are always checked."""
    if not _is_tensor(array) or tuple(array.shape) != (*acting.shape, *space.shape):
        return True
    if isinstance(space, spaces.Discrete):
        if array.is_floating_point() or array.is_complex():
            return True
        low, high = int(space.start), int(space.start + space.n - 1)
        if bool((acting & ((array < low) | (array > high))).any()):
            return True
        if mask is None:
            return False
        index = (array.long() - low).clamp(0, int(space.n) - 1)
        picked = mask.gather(-1, index[..., None])[..., 0]
        return bool((acting & ~picked).any())
    if isinstance(space, spaces.Box):
        if array.is_complex():
            return True
        torch = import_torch()
        low = torch.as_tensor(space.low, device=array.device)
        high = torch.as_tensor(space.high, device=array.device)
        bad = ~torch.isfinite(array) | (array < low) | (array > high)
        live = acting.reshape(*acting.shape, *([1] * len(space.shape)))
        return bool((live & bad).any()) or array.dtype.itemsize > np.dtype(space.dtype).itemsize
    return True


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
        keys: tuple = (),
    ) -> None:
        if isinstance(tree, ArraySpec):
            rows = arrays[path]
            label = name if group is None else f"{name}[{group!r}]"
            label += "".join(f"[{k!r}]" for k in keys)
            self._plan.append((name, group, keys, label, rows, agents))
            return
        for key in tree if isinstance(tree, dict) else range(len(tree)):
            self._add(name, group, tree[key], f"{path}/{key}", arrays, agents, (*keys, key))

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
        if isinstance(value, np.ndarray) and value.dtype.kind not in "biuf":
            self._fail(0, f"{label}: expected an array of numbers, got {_array_text(value)}")
        if _is_flag(rows):  # alive, acting, ends, masks: a number other than 0 or 1 is no flag
            self._check_flags(value, label, agents)
            return
        limits = None if _holds(rows, value) else _limits(rows)
        if limits is None:
            return
        over = (value < limits[0]) | (value > limits[1])
        if _is_float(value) and not _is_float(rows):
            over |= value != value  # NaN has no integer
        if not bool(over.any()):
            return
        hit = tuple(int(k) for k in np.argwhere(to_numpy(over))[0])
        who = f" of agent {agents[hit[1]]!r}" if agents else ""
        row = to_numpy(value[hit[0], hit[1]] if agents else value[hit[0]])
        dtype = to_numpy(rows[:0]).dtype
        self._fail(hit[0], f"{label}{who}: expected {finite_problem(row, dtype)}")

    def _check_flags(self, value: Any, label: str, agents: tuple[str, ...]) -> None:
        """Flags given in another dtype than bool: each 0 or 1 (``0.5`` is not ``True``)."""
        other = (value != 0) & (value != 1)
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


def _is_flag(rows: Any) -> bool:
    if isinstance(rows, np.ndarray):
        return rows.dtype == np.bool_
    return rows.dtype == import_torch().bool


def _is_float(array: Any) -> bool:
    if isinstance(array, np.ndarray):
        return array.dtype.kind == "f"
    return bool(array.is_floating_point())


def _holds(rows: Any, value: Any) -> bool:
    """Whether the dtype of ``rows`` holds every value of ``value``'s dtype, each a numpy
    array or a torch tensor (a tensor for numpy rows too: storing it would round it)."""
    if not is_tensor(rows) and not is_tensor(value):
        return np.can_cast(value.dtype, rows.dtype, "safe")
    target, source = (_torch_dtype_of(a) for a in (rows, value))
    return import_torch().promote_types(source, target) == target


def _torch_dtype_of(array: Any) -> Any:
    return array.dtype if is_tensor(array) else torch_dtype(array.dtype)


def _limits(rows: Any) -> tuple[float, float] | None:
    """The least and greatest number the dtype of ``rows`` holds (``None`` for bool)."""
    if isinstance(rows, np.ndarray):
        kind = rows.dtype.kind
        if kind not in "iuf":
            return None
        info: Any = np.finfo(rows.dtype) if kind == "f" else np.iinfo(rows.dtype)
        return info.min, info.max
    torch = import_torch()
    if rows.dtype == torch.bool:
        return None
    info = torch.finfo(rows.dtype) if rows.is_floating_point() else torch.iinfo(rows.dtype)
    return info.min, info.max
