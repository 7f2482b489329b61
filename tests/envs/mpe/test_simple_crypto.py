"""corral's natively batched ``mpe2/simple_crypto_v3`` against mpe2 itself."""

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

ID = "mpe2/simple_crypto_v3"
CASES = [
    {},
    {"continuous_actions": True},
    {"continuous_actions": True, "max_cycles": 13},
    {"dynamic_rescaling": False, "max_cycles": 9},
]
globals().update(
    differential_tests(
        ID,
        CASES,
        torch_cases=CASES[:2],
        float32_cases=CASES[:2],
        returns_cases=CASES[::2],
        render_cases=CASES[::3],
    )
)


def test_render_draws_each_copys_goal_colour() -> None:
    """bob wears the colour of the copy's goal landmark, as mpe2 draws it."""
    env = check_render_at_reset(ID, {})
    assert set(np.asarray(env.goal).tolist()) == {0, 1}  # both goals drawn


@pytest.mark.parametrize(
    "said",
    [
        {"eve_0": [0, 0, 0, 0], "bob_0": [0.5, 0.25, 0, 1]},  # eve silent: no term of hers
        {"eve_0": [0.3, 0.1, 0.7, 0.2], "bob_0": [0, 0, 0, 0]},  # bob silent: no term of his
        {"eve_0": [0, 0, 0, 0], "bob_0": [0, 0, 0, 0]},
        {"eve_0": [0.3, 0.1, 0.7, 0.2], "bob_0": [0.9, 0.3, 0.6, 0.1]},
    ],
)
def test_rewards_skip_a_listener_that_says_nothing_as_mpe2_does(said) -> None:
    """mpe2 counts a listener's guess only where its communication is not all zeros."""
    raw = mpe2_raw(ID, {"continuous_actions": True})
    raw.reset(seed=3)
    for agent in raw.world.agents:
        agent.state.c = np.array(said.get(agent.name, [0.2, 0.4, 0.1, 0.8]), np.float64)
    env = batched(ID, 3, continuous_actions=True)
    env.reset(seed=0)
    env.from_mpe2(raw, 1)
    assert int(env.goal[1]) == raw.world.landmarks.index(raw.world.agents[0].goal_a)
    want = [raw.scenario.reward(agent, raw.world) for agent in raw.world.agents]
    assert env.reward()[1].tolist() == want
    obs = env.observe()
    for group, (agent,) in env.groups.items():
        np.testing.assert_array_equal(obs[group][1, 0].astype(np.float32), raw.observe(agent))
