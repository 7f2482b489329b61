"""corral's natively batched ``mpe2/simple_line_v1`` against mpe2 itself
(tests/mpe_differential.py has the checks every scenario runs)."""

from __future__ import annotations

import numpy as np
import pytest
from mpe_differential import (
    batched,
    differential_tests,
    mpe2_raw,
)

pytest.importorskip("mpe2")

ID = "mpe2/simple_line_v1"
# N above 5 matches agents to targets by shortest paths rather than by permutations.
CASES = [
    {},
    {"N": 2, "continuous_actions": True, "max_cycles": 13},
    {"N": 6, "terminate_on_success": True, "dynamic_rescaling": False},
]
globals().update(differential_tests(ID, CASES, returns_cases=[CASES[1]], render_cases=CASES[::2]))


def test_episodes_end_on_success_where_asked() -> None:
    """terminate_on_success: every agent within 0.05 of its target ends the episode
    (terminated, not truncated), as mpe2's does; elsewhere it goes on."""
    kwargs = {"terminate_on_success": True}
    env = batched(ID, 2, **kwargs)
    env.reset(seed=0)
    raw = mpe2_raw(ID, kwargs)
    raw.reset(seed=0)
    # Copy 0 and mpe2: the agents near their places on the line, in reverse, standing still.
    targets = raw.scenario._expected_positions
    for agent, target in zip(raw.world.agents, targets[::-1], strict=True):
        agent.state.p_pos = target + 0.01
        agent.state.p_vel = np.zeros(2)
    env.from_mpe2(raw, 0)
    stay = np.zeros((2, 4), np.int64)
    step = env.step({"agent": stay})
    for _ in raw.agents:
        raw.step(0)
    assert all(raw.terminations.values())
    assert step.terminated["agent"].tolist() == [[True] * 4, [False] * 4]
    assert not step.truncated["agent"].any()
    assert step.alive["agent"].tolist() == [[False] * 4, [True] * 4]
    assert step.reward["agent"][0].tolist() == [raw.rewards[a] for a in raw.agents]


def test_a_bad_or_unsupported_argument_is_named() -> None:
    with pytest.raises(ValueError, match="benchmark_data=True"):
        batched(ID, 2, benchmark_data=True)
