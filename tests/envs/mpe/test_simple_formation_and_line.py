"""corral's natively batched ``mpe2/simple_formation_v1`` and ``mpe2/simple_line_v1``
against mpe2 itself (tests/support/mpe_differential.py has the checks every scenario runs): the
two scenarios differ only in where their targets lie."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from support.mpe_differential import (
    batched,
    differential_tests,
    mpe2_raw,
)

pytest.importorskip("mpe2")

FORMATION, LINE = "mpe2/simple_formation_v1", "mpe2/simple_line_v1"
IDS = [FORMATION, LINE]
# Formation's N above 5 matches agents to targets by shortest paths rather than by
# permutations.
CASES = {
    FORMATION: [
        {},
        {"N": 3, "continuous_actions": True, "max_cycles": 13},
        {"N": 7, "terminate_on_success": True, "dynamic_rescaling": False},
    ],
    LINE: [
        {},
        {"N": 2, "continuous_actions": True, "max_cycles": 13},
        {"N": 6, "terminate_on_success": True, "dynamic_rescaling": False},
    ],
}
for _id, _cases in CASES.items():
    _tests = differential_tests(_id, _cases, returns_cases=[_cases[1]], render_cases=_cases[::2])
    _scenario = _id.removeprefix("mpe2/simple_").removesuffix("_v1")
    globals().update({f"{name}_{_scenario}": test for name, test in _tests.items()})


def _on_the_circle(raw: Any) -> None:
    """The agents on formation's circle around the landmark."""
    landmark = raw.world.landmarks[0].state.p_pos
    for i, agent in enumerate(raw.world.agents):
        angle = 0.3 + i * np.pi / 2
        agent.state.p_pos = landmark + 0.5 * np.array([np.cos(angle), np.sin(angle)])


def _on_the_line(raw: Any) -> None:
    """The agents near their places on the line, in reverse."""
    targets = raw.scenario._expected_positions
    for agent, target in zip(raw.world.agents, targets[::-1], strict=True):
        agent.state.p_pos = target + 0.01


AT_TARGETS: dict[str, Callable[[Any], None]] = {FORMATION: _on_the_circle, LINE: _on_the_line}


@pytest.mark.parametrize("id", IDS)
def test_episodes_end_on_success_where_asked(id: str) -> None:
    """terminate_on_success: every agent within 0.05 of its target ends the episode
    (terminated, not truncated), as mpe2's does; elsewhere it goes on."""
    kwargs = {"terminate_on_success": True}
    env = batched(id, 2, **kwargs)
    env.reset(seed=0)
    raw = mpe2_raw(id, kwargs)
    raw.reset(seed=0)
    # Copy 0 and mpe2: the agents at their targets, standing still.
    AT_TARGETS[id](raw)
    for agent in raw.world.agents:
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


@pytest.mark.parametrize("id", IDS)
def test_a_bad_or_unsupported_argument_is_named(id: str) -> None:
    with pytest.raises(ValueError, match="benchmark_data=True"):
        batched(id, 2, benchmark_data=True)
