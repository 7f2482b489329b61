"""corral's natively batched ``mpe2/simple_adversary_v3`` against mpe2 itself (the shared
checks are in tests/mpe_differential.py)."""

from __future__ import annotations

import numpy as np
import pytest
from mpe_differential import (
    batched,
    check_exact,
    check_float32_returns,
    check_float32_step,
    check_render,
    check_render_at_reset,
    check_torch,
    mpe2_raw,
)
from test_native_vector import PLACES

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
IDS = [str(kw) for kw in CASES]
TORCH = [p for p in PLACES if p != ("numpy", "cpu")]


def _some(*index: int) -> dict:
    """The cases ``index`` as parametrize's arguments."""
    return {"argvalues": [CASES[i] for i in index], "ids": [IDS[i] for i in index]}


@pytest.mark.parametrize("env_kwargs", CASES, ids=IDS)
def test_numpy_float64_is_bit_identical_to_mpe2(env_kwargs) -> None:
    check_exact(ID, env_kwargs)


@pytest.mark.parametrize(("array", "device"), TORCH)
@pytest.mark.parametrize("env_kwargs", CASES, ids=IDS)
def test_torch_float64_is_within_1e9_of_numpy(env_kwargs, array, device) -> None:
    check_torch(ID, env_kwargs, device)


# (not max_cycles=13: mpe2's episode ends during the warm-up)
@pytest.mark.parametrize("env_kwargs", **_some(0, 3, 5))
def test_float32_steps_within_1e4_of_mpe2(env_kwargs) -> None:
    check_float32_step(ID, env_kwargs)


def test_float32_mean_return_within_1_percent() -> None:
    check_float32_returns(ID, CASES[2])  # (10,000 episodes: one case)


@pytest.mark.parametrize("env_kwargs", **_some(0, 1))
def test_render_draws_a_copy_as_mpe2_does(env_kwargs) -> None:
    """(The goal landmark is drawn green: the copy's goal reaches mpe2's renderer.)"""
    check_render(ID, env_kwargs)


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
