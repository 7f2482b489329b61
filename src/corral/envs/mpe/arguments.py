"""The keyword arguments of mpe2's scenarios that corral checks before mpe2 sees them.

mpe2 takes any ``max_cycles`` and compares it with its step count, so ``2.5`` ends its
episodes after 3 steps, while an ``int()`` of it would end them after 2. Both ways of
building an ``mpe2/...`` id (mpe2's own env, packed as a dict env, and the natively
batched one) check their arguments here first, so that such a value is refused the
same way by both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.envs.step_count import check_step_count

STEP_COUNTS = ("max_cycles",)
"""The arguments that count steps: an int of at least 1."""


def check_arguments(kwargs: Mapping[str, Any]) -> None:
    """Raise a ``ValueError`` naming the first argument in ``kwargs`` that mpe2 would take
    but not as meant."""
    for name in STEP_COUNTS:
        if name not in kwargs:
            continue
        check_step_count(name, kwargs[name])
