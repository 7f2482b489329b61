"""corral/memory: a cue shown at the first decision, to be named at the last."""

from __future__ import annotations

import numpy as np
import pytest

import corral
from corral.checks.env_checker import check_env
from corral.envs.memory import Memory


@pytest.mark.parametrize("env_id", ["corral/memory", "corral/memory-turns"])
def test_registered_ids_pass_the_conformance_checker(env_id: str) -> None:
    assert check_env(env_id).ok


def play(env: Memory, answers: dict[str, int], seed: int) -> tuple[list, dict[str, float]]:
    """One episode answering ``answers`` (every other action 0); the acting agents of each
    step with their observations, and each agent's return."""
    obs, _ = env.reset(seed=seed)
    steps, returns = [], dict.fromkeys(env.possible_agents, 0.0)
    while env.agents:
        steps.append({a: o.tolist() for a, o in obs.items()})
        obs, rewards, *_ = env.step({a: answers[a] for a in obs})
        for agent, reward in rewards.items():
            returns[agent] += reward
    return steps, returns


def test_the_cue_shows_first_the_query_last_and_blanks_between() -> None:
    env = Memory(num_agents=2, num_cues=3, delay=2)
    steps, _ = play(env, {"agent_0": 0, "agent_1": 0}, seed=1)
    cues = env._cues.tolist()
    first = [[float(k == cue) for k in range(3)] + [0.0] for cue in cues]
    assert steps == [
        {"agent_0": first[0], "agent_1": first[1]},
        {"agent_0": [0.0] * 4, "agent_1": [0.0] * 4},
        {"agent_0": [0.0] * 4, "agent_1": [0.0] * 4},
        {"agent_0": [0.0, 0.0, 0.0, 1.0], "agent_1": [0.0, 0.0, 0.0, 1.0]},
    ]


@pytest.mark.parametrize("turns", [False, True])
def test_only_the_right_answer_at_the_last_decision_pays(turns: bool) -> None:
    env = Memory(num_agents=2, num_cues=4, delay=1, turns=turns)
    env.reset(seed=3)
    cues = env._cues.tolist()
    right = {a: cue for a, cue in zip(env.possible_agents, cues, strict=True)}
    wrong = {a: (cue + 1) % 4 for a, cue in right.items()}
    assert play(env, right, seed=3)[1] == {"agent_0": 1.0, "agent_1": 1.0}
    assert play(env, wrong, seed=3)[1] == {"agent_0": 0.0, "agent_1": 0.0}


def test_taking_turns_one_agent_acts_a_step_and_sees_its_own_cue() -> None:
    env = Memory(num_agents=2, num_cues=2, delay=1, turns=True)
    steps, _ = play(env, {"agent_0": 0, "agent_1": 0}, seed=0)
    assert env.max_episode_steps == 6
    assert [list(s) for s in steps] == [["agent_0"], ["agent_1"]] * 3
    cues = env._cues.tolist()
    assert steps[0]["agent_0"][:2] == [float(k == cues[0]) for k in range(2)]
    assert steps[1]["agent_1"][:2] == [float(k == cues[1]) for k in range(2)]
    assert steps[4]["agent_0"] == steps[5]["agent_1"] == [0.0, 0.0, 1.0]


def test_guessing_wins_one_time_in_num_cues() -> None:
    env = Memory(num_agents=1, num_cues=4, delay=0)
    wins = [play(env, {"agent_0": 2}, seed=seed)[1]["agent_0"] for seed in range(400)]
    assert abs(np.mean(wins) - 0.25) < 0.07


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [({"num_agents": 0}, "num_agents"), ({"num_cues": 1}, "num_cues"), ({"delay": -1}, "delay")],
)
def test_bad_arguments_raise_naming_them(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        Memory(**kwargs)


def test_state_holds_every_cue_and_the_time() -> None:
    env = corral.make("corral/memory", num_agents=2, num_cues=2, delay=0)
    env.reset(seed=5)
    cues = env.unwrapped._cues.tolist()
    expected = [0.0] * 4 + [0.0]
    for i, cue in enumerate(cues):
        expected[2 * i + cue] = 1.0
    assert env.state().tolist() == expected
