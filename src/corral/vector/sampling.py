"""Uniformly random (legal) batched actions, registered per space type."""

from __future__ import annotations

from functools import singledispatch
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays.tree import map_space


@singledispatch
def sample_array(
    space: spaces.Space, lead: tuple[int, ...], rng: np.random.Generator, mask: Any = None
) -> Any:
    """Random actions of shape ``[*lead, *action_shape]``, legal under ``mask`` if given."""
    raise TypeError(f"corral cannot sample batched actions of {type(space).__name__} spaces")


@sample_array.register
def _(space: spaces.Discrete, lead: tuple[int, ...], rng: np.random.Generator, mask: Any = None):
    if mask is None:
        return rng.integers(space.start, space.start + space.n, size=lead, dtype=np.int64)
    # Pick uniformly among legal actions: argmax of random keys restricted to the mask.
    keys = np.where(mask, rng.random((*lead, space.n)), -1.0)
    return np.argmax(keys, axis=-1).astype(np.int64) + space.start


@sample_array.register
def _(space: spaces.Box, lead: tuple[int, ...], rng: np.random.Generator, mask: Any = None):
    """Uniform within the bounds; an unbounded dimension within [-1, 1], a dimension bounded on
    one side within 2 of that bound."""
    low_finite, high_finite = np.isfinite(space.low), np.isfinite(space.high)
    low = np.where(low_finite, space.low, np.where(high_finite, space.high - 2.0, -1.0))
    high = np.where(high_finite, space.high, np.where(low_finite, space.low + 2.0, 1.0))
    if np.issubdtype(space.dtype, np.integer):
        return rng.integers(low, high + 1, size=(*lead, *space.shape)).astype(space.dtype)
    return rng.uniform(low, high, size=(*lead, *space.shape)).astype(space.dtype)


@sample_array.register
def _(space: spaces.MultiDiscrete, lead: tuple[int, ...], rng: np.random.Generator, mask=None):
    return space.start + rng.integers(0, space.nvec, size=(*lead, *space.shape), dtype=np.int64)


@sample_array.register
def _(space: spaces.MultiBinary, lead: tuple[int, ...], rng: np.random.Generator, mask=None):
    return rng.integers(0, 2, size=(*lead, *space.shape), dtype=np.int8)


@sample_array.register(spaces.Dict)
@sample_array.register(spaces.Tuple)
def _(space: spaces.Space, lead: tuple[int, ...], rng: np.random.Generator, mask=None):
    return map_space(lambda leaf: sample_array(leaf, lead, rng), space)
