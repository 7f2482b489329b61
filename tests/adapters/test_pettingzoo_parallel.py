"""The PettingZoo parallel adapter, checked step by step against the raw mpe2 envs."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

import corral
from corral.adapters import adapt
from corral.adapters.pettingzoo_parallel import ParallelEnvAdapter
from corral.errors import InvalidActionError, MissingDependencyError

pettingzoo = pytest.importorskip("pettingzoo")
mpe2 = pytest.importorskip("mpe2")

MPE2_NAMES = sorted(p.stem for p in Path(mpe2.__path__[0]).glob("*_v[0-9]*.py"))


def random_action(rng: np.random.Generator, space: spaces.Space) -> Any:
    if isinstance(space, spaces.Discrete):
        return int(rng.integers(space.n))
    return rng.uniform(space.low, space.high).astype(space.dtype)


def test_every_installed_mpe2_scenario_is_registered() -> None:
    assert len(MPE2_NAMES) >= 12
    assert corral.registry.registered_ids("mpe2") == sorted(f"mpe2/{n}" for n in MPE2_NAMES)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [(n, {}) for n in MPE2_NAMES] + [("simple_spread_v3", {"continuous_actions": True})],
)
def test_same_as_raw_mpe2(name: str, kwargs: dict[str, Any]) -> None:
    kwargs = {"max_cycles": 6, **kwargs}
    raw = importlib.import_module(f"mpe2.{name}").parallel_env(**kwargs)
    env = corral.make(f"mpe2/{name}", **kwargs)
    assert env.possible_agents == raw.possible_agents
    raw_obs, _ = raw.reset(seed=7)
    obs, infos = env.reset(seed=7)
    assert set(obs) == set(infos) == set(raw_obs) == set(env.agents)
    rng = np.random.default_rng(7)
    steps, paid = 0, 0.0
    while raw.agents:
        for agent in obs:
            assert np.array_equal(obs[agent], raw_obs[agent])
            assert env.observation_space(agent) == raw.observation_space(agent)
        assert np.array_equal(env.state(), raw.state())
        actions = {a: random_action(rng, raw.action_space(a)) for a in raw.agents}
        raw_obs, raw_rewards, raw_terms, raw_truncs, _ = raw.step(actions)
        obs, rewards, terms, truncs, infos = env.step(actions)
        steps += 1
        assert rewards == raw_rewards and terms == raw_terms and truncs == raw_truncs
        paid += sum(abs(r) for r in rewards.values())
        ended = [a for a in raw_terms if raw_terms[a] or raw_truncs[a]]
        assert set(obs) == set(env.agents) == set(raw_obs) - set(ended)
        assert set(infos) == set(raw_obs)
        for agent in ended:
            assert np.array_equal(infos[agent]["final_obs"], raw_obs[agent])
    assert steps == 6 and env.agents == [] and obs == {} and paid > 0
    assert env.state_space == raw.state_space


def test_user_loop_simple_spread() -> None:
    env = corral.make("mpe2/simple_spread_v3", N=3, max_cycles=25, continuous_actions=False)
    assert isinstance(env, ParallelEnvAdapter)
    assert env.possible_agents == ["agent_0", "agent_1", "agent_2"]
    obs, infos = env.reset(seed=0)
    steps = 0
    while env.agents:
        assert set(obs) == set(env.agents)
        actions = {a: env.action_space(a).sample(mask=infos[a].get("action_mask")) for a in obs}
        obs, rewards, terms, truncs, infos = env.step(actions)
        steps += 1
        assert set(rewards) == set(terms) == set(actions) and not any(terms.values())
    assert steps == 25 and obs == {} and all(truncs.values())
    assert {a: infos[a]["final_obs"].shape for a in infos} == dict.fromkeys(
        env.possible_agents, (18,)
    )


class Masked(pettingzoo.ParallelEnv):
    """Dict observations with an action mask; ``b`` terminates at step 2, ``a`` is
    truncated at step 4; action 1 is legal only at odd steps; infos come back empty."""

    metadata = {"name": "masked"}
    possible_agents = ["a", "b"]

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Dict(
            {
                "observation": spaces.Box(0, 9, (1,), np.float32),
                "action_mask": spaces.Box(0, 1, (3,), np.int8),
            }
        )

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(3)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {}

    def _obs(self) -> dict:
        mask = np.array([1, self.t % 2, 1], np.int8)
        return {
            a: {"observation": np.array([self.t], np.float32), "action_mask": mask}
            for a in self.agents
        }

    def step(self, actions: dict) -> tuple:
        self.t += 1
        rewards = {a: float(actions[a]) for a in self.agents}
        terms = {a: a == "b" and self.t == 2 for a in self.agents}
        truncs = {a: self.t == 4 for a in self.agents}
        obs = self._obs()
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, {}


def test_masked_dict_observations_and_agents_ending_apart() -> None:
    env = adapt(Masked())
    assert isinstance(env, ParallelEnvAdapter)
    assert env.observation_space("a") == spaces.Box(0, 9, (1,), np.float32)
    assert not hasattr(env, "state_space") and not hasattr(env, "state")
    obs, infos = env.reset(seed=0)
    assert np.array_equal(obs["a"], [0.0])
    assert infos["b"]["action_mask"].dtype == np.int8
    assert infos["b"]["action_mask"].tolist() == [1, 0, 1]
    with pytest.raises(InvalidActionError, match=r"step 0: agent 'b'.*forbids 1"):
        env.step({"a": 0, "b": 1})
    obs, rewards, terms, truncs, infos = env.step({"a": 0, "b": 2})
    assert rewards == {"a": 0.0, "b": 2.0} and infos["a"]["action_mask"].tolist() == [1, 1, 1]
    obs, rewards, terms, truncs, infos = env.step({"a": 1, "b": 1})
    assert terms == {"a": False, "b": True} and list(obs) == ["a"] == env.agents
    assert np.array_equal(infos["b"]["final_obs"], [2.0]) and "action_mask" not in infos["b"]
    with pytest.raises(InvalidActionError, match=r"step 2: got an action for agent 'b'"):
        env.step({"a": 0, "b": 0})
    obs, rewards, terms, truncs, infos = env.step({"a": 2})
    assert rewards == {"a": 2.0} and set(infos) == {"a"}
    obs, rewards, terms, truncs, infos = env.step({"a": 1})
    assert truncs == {"a": True} and obs == {} and env.agents == []
    assert np.array_equal(infos["a"]["final_obs"], [4.0])


class BoolMasked(Masked):
    """Masked with ``bool`` masks: in the observations, or (``in_info``) in the infos."""

    in_info = False

    def _obs(self) -> dict:
        obs = super()._obs()
        for part in obs.values():
            part["action_mask"] = part["action_mask"].astype(bool)
        if not self.in_info:
            return obs
        self.masks = {a: part["action_mask"] for a, part in obs.items()}
        return {a: part["observation"] for a, part in obs.items()}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        obs, _ = super().reset(seed, options)
        return obs, self._infos()

    def step(self, actions: dict) -> tuple:
        *out, _ = super().step(actions)
        return (*out, self._infos())

    def _infos(self) -> dict:
        masks = self.masks if self.in_info else {}
        return {a: {"action_mask": masks[a]} for a in masks if a in self.agents}


@pytest.mark.parametrize("in_info", [False, True], ids=["in-obs", "in-infos"])
def test_bool_masks_arrive_as_int8_and_the_readmes_loop_plays_them(in_info: bool) -> None:
    env = adapt(type("Env", (BoolMasked,), {"in_info": in_info})())
    obs, infos = env.reset(seed=0)
    assert infos["b"]["action_mask"].dtype == np.int8
    assert infos["b"]["action_mask"].tolist() == [1, 0, 1]
    steps = 0
    while env.agents:  # the README's ten lines; Discrete.sample refuses a bool mask
        actions = {a: env.action_space(a).sample(mask=infos[a].get("action_mask")) for a in obs}
        obs, _, _, _, infos = env.step(actions)
        assert all(info["action_mask"].dtype == np.int8 for a, info in infos.items() if a in obs)
        steps += 1
    assert steps == 4


def spread_trace(bad: dict | None) -> tuple[list, str]:
    env = corral.make("mpe2/simple_spread_v3", N=3, max_cycles=5)
    obs, _ = env.reset(seed=3)
    rng = np.random.default_rng(3)
    trace, message = [], ""
    while env.agents:
        if bad is not None and len(trace) == 2:
            with pytest.raises(InvalidActionError) as err:
                env.step(bad)
            message = str(err.value)
        actions = {a: int(rng.integers(5)) for a in obs}
        obs, rewards, *_ = env.step(actions)
        trace.append((rewards, {a: o.tolist() for a, o in obs.items()}))
    return trace, message


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"agent_0": 1, "agent_1": 1, "agent_2": 1, "agent_3": 1}, ["'agent_3'", "not acting"]),
        ({"agent_0": 1, "agent_1": 1}, ["'agent_2'", "no action"]),
        ({"agent_0": 1, "agent_1": 5, "agent_2": 1}, ["'agent_1'", "[0, 4]"]),
        ({"agent_0": 0.5, "agent_1": 1, "agent_2": 1}, ["'agent_0'", "integer"]),
    ],
)
def test_bad_action_raises_and_env_stays_usable(bad: dict, words: list[str]) -> None:
    expected, _ = spread_trace(None)
    got, message = spread_trace(bad)
    for word in [*words, "step 2"]:
        assert word in message
    assert got == expected


SISL_BUTTERFLY = [
    ("pettingzoo/sisl/multiwalker_v9", {"n_walkers": 2}, "Box2D"),
    ("pettingzoo/sisl/pursuit_v5", {"n_evaders": 2, "n_pursuers": 2}, "pygame"),
    ("pettingzoo/butterfly/pistonball_v6", {"n_pistons": 4}, "pymunk"),
    pytest.param(
        "pettingzoo/butterfly/cooperative_pong_v6",
        {},
        "pygame",
        # it renders inside reset() even without a render mode
        marks=pytest.mark.filterwarnings("ignore:.*without specifying any render mode"),
    ),
    ("pettingzoo/butterfly/knights_archers_zombies_v11", {}, "pygame"),
]


@pytest.mark.parametrize(("env_id", "kwargs", "needs"), SISL_BUTTERFLY)
def test_sisl_and_butterfly_run_the_user_loop(env_id: str, kwargs: dict, needs: str) -> None:
    pytest.importorskip(needs)
    env = corral.make(env_id, max_cycles=4, **kwargs)
    assert isinstance(env, ParallelEnvAdapter)
    obs, infos = env.reset(seed=0)
    assert obs and set(obs) <= set(infos)
    steps = 0
    while env.agents:
        for agent in obs:
            assert env.observation_space(agent).contains(obs[agent])
        actions = {a: env.action_space(a).sample(mask=infos[a].get("action_mask")) for a in obs}
        obs, rewards, terms, truncs, infos = env.step(actions)
        steps += 1
        assert set(actions) <= set(rewards) and set(terms) == set(truncs)
    assert 0 < steps <= 4 and obs == {}
    env.close()


def test_missing_dependency_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpe2", None)
    monkeypatch.setitem(sys.modules, "mpe2.simple_v3", None)
    with pytest.raises(MissingDependencyError, match=r"corral\[pettingzoo\]"):
        corral.make("mpe2/simple_v3")


def test_source_attributes_and_episode_limit_pass_through() -> None:
    env = corral.make("mpe2/simple_spread_v3", N=2, max_cycles=7)
    assert env.max_episode_steps == 7
    assert env.max_cycles == 7  # read from the raw mpe2 env under aec_to_parallel
    assert env.unwrapped is env.env.unwrapped and type(env.unwrapped).__name__ == "raw_env"
    with pytest.raises(AttributeError, match="no attribute 'max_cyclez', nor has the"):
        _ = env.max_cyclez
    with pytest.raises(AttributeError, match=r"private attributes .* are not forwarded"):
        _ = env._agent_selector
    assert not hasattr(corral.make("pettingzoo/classic/rps_v2"), "state")  # AEC: no state_space


@pytest.mark.filterwarnings("ignore:builtin type .* has no __module__:DeprecationWarning")
def test_episode_limit_of_a_sisl_env_is_found_inside_its_wrappers() -> None:
    try:
        env = corral.make("pettingzoo/sisl/pursuit_v5", max_cycles=40)
    except MissingDependencyError as err:
        pytest.skip(str(err))
    assert env.max_episode_steps == 40  # kept by pursuit's inner game, under raw_env


class ReportsTheDead(pettingzoo.ParallelEnv):
    """Agent ``b`` dies at step 1 and is reported as terminated at every step after, as some
    envs do (PettingZoo's parallel API test only warns); ``a`` ends at step 4."""

    metadata = {"name": "reports_the_dead"}
    possible_agents = ["a", "b"]

    def __init__(self) -> None:
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(0, 9, (1,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        self.t, self.agents = 0, ["a", "b"]
        return {x: np.zeros(1, np.float32) for x in self.agents}, {}

    def step(self, actions: dict) -> tuple:
        self.t += 1
        self.agents = ["a"] if self.t < 4 else []
        obs = {x: np.full(1, self.t, np.float32) for x in self.possible_agents}
        terms = {"a": self.t >= 4, "b": True}
        return obs, {"a": 1.0, "b": 0.0}, terms, {"a": False, "b": False}, {}


def test_only_an_agent_alive_before_a_step_ends_in_it() -> None:
    env = adapt(ReportsTheDead())
    env.reset(seed=0)
    _, _, terms, _, _ = env.step({"a": 0, "b": 0})
    assert terms == {"a": False, "b": True}
    for _ in range(2):
        _, _, terms, _, _ = env.step({"a": 0})
        assert terms == {"a": False, "b": False}
    _, _, terms, _, _ = env.step({"a": 0})
    assert terms == {"a": True, "b": False}
    vec = corral.VectorEnv([ReportsTheDead])
    vec.reset(seed=0)
    ended = []
    for _ in range(4):
        batch = vec.step({g: np.zeros((1, 1), np.int64) for g in vec.groups})
        ended.append(batch.terminated["b"][0, 0].item())
    assert ended == [True, False, False, False]  # the autoreset at step 4 keeps b's flag down
