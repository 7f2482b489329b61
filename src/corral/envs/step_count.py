"""The one check of what counts an episode's steps (``max_cycles``): an int of at least 1.

Envs check such an argument when they are built, and :class:`StepCount` checks the
attribute at every write, so that ``VectorEnv.set_attr`` (which writes a natively
batched env's ``settable_attributes``) refuses what the constructor refuses.
"""

from __future__ import annotations

import numbers
from typing import Any


def check_step_count(name: str, value: Any) -> int:
    """``value`` as an int; a ``ValueError`` naming ``name`` unless it is an int (not a bool)
    of at least 1."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
        raise ValueError(
            f"{name} must be an int of at least 1 (the steps of an episode), got {value!r}"
        )
    return int(value)


class StepCount:
    """An attribute that counts an episode's steps, checked by :func:`check_step_count` at
    every write (``max_cycles = StepCount()`` in a class body)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, f"_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj, self.slot)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj, self.slot, check_step_count(self.name, value))
