"""corral's natively batched ``mpe2/simple_reference_v3`` against mpe2 itself."""

from __future__ import annotations

import numpy as np
import pytest
from support.mpe_differential import (
    batched,
    check_render_at_reset,
    differential_tests,
)

pytest.importorskip("mpe2")

ID = "mpe2/simple_reference_v3"
CASES = [
    {},
    {"local_ratio": 0.3, "max_cycles": 13},
    {"continuous_actions": True, "local_ratio": 1.0},
    {"continuous_actions": True, "max_cycles": 9, "dynamic_rescaling": False},
]
globals().update(differential_tests(ID, CASES, returns_cases=[CASES[1]], render_cases=CASES[::3]))


def test_render_draws_each_copys_goal_colours() -> None:
    """Each agent wears the colour of the landmark it must reach (the other's goal)."""
    env = check_render_at_reset(ID, {})
    assert set(np.asarray(env.goals).ravel().tolist()) == {0, 1, 2}  # every colour drawn


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"benchmark_data": True}, "benchmark_data=True"), ({"local_ratio": 1.5}, "local_ratio")],
)
def test_a_bad_or_unsupported_argument_is_named(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        batched(ID, 2, **kwargs)
