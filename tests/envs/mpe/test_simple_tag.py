"""corral's natively batched ``mpe2/simple_tag_v3`` against mpe2 itself (the shared checks
are in tests/support/mpe_differential.py)."""

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

ID = "mpe2/simple_tag_v3"
CASES = [
    {},
    {"num_good": 2, "num_adversaries": 2, "num_obstacles": 3, "continuous_actions": True},
    {"num_agent_neighbors": 2, "num_landmark_neighbors": 1, "max_cycles": 15},
    # More neighbours than there are: zero-padded slots.
    {"num_good": 2, "num_obstacles": 0, "num_agent_neighbors": 5, "num_landmark_neighbors": 3},
    {"curriculum": True, "dynamic_rescaling": False},
    # Many adversaries, so that random play catches the prey and episodes end early.
    {"terminate_on_success": True, "num_adversaries": 6, "num_obstacles": 0},
    {"continuous_actions": True, "num_agent_neighbors": 3, "num_good": 3, "num_adversaries": 1},
    # No prey: every prey is caught (vacuously), so in mpe2 every step ends the episode.
    {"num_good": 0, "terminate_on_success": True},
]
globals().update(
    differential_tests(
        ID, CASES, float32_cases=[CASES[i] for i in (1, 3, 6)], render_cases=[CASES[0], CASES[2]]
    )
)


# (not terminate_on_success nor max_cycles=15: mpe2's episode ends during the warm-up)


def test_render_draws_every_copy_at_reset_as_mpe2_does() -> None:
    check_render_at_reset(ID, CASES[1])


def test_rewards_and_success_from_a_given_state_are_mpe2s() -> None:
    """Catches and the boundary penalty in each of its pieces (inside 0.9, linear to 1,
    exponential, capped at 10) give mpe2's rewards, and the episode ends exactly when every
    prey is caught."""
    kwargs = {"num_good": 2, "num_adversaries": 2, "terminate_on_success": True}
    env = batched(ID, 1, **kwargs)
    env.reset(seed=0)
    raw = mpe2_raw(ID, kwargs)
    raw.reset(seed=0)
    states = {  # adversary 0, adversary 1, prey 0, prey 1
        "prey 0 caught twice, prey 1 in the linear band": [
            (0.35, -0.15),
            (0.25, -0.25),
            (0.3, -0.2),
            (0.95, 0.5),
        ],
        "prey 1 in the exponential band": [(0.35, -0.15), (0.0, 0.0), (0.3, -0.2), (-1.2, 0.92)],
        "prey 1 at the cap of 10": [(0.35, -0.15), (0.0, 0.0), (0.3, -0.2), (2.5, -4.0)],
        "every prey caught": [(0.35, -0.15), (0.51, 0.51), (0.3, -0.2), (0.5, 0.5)],
    }
    ended = []
    for name, positions in states.items():
        for agent, position in zip(raw.world.agents, positions, strict=True):
            agent.state.p_pos = np.array(position)
        env.from_mpe2(raw, 0)
        want = [raw.scenario.reward(a, raw.world) for a in raw.world.agents]
        assert env.reward()[0].tolist() == want, name
        ended.append(bool(env.terminal()[0]))
        assert ended[-1] == raw.scenario.is_terminal(raw.world), name
    assert ended == [False, False, False, True]


def test_curriculum_keeps_the_slow_prey_as_mpe2_1_1_1_does() -> None:
    """With ``curriculum``, mpe2 1.1.1's base scenario swallows every stage set (its
    ``curriculum_stage`` property ignores assignments): the prey keep stage 0's half speed
    after ``set_curriculum_stage(2)``, in mpe2 and here."""
    kwargs = {"curriculum": True}
    env = batched(ID, 2, **kwargs)
    raw = mpe2_raw(ID, kwargs)
    for target in (env, raw):
        target.set_curriculum_stage(2)
        target.advance_curriculum()
    raw.reset(seed=3)
    env.reset(seed=3)
    assert env.curriculum_stage == raw.curriculum_stage == 0
    prey = raw.world.agents[-1]
    assert (prey.max_speed, prey.accel) == (0.65, 2.0)
    assert env.bodies.max_speed[3] == prey.max_speed and env.bodies.accel[3] == prey.accel


def test_a_curriculum_stage_that_changes_the_prey_speed_is_refused(monkeypatch) -> None:
    """An mpe2 whose stage does change (as its docs describe) would need other prey speeds
    than the batched world holds: the reset says so instead of running at the old ones."""
    env = batched(ID, 2, curriculum=True)
    monkeypatch.setattr(type(env.scenario), "curriculum_stage", property(lambda self: 2))
    with pytest.raises(NotImplementedError, match="curriculum stage 2 gives the prey max_speed"):
        env.reset(seed=0)


def test_observations_have_mpe2s_groups_and_sizes() -> None:
    env = batched(ID, 3, num_good=2, num_adversaries=3, num_obstacles=1)
    step = env.reset(seed=0)
    # [vel, pos, landmark, 4 others, prey velocities (2 for adversaries, 1 for prey)]
    assert {g: o.shape for g, o in step.obs.items()} == {
        "adversary": (3, 3, 2 + 2 + 2 + 8 + 4),
        "agent": (3, 2, 2 + 2 + 2 + 8 + 2),
    }
