"""Ranges of numeric settings, declared next to each field and checked when a config is built.

A config dataclass declares a setting's range in its annotation, and calls
:func:`check_ranges` from ``__post_init__``::

    @dataclass
    class Config:
        gamma: Annotated[float, Range(ge=0, le=1)] = 0.99

    Config(gamma=5)  # ConfigError: gamma must be in [0, 1], got 5

``None`` and non-numeric values (``"auto"``) are not checked (their types are
the config's business); a tuple or list is checked entry by entry. NaN and inf
are in no range (``lr=inf`` would train to NaN).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass
from typing import Any

from corral.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """The values a numeric setting may take: ``ge``/``gt`` bound it below (inclusive or
    not), ``le``/``lt`` above."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def __contains__(self, value: float) -> bool:
        # NaN and inf are in no range: no setting means "no limit" by infinity
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def __str__(self) -> str:
        low = ("[", self.ge) if self.ge is not None else ("(", self.gt)
        high = ("]", self.le) if self.le is not None else (")", self.lt)
        if low[1] is not None and high[1] is not None:
            return f"in {low[0]}{_show(low[1])}, {_show(high[1])}{high[0]}"
        if low[1] is not None:
            return f"at least {_show(low[1])}" if low[0] == "[" else f"greater than {_show(low[1])}"
        if high[1] is not None:
            return f"at most {_show(high[1])}" if high[0] == "]" else f"less than {_show(high[1])}"
        return "any number"


SEED = Range(ge=0, le=2**64 - 1)
"""The seeds a run takes: PyTorch's generators take none above ``2**64 - 1``."""


def check_ranges(config: Any) -> None:
    """Raise :class:`~corral.errors.ConfigError` naming the first field of the dataclass
    ``config`` whose value is outside its declared :class:`Range`."""
    kind: type = type(config)  # mypy does not see ``type[Any]`` as hashable
    for name, limits in declared_ranges(kind).items():
        value = getattr(config, name)
        many = isinstance(value, (tuple, list))
        items = value if many else [value]
        if not all(_fits(item, limits) for item in items):
            what = f"every entry of {name}" if many else name
            needs = [] if all(map(_finite, items)) else ["a finite number"]
            if limits != Range():  # any number: finiteness is the only limit
                needs.append(str(limits))
            raise ConfigError(f"{what} must be {' '.join(needs)}, got {_show(value)}")


@functools.cache
def declared_ranges(cls: type) -> dict[str, Range]:
    """The :class:`Range` of each field of the dataclass ``cls`` that declares one."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = {}
    for f in dataclasses.fields(cls):
        found = [m for m in getattr(hints[f.name], "__metadata__", ()) if isinstance(m, Range)]
        if found:
            out[f.name] = found[0]
    return out


def _fits(value: Any, limits: Range) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return True
    return value in limits


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def _show(value: Any) -> str:
    """``5`` for ``5.0`` (as the user typed it, most likely), ``repr`` otherwise."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, (tuple, list)):
        inner = ", ".join(_show(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    return repr(value)
