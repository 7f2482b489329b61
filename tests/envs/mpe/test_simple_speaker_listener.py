"""corral's natively batched ``mpe2/simple_speaker_listener_v4`` against mpe2 itself."""

from __future__ import annotations

import numpy as np
import pytest
from support.mpe_differential import (
    batched,
    check_render_at_reset,
    differential_tests,
)

pytest.importorskip("mpe2")

ID = "mpe2/simple_speaker_listener_v4"
CASES = [
    {},
    {"max_cycles": 13},
    {"continuous_actions": True},
    {"continuous_actions": True, "max_cycles": 9, "dynamic_rescaling": False},
]
globals().update(differential_tests(ID, CASES, returns_cases=[CASES[2]], render_cases=CASES[::3]))


def test_render_draws_each_copys_goal_colours() -> None:
    """The listener wears its goal landmark's colour, lightened."""
    env = check_render_at_reset(ID, {})
    assert set(np.asarray(env.goal).tolist()) == {0, 1, 2}  # every colour drawn


def test_the_speaker_never_moves() -> None:
    """The speaker stays where its reset put it, whatever it says; the listener moves."""
    env = batched(ID, 3)
    env.reset(seed=1)
    start = env.world.pos.copy()
    rng = np.random.default_rng(0)
    for _ in range(5):
        env.step({"speaker": rng.integers(0, 3, (3, 1)), "listener": np.full((3, 1), 2)})
    assert (env.world.pos[:, 0] == start[:, 0]).all()
    assert (env.world.pos[:, 1, 0] > start[:, 1, 0]).all()


def test_an_unsupported_argument_is_named() -> None:
    with pytest.raises(ValueError, match="benchmark_data=True"):
        batched(ID, 2, benchmark_data=True)
