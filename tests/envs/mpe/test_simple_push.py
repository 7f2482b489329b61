"""corral's natively batched ``mpe2/simple_push_v3`` against mpe2 itself."""

from __future__ import annotations

import numpy as np
import pytest
from support.mpe_differential import (
    batched,
    check_render_at_reset,
    differential_tests,
)

pytest.importorskip("mpe2")

ID = "mpe2/simple_push_v3"
CASES = [
    {},
    {"max_cycles": 13},
    {"continuous_actions": True},
    {"continuous_actions": True, "max_cycles": 9, "dynamic_rescaling": False},
]
globals().update(differential_tests(ID, CASES, render_cases=CASES[::3]))


def test_render_draws_each_copys_goal_colours() -> None:
    """The agent wears a colour of its goal landmark; the adversary does not."""
    env = check_render_at_reset(ID, {})
    assert set(np.asarray(env.goal).tolist()) == {0, 1}  # every colour drawn


def test_an_unsupported_argument_is_named() -> None:
    with pytest.raises(ValueError, match="benchmark_data=True"):
        batched(ID, 2, benchmark_data=True)
