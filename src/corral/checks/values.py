"""How corral describes and judges the values an env returns, and whether it runs in debug mode.

The vector env (:mod:`corral.vector`) and the conformance checker
(:mod:`corral.checks.env_checker`) both name a bad value in their messages and judge
numbers the same way: NaN and inf are not finite, and a finite value that
its dtype cannot hold (``1e300`` as ``float32``, ``300`` as ``uint8``) overflows;
:func:`store_exactly` stores an array only where no number overflows.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

DEBUG_ENV_VAR = "CORRAL_DEBUG"
_TRUE = frozenset({"1", "true", "yes", "on"})


def debug_mode() -> bool:
    """Whether corral runs in debug mode: ``CORRAL_DEBUG`` set to a true value
    (``1``, ``true``, ``yes``, ``on``) or Python's development mode (``python -X dev``).

    In debug mode a vector env checks that every observation, reward and state
    is finite (``check_finite``) unless told otherwise.
    """
    return sys.flags.dev_mode or os.environ.get(DEBUG_ENV_VAR, "").strip().lower() in _TRUE


def describe(value: Any) -> str:
    """``value`` as a message names it: type, and shape, dtype and range for arrays."""
    if isinstance(value, np.ndarray):
        text = f"array of shape {value.shape} and dtype {value.dtype}"
        if value.size and np.issubdtype(value.dtype, np.number):
            text += f" with values in [{value.min()}, {value.max()}]"
        return text
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 80 else text[:77] + '...'}"


def finite_problem(value: Any, dtype: np.dtype) -> str | None:
    """What ``value``'s numbers, stored as ``dtype``, should have been, or ``None`` if fine.

    A float ``value`` with NaN or inf is not finite; a value beyond the range of
    ``dtype`` (``1e300`` stored as ``float32`` becomes inf) overflows it. The text
    reads after "expected", e.g. ``"finite values, got nan at index (2,)"``.
    """
    try:
        numbers = np.asarray(value)
    except (TypeError, ValueError):
        return None
    if numbers.dtype.kind not in "biuf" or numbers.size == 0:
        return None
    if numbers.dtype.kind == "f":
        bad = ~np.isfinite(numbers)
        if bad.any():
            return f"finite values, got {numbers[bad][0]}{_at(bad)}"
    dtype = np.dtype(dtype)
    if dtype.kind not in "iuf":
        return None
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    wide = numbers.astype(np.float64) if numbers.dtype.kind in "biu" else numbers
    over = (wide > info.max) | (wide < info.min)
    if not over.any():
        return None
    return (
        f"values that {dtype} holds (in [{info.min:.6g}, {info.max:.6g}]), got "
        f"{numbers[over][0]:.6g}{_at(over)}, which overflows {dtype}"
    )


def store_exactly(target: np.ndarray, index: Any, values: np.ndarray) -> None:
    """``target[index] = values``, or an ``OverflowError`` (nothing written) where that
    would change a number beyond rounding (numpy does so silently): a float beyond the
    range of a narrower float dtype (stored as inf), an integer outside an integer dtype's
    range (wrapped around: 300 as ``uint8`` is 44), a NaN, inf or out-of-range float stored
    as an integer. Casts that hold every value (``float32`` into ``float64``) cost nothing
    more."""
    target[index] = exactly_as(values, target.dtype)


def exactly_as(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values`` to store in an array of ``dtype``: themselves where ``dtype`` holds every
    value of theirs, else cast to it; an ``OverflowError`` where a number would change
    beyond rounding (see :func:`store_exactly`)."""
    source = values.dtype
    if source == dtype or _holds(source, dtype):
        return values
    if dtype.kind in "iu" and source.kind in "iu" and values.size:
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise OverflowError(f"values beyond the range of {dtype}")
    try:
        return _cast_raising(values, dtype)
    except FloatingPointError as err:
        raise OverflowError(f"{err} to {dtype}") from None


# (dtype of the values, dtype of the array) -> whether the array's dtype holds every value.
_HOLDS: dict[tuple[np.dtype, np.dtype], bool] = {}


def _holds(source: np.dtype, dtype: np.dtype) -> bool:
    holds = _HOLDS.get((source, dtype))
    if holds is None:
        holds = _HOLDS[source, dtype] = bool(np.can_cast(source, dtype, "safe"))
    return holds


@np.errstate(over="raise", invalid="raise")  # as a decorator: less per call than a with
def _cast_raising(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return values.astype(dtype)


def _at(bad: np.ndarray) -> str:
    return f" at index {tuple(int(k) for k in np.argwhere(bad)[0])}" if bad.ndim else ""
