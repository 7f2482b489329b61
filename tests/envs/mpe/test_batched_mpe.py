"""corral's natively batched MPE, simple and simple_spread, against mpe2 itself
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
    check_torch,
    mpe2_raw,
)

import corral

pytest.importorskip("mpe2")

CASES = [
    ("mpe2/simple_v3", {}),
    ("mpe2/simple_v3", {"continuous_actions": True, "max_cycles": 13}),
    ("mpe2/simple_spread_v3", {}),
    ("mpe2/simple_spread_v3", {"N": 4, "local_ratio": 0.25, "max_cycles": 17}),
    ("mpe2/simple_spread_v3", {"continuous_actions": True, "N": 2}),
    ("mpe2/simple_spread_v3", {"num_agent_neighbors": 1, "num_landmark_neighbors": 2}),
    ("mpe2/simple_spread_v3", {"N": 2, "num_agent_neighbors": 3, "num_landmark_neighbors": 4}),
    ("mpe2/simple_spread_v3", {"curriculum": True, "dynamic_rescaling": False}),
    ("mpe2/simple_spread_v3", {"N": 1}),  # no other agent: empty communication
]
IDS = [f"{id.split('/')[1]}-{kw}" for id, kw in CASES]
TORCH = [p for p in PLACES if p != ("numpy", "cpu")]


@pytest.mark.parametrize(("id", "env_kwargs"), CASES, ids=IDS)
def test_numpy_float64_is_bit_identical_to_mpe2(id, env_kwargs) -> None:
    check_exact(id, env_kwargs)


@pytest.mark.parametrize(("array", "device"), TORCH)
@pytest.mark.parametrize(("id", "env_kwargs"), CASES, ids=IDS)
def test_torch_float64_is_within_1e9_of_numpy(id, env_kwargs, array, device) -> None:
    check_torch(id, env_kwargs, device)


@pytest.mark.parametrize(("id", "env_kwargs"), CASES[::2], ids=IDS[::2])
def test_float32_steps_within_1e4_of_mpe2(id, env_kwargs) -> None:
    check_float32_step(id, env_kwargs)


@pytest.mark.parametrize(("id", "env_kwargs"), CASES[1::2], ids=IDS[1::2])
def test_float32_mean_return_within_1_percent(id, env_kwargs) -> None:
    check_float32_returns(id, env_kwargs)


@pytest.mark.parametrize(("id", "env_kwargs"), CASES[:4:2], ids=IDS[:4:2])
def test_render_draws_a_copy_as_mpe2_does(id, env_kwargs) -> None:
    check_render(id, env_kwargs)


@pytest.mark.parametrize("backend", ["sync", "subproc"])
def test_a_vector_env_renders_every_native_copy_as_the_dict_envs_do(backend) -> None:
    kwargs = {"id": "mpe2/simple_spread_v3", "num_envs": 3, "seed": 6}
    kwargs["env_kwargs"] = {"render_mode": "rgb_array", "N": 2}
    rng = np.random.default_rng(0)
    options = {"num_workers": 2} if backend == "subproc" else {}
    with (
        corral.make_vec(**kwargs, native=False) as ref,
        corral.make_vec(**kwargs, backend=backend, native=True, **options) as native,
    ):
        batch = ref.reset()
        native.reset()
        for _ in range(4):
            actions = ref.sample_actions(batch, rng)
            batch = ref.step(actions)
            native.step(actions)
        want, got = ref.render(), native.render()
    assert len(got) == 3
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)


def test_episodes_end_on_success_where_asked() -> None:
    """terminate_on_success: every landmark covered ends the episode (terminated, not
    truncated), as in mpe2; uncovered, it goes on."""
    env = batched("mpe2/simple_spread_v3", 2, terminate_on_success=True)
    env.reset(seed=0)
    pos = env.world.pos
    pos[0, :3] = pos[0, 3:] + 0.01  # copy 0: each agent on its landmark, standing still
    env.world.vel[0] = 0
    step = env.step({"agent": np.zeros((2, 3), np.int64)})
    assert step.terminated["agent"].tolist() == [[True] * 3, [False] * 3]
    assert not step.truncated["agent"].any()
    assert step.alive["agent"].tolist() == [[False] * 3, [True] * 3]


def test_curriculum_stages_reward_collisions_as_mpe2_does() -> None:
    """The collision penalty at each curriculum stage is mpe2's (in mpe2 1.1.1 the base
    scenario's ``curriculum_stage`` property swallows the stage: it stays 0)."""
    kwargs = {"curriculum": True}
    env = batched("mpe2/simple_spread_v3", 1, **kwargs)
    env.reset(seed=0)
    raw = mpe2_raw("mpe2/simple_spread_v3", kwargs)
    raw.reset(seed=0)
    agents = raw.world.agents
    agents[1].state.p_pos = agents[0].state.p_pos + 0.01  # agents 0 and 1 overlap
    for stage in (0, 1):
        raw.set_curriculum_stage(stage)
        env.set_curriculum_stage(stage)
        assert env.curriculum_stage == raw.curriculum_stage
        env.from_mpe2(raw, 0)
        want = [raw.scenario.reward(a, raw.world) for a in agents]
        assert env.reward()[0].tolist() == want


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"benchmark_data": True}, "benchmark_data=True"),
        ({"dtype": "float16"}, "dtype must be one of"),
        ({"render_mode": "human"}, "render_mode must be None or 'rgb_array'"),
        ({"local_ratio": 2.0}, "local_ratio"),
    ],
)
def test_a_bad_or_unsupported_argument_is_named(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        batched("mpe2/simple_spread_v3", 2, **kwargs)


def test_a_copy_not_reset_yet_cannot_be_drawn() -> None:
    env = batched("mpe2/simple_v3", 2)
    with pytest.raises(RuntimeError, match="copy 1 has no episode to draw yet"):
        env.render(1)
    env.reset(seed=0)
    assert env.render(1).shape == (700, 700, 3)
