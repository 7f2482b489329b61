"""Gymnasium envs of several agents (EPyMARL's LBF and RWARE): one agent per Tuple entry,
step for step the raw env's results, the vector backends, refusals of other Tuple envs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces

import corral
from corral.errors import MissingDependencyError, UnsupportedEnvError

PACKAGES = {"lbf": "lbforaging", "rware": "rware"}

# Gymnasium's passive checker, on a user's gymnasium.make(...), expects one float reward.
LIST_REWARD_WARNING = "ignore:.*The reward returned by `step\\(\\)` must be a float"


def raw_env(source: str, name: str, **kwargs: Any) -> gymnasium.Env:
    """The env as EPyMARL's users build it (the checker off: it expects one agent)."""
    pytest.importorskip(PACKAGES[source])
    return gymnasium.make(name, disable_env_checker=True, **kwargs)


# (source, Gymnasium id, keyword arguments, whether random play earns rewards in 600 steps)
CASES = [
    ("lbf", "Foraging-8x8-2p-3f-v3", {}, True),
    # small field: loads are frequent and eating all food ends episodes before the limit
    ("lbf", "Foraging-5x5-3p-1f-v3", {}, True),
    # Gymnasium's TimeLimit truncates before LBF's own limit of 50 steps
    ("lbf", "Foraging-8x8-2p-2f-coop-v3", {"max_episode_steps": 20}, False),
    ("rware", "rware-tiny-2ag-v2", {"max_steps": 60}, False),
    # a tiny warehouse where random robots deliver (rewards to either agent)
    (
        "rware",
        "rware-tiny-2ag-v2",
        {"layout": "xx\ngg", "request_queue_size": 1, "max_steps": 50},
        True,
    ),
]


@pytest.mark.parametrize(("source", "name", "kwargs", "rewarded"), CASES)
def test_matches_the_raw_env_step_for_step(
    source: str, name: str, kwargs: dict[str, Any], rewarded: bool
) -> None:
    raw = raw_env(source, name, **kwargs)
    env = corral.make(f"{source}/{name}", **kwargs)
    n = len(raw.action_space)
    agents = [f"agent_{i}" for i in range(n)]
    assert env.possible_agents == agents
    for i, agent in enumerate(agents):
        assert env.observation_space(agent) == raw.observation_space[i]
        assert env.action_space(agent) == raw.action_space[i]
    rng = np.random.default_rng(7)
    episodes, rewards_seen, ends = 0, 0, {"terminated": 0, "truncated": 0}
    obs, infos = env.reset(seed=100)
    raw_obs, raw_info = raw.reset(seed=100)
    for _ in range(600):
        for i, agent in enumerate(agents):
            np.testing.assert_array_equal(obs[agent], raw_obs[i])
            assert infos[agent] == raw_info
        action = rng.integers(0, raw.action_space[0].n, size=n)
        obs, rewards, terms, truncs, infos = env.step(dict(zip(agents, action, strict=True)))
        raw_obs, raw_rewards, raw_term, raw_trunc, raw_info = raw.step(tuple(action))
        assert rewards == {agent: float(raw_rewards[i]) for i, agent in enumerate(agents)}
        assert terms == dict.fromkeys(agents, raw_term)
        assert truncs == dict.fromkeys(agents, raw_trunc)
        rewards_seen += any(raw_rewards)
        if raw_term or raw_trunc:
            assert obs == {} and env.agents == []
            for i, agent in enumerate(agents):
                np.testing.assert_array_equal(infos[agent].pop("final_obs"), raw_obs[i])
                assert infos[agent] == raw_info
            ends["terminated" if raw_term else "truncated"] += 1
            episodes += 1
            obs, infos = env.reset(seed=100 + episodes)
            raw_obs, raw_info = raw.reset(seed=100 + episodes)
        else:
            assert env.agents == agents
    assert episodes >= 3
    if rewarded:
        assert rewards_seen  # rewards other than 0 were compared
    if "max_episode_steps" in kwargs:
        assert ends["truncated"] and env.max_episode_steps == kwargs["max_episode_steps"]


@pytest.mark.filterwarnings(LIST_REWARD_WARNING)
@pytest.mark.parametrize(
    ("package", "name"), [("lbforaging", "Foraging-8x8-2p-3f-v3"), ("rware", "rware-tiny-2ag-v2")]
)
def test_adapt_plays_the_gymnasium_env_as_its_agents(package: str, name: str) -> None:
    pytest.importorskip(package)
    env = corral.adapt(gymnasium.make(name))  # the user's env, Gymnasium's checker on
    assert env.possible_agents == ["agent_0", "agent_1"] and env.simultaneous
    obs, _ = env.reset(seed=0)
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(i)
    steps = 0
    while env.agents:
        assert sorted(obs) == env.agents == env.possible_agents
        obs, rewards, terms, truncs, _ = env.step({a: env.action_space(a).sample() for a in obs})
        steps += 1
        assert all(type(r) is float for r in rewards.values())
    assert steps == {"lbforaging": 50, "rware": 500}[package]  # each env's own step limit
    assert all(terms.values()) and not any(truncs.values())  # both envs call it done
    assert env.n_agents == 2  # the source env's attributes pass through
    env.close()


@pytest.mark.parametrize(
    "env_id",
    ["lbf/Foraging-8x8-2p-3f-v3", "lbf/Foraging-2s-8x8-3p-2f-coop-v3", "rware/rware-tiny-4ag-v2"],
)
def test_passes_the_checker(env_id: str) -> None:
    pytest.importorskip(PACKAGES[env_id.split("/")[0]])
    report = corral.check_env(env_id, raise_on_error=False)
    assert report.ok and report.complete, str(report)


@pytest.mark.filterwarnings(LIST_REWARD_WARNING)
def test_the_checker_passes_an_adapted_env_and_an_unlisted_id() -> None:
    pytest.importorskip("lbforaging")
    assert corral.check_env(corral.adapt(gymnasium.make("Foraging-6x6-4p-2f-v3"))).ok
    assert "lbf/Foraging-6x6-4p-2f-v3" not in corral.registered_ids()
    assert corral.check_env("lbf/Foraging-6x6-4p-2f-v3").ok  # built through the namespace


@pytest.mark.parametrize(("source", "name"), [(s, n) for s, n, *_ in CASES[:1] + CASES[3:4]])
def test_vector_backends_step_it_as_the_env_does(source: str, name: str) -> None:
    pytest.importorskip(PACKAGES[source])
    kwargs = {"max_steps": 30} if source == "rware" else {}
    env_id = f"{source}/{name}"
    batches = {}
    for backend in ("sync", "subproc"):
        venv = corral.make_vec(env_id, 2, backend=backend, seed=0, env_kwargs=kwargs)
        rng = np.random.default_rng(1)
        batch = venv.reset()
        seen = [batch]
        for _ in range(60):  # past the end of an episode (50 steps, or 30)
            actions = rng.integers(0, 5, size=(2, 2))
            seen.append(venv.step({"agent": actions}))
        venv.close()
        batches[backend] = seen
    single = corral.make(env_id, **kwargs)
    obs, _ = single.reset(seed=0)
    first = batches["sync"][0].obs["agent"][0]
    np.testing.assert_array_equal(first, np.stack([obs["agent_0"], obs["agent_1"]]))
    assert any(b.done.any() for b in batches["sync"])
    for sync, subproc in zip(batches["sync"], batches["subproc"], strict=True):
        for field in ("obs", "reward", "terminated", "truncated"):
            np.testing.assert_array_equal(
                getattr(sync, field)["agent"], getattr(subproc, field)["agent"]
            )
        np.testing.assert_array_equal(sync.done, subproc.done)


def test_make_through_the_gym_namespace_picks_the_multi_agent_adapter() -> None:
    pytest.importorskip("lbforaging")
    env = corral.make("gym/lbforaging:Foraging-5x5-2p-1f-v3", disable_env_checker=True)
    assert env.possible_agents == ["agent_0", "agent_1"]
    env.reset(seed=0)
    _, rewards, *_ = env.step({"agent_0": 0, "agent_1": 0})
    assert rewards == {"agent_0": 0.0, "agent_1": 0.0}


def test_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for source, package in PACKAGES.items():
        monkeypatch.setitem(sys.modules, package, None)  # as if not installed
        with pytest.raises(MissingDependencyError, match=rf"pip install 'corral\[{source}\]'"):
            corral.make(f"{source}/anything-v0")


# -- envs that declare several agents but break the convention ----------------------------


class TupleEnv(gymnasium.Env):
    """Two agents with Tuple spaces; ``n_agents``, the rewards and the end flags as given."""

    def __init__(
        self,
        n_agents: Any = 2,
        spaces_of: int = 2,
        reward: Any = (1.0, 2.0),
        dones: list[Any] | None = None,
    ) -> None:
        if n_agents is not None:
            self.n_agents = n_agents
        self.observation_space = spaces.Tuple([spaces.Discrete(3)] * spaces_of)
        self.action_space = spaces.Tuple([spaces.Discrete(2)] * spaces_of)
        self.reward = reward
        self.dones = list(dones or [True])

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        return (0,) * len(self.action_space), {"seen": True}

    def step(self, action: Any) -> Any:
        observation = tuple(int(a) + 1 for a in action)
        return observation, self.reward, self.dones.pop(0), False, {"step": 1}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (TupleEnv(n_agents=None), "has no n_agents"),
        (TupleEnv(n_agents=3), "observation_space has 2 entries for n_agents=3"),
        (TupleEnv(n_agents=1.5), "n_agents is 1.5, not a positive int"),
    ],
    ids=["no-n_agents", "lengths-disagree", "n_agents-not-int"],
)
def test_a_tuple_env_off_the_convention_is_refused(env: gymnasium.Env, expected: str) -> None:
    with pytest.raises(UnsupportedEnvError) as err:
        corral.adapt(env)
    message = str(err.value)
    assert "TupleEnv does not follow the multi-agent Gymnasium convention" in message
    assert expected in message and "GymnasiumEnvAdapter(env)" in message


def test_n_agents_without_tuple_spaces_is_refused() -> None:
    env = gymnasium.make("CartPole-v1").unwrapped
    env.n_agents = 2
    with pytest.raises(UnsupportedEnvError, match=r"'CartPole-v1'.*observation_space is Box"):
        corral.adapt(env)


def test_a_single_agent_tuple_env_can_still_be_wrapped_as_one_agent() -> None:
    from corral.adapters.gymnasium import GymnasiumEnvAdapter

    env = GymnasiumEnvAdapter(TupleEnv(n_agents=None, reward=0.5))
    env.reset(seed=0)
    _, rewards, terms, *_ = env.step({"agent_0": (1, 0)})
    assert rewards == {"agent_0": 0.5} and terms == {"agent_0": True}


def test_rewards_that_are_not_one_per_agent_are_refused() -> None:
    env = corral.adapt(TupleEnv(reward=3.0))
    env.reset()
    with pytest.raises(UnsupportedEnvError, match="step 0: expected rewards for each of its 2"):
        env.step({"agent_0": 0, "agent_1": 1})


def test_a_list_of_dones_ends_the_episode_when_all_are_true() -> None:
    env = corral.adapt(TupleEnv(dones=[[True, False], [True, True]]))
    obs, infos = env.reset(seed=0)
    assert obs == {"agent_0": 0, "agent_1": 0} and infos["agent_1"] == {"seen": True}
    obs, rewards, terms, truncs, infos = env.step({"agent_0": 1, "agent_1": 0})
    assert obs == {"agent_0": 2, "agent_1": 1} and env.agents == ["agent_0", "agent_1"]
    assert rewards == {"agent_0": 1.0, "agent_1": 2.0}
    assert terms == truncs == {"agent_0": False, "agent_1": False}
    obs, _, terms, truncs, infos = env.step({"agent_0": 0, "agent_1": 1})
    assert obs == {} and env.agents == [] and terms == {"agent_0": True, "agent_1": True}
    assert infos == {"agent_0": {"step": 1, "final_obs": 1}, "agent_1": {"step": 1, "final_obs": 2}}


def test_invalid_actions_raise_and_leave_the_env_usable() -> None:
    env = corral.adapt(TupleEnv(dones=[False, False]))
    env.reset()
    for bad in ({"agent_0": 0}, {"agent_0": 0, "agent_1": 2}, {"agent_0": 0, "agent_1": 1, "x": 0}):
        with pytest.raises(corral.InvalidActionError):
            env.step(bad)
    obs, *_ = env.step({"agent_0": 1, "agent_1": 1})
    assert obs == {"agent_0": 2, "agent_1": 2}


def test_trains_mappo_from_the_cli(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("lbforaging")
    pytest.importorskip("torch")
    pytest.importorskip("yaml")
    from corral import cli

    argv = ["train", "mappo", "--env", "lbf/Foraging-8x8-2p-3f-v3", "--total-steps", "2000"]
    argv += ["--run-dir", str(tmp_path / "run"), "--no-progress", "--set", "num_envs=2"]
    code = cli.main([*argv, "eval_episodes=4", "device=cpu", "tensorboard=false"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"run {tmp_path / 'run'}: 2000 env steps" in out
