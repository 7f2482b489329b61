"""corral's natively batched ``mpe2/simple_world_comm_v3`` against mpe2 itself."""

from __future__ import annotations

import numpy as np
import pytest
from support.mpe_differential import (
    batched,
    differential_tests,
    mpe2_raw,
)

pytest.importorskip("mpe2")

ID = "mpe2/simple_world_comm_v3"
CASES = [
    {},
    {"continuous_actions": True},
    # every count changed; one forest, so agents share it or see each other outside
    {"num_good": 3, "num_adversaries": 2, "num_obstacles": 2, "num_food": 3, "num_forests": 1},
    # no plain adversaries, no obstacles, three forests; episodes of 11 steps
    {"num_adversaries": 1, "num_obstacles": 0, "num_forests": 3, "max_cycles": 11},
    # the leader is the only adversary's name but a good agent (mpe2 names agent 0 so)
    {"num_adversaries": 0, "num_good": 2, "num_forests": 0, "continuous_actions": True},
    {"dynamic_rescaling": False, "num_food": 1, "max_cycles": 15},
]
globals().update(
    differential_tests(
        ID,
        CASES,
        torch_cases=CASES[:3],
        float32_cases=CASES[:3],
        returns_cases=[{}],
        render_cases=[CASES[0], CASES[5]],
    )
)


def test_forests_food_contacts_and_bounds_are_mpe2s_at_a_crafted_state() -> None:
    """Forest hiding (shared forest, both outside, the leader's sight), two adversaries on
    one good agent, two foods in reach, and every piece of the boundary penalty: the
    observations and rewards of every agent are mpe2's own."""
    kwargs = {"num_good": 3}
    raw = mpe2_raw(ID, kwargs)
    raw.reset(seed=0)
    world = raw.world
    place = {
        "leadadversary_0": (-0.5, -0.5),  # in forest 1
        "adversary_0": (0.55, 0.5),  # in forest 0, on agent_0
        "adversary_1": (0.45, 0.52),  # in forest 0, on agent_0
        "adversary_2": (0.0, 0.0),  # outside
        "agent_0": (0.5, 0.5),  # in forest 0, at both foods
        "agent_1": (0.95, -3.0),  # outside: bound (x - 0.9) * 10 and the cap 10
        "agent_2": (1.5, 0.1),  # outside: bound exp(2x - 2)
        "landmark 0": (0.0, 0.9),
        "food 0": (0.52, 0.5),
        "food 1": (0.48, 0.49),
        "forest 0": (0.5, 0.5),
        "forest 1": (-0.5, -0.5),
    }
    for entity in world.entities:
        entity.state.p_pos = np.array(place[entity.name], np.float64)
    env = batched(ID, 2, **kwargs)
    env.reset(seed=1)
    env.from_mpe2(raw, 0)
    obs, reward = env.observe(), env.reward()
    for group, agents in env.groups.items():
        for k, agent in enumerate(agents):
            np.testing.assert_array_equal(obs[group][0, k], raw.observe(agent), err_msg=agent)
    want = [raw.scenario.reward(agent, world) for agent in world.agents]
    assert reward[0].tolist() == want
    hidden = obs["adversary"][0, 2, 14:26].reshape(6, 2)  # adversary_2's view of the others
    assert (hidden[:4] == 0).all() and (hidden[4:] != 0).any(
        1
    ).all()  # it sees only the outside ones


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_good": 0}, "num_good must be at least 1"),
        ({"num_food": 0}, "num_food must be at least 1"),
        ({"benchmark_data": True}, "benchmark_data=True"),
    ],
)
def test_arguments_mpe2_cannot_step_with_are_refused_by_name(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        batched(ID, 2, **kwargs)
