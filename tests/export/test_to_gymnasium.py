"""corral.to_gymnasium, proven by Gymnasium's check_env and against the raw Gymnasium envs."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env, data_equivalence

import corral
from corral.errors import EpisodeOverError, ExportError
from corral.export.to_gymnasium import GymnasiumEnvExport

# The export is built by corral, not gymnasium.make, so it has no EnvSpec to rebuild
# itself in other render modes with; that is the one warning the raw env does not give.
NO_SPEC = "Not able to test alternative render modes due to the environment not having a spec."


def check_env_warnings(env: gymnasium.Env) -> set[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    return {str(w.message) for w in caught}


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [("CartPole-v1", {}), ("CartPole-v1", {"render_mode": "rgb_array"}), ("Pendulum-v1", {})],
)
def test_exports_pass_check_env_with_the_raw_envs_warnings(name: str, kwargs: dict) -> None:
    export = corral.to_gymnasium(f"gym/{name}", **kwargs)
    assert isinstance(export, gymnasium.Env) and export.render_mode == kwargs.get("render_mode")
    warned = check_env_warnings(export)
    no_spec = {w for w in warned if NO_SPEC in w}
    assert len(no_spec) == 1
    assert warned - no_spec == check_env_warnings(gymnasium.make(name, **kwargs).unwrapped)


def test_a_corral_single_agent_env_passes_check_env() -> None:
    warned = check_env_warnings(corral.to_gymnasium("mdp/two_round_nmdp"))
    assert len(warned) == 1 and NO_SPEC in warned.pop()


def rollout(env: gymnasium.Env, seed: int, steps: int) -> list[Any]:
    env.action_space.seed(seed)
    seen = [env.reset(seed=seed)]
    for _ in range(steps):
        observation, reward, terminated, truncated, info = env.step(env.action_space.sample())
        seen.append((observation, float(reward), terminated, truncated, info))
        if terminated or truncated:
            break
    return seen


@pytest.mark.parametrize(
    ("name", "kwargs", "ends_by"),
    [
        ("CartPole-v1", {}, "termination"),
        ("Pendulum-v1", {"max_episode_steps": 7}, "truncation"),
        ("FrozenLake-v1", {"is_slippery": True}, None),
        ("Taxi-v4", {}, None),  # its info's action_mask is a hint: every action is taken
    ],
)
def test_export_reproduces_the_raw_gymnasium_env(
    name: str, kwargs: dict, ends_by: str | None
) -> None:
    for seed in range(3):
        raw = rollout(gymnasium.make(name, **kwargs), seed, steps=200)
        export = rollout(corral.to_gymnasium(f"gym/{name}", **kwargs), seed, steps=200)
        assert data_equivalence(export, raw)
    if ends_by is not None:  # the last step, with its final observation, was compared
        assert raw[-1][2 if ends_by == "termination" else 3] is True


def test_the_final_observation_is_returned_by_step() -> None:
    export = corral.to_gymnasium("gym/CartPole-v1")
    own = corral.make("gym/CartPole-v1")
    export.reset(seed=4)
    own.reset(seed=4)
    terminated = False
    while not terminated:
        observation, _, terminated, _, info = export.step(1)
        obs, _, _, _, infos = own.step({"agent_0": 1})
    assert obs == {} and np.array_equal(observation, infos["agent_0"]["final_obs"])
    assert "final_obs" not in info
    with pytest.raises(EpisodeOverError):
        export.step(1)


def test_action_masks_stay_in_info() -> None:
    export = corral.to_gymnasium("gym/Taxi-v4")
    _, info = export.reset(seed=0)
    raw = gymnasium.make("Taxi-v4")
    _, raw_info = raw.reset(seed=0)
    assert info["action_mask"].dtype == np.int8
    assert np.array_equal(info["action_mask"], raw_info["action_mask"])


def test_multi_agent_envs_are_refused() -> None:
    with pytest.raises(ExportError, match=r"one agent.*has 2: \['player_0', 'player_1'\]"):
        corral.to_gymnasium("corral/rps")


def test_the_refusal_names_the_env_by_its_id_else_by_its_class_and_name() -> None:
    with pytest.raises(ExportError, match=r"but 'corral/rps' has 2"):
        corral.to_gymnasium("corral/rps")
    with pytest.raises(ExportError, match=r"but RockPaperScissors 'rps' has 2"):
        corral.to_gymnasium(corral.make("corral/rps"))


def test_render_passes_through() -> None:
    export = corral.to_gymnasium("gym/CartPole-v1", render_mode="rgb_array")
    export.reset(seed=0)
    frame = export.render()
    assert isinstance(export, GymnasiumEnvExport)
    assert frame.shape == (400, 600, 3) and frame.dtype == np.uint8
    export.close()
