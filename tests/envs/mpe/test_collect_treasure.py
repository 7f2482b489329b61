"""corral's natively batched ``mpe2/collect_treasure_v1`` against mpe2 itself
(tests/support/mpe_differential.py has the checks every scenario runs)."""

from __future__ import annotations

import numpy as np
import pytest
from support.batches import PLACES
from support.mpe_differential import (
    batched,
    check_exact,
    check_float32_returns,
    check_float32_step,
    check_render,
    check_render_at_reset,
    check_torch,
    mpe2_raw,
)

from corral.arrays import to_numpy

pytest.importorskip("mpe2")

ID = "mpe2/collect_treasure_v1"
# The last: 9 collectors (their centroid adds 8 or more positions), 6 types (the most
# mpe2 has colours for), a single treasure (none left while it waits to respawn).
CASES = [
    {},
    {"num_collectors": 3, "num_deposits": 3, "num_treasures": 2, "continuous_actions": True},
    {
        "num_collectors": 9,
        "num_deposits": 6,
        "num_treasures": 1,
        "max_cycles": 15,
        "dynamic_rescaling": False,
    },
]
TORCH = [p for p in PLACES if p != ("numpy", "cpu")]


@pytest.mark.parametrize("env_kwargs", CASES, ids=str)
def test_numpy_float64_is_bit_identical_to_mpe2(env_kwargs) -> None:
    check_exact(ID, env_kwargs, steps=3 * env_kwargs.get("max_cycles", 25) + 5)


@pytest.mark.parametrize(("array", "device"), TORCH)
@pytest.mark.parametrize("env_kwargs", CASES, ids=str)
def test_torch_float64_is_within_1e9_of_numpy(env_kwargs, array, device) -> None:
    check_torch(ID, env_kwargs, device)


@pytest.mark.parametrize("env_kwargs", CASES, ids=str)
def test_float32_steps_within_1e4_of_mpe2(env_kwargs) -> None:
    check_float32_step(ID, {**env_kwargs, "max_cycles": 25})  # room for its warm-up steps


def test_float32_mean_return_within_1_percent() -> None:
    kwargs = {"num_collectors": 2, "num_deposits": 1, "num_treasures": 2}
    check_float32_returns(ID, {**kwargs, "continuous_actions": True})


@pytest.mark.parametrize("env_kwargs", CASES[::2], ids=str)
def test_render_draws_a_copy_as_mpe2_does(env_kwargs) -> None:
    check_render(ID, env_kwargs)


def test_render_at_reset_shows_each_treasures_type() -> None:
    check_render_at_reset(ID, CASES[1])


def _stage(raw, places: dict[str, tuple[float, float]], kinds: dict[int, int]) -> None:
    """Put mpe2's entities (by name) at ``places``, standing still; treasure ``k`` of
    type ``kinds[k]``."""
    for entity in raw.world.entities:
        entity.state.p_vel = np.zeros(2)
        if entity.name in places:
            entity.state.p_pos = np.array(places[entity.name], np.float64)
    for k, kind in kinds.items():
        raw.world.landmarks[k].type = kind


def _step_both(env, raw, steps: int) -> list[dict[str, float]]:
    """Step copy 0 of ``env`` and mpe2's ``raw`` with no-ops; each step's observations
    and rewards are the same bits. Returns mpe2's rewards."""
    rewards = []
    for t in range(steps):
        step = env.step({g: np.zeros((1, len(a)), np.int64) for g, a in env.groups.items()})
        for _ in raw.agents:
            raw.step(0)
        for group, agents in env.groups.items():
            for k, agent in enumerate(agents):
                np.testing.assert_array_equal(
                    to_numpy(step.obs[group][0, k]), raw.observe(agent), err_msg=f"{t} {agent}"
                )
                assert float(to_numpy(step.reward[group][0, k])) == raw.rewards[agent], (t, agent)
        rewards.append(dict(raw.rewards))
    return rewards


FAR = {  # everything else apart from the scenes below
    "collector_4": (-0.5, -0.5),
    "collector_5": (0.0, 0.9),
    "deposit_0": (0.0, -0.9),
    "treasure_4": (0.9, 0.0),
    "treasure_5": (-0.9, 0.0),
}


def test_pickups_deliveries_and_respawns_are_mpe2s() -> None:
    """Two collectors on one treasure: the first takes it (and the two overlap); one
    collector on two treasures takes the first; a collector on a treasure and on its
    deposit picks it up and delivers it in the same step; the next step those treasures
    respawn from the generator mpe2's world keeps. Drawn, the picked-up treasures are
    hidden and the collectors take their colours, as in mpe2."""
    env = batched(ID, 1, render_mode="rgb_array")
    env.reset(seed=1)
    raw = mpe2_raw(ID, {"render_mode": "rgb_array"})
    raw.reset(seed=1)
    places = {
        "treasure_0": (0.5, 0.5), "collector_0": (0.5, 0.5), "collector_1": (0.52, 0.5),
        "treasure_1": (-0.5, 0.5), "treasure_2": (-0.5, 0.53), "collector_2": (-0.5, 0.515),
        "treasure_3": (0.5, -0.5), "collector_3": (0.5, -0.5), "deposit_1": (0.5, -0.5),
    }  # fmt: skip
    _stage(raw, {**FAR, **places}, {3: 1})
    env.from_mpe2(raw, 0)
    kinds = [lm.type for lm in raw.world.landmarks]
    first = _step_both(env, raw, 1)[0]
    # The scene played as described (the step itself was compared above).
    holding = [a.holding for a in raw.world.agents[:4]]
    assert holding == [kinds[0], None, kinds[1], None]
    assert [lm.alive for lm in raw.world.landmarks[:4]] == [False, False, True, False]
    assert first["deposit_0"] > 15  # three pickups and a delivery: +20, less shaping
    assert first["collector_1"] < first["collector_2"] - 4  # collectors 0 and 1 overlap
    np.testing.assert_array_equal(env.render(0), raw.render())
    _step_both(env, raw, 2)
    assert all(lm.alive for lm in raw.world.landmarks)  # respawned


def test_with_no_treasure_left_collectors_are_not_pulled_anywhere() -> None:
    """The only treasure picked up: no live treasure to head for until it respawns."""
    kwargs = {"num_collectors": 2, "num_deposits": 1, "num_treasures": 1}
    env = batched(ID, 1, **kwargs)
    env.reset(seed=2)
    raw = mpe2_raw(ID, kwargs)
    raw.reset(seed=2)
    places = {"treasure_0": (0.3, 0.3), "collector_0": (0.3, 0.3), "collector_1": (-0.6, 0.2)}
    _stage(raw, {**places, "deposit_0": (0.0, -0.9)}, {})
    env.from_mpe2(raw, 0)
    first = _step_both(env, raw, 2)[0]
    assert first["collector_1"] == 5.0  # the pickup's bonus, and no distance to pay


def test_respawns_replay_the_draws_of_the_copys_reset() -> None:
    """mpe2's world keeps a copy of the generator as it was before the reset's draws, and
    respawns from it: a treasure's first respawn lands where the copy's seed's first
    draws put it (the env's generator, for later resets, is left alone)."""
    env = batched(ID, 2)
    env.reset(seed=10)
    for copy in (0, 1):
        env.world.pos[copy, :6] = env.world.pos[copy, 8 + copy]  # every collector on it
    env.world.vel[:] = 0
    noop = {g: np.zeros((2, len(a)), np.int64) for g, a in env.groups.items()}
    env.step(noop)
    env.step(noop)  # the treasure picked up respawns
    for copy in (0, 1):
        stream = np.random.default_rng(10 + copy)
        stream.uniform()  # the respawn chance
        want = stream.uniform(-0.95, 0.95, 2)
        np.testing.assert_array_equal(env.world.pos[copy, 8 + copy], want)
        assert env.kind[copy, copy] == stream.integers(0, 2)


def test_a_bad_or_unsupported_argument_is_named() -> None:
    with pytest.raises(ValueError, match="benchmark_data=True"):
        batched(ID, 2, benchmark_data=True)
    with pytest.raises(ValueError, match="At most 6 deposit types"):
        batched(ID, 2, num_deposits=7)


def test_a_copy_whose_episode_ended_stands_still() -> None:
    """Stepped after its episode ended (before a reset), a copy picks nothing up, draws no
    respawn and earns nothing, as a dict env stepped after its end does."""
    env = batched(ID, 2, max_cycles=1)
    env.reset(seed=3)
    noop = {g: np.zeros((2, len(a)), np.int64) for g, a in env.groups.items()}
    env.world.pos[:, 0] = env.world.pos[:, 8]  # collector 0 on treasure 0
    env.world.vel[:] = 0
    env.step(noop)  # the last step: collector 0 picks treasure 0 up
    assert to_numpy(env.holding)[:, 0].tolist() == to_numpy(env.kind)[:, 0].tolist()
    env.world.pos[:, 1] = env.world.pos[:, 9]  # collector 1 on treasure 1
    before = [to_numpy(a).copy() for a in (env.holding, env.alive, env.kind, env.world.pos)]
    step = env.step(noop)
    after = [to_numpy(a) for a in (env.holding, env.alive, env.kind, env.world.pos)]
    for old, new in zip(before, after, strict=True):
        np.testing.assert_array_equal(new, old)
    assert not any(to_numpy(r).any() for r in step.reward.values())
