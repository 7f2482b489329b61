"""corral's natively batched ``mpe2/simple_adversary_v3`` against mpe2 itself (the shared
checks are in tests/support/mpe_differential.py)."""

from __future__ import annotations

import numpy as np
import pytest
from support.mpe_differential import (
    batched,
    check_render_at_reset,
    differential_tests,
    mpe2_raw,
)

pytest.importorskip("mpe2")

ID = "mpe2/simple_adversary_v3"
CASES = [
    {},
    {"N": 3, "max_cycles": 13},
    {"continuous_actions": True, "N": 1},
    {"num_agent_neighbors": 1, "num_landmark_neighbors": 1},
    # More neighbours than there are: zero-padded slots.
    {"N": 2, "num_agent_neighbors": 4, "num_landmark_neighbors": 3, "dynamic_rescaling": False},
    {"continuous_actions": True, "N": 4, "num_landmark_neighbors": 2},
]
globals().update(
    differential_tests(
        ID,
        CASES,
        float32_cases=[CASES[i] for i in (0, 3, 5)],
        returns_cases=[CASES[2]],
        render_cases=CASES[:2],
    )
)


# (not max_cycles=13: mpe2's episode ends during the warm-up)


def test_render_draws_each_copys_goal_green() -> None:
    env = check_render_at_reset(ID, {"N": 3})
    assert len(set(np.asarray(env.goal).tolist())) > 1  # copies with different goals drawn


def test_each_copy_draws_its_goal_first_as_mpe2_does() -> None:
    """Copy ``i`` of ``reset(seed=s)`` has the goal of mpe2's ``reset(seed=s + i)``, and
    a state read from mpe2 brings its goal (observations and rewards follow it)."""
    env = batched(ID, 6, N=3)
    env.reset(seed=40)
    goals = []
    for copy in range(6):
        raw = mpe2_raw(ID, {"N": 3})
        raw.reset(seed=40 + copy)
        goals.append(raw.world.landmarks.index(raw.world.agents[0].goal_a))
    assert env.goal.tolist() == goals
    assert len(set(goals)) > 1  # the copies differ
    raw = mpe2_raw(ID, {"N": 3})
    raw.reset(seed=1)
    env.from_mpe2(raw, 2)
    assert int(env.goal[2]) == raw.world.landmarks.index(raw.world.agents[0].goal_a)
    seen = env.observe()["agent"][2].astype(np.float32)
    for k, agent in enumerate(raw.world.agents[1:]):
        np.testing.assert_array_equal(seen[k], raw.observe(agent.name))
    want = [raw.scenario.reward(a, raw.world) for a in raw.world.agents]
    assert env.reward()[2].tolist() == want


def test_observations_have_mpe2s_groups_and_sizes() -> None:
    env = batched(ID, 3, N=3)
    step = env.reset(seed=0)
    # the adversary: [3 landmarks, 3 others]; an agent: [goal, 3 landmarks, 3 others]
    assert {g: o.shape for g, o in step.obs.items()} == {
        "adversary": (3, 1, 12),
        "agent": (3, 3, 14),
    }
