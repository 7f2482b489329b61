"""corral/rps (turn-based) and corral/rps4 (asynchronous)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import corral
from corral.envs.rps import RockPaperScissors
from corral.envs.rps4 import RockPaperScissors4

ROCK, PAPER, SCISSORS = 0, 1, 2


def play_random(env, seed: int) -> list[tuple]:
    """The user loop; checks the contract at every step and returns the steps taken."""
    obs, infos = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    steps = []
    while env.agents:
        alive = list(env.agents)
        assert set(obs) <= set(alive) and set(infos) >= set(obs)
        for agent, o in obs.items():
            assert env.observation_space(agent).contains(o)
        actions = {a: int(rng.integers(env.action_space(a).n)) for a in obs}
        obs, rewards, terms, truncs, infos = env.step(actions)
        assert set(rewards) == set(terms) == set(truncs) == set(alive)
        assert sum(rewards.values()) == 0.0
        ended = {a for a in alive if terms[a] or truncs[a]}
        assert not ended & set(obs) and not ended & set(env.agents)
        for agent in ended:
            assert env.observation_space(agent).contains(infos[agent]["final_obs"])
        steps.append((sorted(actions), rewards))
    assert obs == {}
    return steps


@pytest.mark.parametrize("seed", range(5))
def test_rps_user_loop(seed: int) -> None:
    env = corral.make("corral/rps", num_rounds=4)
    steps = play_random(env, seed)
    assert [acting for acting, _ in steps] == [["player_0"], ["player_1"]] * 4
    assert all(rewards == {"player_0": 0.0, "player_1": 0.0} for _, rewards in steps[::2])


def test_rps_reward_arrives_with_player_1_move() -> None:
    env = corral.make("corral/rps")
    env.reset(seed=0)
    rounds = [(ROCK, SCISSORS, 1.0), (ROCK, PAPER, -1.0), (PAPER, PAPER, 0.0)]
    for k, (move_0, move_1, reward_0) in enumerate(rounds):
        obs, rewards, terms, truncs, infos = env.step({"player_0": move_0})
        assert list(obs) == ["player_1"]
        assert rewards == {"player_0": 0.0, "player_1": 0.0}
        obs, rewards, terms, truncs, infos = env.step({"player_1": move_1})
        assert rewards == {"player_0": reward_0, "player_1": -reward_0}
        last = k == len(rounds) - 1
        assert terms == {"player_0": last, "player_1": last}
        assert truncs == {"player_0": False, "player_1": False}
    assert env.agents == [] and obs == {}
    assert set(infos) == {"player_0", "player_1"}
    np.testing.assert_array_equal(infos["player_0"]["final_obs"], [0, 1, 0, 0, 1, 0, 1])


def test_rps_observations_encode_previous_round() -> None:
    env = RockPaperScissors(num_rounds=2)
    obs, _ = env.reset()
    np.testing.assert_array_equal(obs["player_0"], np.zeros(7))
    env.step({"player_0": ROCK})
    obs, *_ = env.step({"player_1": SCISSORS})
    np.testing.assert_array_equal(obs["player_0"], [1, 0, 0, 0, 0, 1, 0.5])
    obs, *_ = env.step({"player_0": PAPER})
    np.testing.assert_array_equal(obs["player_1"], [0, 0, 1, 1, 0, 0, 0.5])


def test_rps_player_1_does_not_see_the_current_move() -> None:
    seen, states = [], []
    for move in (ROCK, PAPER, SCISSORS):
        env = RockPaperScissors()
        env.reset(seed=0)
        obs, *_ = env.step({"player_0": move})
        seen.append(obs["player_1"])
        states.append(env.state())
    assert all(np.array_equal(seen[0], o) for o in seen[1:])
    # The global state, for centralised critics, does hold the pending move.
    assert len({s.tobytes() for s in states}) == 3
    assert all(env.state_space.contains(s) for s in states)


@pytest.mark.parametrize(
    ("actions", "needle"),
    [
        ({}, "'player_0' must act"),
        ({"player_1": 0}, "'player_1', which is not acting"),
        ({"player_0": 0, "player_1": 0}, "'player_1', which is not acting"),
        ({"player_0": 3}, "'player_0'"),
        ({"player_0": -1}, "'player_0'"),
        ({"player_0": 1.5}, "'player_0'"),
        ({"player_0": "rock"}, "'player_0'"),
        ([0], "dict"),
    ],
)
def test_rps_bad_actions_raise_and_leave_env_usable(actions, needle: str) -> None:
    env = corral.make("corral/rps", num_rounds=1)
    env.reset(seed=0)
    with pytest.raises(corral.InvalidActionError, match="step 0") as err:
        env.step(actions)
    assert needle in str(err.value)
    env.step({"player_0": ROCK})
    _, rewards, terms, *_ = env.step({"player_1": SCISSORS})
    assert rewards == {"player_0": 1.0, "player_1": -1.0} and all(terms.values())


def test_rps_error_names_the_step() -> None:
    env = RockPaperScissors()
    env.reset()
    env.step({"player_0": ROCK})
    with pytest.raises(corral.InvalidActionError, match="step 1: agent 'player_1'"):
        env.step({"player_1": 7})


def test_rps_step_outside_an_episode_raises() -> None:
    env = RockPaperScissors(num_rounds=1)
    with pytest.raises(corral.EpisodeOverError):
        env.step({"player_0": 0})
    env.reset()
    env.step({"player_0": 0})
    env.step({"player_1": 0})
    with pytest.raises(corral.EpisodeOverError):
        env.step({"player_0": 0})


def test_rps_render_and_arguments() -> None:
    env = corral.make("corral/rps", render_mode="ansi")
    env.reset()
    env.step({"player_0": ROCK})
    env.step({"player_1": PAPER})
    text = env.render()
    assert "round 1/3" in text and "rock vs paper" in text and "player_1 wins" in text
    assert RockPaperScissors().render() is None
    with pytest.raises(ValueError, match="num_rounds"):
        RockPaperScissors(num_rounds=0)
    with pytest.raises(ValueError, match="render_mode"):
        RockPaperScissors(render_mode="human")


RPS4_CYCLE = [["player_0", "player_1"], ["player_2", "player_3"], ["player_2", "player_3"]]


@pytest.mark.parametrize("seed", range(5))
def test_rps4_user_loop_follows_the_schedule(seed: int) -> None:
    env = corral.make("corral/rps4", num_cycles=3)
    steps = play_random(env, seed)
    assert [acting for acting, _ in steps] == RPS4_CYCLE * 3
    for acting, rewards in steps:
        idle = set(rewards) - set(acting)
        assert all(rewards[a] == 0.0 for a in idle)
        assert rewards[acting[0]] == -rewards[acting[1]]


def test_rps4_exact_schedule_and_rewards() -> None:
    env = RockPaperScissors4(num_cycles=2)
    obs, infos = env.reset(seed=0)
    expected_keys = [*RPS4_CYCLE, *RPS4_CYCLE, []]
    for k in range(6):
        assert list(obs) == expected_keys[k] and list(infos) == expected_keys[k]
        first, second = obs
        obs, rewards, terms, truncs, infos = env.step({first: PAPER, second: ROCK})
        assert rewards == {
            a: (1.0 if a == first else -1.0 if a == second else 0.0) for a in rewards
        }
        assert set(rewards) == set(env.possible_agents)
        assert all(terms[a] == (k == 5) for a in terms) and not any(truncs.values())
    assert list(obs) == expected_keys[6] and env.agents == []
    assert set(infos) == set(env.possible_agents)
    assert all("final_obs" in info for info in infos.values())


def test_rps4_observation_tracks_own_pair() -> None:
    env = RockPaperScissors4(num_cycles=1)
    env.reset()
    obs, *_ = env.step({"player_0": PAPER, "player_1": ROCK})
    np.testing.assert_allclose(obs["player_2"], [0, 0, 0, 0, 0, 0, 1 / 3], rtol=1e-6)
    obs, *_ = env.step({"player_2": SCISSORS, "player_3": ROCK})
    np.testing.assert_allclose(obs["player_3"], [1, 0, 0, 0, 0, 1, 2 / 3], rtol=1e-6)
    _, _, _, _, infos = env.step({"player_2": ROCK, "player_3": ROCK})
    np.testing.assert_array_equal(infos["player_1"]["final_obs"], [1, 0, 0, 0, 1, 0, 1])
    np.testing.assert_array_equal(env.state(), [0, 1, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1])


def test_rps4_bad_actions_raise_and_leave_env_usable() -> None:
    env = corral.make("corral/rps4")
    env.reset()
    env.step({"player_0": ROCK, "player_1": ROCK})
    with pytest.raises(corral.InvalidActionError, match=r"step 1: .*'player_0', which is not"):
        env.step({"player_0": ROCK, "player_2": ROCK})
    with pytest.raises(corral.InvalidActionError, match="step 1: agent 'player_3' must act"):
        env.step({"player_2": ROCK})
    with pytest.raises(corral.InvalidActionError, match="step 1: agent 'player_3'"):
        env.step({"player_2": ROCK, "player_3": 3})
    obs, rewards, *_ = env.step({"player_2": ROCK, "player_3": PAPER})
    assert list(obs) == ["player_2", "player_3"] and rewards["player_3"] == 1.0


def test_rgb_array_frames_show_moves_results_and_turns() -> None:
    from corral.envs.rps import GAP, MOVE_COLOURS, NO_MOVE, PANEL, RESULT_COLOURS, TO_MOVE

    def panel(frame: np.ndarray, k: int, dy: int = PANEL // 2) -> tuple[int, ...]:
        """The colour in player ``k``'s panel, ``dy`` pixels down (its centre by default)."""
        return tuple(int(v) for v in frame[GAP + dy, GAP + k * (PANEL + GAP) + PANEL // 2])

    def turn_bar(frame: np.ndarray, k: int) -> bool:
        return panel(frame, k, PANEL + GAP) == TO_MOVE

    env = corral.make("corral/rps", render_mode="rgb_array", num_rounds=2)
    assert "rgb_array" in env.metadata["render_modes"]
    env.reset()
    start = env.render()
    assert start.shape == (108, 152, 3) and start.dtype == np.uint8
    assert panel(start, 0) == panel(start, 1) == NO_MOVE
    assert turn_bar(start, 0) and not turn_bar(start, 1)
    env.step({"player_0": ROCK})
    assert not turn_bar(env.render(), 0) and turn_bar(env.render(), 1)
    env.step({"player_1": PAPER})
    frame = env.render()
    assert (panel(frame, 0), panel(frame, 1)) == (MOVE_COLOURS[ROCK], MOVE_COLOURS[PAPER])
    assert panel(frame, 0, 1) == RESULT_COLOURS[-1.0] and panel(frame, 1, 1) == RESULT_COLOURS[1.0]

    env4 = corral.make("corral/rps4", render_mode="rgb_array", num_cycles=1)
    obs, _ = env4.reset()
    frames = [env4.render()]
    while env4.agents:
        obs, *_ = env4.step(dict.fromkeys(obs, SCISSORS))
        frames.append(env4.render())
    assert frames[0].shape == (108, 4 * (PANEL + GAP) + GAP, 3)
    assert [turn_bar(frames[0], k) for k in range(4)] == [True, True, False, False]
    assert [turn_bar(frames[1], k) for k in range(4)] == [False, False, True, True]
    assert panel(frames[-1], 3) == MOVE_COLOURS[SCISSORS]
    assert panel(frames[-1], 3, 1) == RESULT_COLOURS[0.0]
    assert all((a != b).any() for a, b in itertools.pairwise(frames))
