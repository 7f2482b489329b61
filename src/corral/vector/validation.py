"""Checks of batched actions, before anything reaches an env.

``action_array_problem(space, array, acting)`` looks at a whole group's
actions ``[E, n, *shape]`` at once and returns the first problem among the
acting entries as ``(env, agent_index, text)``, or ``None``. It is registered
per space type, like the single-action checks in :mod:`corral.spaces`;
``clip_to_space`` (for ``clip_actions=True``) likewise.
"""

from __future__ import annotations

from functools import singledispatch
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays import import_torch, to_numpy

Problem = tuple[int, int, str] | None


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
    if _is_tensor(acting):
        if not _tensor_suspect(space, array, acting, mask):
            return None
        array = _host(array)
        acting = to_numpy(acting)
        mask = None if mask is None else to_numpy(mask)
    problem = action_array_problem(space, array, acting)
    if problem is None and mask is not None:
        problem = mask_problem(space, array, acting, mask)
    return problem


def _is_tensor(value: Any) -> bool:
    return not isinstance(value, np.ndarray) and hasattr(value, "is_floating_point")


def _host(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _host(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_host(v) for v in value)
    return to_numpy(value) if _is_tensor(value) else value


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
