"""Whether a value an env returns is valid for its dtype, how it is described, and whether
corral runs in debug mode.

The one home of these rules: the vector layer (:mod:`corral.vector`: the arrays a
natively batched env returns, the dict envs' packer, the finite checks per copy) and the
conformance checkers (:mod:`corral.checks`) name a bad value and judge numbers the same
way: NaN and inf are not finite (:func:`finite_problem`, :func:`nonfinite_cells`,
:func:`not_finite`), a finite value that its dtype cannot hold (``1e300`` as ``float32``,
``300`` or ``300.0`` as ``uint8``) overflows (:func:`finite_problem`,
:func:`overflow_flags`), a flag is 0 or 1 (:func:`nonflag_flags`); :func:`store_exactly`
stores an array only where no number overflows. Not finite and overflow are two faults:
``inf`` stored as ``float32`` stays ``inf`` (only a finite check refuses it), while NaN and
inf have no integer, so an integer dtype refuses them as it refuses ``300.0``. They judge
numpy arrays, and torch tensors where the vector layer keeps them.

What an env returns for a reward and an end flag is judged twice over, on purpose: the
contract (:func:`is_reward`, :func:`is_end_flag`, which :func:`corral.check_env` checks)
asks for a real number and a bool; the dict envs' packer runs the envs it is given and
also takes what has one plain meaning (:func:`packed_reward`, :func:`packed_flag`: a bool
reward, a one-element array, ``0``/``1`` for a flag).
"""

from __future__ import annotations

import math
import numbers
import os
import sys
from typing import Any

import numpy as np

from corral.arrays import import_torch, is_tensor, to_numpy, torch_dtype

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
            if np.issubdtype(value.dtype, np.complexfloating):
                return text  # complex numbers have no order
            finite = value[np.isfinite(value)]
            if finite.size:  # the range of the numbers, beside the NaN and inf it holds
                text += f" with values in [{finite.min()}, {finite.max()}]"
            if finite.size < value.size:
                text += f", {value.size - finite.size} of them NaN or inf"
        return text
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 80 else text[:77] + '...'}"


def is_reward(value: Any) -> bool:
    """Whether ``value`` is a reward as the contract asks (what :func:`corral.check_env`
    checks): a real number, Python's or numpy's, and not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def packed_reward(value: Any) -> float | None:
    """``value`` as the reward the dict envs' packer stores, or ``None`` where it is no
    real number.

    More lenient than :func:`is_reward`, on purpose: the packer runs the envs it is given
    and takes what has one plain meaning, a bool (``True`` is ``1.0``) and a one-element
    array of numbers; :func:`corral.check_env` reports both.
    """
    if isinstance(value, int) and abs(value) > sys.float_info.max:
        return math.inf if value > 0 else -math.inf  # beyond float64, as is_finite reads it
    if isinstance(value, (numbers.Real, np.bool_)):
        return float(value)
    if isinstance(value, np.ndarray) and value.size == 1 and holds_numbers(value):
        return float(value.item())
    return None


def is_end_flag(value: Any) -> bool:
    """Whether ``value`` is a termination or truncation as the contract asks (what
    :func:`corral.check_env` checks): a bool, Python's or numpy's."""
    return isinstance(value, (bool, np.bool_))


def packed_flag(value: Any) -> bool | None:
    """``value`` as the end flag the dict envs' packer stores, or ``None`` where it is none.

    More lenient than :func:`is_end_flag`, on purpose (see :func:`packed_reward`): the
    packer also takes the integer ``0`` or ``1``, and a one-element array holding a bool,
    ``0`` or ``1``; :func:`corral.check_env` reports them.
    """
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or (
        isinstance(value, numbers.Integral) and value in (0, 1)
    ):
        return bool(value)
    return None


def holds_numbers(array: Any) -> bool:
    """Whether the numpy array ``array`` holds numbers: its dtype is bool, integer or float
    (not complex, text or objects)."""
    return array.dtype.kind in "biuf"


def is_finite(value: Any) -> bool:
    """Whether every number of ``value`` (a number, or a numpy array of numbers) is finite:
    neither NaN nor inf; a Python int too large for a float64 counts as inf (what storing it
    as a reward makes of it)."""
    if isinstance(value, int):
        try:
            return math.isfinite(float(value))
        except OverflowError:
            return False
    if isinstance(value, float):
        return math.isfinite(value)
    return bool(np.isfinite(value).all())


def changed_agents(now: np.ndarray, then: np.ndarray) -> np.ndarray:
    """``[E, n]``: the agents whose rows differ between two arrays ``[E, n, ...]`` (NaN equal
    to NaN)."""
    same = now == then
    if now.dtype.kind in "fc":
        same |= np.isnan(now) & np.isnan(then)
    return ~same.reshape(*same.shape[:2], -1).all(axis=2)


def not_finite(array: np.ndarray) -> np.ndarray:
    """Where the numpy array ``array`` of numbers holds NaN or inf (nowhere for a dtype
    without them)."""
    return ~np.isfinite(array)


def finite_problem(value: Any, dtype: np.dtype) -> str | None:
    """What ``value``'s numbers, stored as ``dtype``, should have been, or ``None`` if fine.

    A float ``value`` with NaN or inf is not finite; a value beyond the range of
    ``dtype`` (``1e300`` stored as ``float32`` becomes inf) overflows it. The text
    reads after "expected", e.g. ``"finite values, got nan at index (2,)"``.
    """
    try:
        array = np.asarray(value)
    except (TypeError, ValueError):
        return None
    if not holds_numbers(array) or array.size == 0:
        return None
    if array.dtype.kind == "f":
        bad = not_finite(array)
        if bad.any():
            return f"finite values, got {array[bad][0]}{_at(bad)}"
    dtype = np.dtype(dtype)
    if dtype.kind not in "iuf":
        return None
    info = np.finfo(dtype) if dtype.kind == "f" else np.iinfo(dtype)
    wide = array.astype(np.float64) if array.dtype.kind in "biu" else array
    over = _above(wide, info.max) | (wide < info.min)
    if not over.any():
        return None
    return (
        f"values that {dtype} holds (in [{info.min:.6g}, {info.max:.6g}]), got "
        f"{array[over][0]:.6g}{_at(over)}, which overflows {dtype}"
    )


def store_exactly(target: np.ndarray, index: Any, values: np.ndarray) -> None:
    """``target[index] = values``, or an ``OverflowError`` (nothing written) where that
    would change a number beyond rounding (numpy does so silently): a finite float beyond
    the range of a narrower float dtype (stored as inf), a number outside an integer
    dtype's range (wrapped around: ``300`` and ``300.0`` as ``uint8`` are 44), a NaN or inf
    stored as an integer (which has neither). An inf stored as a narrower float stays inf:
    not finite is a fault of its own (:func:`finite_problem`), not an overflow. Casts that
    hold every value (``float32`` into ``float64``) cost nothing more."""
    target[index] = exactly_as(values, target.dtype)


def exactly_as(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``values`` to store in an array of ``dtype``: themselves where ``dtype`` holds every
    value of theirs, else cast to it; an ``OverflowError`` where a number would change
    beyond rounding (see :func:`store_exactly`; as a bool, any number but 0 and 1)."""
    source = values.dtype
    if source == dtype or _holds(source, dtype):
        return values
    if dtype.kind == "b" and values.size and not ((values == 0) | (values == 1)).all():
        raise OverflowError(f"{values[(values != 0) & (values != 1)][0]} stored as bool")
    if dtype.kind in "iu" and source.kind in "iuf" and values.size:
        finite = np.isfinite(values) if source.kind == "f" else None
        if finite is not None and not finite.all():
            raise OverflowError(f"{values[~finite][0]} stored as {dtype}, which has no NaN or inf")
        info = np.iinfo(dtype)
        if values.min() < info.min or _above(np.asarray(values.max()), info.max):
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


def nonfinite_cells(value: Any, rows: Any | None = None) -> dict[int, int]:
    """Each copy (the first axis; among the bool mask ``rows``, all for ``None``) where the
    array ``value`` holds NaN or inf -> its first agent holding one (the second axis; 0
    for a value without agents)."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind != "f":
            return {}
        bad = not_finite(value)
    else:
        if not value.is_floating_point():
            return {}
        bad = ~value.isfinite()
    if rows is not None:
        bad = bad & rows.reshape(-1, *([1] * (bad.ndim - 1)))
    if not bool(bad.any()):
        return {}
    cells: dict[int, int] = {}
    for index in np.argwhere(to_numpy(bad)):
        cells.setdefault(int(index[0]), int(index[1]) if len(index) > 1 else 0)
    return cells


def has_dtype(array: Any, dtype: np.dtype) -> bool:
    """Whether ``array`` (numpy or torch) has the dtype ``dtype`` (a tensor: torch's own
    for it, ``torch.float32`` for ``float32``)."""
    if is_tensor(array):
        return bool(array.dtype == torch_dtype(dtype))
    return np.dtype(array.dtype) == dtype


def is_flag_array(rows: Any) -> bool:
    """Whether ``rows`` (numpy or torch) hold flags: bool."""
    if isinstance(rows, np.ndarray):
        return rows.dtype == np.bool_
    return bool(rows.dtype == import_torch().bool)


def nonflag_flags(value: Any) -> Any:
    """Where ``value``, given for flags in another dtype than bool, is neither 0 nor 1
    (``0.5`` is no ``True``)."""
    return (value != 0) & (value != 1)


def overflow_flags(value: Any, rows: Any) -> Any | None:
    """Where a number of ``value`` would change beyond rounding stored in ``rows``'s dtype
    (each numpy or torch; ``1e300`` as ``float32`` is inf, ``300`` as ``uint8`` is 44, NaN
    and inf have no integer), or ``None`` where that dtype holds every value of
    ``value``'s: what :func:`store_exactly` refuses. An inf for a float dtype is not
    marked: it is stored as inf, and not finite is a fault of its own."""
    if _dtype_holds(rows, value):
        return None
    limits = _dtype_limits(rows)
    if limits is None:  # bool: 0 and 1 only
        return (value != 0) & (value != 1)
    over = (value < limits[0]) | _above(value, limits[1])
    if _is_float(value):
        if _is_float(rows):
            over &= _finite(value)
        else:
            over |= value != value  # NaN has no integer
    return over


def _above(values: Any, maximum: Any) -> Any:
    """Where ``values`` (numpy or torch) exceed ``maximum`` exactly: an integer maximum
    may round up in the values' float dtype (int64's ``2**63 - 1`` is ``2**63`` as a
    float64, where ``2.0**63 > maximum`` would be false), and the integer lower bounds are
    powers of two, which need no such care."""
    if not _is_float(values) or not isinstance(maximum, (int, np.integer)):
        return values > maximum
    if isinstance(values, np.ndarray):
        rounded = float(values.dtype.type(maximum))
    else:
        rounded = import_torch().tensor(int(maximum), dtype=values.dtype).item()
    return values >= rounded if rounded > int(maximum) else values > rounded


def _finite(array: Any) -> Any:
    return np.isfinite(array) if isinstance(array, np.ndarray) else array.isfinite()


def _is_float(array: Any) -> bool:
    if isinstance(array, np.ndarray):
        return array.dtype.kind == "f"
    return bool(array.is_floating_point())


def _dtype_holds(rows: Any, value: Any) -> bool:
    """Whether the dtype of ``rows`` holds every value of ``value``'s dtype, each a numpy
    array or a torch tensor (a tensor for numpy rows too: storing it would round it)."""
    if not is_tensor(rows) and not is_tensor(value):
        return _holds(value.dtype, rows.dtype)
    target, source = (_torch_dtype_of(a) for a in (rows, value))
    return bool(import_torch().promote_types(source, target) == target)


def _torch_dtype_of(array: Any) -> Any:
    return array.dtype if is_tensor(array) else torch_dtype(array.dtype)


def _dtype_limits(rows: Any) -> tuple[float, float] | None:
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
