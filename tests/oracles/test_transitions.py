"""Transition assembly, checked against transitions worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from corral.vector import make_vec
from oracles.transitions import TransitionAssembler

ROCK, PAPER, SCISSORS = 0, 1, 2


def _play(venv, moves):
    """Step ``venv`` (1 env) with ``moves[k]`` for the single acting agent; collect transitions."""
    assembler = TransitionAssembler(venv)
    batch = venv.reset(seed=0)
    collected = []
    for move in moves:
        actions = {g: np.full((1, len(a)), move, dtype=np.int64) for g, a in venv.groups.items()}
        assembler.act(batch, actions)
        batch = venv.step(actions)
        for g, t in assembler.observe(batch).items():
            for k in range(len(t["reward"])):
                collected.append({name: value[k] for name, value in t.items()} | {"group": g})
    return collected


def test_rps_first_movers_reward_is_credited_to_its_own_move() -> None:
    venv = make_vec("corral/rps", 1, env_kwargs={"num_rounds": 2})
    # Round 1: player_0 rock, player_1 scissors (player_0 wins). Round 2: paper, paper.
    got = _play(venv, [ROCK, SCISSORS, PAPER, PAPER])
    venv.close()
    summary = [
        (venv.groups["player"][t["agent"]], int(t["action"]), t["reward"], bool(t["terminated"]))
        for t in got
    ]
    assert summary == [
        ("player_0", ROCK, 1.0, False),  # completes when player_0 must act again
        ("player_1", SCISSORS, -1.0, False),  # completes at player_1's next turn
        ("player_0", PAPER, 0.0, True),
        ("player_1", PAPER, 0.0, True),
    ]


def test_rps_next_observation_is_the_agents_own() -> None:
    venv = make_vec("corral/rps", 1, env_kwargs={"num_rounds": 2})
    got = _play(venv, [ROCK, SCISSORS, PAPER, PAPER])
    first = got[0]
    obs_space = venv.observation_space("player")
    assert first["next_obs"].shape == obs_space.shape
    assert not np.array_equal(first["obs"], first["next_obs"])
    last_p0, last_p1 = got[2], got[3]
    assert last_p0["truncated"] == last_p1["truncated"] == False  # noqa: E712
    venv.close()


def test_rps4_idle_agents_wait_for_their_next_turn() -> None:
    """Players 0/1 play one round, then 2/3 play two: 0's transition spans three steps."""
    venv = make_vec("corral/rps4", 1, env_kwargs={"num_cycles": 2})
    assembler = TransitionAssembler(venv)
    batch = venv.reset(seed=0)
    agents = venv.groups["player"]
    completed = []
    # step 1: players 0/1 (rock vs scissors: 0 wins); steps 2-3: players 2/3; step 4: 0/1 again.
    plan = [[ROCK, SCISSORS, 0, 0], [0, 0, PAPER, ROCK], [0, 0, ROCK, ROCK], [PAPER, PAPER, 0, 0]]
    for row in plan:
        actions = {"player": np.array([row], dtype=np.int64)}
        assembler.act(batch, actions)
        batch = venv.step(actions)
        t = assembler.observe(batch).get("player")
        completed.append(
            []
            if t is None
            else [(agents[a], float(r)) for a, r in zip(t["agent"], t["reward"], strict=True)]
        )
    venv.close()
    assert completed[0] == []  # 0/1 wait for their next round
    assert completed[1] == [("player_2", 1.0), ("player_3", -1.0)]  # 2/3 act again next step
    # 0/1 must act again at step 4: their round-1 reward completes their transitions now.
    assert completed[2] == [("player_0", 1.0), ("player_1", -1.0)]
    # 2/3's second round (rock vs rock) completes when they must act again, after step 4.
    assert completed[3] == [("player_2", 0.0), ("player_3", 0.0)]


def _batch(reward, terminated, truncated, acting, done, obs, final_obs, alive=None):
    as_array = np.array
    return SimpleNamespace(
        reward={"a": as_array([reward], dtype=float)},
        terminated={"a": as_array([terminated])},
        truncated={"a": as_array([truncated])},
        acting={"a": as_array([acting])},
        alive={"a": as_array([alive if alive is not None else acting])},
        done=as_array([done]),
        obs={"a": as_array([obs], dtype=np.float32)[..., None]},
        final_obs={"a": as_array([final_obs], dtype=np.float32)[..., None]},
        state=None,
        action_mask={},
    )


@pytest.fixture
def two_agents():
    venv = SimpleNamespace(num_envs=1, groups={"a": ("a_0", "a_1")})
    assembler = TransitionAssembler(venv)
    first = _batch([0, 0], [False, False], [False, False], [True, True], False, [1, 2], [0, 0])
    assembler.act(first, {"a": np.array([[3, 4]])})
    return assembler


def test_an_agent_that_dies_mid_episode_ends_with_its_final_observation(two_agents) -> None:
    # a_1 is caught: terminated, no longer acting; a_0 acts on. The runner writes the
    # dead agent's final observation into its obs row.
    died = _batch([0.5, -1], [False, True], [False, False], [True, False], False, [5, 6], [0, 0])
    t = two_agents.observe(died)["a"]
    assert t["agent"].tolist() == [0, 1]
    assert t["reward"].tolist() == [0.5, -1.0]
    assert t["terminated"].tolist() == [False, True]
    assert t["next_obs"][:, 0].tolist() == [5.0, 6.0]
    assert t["action"].tolist() == [3, 4]
    assert t["next_acting"].tolist() == [True, False]
    # a_1 is gone: later rewards are not credited to it.
    two_agents.act(died, {"a": np.array([[7, 0]])})
    later = _batch([1, 9], [False, False], [False, False], [True, False], False, [8, 6], [0, 0])
    t = two_agents.observe(later)["a"]
    assert t["agent"].tolist() == [0]
    assert t["reward"].tolist() == [1.0]


def test_truncation_bootstraps_from_final_obs_and_termination_is_kept(two_agents) -> None:
    # The env is done: a_0 truncated, a_1 terminated; obs already holds the next episode.
    end = _batch([1, 2], [False, True], [True, False], [True, True], True, [100, 100], [5, 6])
    t = two_agents.observe(end)["a"]
    assert t["truncated"].tolist() == [True, False]
    assert t["terminated"].tolist() == [False, True]
    assert t["next_obs"][:, 0].tolist() == [5.0, 6.0]  # the old episode's, not the new one's
    assert t["next_acting"].tolist() == [False, False]


def test_rewards_accumulate_until_the_agent_acts_again(two_agents) -> None:
    wait = _batch([1, 2], [False, False], [False, False], [False, False], False, [1, 2], [0, 0])
    assert two_agents.observe(wait) == {}
    again = _batch([3, 4], [False, False], [False, False], [True, False], False, [9, 9], [0, 0])
    t = two_agents.observe(again)["a"]
    assert t["agent"].tolist() == [0]
    assert t["reward"].tolist() == [4.0]
    final = _batch([0, 5], [True, True], [False, False], [False, False], True, [0, 0], [1, 1])
    t = two_agents.observe(final)["a"]
    assert t["agent"].tolist() == [1]
    assert t["reward"].tolist() == [11.0]  # 2 + 4 + 5, all after a_1's single action


def test_rows_ending_an_episode_allow_every_next_action() -> None:
    """The new episode's mask must not leak into a truncated row's bootstrap."""
    venv = make_vec("corral/tag", 2, seed=0, env_kwargs={"max_cycles": 3})
    assembler = TransitionAssembler(venv)
    batch = venv.reset()
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(6):
        actions = venv.sample_actions(batch, rng)
        assembler.act(batch, actions)
        batch = venv.step(actions)
        for t in assembler.observe(batch).values():
            done = batch.done[t["env"]]
            assert t["next_action_mask"][done].all()
            ended += int(done.sum())
    assert ended > 0
    venv.close()
