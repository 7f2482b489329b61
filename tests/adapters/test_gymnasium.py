"""Gymnasium adapter: one agent ``agent_0``, same results as the raw env, final_obs, bad actions."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest

import corral
from corral.adapters.gymnasium import GymnasiumEnvAdapter
from corral.errors import UnknownEnvError

AGENT = "agent_0"


@pytest.mark.parametrize("env_id", ["gym/CartPole-v1", "gym/Pendulum-v1"])
def test_user_loop(env_id: str) -> None:
    env = corral.make(env_id)
    obs, infos = env.reset(seed=0)
    steps = 0
    while env.agents:
        assert list(obs) == [AGENT] and env.observation_space(AGENT).contains(obs[AGENT])
        actions = {a: env.action_space(a).sample(mask=infos[a].get("action_mask")) for a in obs}
        obs, rewards, terms, truncs, infos = env.step(actions)
        steps += 1
        assert list(rewards) == list(terms) == list(truncs) == [AGENT]
    assert obs == {} and (terms[AGENT] or truncs[AGENT])
    assert env.observation_space(AGENT).contains(infos[AGENT]["final_obs"])
    if env_id == "gym/Pendulum-v1":
        assert steps == 200 and truncs[AGENT] and not terms[AGENT]
    env.close()


@pytest.mark.parametrize("name", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_raw_gymnasium(name: str, seed: int) -> None:
    env = corral.make(f"gym/{name}")
    raw = gymnasium.make(name)
    space = raw.action_space
    space.seed(seed)
    obs, _ = env.reset(seed=seed)
    raw_obs, _ = raw.reset(seed=seed)
    np.testing.assert_array_equal(obs[AGENT], raw_obs)
    while env.agents:
        action = space.sample()
        obs, rewards, terms, truncs, infos = env.step({AGENT: action})
        raw_obs, raw_reward, raw_term, raw_trunc, _ = raw.step(action)
        assert rewards[AGENT] == raw_reward
        assert (terms[AGENT], truncs[AGENT]) == (raw_term, raw_trunc)
        latest = infos[AGENT]["final_obs"] if not env.agents else obs[AGENT]
        np.testing.assert_array_equal(latest, raw_obs)
    assert raw_term or raw_trunc


def test_final_obs_on_truncation_is_the_last_observation() -> None:
    env = corral.make("gym/CartPole-v1", max_episode_steps=5)
    raw = gymnasium.make("CartPole-v1", max_episode_steps=5)
    obs, _ = env.reset(seed=3)
    raw.reset(seed=3)
    for t in range(5):
        assert env.agents == [AGENT]
        obs, _rewards, terms, truncs, infos = env.step({AGENT: t % 2})
        raw_obs, *_ = raw.step(t % 2)
    assert truncs == {AGENT: True} and terms == {AGENT: False}
    assert env.agents == [] and obs == {}
    np.testing.assert_array_equal(infos[AGENT]["final_obs"], raw_obs)
    with pytest.raises(corral.EpisodeOverError):
        env.step({AGENT: 0})


@pytest.mark.parametrize(
    "action",
    [np.array([np.nan], dtype=np.float32), np.array([0.5, 0.5], dtype=np.float32), 0.5],
    ids=["nan", "wrong-shape", "scalar"],
)
def test_bad_continuous_actions_raise_and_leave_env_usable(action: Any) -> None:
    env = corral.make("gym/Pendulum-v1")
    env.reset(seed=0)
    env.step({AGENT: np.array([0.0], dtype=np.float32)})
    with pytest.raises(corral.InvalidActionError) as err:
        env.step({AGENT: action})
    assert "'agent_0'" in str(err.value) and "step 1" in str(err.value)
    obs, *_ = env.step({AGENT: np.array([1.0], dtype=np.float32)})
    assert list(obs) == [AGENT]


def test_action_mask_from_info_is_int8_and_enforced() -> None:
    env = corral.make("gym/Taxi-v4")
    _, infos = env.reset(seed=0)
    mask = infos[AGENT]["action_mask"]
    assert mask.dtype == np.int8 and 0 < mask.sum() < len(mask)
    illegal = int(np.flatnonzero(mask == 0)[0])
    with pytest.raises(corral.InvalidActionError, match="mask forbids"):
        env.step({AGENT: illegal})
    for bad in ({}, {"agent_1": 0}, {AGENT: 6}):
        with pytest.raises(corral.InvalidActionError):
            env.step(bad)
    obs, *_ = env.step({AGENT: int(np.flatnonzero(mask)[0])})
    assert list(obs) == [AGENT]


def test_gym_info_is_passed_through() -> None:
    env = corral.make("gym/FrozenLake-v1")
    _, infos = env.reset(seed=0)
    assert infos[AGENT]["prob"] == 1


def test_registration_adaptation_and_namespace() -> None:
    listed = corral.registered_ids("gym")
    for name in ["CartPole-v1", "Pendulum-v1", "FrozenLake-v1", "MountainCar-v0", "Acrobot-v1"]:
        assert f"gym/{name}" in listed
    env = corral.make("gym/CliffWalking-v1")  # not listed: built through the namespace
    assert isinstance(env, GymnasiumEnvAdapter)
    assert env.env.spec.id == "CliffWalking-v1"
    adapted = corral.adapt(gymnasium.make("FrozenLake-v1", render_mode="ansi"))
    assert isinstance(adapted, GymnasiumEnvAdapter) and adapted.possible_agents == [AGENT]
    adapted.reset(seed=0)
    assert adapted.render_mode == "ansi" and "F" in adapted.render()
    adapted.close()


def test_a_module_that_cannot_be_imported_is_an_unknown_env_naming_it() -> None:
    with pytest.raises(UnknownEnvError, match=r"gym/nosuchmod:Foo-v0: cannot import 'nosuchmod'"):
        corral.make("gym/nosuchmod:Foo-v0")


def test_time_limit_and_gymnasium_attributes_pass_through() -> None:
    from gymnasium.envs.classic_control import CartPoleEnv
    from gymnasium.wrappers import TimeLimit

    env = corral.make("gym/CartPole-v1", max_episode_steps=15)
    assert env.max_episode_steps == 15
    assert env.spec.id == "CartPole-v1"  # the wrapper's attribute, reached through the adapter
    assert env.gravity == 9.8 and isinstance(env.unwrapped, CartPoleEnv)
    assert corral.adapt(TimeLimit(CartPoleEnv(), 33)).max_episode_steps == 33  # no spec
    assert corral.adapt(CartPoleEnv()).max_episode_steps is None
    with pytest.raises(AttributeError, match="no attribute 'gravty', nor has the TimeLimit"):
        _ = env.gravty
