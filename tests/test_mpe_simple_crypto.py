"""corral's natively batched ``mpe2/simple_crypto_v3`` against mpe2 itself."""

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

ID = "mpe2/simple_crypto_v3"
CASES = [
    {},
    {"continuous_actions": True},
    {"continuous_actions": True, "max_cycles": 13},
    {"dynamic_rescaling": False, "max_cycles": 9},
]
IDS = [str(kw) for kw in CASES]
TORCH = [p for p in PLACES if p != ("numpy", "cpu")]


@pytest.mark.parametrize("env_kwargs", CASES, ids=IDS)
def test_numpy_float64_is_bit_identical_to_mpe2(env_kwargs) -> None:
    check_exact(ID, env_kwargs)


@pytest.mark.parametrize(("array", "device"), TORCH)
@pytest.mark.parametrize("env_kwargs", CASES[:2], ids=IDS[:2])
def test_torch_float64_is_within_1e9_of_numpy(env_kwargs, array, device) -> None:
    check_torch(ID, env_kwargs, device)


@pytest.mark.parametrize("env_kwargs", CASES[:2], ids=IDS[:2])
def test_float32_steps_within_1e4_of_mpe2(env_kwargs) -> None:
    check_float32_step(ID, env_kwargs)


@pytest.mark.parametrize("env_kwargs", CASES[::2], ids=IDS[::2])
def test_float32_mean_return_within_1_percent(env_kwargs) -> None:
    check_float32_returns(ID, env_kwargs)


@pytest.mark.parametrize("env_kwargs", CASES[::3], ids=IDS[::3])
def test_render_draws_a_copy_as_mpe2_does(env_kwargs) -> None:
    check_render(ID, env_kwargs)


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
