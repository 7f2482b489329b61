"""Whether an action is legal in its space: one rule per space type, applied in three modes.

:func:`action_rule` gives a space's rule (registered per space type: supporting a new
space type means registering one class, not editing a chain). A rule says what an
action of its space must be, and judges

- one action (a dict env's step): :meth:`ActionRule.problem` returns ``None`` for a legal
  action and what was expected otherwise (the text reads after "expected");
- a group's actions on the host, a numpy array ``[E, n, *shape]`` (the vector layer):
  :meth:`ActionRule.array_problem` returns the first problem among the acting entries as
  ``(env, agent_index, text)``; :meth:`ActionRule.fine` and :meth:`ActionRule.few_check`
  are its one-look fast paths (``True``: every entry, acting or not, is legal);
- a group's actions as a tensor on its device: :meth:`ActionRule.device_check` flags
  the entries at fault by kind of problem, on the device, and gives legal stand-ins,
  so the flags can be read later (:mod:`corral.vector.deferred`) or at once
  (:func:`group_problem`).

An action mask (``Discrete`` spaces) is part of the rule: an action in range is legal
where its mask holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cached_property, singledispatch
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces

from corral.arrays import import_torch, to_numpy, torch_dtype, tree_to_numpy

Problem = tuple[int, int, str] | None
"""The first problem of a group's actions: ``(env, agent_index, text)`` (``-1, -1`` where
the whole array is wrong), or ``None``."""
FineCheck = Callable[[Any, Any], bool]

# Up to this many actions in a group, they are range-checked as Python integers.
_FEW_ACTIONS = 16


class DeviceChecked(NamedTuple):
    """A group's actions checked on their device (nothing read back)."""

    faults: list[tuple[str, Any]]
    """Per kind of problem (a key of :attr:`ActionRule.kinds`, in their order), a bool
    tensor ``[E, n]``: the acting entries at fault."""
    safe: Any
    """The actions with a legal stand-in for every entry at fault, acting or not."""
    counts: Any | None
    """With ``clip``: per ``[env, agent]``, how many entries were clipped (acting ones)."""


def action_rule(space: spaces.Space) -> ActionRule:
    """The rule of ``space``, built once per space object (a space is not changed once
    in use)."""
    kept = _RULES.get(id(space))
    if kept is not None and kept[0] is space:
        return kept[1]
    rule = _rule_for(space)
    if len(_RULES) >= 256:  # spaces made anew per call: keep a few, not all
        _RULES.clear()
    _RULES[id(space)] = (space, rule)
    return rule


_RULES: dict[int, tuple[spaces.Space, ActionRule]] = {}


def action_problem(space: spaces.Space, action: Any, mask: np.ndarray | None = None) -> str | None:
    """Why ``action`` is not a legal member of ``space`` (under its action ``mask``, if
    any), or ``None`` if it is."""
    return action_rule(space).problem(action, mask)


class ActionRule:
    """The rule of a space corral has no closer rule for: gymnasium's ``contains`` for
    one action; no batched check."""

    kinds: dict[str, str] = {}
    """What the device mode flags: kind of problem -> what was expected."""

    def __init__(self, space: spaces.Space) -> None:
        self.space = space

    def problem(self, action: Any, mask: np.ndarray | None = None) -> str | None:
        """Why ``action`` is not legal (``mask``: its action mask, if its space has
        masks), or ``None``."""
        return None if self.space.contains(action) else f"an element of {self.space}"

    def array_problem(self, array: Any, acting: np.ndarray, mask: Any | None = None) -> Problem:
        """The first illegal acting entry of a group's action array (numpy), or ``None``."""
        raise TypeError(
            f"corral has no batched action check for {type(self.space).__name__} spaces"
        )

    def fine(self, array: Any, acting: Any, mask: Any | None) -> bool:
        """At one look at the whole group: whether every entry, acting or not, is legal
        (``False``: some entry may not be; :meth:`array_problem` looks closer)."""
        return False

    def few_check(self, shape: tuple[int, ...]) -> FineCheck | None:
        """:meth:`fine` at less cost per call for a group of a few actions of ``shape``
        (``[E, n]``) on numpy, as ``fine(array, mask)``; ``None`` where there is none."""
        return None

    def prepare_device(self, device: Any) -> None:
        """Make the constants :meth:`device_check` needs on ``device`` now (a copy from the
        host that a step then need not make)."""

    def device_check(
        self, array: Any, acting: Any, mask: Any | None, clip: bool
    ) -> DeviceChecked | None:
        """A group's tensor of actions checked on its device; ``None`` where this mode
        does not apply (another space, or an array whose shape or dtype is wrong: the host
        mode says what is wrong). With ``clip``, ``Box`` entries out of bounds are clipped
        and counted, not faults."""
        return None


@singledispatch
def _rule_for(space: spaces.Space) -> ActionRule:
    return ActionRule(space)


def _integer_scalar(action: Any) -> int | None:
    if type(action) is int or isinstance(action, np.integer):  # the common case, fast
        return int(action)
    arr = np.asarray(action)
    if arr.shape != () or not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool):
        return None
    return int(arr)


def _first(bad: np.ndarray, text: str) -> Problem:
    """The first ``[env, agent]`` where ``bad`` holds (reduced over trailing axes)."""
    if bad.ndim > 2:
        bad = np.asarray(bad.reshape(*bad.shape[:2], -1).any(axis=-1))
    hits = np.argwhere(bad)
    if len(hits) == 0:
        return None
    env, agent = (int(x) for x in hits[0])
    return env, agent, text


def _shape_problem(space_shape: tuple[int, ...], array: np.ndarray, lead: tuple[int, ...]) -> str:
    expected = (*lead, *space_shape)
    if array.shape != expected:
        return f"an array of shape {expected} ([env, agent, *action_shape]), got {array.shape}"
    return ""


def _is_tensor(value: Any) -> bool:
    return not isinstance(value, np.ndarray) and hasattr(value, "is_floating_point")


class DiscreteRule(ActionRule):
    """An integer in ``[start, start + n)``, and, under an action mask, one it allows."""

    space: spaces.Discrete

    def __init__(self, space: spaces.Discrete) -> None:
        super().__init__(space)
        self.low, self.n = int(space.start), int(space.n)

    @cached_property
    def expected(self) -> str:
        return f"an integer in [{self.low}, {self.low + self.n - 1}]"

    @cached_property
    def kinds(self) -> dict[str, str]:  # type: ignore[override]
        return {"range": self.expected, "mask": _FORBIDDEN}

    def problem(self, action: Any, mask: np.ndarray | None = None) -> str | None:
        value = _integer_scalar(action)
        if value is None:
            return f"{self.expected}, got {action!r} of type {type(action).__name__}"
        if not self.low <= value < self.low + self.n:
            return f"{self.expected}, got {value}"
        index = value - self.low  # mask entry i: the action start + i
        if mask is None or index >= len(mask) or mask[index]:
            return None
        legal = (np.flatnonzero(mask) + self.low).tolist()
        return f"a legal action {legal} (the action mask forbids {value})"

    def array_problem(self, array: Any, acting: np.ndarray, mask: Any | None = None) -> Problem:
        array = np.asarray(array)
        shape = _shape_problem((), array, acting.shape)
        if shape:
            return -1, -1, shape
        if array.dtype.kind not in "iub":
            return -1, -1, f"integer actions, got dtype {array.dtype}"
        low, high = self.low, self.low + self.n - 1
        if array.size and (array.min() < low or array.max() > high):
            problem = _first(acting & ((array < low) | (array > high)), self.expected)
            if problem is not None:
                return problem
        if mask is None or mask.all():
            return None
        index = np.clip(np.asarray(array, dtype=np.int64) - low, 0, self.n - 1)
        picked = np.take_along_axis(mask, index[..., None], axis=-1)[..., 0]
        return _first(acting & ~picked, _FORBIDDEN)

    def fine(self, array: Any, acting: Any, mask: Any | None) -> bool:
        if isinstance(array, np.ndarray):
            if not isinstance(acting, np.ndarray) or array.shape != acting.shape:
                return False
        elif not (_is_tensor(array) and _is_tensor(acting)) or array.shape != acting.shape:
            return False
        low, n = self.low, self.n
        numpy_int = isinstance(array, np.ndarray) and array.dtype.kind in "iu"
        if numpy_int and not _holds(array.dtype.kind, array.dtype.itemsize, low, n):
            return False  # shifting by low could wrap: array_problem checks exactly
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
                return False  # float, complex or bool: array_problem says what is wrong
            if not _holds("i" if array.dtype.is_signed else "u", array.itemsize, low, n):
                return False
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

    def few_check(self, shape: tuple[int, ...]) -> FineCheck | None:
        if not 0 < math.prod(shape) <= _FEW_ACTIONS:
            return None
        low, n = self.low, self.n

        def fine(array: Any, mask: np.ndarray | None) -> bool:
            if type(array) is not np.ndarray or array.shape != shape or array.dtype.kind != "i":
                return False
            return _few_legal(array.ravel().tolist(), low, n, mask)

        return fine

    def device_check(
        self, array: Any, acting: Any, mask: Any | None, clip: bool
    ) -> DeviceChecked | None:
        if not _is_tensor(array) or tuple(array.shape) != tuple(acting.shape):
            return None
        if array.device != acting.device or array.is_floating_point() or array.is_complex():
            return None
        low, n = self.low, self.n
        index = array.long() - low
        outside = (index < 0) | (index >= n)
        index = index.clamp(0, n - 1)
        faults = [("range", acting & outside)]
        if mask is None:
            return DeviceChecked(faults, index.where(~outside, 0) + low, None)
        allowed = mask.gather(-1, index[..., None])[..., 0]
        faults.append(("mask", acting & ~outside & ~allowed))
        first_legal = mask.to(import_torch().uint8).argmax(-1)
        return DeviceChecked(faults, index.where(allowed & ~outside, first_legal) + low, None)


_FORBIDDEN = "a legal action (its action mask forbids this one)"


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


def _holds(kind: str, itemsize: int, low: int, n: int) -> bool:
    """Whether integers of ``kind`` (``"i"`` or ``"u"``) and ``itemsize`` bytes hold every
    action ``low .. low + n - 1``."""
    bits = 8 * itemsize
    if kind == "u":
        return low >= 0 and low + n <= 1 << bits
    return -(1 << (bits - 1)) <= low and low + n <= 1 << (bits - 1)


class BoxRule(ActionRule):
    """Numbers of the space's shape, castable to its dtype, finite, within its bounds, and
    (from a wider dtype) that its dtype holds."""

    space: spaces.Box

    @cached_property
    def kinds(self) -> dict[str, str]:  # type: ignore[override]
        space = self.space
        kinds = {
            "finite": "finite values (got NaN or inf)",
            "bounds": f"values within [{space.low.min()}, {space.high.max()}]",
        }
        if space.dtype.kind == "f":
            kinds["limit"] = (
                f"values that {space.dtype} holds (|x| <= {_limits(space.dtype)[1]:.6g}; "
                "more is inf)"
            )
        return kinds

    def problem(self, action: Any, mask: np.ndarray | None = None) -> str | None:
        space = self.space
        arr = np.asarray(action)
        if arr.shape != space.shape:
            return f"an array of shape {space.shape}, got shape {arr.shape}"
        if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            return f"a numeric array of dtype {space.dtype}, got dtype {arr.dtype}"
        if np.issubdtype(space.dtype, np.integer) and not np.issubdtype(arr.dtype, np.integer):
            return f"an integer array of dtype {space.dtype}, got dtype {arr.dtype}"
        floats = space.dtype.kind == "f"
        if floats and not np.can_cast(arr.dtype, space.dtype, casting="same_kind"):  # complex
            return f"values castable to {space.dtype}, got dtype {arr.dtype}"
        if not np.all(np.isfinite(arr)):
            return f"finite values in [{space.low.min()}, {space.high.max()}], got {arr.tolist()}"
        if floats and not np.can_cast(arr.dtype, space.dtype):
            top = _limits(space.dtype)[1]  # a wider float beyond it would be stored as inf
            if np.any(np.abs(arr) > top):
                return f"{self.kinds['limit']}, got {arr.tolist()}"
        # a float is read as the space's dtype holds it; an integer as it is (a cast could wrap)
        value = arr if space.dtype.kind in "iu" else arr.astype(space.dtype)
        if np.any(value < space.low) or np.any(value > space.high):
            return f"values within the bounds of {space}, got {arr.tolist()}"
        return None

    def array_problem(self, array: Any, acting: np.ndarray, mask: Any | None = None) -> Problem:
        space = self.space
        array = np.asarray(array)
        shape = _shape_problem(space.shape, array, acting.shape)
        if shape:
            return -1, -1, shape
        if not np.can_cast(array.dtype, space.dtype, casting="same_kind"):
            return -1, -1, f"actions castable to {space.dtype}, got dtype {array.dtype}"
        live = acting.reshape(*acting.shape, *([1] * len(space.shape)))
        finite = np.isfinite(array)
        if not finite.all():  # NaN where no agent acts is ignored: the checks below go on
            problem = _first(live & ~finite, self.kinds["finite"])
            if problem is not None:
                return problem
        outside = (array < space.low) | (array > space.high)
        if outside.any():
            problem = _first(live & outside, self.kinds["bounds"])
            if problem is not None:
                return problem
        if space.dtype.kind == "f" and not np.can_cast(array.dtype, space.dtype):
            # only a wider input can hold values beyond the space's dtype (an unbounded Box)
            over = np.abs(array) > _limits(space.dtype)[1]
            if over.any():
                return _first(live & over, self.kinds["limit"])
        return None

    def device_check(
        self, array: Any, acting: Any, mask: Any | None, clip: bool
    ) -> DeviceChecked | None:
        space = self.space
        if not _is_tensor(array) or array.device != acting.device or array.is_complex():
            return None
        if tuple(array.shape) != (*acting.shape, *space.shape):
            return None
        if array.is_floating_point() and space.dtype.kind != "f":
            return None  # not castable to the space's dtype
        torch = import_torch()
        low, high, least, most = self._bounds(array.device)
        value = array if array.dtype == torch.float64 else array.to(torch.float64)
        lead = acting.reshape(*acting.shape, *([1] * len(space.shape)))
        per_agent = acting.shape

        def agents(flags: Any) -> Any:
            return flags.reshape(*per_agent, -1).any(-1) if space.shape else flags

        # clipping comes first, as on the host: inf is clipped to a finite bound, NaN stays
        kept = value.clamp(low, high) if clip else value
        faults = [("finite", agents(lead & ~torch.isfinite(kept)))]
        outside = (value < low) | (value > high)
        counts = None
        if clip:
            counts = outside.reshape(*per_agent, -1).sum(-1) * acting
        else:
            faults.append(("bounds", agents(lead & outside)))
        if space.dtype.kind == "f" and array.dtype.itemsize > np.dtype(space.dtype).itemsize:
            over = kept.abs() > float(_limits(space.dtype)[1])
            faults.append(("limit", agents(lead & over)))
        safe = value.where(~value.isnan(), least).clamp(least, most)
        return DeviceChecked(faults, safe.to(torch_dtype(space.dtype)), counts)

    def prepare_device(self, device: Any) -> None:
        self._bounds(device)

    def _bounds(self, device: Any) -> tuple[Any, Any, Any, Any]:
        """The bounds, and the stand-ins' (finite) bounds, as float64 tensors on
        ``device`` (made once per device)."""
        key = str(device)
        bounds = self._on_device.get(key)
        if bounds is None:
            torch, space = import_torch(), self.space
            least, most = _limits(space.dtype)
            put = lambda a: torch.as_tensor(a, dtype=torch.float64, device=device)  # noqa: E731
            bounds = (
                put(space.low),
                put(space.high),
                put(np.maximum(space.low, least)),  # the stand-ins' bounds: finite
                put(np.minimum(space.high, most)),
            )
            # kept by the name asked for and by the tensors' own ("cuda" is "cuda:0")
            self._on_device[key] = self._on_device[str(bounds[0].device)] = bounds
        return bounds

    @cached_property
    def _on_device(self) -> dict[str, tuple[Any, Any, Any, Any]]:
        return {}


def _limits(dtype: np.dtype) -> tuple[float, float]:
    info: Any = np.finfo(dtype) if np.dtype(dtype).kind == "f" else np.iinfo(dtype)
    return float(info.min), float(info.max)


class MultiDiscreteRule(ActionRule):
    """Integers of the space's shape, each in ``[start, start + nvec)``."""

    space: spaces.MultiDiscrete

    def problem(self, action: Any, mask: np.ndarray | None = None) -> str | None:
        space = self.space
        arr = np.asarray(action)
        if arr.shape != space.shape or not np.issubdtype(arr.dtype, np.integer):
            return f"an integer array of shape {space.shape}, got {arr.tolist()} ({arr.dtype})"
        if np.any(arr < space.start) or np.any(arr >= space.start + space.nvec):
            return f"values in [{space.start}, {space.start + space.nvec}), got {arr.tolist()}"
        return None

    def array_problem(self, array: Any, acting: np.ndarray, mask: Any | None = None) -> Problem:
        space = self.space
        array = np.asarray(array)
        shape = _shape_problem(space.shape, array, acting.shape)
        if shape:
            return -1, -1, shape
        if not np.issubdtype(array.dtype, np.integer):
            return -1, -1, f"integer actions, got dtype {array.dtype}"
        live = acting.reshape(*acting.shape, *([1] * len(space.shape)))
        outside = (array < space.start) | (array >= space.start + space.nvec)
        return _first(live & outside, f"integers in [{space.start}, {space.start + space.nvec})")


class MultiBinaryRule(ActionRule):
    """0s and 1s of the space's shape."""

    space: spaces.MultiBinary

    def problem(self, action: Any, mask: np.ndarray | None = None) -> str | None:
        arr = np.asarray(action)
        if arr.shape != self.space.shape or not np.all((arr == 0) | (arr == 1)):
            return f"a 0/1 array of shape {self.space.shape}, got {arr.tolist()}"
        return None

    def array_problem(self, array: Any, acting: np.ndarray, mask: Any | None = None) -> Problem:
        array = np.asarray(array)
        shape = _shape_problem(self.space.shape, array, acting.shape)
        if shape:
            return -1, -1, shape
        live = acting.reshape(*acting.shape, *([1] * len(self.space.shape)))
        return _first(live & (array != 0) & (array != 1), "values 0 or 1")


class DictRule(ActionRule):
    """A dict with the space's keys, each value legal in its subspace."""

    space: spaces.Dict

    def __init__(self, space: spaces.Dict) -> None:
        super().__init__(space)
        self.parts = {key: _rule_for(sub) for key, sub in space.spaces.items()}

    def problem(self, action: Any, mask: np.ndarray | None = None) -> str | None:
        if not isinstance(action, dict) or set(action) != set(self.parts):
            return f"a dict with keys {sorted(self.parts)}, got {action!r}"
        for key, rule in self.parts.items():
            problem = rule.problem(action[key])
            if problem is not None:
                return f"[{key!r}]: {problem}"
        return None

    def array_problem(self, array: Any, acting: np.ndarray, mask: Any | None = None) -> Problem:
        if not isinstance(array, dict) or set(array) != set(self.parts):
            return -1, -1, f"a dict of arrays with keys {sorted(self.parts)}"
        for key, rule in self.parts.items():
            problem = rule.array_problem(array[key], acting)
            if problem is not None:
                return problem[0], problem[1], f"[{key!r}]: {problem[2]}"
        return None


class TupleRule(ActionRule):
    """A tuple (or list) with one action per subspace, each legal in it."""

    space: spaces.Tuple

    def __init__(self, space: spaces.Tuple) -> None:
        super().__init__(space)
        self.parts = [_rule_for(sub) for sub in space.spaces]

    def problem(self, action: Any, mask: np.ndarray | None = None) -> str | None:
        if not isinstance(action, (tuple, list)) or len(action) != len(self.parts):
            return f"a tuple of {len(self.parts)} actions, got {action!r}"
        for i, (rule, part) in enumerate(zip(self.parts, action, strict=True)):
            problem = rule.problem(part)
            if problem is not None:
                return f"[{i}]: {problem}"
        return None

    def array_problem(self, array: Any, acting: np.ndarray, mask: Any | None = None) -> Problem:
        if not isinstance(array, (tuple, list)) or len(array) != len(self.parts):
            return -1, -1, f"a tuple of {len(self.parts)} arrays"
        for i, rule in enumerate(self.parts):
            problem = rule.array_problem(array[i], acting)
            if problem is not None:
                return problem[0], problem[1], f"[{i}]: {problem[2]}"
        return None


for _space_type, _rule_type in (
    (spaces.Discrete, DiscreteRule),
    (spaces.Box, BoxRule),
    (spaces.MultiDiscrete, MultiDiscreteRule),
    (spaces.MultiBinary, MultiBinaryRule),
    (spaces.Dict, DictRule),
    (spaces.Tuple, TupleRule),
):
    _rule_for.register(_space_type, _rule_type)


def group_problem(
    rule: ActionRule, array: Any, acting: Any, mask: Any | None, *, host_views: bool
) -> Problem:
    """The first illegal acting entry of a group's actions (its mask included), or ``None``;
    on numpy arrays, or on torch tensors (checked on their device by the device mode, read
    back only to name a problem by the host mode). ``host_views`` is the caller's
    :attr:`corral.Place.host_views`: whether CPU tensors are checked through numpy views."""
    tensor = _is_tensor(acting)
    if tensor and acting.device.type == "cpu" and host_views:  # cheaper
        acting = to_numpy(acting)
        mask = None if mask is None else to_numpy(mask)
        tensor = False
    if not tensor and type(array) is not np.ndarray:
        array = tree_to_numpy(array)
    if rule.fine(array, acting, mask):
        return None
    if tensor:
        if not device_suspect(rule, array, acting, mask):
            return None
        array = tree_to_numpy(array)
        acting = to_numpy(acting)
        mask = None if mask is None else to_numpy(mask)
    return rule.array_problem(array, acting, mask)


def device_suspect(rule: ActionRule, array: Any, acting: Any, mask: Any | None) -> bool:
    """Whether a group's tensor of actions may hold a problem: the device mode's faults,
    read back at once (``True`` where that mode does not apply: the host mode decides)."""
    checked = rule.device_check(array, acting, mask, clip=False)
    if checked is None:
        return True
    torch = import_torch()
    return bool(torch.stack([flags.any() for _, flags in checked.faults]).any())
