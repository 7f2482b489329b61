"""The PettingZoo AEC adapter, checked against PettingZoo's own agent_iter()/last() loop."""

from __future__ import annotations

import importlib
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

import corral
from corral.adapters import adapt
from corral.adapters.pettingzoo_aec import AECEnvAdapter
from corral.errors import InvalidActionError, MissingDependencyError

pettingzoo = pytest.importorskip("pettingzoo")

# texas_holdem_no_limit builds a float64-bounded Box
pytestmark = pytest.mark.filterwarnings("ignore:.*Box (low|high)'s precision lowered:UserWarning")

# name -> (kwargs, the module it needs beyond pettingzoo)
CHEAP_CLASSIC: dict[str, tuple[dict[str, Any], str | None]] = {
    "rps_v2": ({}, None),
    "tictactoe_v3": ({}, None),
    "connect_four_v3": ({}, None),
    "leduc_holdem_v4": ({}, "rlcard"),
    "texas_holdem_v4": ({}, "rlcard"),
    "texas_holdem_no_limit_v6": ({}, "rlcard"),
    "go_v5": ({"board_size": 5}, None),
    "hanabi_v5": ({"colors": 2, "ranks": 3, "hand_size": 3}, "pyspiel"),
}


@dataclass
class Turn:
    """One turn of one agent: what it was told, and what it did (None: a dead step)."""

    agent: str
    reward: float
    obs: Any
    mask: Any
    action: int | None


def split(raw_obs: Any) -> tuple[Any, Any]:
    if isinstance(raw_obs, dict):
        return np.array(raw_obs["observation"]), np.array(raw_obs["action_mask"], dtype=np.int8)
    return np.array(raw_obs), None


def pick(rng: np.random.Generator, space: Any, mask: Any) -> int:
    legal = np.flatnonzero(mask) if mask is not None else np.arange(space.n)
    return int(rng.choice(legal))


def raw_turns(env: Any, seed: int) -> list[Turn]:
    """PettingZoo's own loop on ``env``, with random legal actions drawn from ``seed``."""
    env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    turns = []
    for agent in env.agent_iter():
        raw_obs, reward, term, trunc, _ = env.last()
        obs, mask = split(raw_obs)
        action = None if term or trunc else pick(rng, env.action_space(agent), mask)
        turns.append(Turn(agent, float(reward), obs, mask, action))
        env.step(action)
    env.close()
    return turns


def corral_turns(env: Any, seed: int, actions: list[Turn]) -> list[Turn]:
    """The corral loop replaying ``actions``; an agent's reward at a turn is its corral
    rewards summed since its previous action (what last() should have said)."""
    obs, infos = env.reset(seed=seed)
    since_action: defaultdict[str, float] = defaultdict(float)
    turns = []
    for step, played in enumerate(actions):
        assert list(obs) == [played.agent], f"step {step}: obs keys {list(obs)}"
        agent = played.agent
        turns.append(
            Turn(
                agent,
                since_action.pop(agent, 0.0),
                obs[agent],
                infos[agent].get("action_mask"),
                played.action,
            )
        )
        alive = list(env.agents)
        obs, rewards, terms, truncs, infos = env.step({agent: played.action})
        assert set(terms) == set(truncs) == set(alive) <= set(rewards)
        for a, r in rewards.items():
            since_action[a] += r
        for a in alive:
            if terms[a] or truncs[a]:
                assert a not in env.agents and a not in obs
                turns.append(Turn(a, since_action.pop(a, 0.0), infos[a]["final_obs"], None, None))
    assert env.agents == [] and obs == {}
    return turns


def by_agent(turns: list[Turn]) -> dict[str, list[Turn]]:
    out: defaultdict[str, list[Turn]] = defaultdict(list)
    for turn in turns:
        out[turn.agent].append(turn)
    return dict(out)


def assert_same_turns(raw: list[Turn], mine: list[Turn]) -> None:
    raw_by, mine_by = by_agent(raw), by_agent(mine)
    assert set(raw_by) == set(mine_by)
    for agent, expected in raw_by.items():
        got = mine_by[agent]
        assert [t.action for t in got] == [t.action for t in expected]
        # the rewards between two turns add up to last()'s reward at the second
        assert [t.reward for t in got] == [t.reward for t in expected], agent
        assert sum(t.reward for t in got) == sum(t.reward for t in expected)
        for g, e in zip(got, expected, strict=True):
            assert np.array_equal(g.obs, e.obs)
            if e.action is not None:
                assert (g.mask is None) == (e.mask is None)
                assert e.mask is None or (
                    g.mask.dtype == np.int8 and np.array_equal(g.mask, e.mask)
                )


@pytest.mark.parametrize("name", sorted(CHEAP_CLASSIC))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_same_rewards_observations_and_masks_as_pettingzoo(name: str, seed: int) -> None:
    kwargs, needs = CHEAP_CLASSIC[name]
    if needs is not None:
        pytest.importorskip(needs)
    raw = raw_turns(pettingzoo.make("aec", f"classic/{name}", **kwargs), seed)
    env = corral.make(f"pettingzoo/classic/{name}", **kwargs)
    assert_same_turns(raw, corral_turns(env, seed, [t for t in raw if t.action is not None]))


class Duel(pettingzoo.ParallelEnv):
    """Two agents paid every cycle; as an AEC env (parallel_to_aec) its cumulative rewards
    are replaced each cycle instead of being reset when an agent acts."""

    metadata = {"name": "duel"}
    render_mode = None
    possible_agents = ["a", "b"]

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(0, 9, (1,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(3)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple:
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def _obs(self) -> dict:
        return {a: np.array([self.t], np.float32) for a in self.agents}

    def step(self, actions: dict) -> tuple:
        self.t += 1
        diff = float(actions["a"] - actions["b"])
        rewards = {"a": diff, "b": 0.5 - diff}
        done = dict.fromkeys(self.agents, self.t == 4)
        obs, infos = self._obs(), {a: {} for a in self.agents}
        self.agents = [] if self.t == 4 else self.agents
        return obs, rewards, dict.fromkeys(done, False), done, infos


@pytest.mark.parametrize("seed", [0, 1])
def test_converted_parallel_env_sums_match_last(seed: int) -> None:
    from pettingzoo.utils.conversions import parallel_to_aec

    raw = raw_turns(parallel_to_aec(Duel()), seed)
    env = adapt(parallel_to_aec(Duel()))
    assert isinstance(env, AECEnvAdapter)
    assert_same_turns(raw, corral_turns(env, seed, [t for t in raw if t.action is not None]))


def test_a_converted_parallel_env_pays_each_round_in_the_step_that_ends_it() -> None:
    """parallel_to_aec (MAgent2's env()) replaces its cumulative rewards at a round's last
    move: corral's per-step rewards are then the parallel env's, in the step it pays them."""
    from pettingzoo.utils.conversions import parallel_to_aec

    env, par = adapt(parallel_to_aec(Duel())), Duel()
    obs, _ = env.reset(seed=0)
    par.reset(seed=0)
    rng, moves, paid = np.random.default_rng(0), {}, []
    while env.agents:
        (agent,) = obs
        moves[agent] = int(rng.integers(3))
        obs, rewards, *_ = env.step({agent: moves[agent]})
        if len(moves) < 2:
            assert rewards == {"a": 0.0, "b": 0.0}  # nothing happens until the round ends
            continue
        expected = par.step(moves)[1]
        assert rewards == expected
        paid.append(expected)
        moves = {}
    assert len(paid) == 4 and any(r["a"] != 0 for r in paid)


class Elimination(pettingzoo.AECEnv):
    """p0's first move knocks p2 out while p1 plays next, so p2's dead step comes only
    after p1's move, and p2 still earns 0.5 during it; all are truncated at move 5."""

    metadata = {"name": "elimination"}
    render_mode = None
    possible_agents = ["p0", "p1", "p2"]

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(0, 9, (1,), np.float32)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.t], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.t = 0
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = "p0"

    def _after(self, agent: str) -> str:
        return self.agents[(self.agents.index(agent) + 1) % len(self.agents)]

    def step(self, action: int | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self._clear_rewards()
        self.t += 1
        self.rewards[agent] = float(action)
        if "p2" in self.agents:
            self.rewards["p2"] = {1: -1.0, 2: 0.5}.get(self.t, 0.0)
            self.terminations["p2"] = True
        self.truncations = dict.fromkeys(self.agents, self.t == 5)
        self._accumulate_rewards()
        nxt = self._after(agent)
        if self.terminations[nxt] or self.truncations[nxt]:
            self._skip_agent_selection = self._after(nxt)
        self.agent_selection = nxt


def test_agent_ended_out_of_turn_leaves_at_once_and_keeps_its_return() -> None:
    raw = raw_turns(Elimination(), seed=0)
    raw_returns = {a: sum(t.reward for t in raw if t.agent == a) for a in ("p0", "p1", "p2")}
    env = adapt(Elimination())
    obs, _ = env.reset(seed=0)
    returns: defaultdict[str, float] = defaultdict(float)
    seen = []
    for played in [t for t in raw if t.action is not None]:
        assert list(obs) == [played.agent]
        obs, rewards, terms, _, infos = env.step({played.agent: played.action})
        seen.append((dict(terms), rewards.get("p2"), list(env.agents), infos))
        for a, r in rewards.items():
            returns[a] += r
    # p0's move ends p2 although p1 plays next: p2 leaves at once, with its final obs
    terms, p2_reward, agents, infos = seen[0]
    assert terms == {"p0": False, "p1": False, "p2": True} and p2_reward == -1.0
    assert agents == ["p0", "p1"] and np.array_equal(infos["p2"]["final_obs"], [1.0])
    # what p2 still earns before its dead step is paid, though it is not alive any more
    terms, p2_reward, agents, infos = seen[1]
    assert list(terms) == ["p0", "p1"] and p2_reward == 0.5 and "p2" not in infos
    assert env.agents == [] and obs == {}
    assert dict(returns) == raw_returns and raw_returns["p2"] == -0.5


def test_games_with_rewards_are_covered() -> None:
    # guards the differential test against comparing only zeros
    raw = raw_turns(pettingzoo.make("aec", "classic/rps_v2"), 0)
    assert any(t.reward != 0 for t in raw)


def test_user_loop_connect_four_only_acting_agent_in_obs() -> None:
    env = corral.make("pettingzoo/classic/connect_four_v3")
    assert isinstance(env, AECEnvAdapter)
    assert env.observation_space("player_0").shape == (6, 7, 2)
    obs, infos = env.reset(seed=0)
    returns: defaultdict[str, float] = defaultdict(float)
    steps = 0
    while env.agents:
        assert len(obs) == 1 and next(iter(obs)) in env.agents
        assert infos[next(iter(obs))]["action_mask"].dtype == np.int8
        alive = list(env.agents)
        actions = {a: env.action_space(a).sample(mask=infos[a].get("action_mask")) for a in obs}
        obs, rewards, terms, truncs, infos = env.step(actions)
        assert list(terms) == list(truncs) == list(rewards) == alive
        for a, r in rewards.items():
            returns[a] += r
        steps += 1
    assert obs == {} and steps >= 7
    assert sorted(returns.values()) in ([-1.0, 1.0], [0.0, 0.0])
    assert all("final_obs" in infos[a] for a in env.possible_agents)


def fill_column_zero(env: Any, seed: int) -> tuple[dict, dict]:
    obs, infos = env.reset(seed=seed)
    for _ in range(6):  # alternate in column 0: full, nobody wins
        obs, _, _, _, infos = env.step({next(iter(obs)): 0})
    return obs, infos


def finish(env: Any, obs: dict, infos: dict, seed: int) -> list[tuple]:
    rng = np.random.default_rng(seed)
    trace = []
    while env.agents:
        (agent,) = obs
        action = pick(rng, env.action_space(agent), infos[agent]["action_mask"])
        obs, rewards, terms, _, infos = env.step({agent: action})
        trace.append((agent, action, rewards, terms))
    return trace


@pytest.mark.parametrize(
    ("actions", "words"),
    [
        ({"player_1": 3}, ["'player_1'", "not acting"]),
        ({}, ["'player_0'", "no action"]),
        ({"player_0": 7}, ["'player_0'", "[0, 6]"]),
        ({"player_0": 0}, ["'player_0'", "forbids 0"]),
        ({"player_0": 2.0}, ["'player_0'", "integer"]),
    ],
)
def test_bad_action_raises_and_env_stays_usable(actions: dict, words: list[str]) -> None:
    clean = corral.make("pettingzoo/classic/connect_four_v3")
    expected = finish(clean, *fill_column_zero(clean, 5), seed=9)

    env = corral.make("pettingzoo/classic/connect_four_v3")
    obs, infos = fill_column_zero(env, 5)
    assert list(obs) == ["player_0"] and infos["player_0"]["action_mask"][0] == 0
    with pytest.raises(InvalidActionError) as err:
        env.step(actions)
    for word in [*words, "step 6"]:
        assert word in str(err.value)
    assert finish(env, obs, infos, seed=9) == expected


def test_spaces_and_state_pass_through() -> None:
    env = corral.make("pettingzoo/classic/tictactoe_v3", render_mode="rgb_array")
    assert env.possible_agents == ["player_1", "player_2"]
    assert env.action_space("player_1").n == 9
    assert env.observation_space("player_1").shape == (3, 3, 2)
    assert env.render_mode == "rgb_array" and env.metadata["name"] == "tictactoe_v3"
    assert not hasattr(env, "state_space") and not hasattr(env, "state")
    env.reset(seed=0)
    assert env.render().ndim == 3
    env.close()


def test_detector_adapts_a_raw_aec_env() -> None:
    raw = pettingzoo.make("aec", "classic/rps_v2")
    env = adapt(raw)
    assert isinstance(env, AECEnvAdapter) and env.env is raw
    obs, _ = env.reset(seed=0)
    assert list(obs) == ["player_0"]


def test_every_installed_classic_env_is_registered() -> None:
    folder = Path(importlib.import_module("pettingzoo.classic").__path__[0])
    installed = {f"pettingzoo/classic/{p.stem}" for p in folder.glob("*_v[0-9]*.py")}
    assert installed and installed <= set(corral.registry.registered_ids("pettingzoo"))


@pytest.mark.parametrize(("name", "needs"), [("chess_v6", "chess"), ("texas_holdem_v4", "rlcard")])
def test_classic_builds_through_make(name: str, needs: str) -> None:
    pytest.importorskip(needs)
    env = corral.make(f"pettingzoo/classic/{name}")
    obs, infos = env.reset(seed=1)
    (agent,) = obs
    assert obs[agent].shape == env.observation_space(agent).shape
    assert infos[agent]["action_mask"].sum() > 0


def test_missing_dependency_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pettingzoo.classic.rps.rps", None)
    with pytest.raises(MissingDependencyError, match=r"corral\[pettingzoo\]"):
        corral.make("pettingzoo/classic/rps_v2")


def test_episode_limit_counts_one_step_per_agent_turn() -> None:
    env = corral.make("pettingzoo/classic/rps_v2", max_cycles=4)
    assert env.max_cycles == 4 and env.max_episode_steps == 8
    obs, _ = env.reset(seed=0)
    steps = 0
    while env.agents:
        obs, *_ = env.step({a: 0 for a in obs})
        steps += 1
    assert steps == 8
    assert corral.make("pettingzoo/classic/tictactoe_v3").max_episode_steps is None
