"""Per-space checks of single actions, registered per space type.

``action_problem(space, action)`` returns ``None`` for a valid action and a
short description of what was expected otherwise. Supporting a new space type
means registering one function, not editing a chain.
"""

from __future__ import annotations

from functools import singledispatch
from typing import Any

import numpy as np
from gymnasium import spaces


@singledispatch
def action_problem(space: spaces.Space, action: Any) -> str | None:
    """Why ``action`` is not a valid member of ``space``, or ``None`` if it is."""
    return None if space.contains(action) else f"an element of {space}"


def _integer_scalar(action: Any) -> int | None:
    if type(action) is int or isinstance(action, np.integer):  # the common case, fast
        return int(action)
    arr = np.asarray(action)
    if arr.shape != () or not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool):
        return None
    return int(arr)


@action_problem.register
def _(space: spaces.Discrete, action: Any) -> str | None:
    value = _integer_scalar(action)
    if value is not None and space.start <= value < space.start + space.n:
        return None
    expected = f"an integer in [{space.start}, {space.start + space.n - 1}]"
    if value is None:
        return f"{expected}, got {action!r} of type {type(action).__name__}"
    return f"{expected}, got {value}"


@action_problem.register
def _(space: spaces.Box, action: Any) -> str | None:
    arr = np.asarray(action)
    if arr.shape != space.shape:
        return f"an array of shape {space.shape}, got shape {arr.shape}"
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        return f"a numeric array of dtype {space.dtype}, got dtype {arr.dtype}"
    if np.issubdtype(space.dtype, np.integer) and not np.issubdtype(arr.dtype, np.integer):
        return f"an integer array of dtype {space.dtype}, got dtype {arr.dtype}"
    if not np.all(np.isfinite(arr)):
        return f"finite values in [{space.low.min()}, {space.high.max()}], got {arr.tolist()}"
    cast = arr.astype(space.dtype)
    if np.any(cast < space.low) or np.any(cast > space.high):
        return f"values within the bounds of {space}, got {arr.tolist()}"
    return None


@action_problem.register
def _(space: spaces.MultiDiscrete, action: Any) -> str | None:
    arr = np.asarray(action)
    if arr.shape != space.shape or not np.issubdtype(arr.dtype, np.integer):
        return f"an integer array of shape {space.shape}, got {arr.tolist()} ({arr.dtype})"
    if np.any(arr < space.start) or np.any(arr >= space.start + space.nvec):
        return f"values in [{space.start}, {space.start + space.nvec}), got {arr.tolist()}"
    return None


@action_problem.register
def _(space: spaces.MultiBinary, action: Any) -> str | None:
    arr = np.asarray(action)
    if arr.shape != space.shape or not np.all((arr == 0) | (arr == 1)):
        return f"a 0/1 array of shape {space.shape}, got {arr.tolist()}"
    return None


@action_problem.register
def _(space: spaces.Dict, action: Any) -> str | None:
    if not isinstance(action, dict) or set(action) != set(space.spaces):
        return f"a dict with keys {sorted(space.spaces)}, got {action!r}"
    for key, sub in space.spaces.items():
        problem = action_problem(sub, action[key])
        if problem is not None:
            return f"[{key!r}]: {problem}"
    return None


@action_problem.register
def _(space: spaces.Tuple, action: Any) -> str | None:
    if not isinstance(action, (tuple, list)) or len(action) != len(space.spaces):
        return f"a tuple of {len(space.spaces)} actions, got {action!r}"
    for i, (sub, part) in enumerate(zip(space.spaces, action, strict=True)):
        problem = action_problem(sub, part)
        if problem is not None:
            return f"[{i}]: {problem}"
    return None


def mask_problem(mask: np.ndarray | None, action: Any) -> str | None:
    """Why a (valid) discrete ``action`` is forbidden by ``mask``, or ``None``."""
    if mask is None:
        return None
    value = _integer_scalar(action)
    if value is None or value < 0 or value >= len(mask) or mask[value]:
        return None
    legal = np.flatnonzero(mask).tolist()
    return f"a legal action {legal} (the action mask forbids {value})"
