"""MAgent2's scenarios through the PettingZoo parallel adapter, checked step by step
against the raw envs, alone and in the vector layer, over steps where agents die."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.cli import run

import corral
from corral.errors import MissingDependencyError

magent2 = pytest.importorskip("magent2")

SCENARIOS = sorted(p.stem for p in Path(magent2.__path__[0], "environments").glob("*_v[0-9]*.py"))
# (every id passes the checker in tests/checks/test_conformance_all.py, on small maps)

# Small maps (battlefield's smallest is 46; gather's map is fixed), so that the tests are fast.
SMALL: dict[str, dict[str, Any]] = {
    "adversarial_pursuit_v4": {"map_size": 16},
    "battle_v4": {"map_size": 30},
    "battlefield_v5": {"map_size": 46},
    "combined_arms_v6": {"map_size": 16},
    "gather_v5": {},
    "tiger_deer_v4": {"map_size": 16},
}

# battle's moves toward the other team (red starts on the left) and its attacks
TOWARD = {"red": (7, 8), "blue": (5, 6)}
ATTACKS = range(13, 21)


def raw_env(name: str, **kwargs: Any) -> Any:
    package = name.rpartition("_v")[0]
    return importlib.import_module(f"magent2.environments.{package}").parallel_env(**kwargs)


def action(rng: np.random.Generator, name: str, agent: str, n: int) -> int:
    """A random action; in battle, one that charges the other team or attacks, so that
    agents meet and die within a short episode."""
    if name != "battle_v4":
        return int(rng.integers(n))
    if rng.random() < 0.3:
        return int(rng.choice(TOWARD[agent.split("_")[0]]))
    return int(rng.choice(ATTACKS))


def test_every_installed_scenario_is_registered() -> None:
    assert len(SCENARIOS) == 6 and set(SMALL) == set(SCENARIOS)
    assert corral.registry.registered_ids("magent2") == [f"magent2/{n}" for n in SCENARIOS]


@pytest.mark.parametrize("name", SCENARIOS)
def test_same_as_the_raw_env_step_for_step(name: str) -> None:
    kwargs = {**SMALL[name], "max_cycles": 100}
    raw = raw_env(name, **kwargs)
    env = corral.make(f"magent2/{name}", **kwargs)
    assert env.possible_agents == raw.possible_agents and env.max_episode_steps == 100
    raw_obs, _ = raw.reset(seed=5)
    obs, infos = env.reset(seed=5)
    rng = np.random.default_rng(5)
    steps, died = 0, 0
    while raw.agents:
        # the ended agents' last observations are in infos, not obs
        assert env.agents == raw.agents == list(obs) and set(infos) == set(raw_obs)
        for agent in obs:
            assert np.array_equal(obs[agent], raw_obs[agent])
        assert np.array_equal(env.state(), raw.state())
        actions = {a: action(rng, name, a, raw.action_space(a).n) for a in raw.agents}
        raw_obs, raw_rewards, raw_terms, raw_truncs, _ = raw.step(actions)
        obs, rewards, terms, truncs, infos = env.step(actions)
        steps += 1
        assert rewards == raw_rewards and terms == raw_terms and truncs == raw_truncs
        dead = [a for a in raw_terms if raw_terms[a] and not raw_truncs[a]]
        died += len(dead)
        for agent in dead:  # a dying agent's reward, and its last observation in infos
            assert agent not in env.agents and agent in rewards
            assert np.array_equal(infos[agent]["final_obs"], raw_obs[agent])
    assert env.agents == [] and obs == {} and 0 < steps <= 100
    if name in ("battle_v4", "gather_v5"):
        assert died > 0


@pytest.mark.parametrize("backend", ["sync", "subproc"])
def test_vector_backends_step_it_as_the_raw_env_does(backend: str) -> None:
    kwargs = {"map_size": 30, "max_cycles": 90}
    num_envs, seed = 2, 11
    venv = corral.make_vec(
        "magent2/battle_v4", num_envs, backend=backend, native=False, env_kwargs=kwargs
    )
    raws = [raw_env("battle_v4", **kwargs) for _ in range(num_envs)]
    groups = {"red": raws[0].possible_agents[:30], "blue": raws[0].possible_agents[30:]}
    assert venv.groups == {g: tuple(agents) for g, agents in groups.items()}
    batch = venv.reset(seed=seed)
    raw_obs = [raw.reset(seed=seed + e)[0] for e, raw in enumerate(raws)]
    rng = np.random.default_rng(5)
    died = resets = 0
    for _ in range(120):  # past the end of the first episodes (90 steps)
        for e, raw in enumerate(raws):
            for group, agents in groups.items():
                alive = [a in raw.agents for a in agents]
                np.testing.assert_array_equal(batch.alive[group][e], alive)
                for j, agent in enumerate(agents):
                    if alive[j]:
                        np.testing.assert_array_equal(batch.obs[group][e, j], raw_obs[e][agent])
        actions = {
            g: np.array([[action(rng, "battle_v4", a, 21) for a in agents] for _ in raws])
            for g, agents in groups.items()
        }
        batch = venv.step(actions)
        for e, raw in enumerate(raws):
            moves = {a: int(actions[g][e, j]) for g, ag in groups.items() for j, a in enumerate(ag)}
            raw_obs[e], rewards, terms, truncs, _ = raw.step({a: moves[a] for a in raw.agents})
            for group, agents in groups.items():
                for j, agent in enumerate(agents):
                    assert batch.reward[group][e, j] == pytest.approx(rewards.get(agent, 0.0))
                    assert batch.terminated[group][e, j] == terms.get(agent, False)
                    assert batch.truncated[group][e, j] == truncs.get(agent, False)
                    if terms.get(agent) and not truncs.get(agent):
                        died += 1
            assert batch.done[e] == (not raw.agents)
            if batch.done[e]:  # same-step autoreset: the batch holds the next episode
                resets += 1
                raw_obs[e], _ = raw.reset()
    venv.close()
    assert died > 0 and resets == num_envs


def test_battle_groups_are_its_two_teams_of_hundreds() -> None:
    env = corral.make("magent2/battle_v4")
    groups = corral.group_agents(env.possible_agents, env.observation_space, env.action_space)
    assert list(groups) == ["red", "blue"]
    assert groups["red"] == [f"red_{i}" for i in range(81)]
    assert groups["blue"] == [f"blue_{i}" for i in range(81)]


def test_env_kwargs_reach_the_scenario() -> None:
    env = corral.make("magent2/battle_v4", map_size=20, minimap_mode=True, max_cycles=7)
    assert len(env.possible_agents) == 24 and env.max_episode_steps == 7
    # a minimap channel per team and the position (two channels)
    assert env.observation_space("red_0").shape == (13, 13, 9)


def test_corral_check_passes_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "check", "magent2/battle_v4", "--set", "map_size=16", "max_cycles=50"
    )
    assert code == 0 and "ok, no contract violation found" in out


def test_missing_dependency_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "magent2", None)
    monkeypatch.setitem(sys.modules, "magent2.environments.battle", None)
    with pytest.raises(MissingDependencyError, match=r"corral\[magent2\]"):
        corral.make("magent2/battle_v4")


def test_ippo_trains_both_teams_from_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("yaml")
    argv = ["train", "ippo", "--env", "magent2/battle_v4", "--total-steps", "256"]
    argv += ["--run-dir", str(tmp_path / "run"), "--no-progress", "--set", "num_envs=2"]
    argv += ["env_kwargs={map_size: 12, max_cycles: 20}", "rollout_steps=32", "eval_episodes=2"]
    code, out, err = run(capsys, *argv, "device=cpu", "tensorboard=false")
    assert code == 0, err
    assert f"run {tmp_path / 'run'}: 256 env steps" in out
    assert "the learned agents of the groups ['red', 'blue']" in err
    header = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"eval_return/red", "eval_return/blue"} <= set(header)
