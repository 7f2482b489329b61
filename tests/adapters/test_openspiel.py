"""OpenSpiel adapter: played in lockstep with raw pyspiel states, seeding, bad actions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import corral
from corral.adapters.openspiel import OpenSpielEnv

pyspiel = pytest.importorskip("pyspiel")

DIFFERENTIAL_GAMES = [
    ("tic_tac_toe", {}),
    ("kuhn_poker", {}),
    ("leduc_poker", {}),
    ("connect_four", {}),
    ("goofspiel", {"num_cards": 4}),
    ("matrix_pd", {}),
    # rewards during the episode: one player; simultaneous moves with chance nodes
    ("cliff_walking", {"horizon": 20}),
    ("coop_box_pushing", {"horizon": 20}),
]


def load(name: str, params: dict[str, Any]) -> Any:
    return pyspiel.load_game(name, params) if params else pyspiel.load_game(name)


def raw_tensor(state: Any, player: int) -> np.ndarray:
    game = state.get_game()
    if game.get_type().provides_information_state_tensor:
        values, shape = (
            state.information_state_tensor(player),
            game.information_state_tensor_shape(),
        )
    else:
        values, shape = state.observation_tensor(player), game.observation_tensor_shape()
    return np.asarray(values, dtype=np.float32).reshape(shape)


def raw_acting(state: Any) -> list[int]:
    if state.is_terminal():
        return []
    if state.is_simultaneous_node():
        return list(range(state.num_players()))
    return [state.current_player()]


def catch_up_chance(raw: Any, adapter_state: Any) -> None:
    """Apply to ``raw`` the chance outcomes the adapter drew (read from its history)."""
    history = adapter_state.full_history()
    while raw.is_chance_node():
        entry = history[len(raw.history())]
        assert entry.player == pyspiel.PlayerId.CHANCE
        assert entry.action in [outcome for outcome, _ in raw.chance_outcomes()]
        raw.apply_action(entry.action)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("name", "params"), DIFFERENTIAL_GAMES, ids=[g for g, _ in DIFFERENTIAL_GAMES]
)
def test_matches_raw_pyspiel(name: str, params: dict[str, Any], seed: int) -> None:
    env = corral.make(f"openspiel/{name}", **params)
    raw = load(name, params).new_initial_state()
    choose = np.random.default_rng(100 + seed)
    agents = env.possible_agents
    totals = dict.fromkeys(agents, 0.0)

    obs, infos = env.reset(seed=seed)
    catch_up_chance(raw, env.spiel_state)
    while not raw.is_terminal():
        acting = raw_acting(raw)
        assert list(obs) == [agents[p] for p in acting]
        actions = {}
        for p in acting:
            agent = agents[p]
            np.testing.assert_array_equal(obs[agent], raw_tensor(raw, p))
            assert obs[agent].dtype == np.float32
            assert env.observation_space(agent).contains(obs[agent])
            mask = infos[agent]["action_mask"]
            assert mask.dtype == np.int8
            assert np.flatnonzero(mask).tolist() == sorted(raw.legal_actions(p))
            actions[agent] = int(choose.choice(raw.legal_actions(p)))
        if raw.is_simultaneous_node():
            raw.apply_actions([actions[a] for a in agents])
        else:
            raw.apply_action(actions[agents[acting[0]]])
        obs, rewards, terms, truncs, infos = env.step(actions)
        catch_up_chance(raw, env.spiel_state)
        assert set(rewards) == set(terms) == set(truncs) == set(agents)
        assert all(terms[a] == raw.is_terminal() and not truncs[a] for a in agents)
        for agent, reward in rewards.items():
            totals[agent] += reward

    assert env.agents == [] and obs == {}
    assert [totals[a] for a in agents] == raw.returns()
    for p, agent in enumerate(agents):
        np.testing.assert_array_equal(infos[agent]["final_obs"], raw_tensor(raw, p))
    assert env.spiel_state.history() == raw.history()


def test_rewards_arrive_during_the_episode_in_games_that_give_them() -> None:
    env = corral.make("openspiel/coop_box_pushing", horizon=10)
    choose = np.random.default_rng(0)
    obs, infos = env.reset(seed=0)
    nonzero_before_end = 0
    while env.agents:
        actions = {a: int(choose.choice(np.flatnonzero(infos[a]["action_mask"]))) for a in obs}
        obs, rewards, terms, _, infos = env.step(actions)
        if not any(terms.values()):
            nonzero_before_end += any(r != 0 for r in rewards.values())
    assert nonzero_before_end > 0


def play(env: Any, seed: int, policy_seed: int = 0) -> list[tuple[str, Any]]:
    choose = np.random.default_rng(policy_seed)
    obs, infos = env.reset(seed=seed)
    trajectory: list[tuple[str, Any]] = [("obs", obs)]
    while env.agents:
        actions = {a: int(choose.choice(np.flatnonzero(infos[a]["action_mask"]))) for a in obs}
        obs, rewards, _, _, infos = env.step(actions)
        trajectory += [("obs", obs), ("rewards", rewards)]
    return trajectory


def same(a: list[tuple[str, Any]], b: list[tuple[str, Any]]) -> bool:
    if len(a) != len(b):
        return False
    for (kind_a, item_a), (kind_b, item_b) in zip(a, b, strict=True):
        if kind_a != kind_b or list(item_a) != list(item_b):
            return False
        if not all(np.array_equal(item_a[k], item_b[k]) for k in item_a):
            return False
    return True


# negotiation and bridge_uncontested_bidding draw their chance from the game's own generator
@pytest.mark.parametrize(
    "game", ["kuhn_poker", "leduc_poker", "negotiation", "bridge_uncontested_bidding"]
)
def test_same_seed_same_trajectory_and_other_seeds_differ(game: str) -> None:
    env = corral.make(f"openspiel/{game}")
    first = play(env, seed=7)
    assert same(first, play(env, seed=7))
    assert same(first, play(corral.make(f"openspiel/{game}"), seed=7))
    assert not all(same(first, play(env, seed=s)) for s in range(8, 16))


def test_chance_outcomes_follow_their_probabilities() -> None:
    # 2048's first chance node places a 2 (probability 0.9) or a 4 (0.1) on one
    # of 16 cells; odd outcomes are the 4s.
    env = corral.make("openspiel/2048")
    fours = 0
    for seed in range(400):
        env.reset(seed=seed)
        fours += env.spiel_state.history()[0] % 2
    assert 20 <= fours <= 65


def test_user_loop_turn_based_game_shows_only_the_player_to_move() -> None:
    env = corral.make("openspiel/kuhn_poker")
    obs, infos = env.reset(seed=0)
    movers = []
    while env.agents:
        assert len(obs) == 1
        movers.append(next(iter(obs)))
        assert movers[-1] == f"player_{env.spiel_state.current_player()}"
        actions = {a: env.action_space(a).sample(mask=infos[a].get("action_mask")) for a in obs}
        obs, _rewards, terms, _truncs, infos = env.step(actions)
    assert movers[:2] == ["player_0", "player_1"]
    assert obs == {} and all(terms.values())


def test_user_loop_simultaneous_game_shows_every_player() -> None:
    env = corral.make("openspiel/goofspiel", num_cards=5)
    obs, infos = env.reset(seed=0)
    steps = 0
    while env.agents:
        assert sorted(obs) == ["player_0", "player_1"]
        actions = {a: env.action_space(a).sample(mask=infos[a].get("action_mask")) for a in obs}
        obs, _rewards, _terms, _truncs, infos = env.step(actions)
        steps += 1
    assert steps == 4  # the last card is played automatically
    assert obs == {} and sorted(infos) == ["player_0", "player_1"]


def bad_action_message(env: Any, actions: dict[str, Any]) -> str:
    with pytest.raises(corral.InvalidActionError) as err:
        env.step(actions)
    return str(err.value)


def test_bad_actions_in_a_turn_based_game_raise_and_leave_env_usable() -> None:
    env = corral.make("openspiel/tic_tac_toe")
    obs, _ = env.reset(seed=0)
    env.step({"player_0": 4})
    history = env.spiel_state.history()
    for actions, needle in [
        ({"player_1": 9}, "'player_1'"),  # out of range
        ({"player_1": 4}, "'player_1'"),  # cell taken: masked
        ({"player_0": 0}, "'player_0'"),  # not its turn
        ({}, "'player_1'"),  # missing
        ({"player_1": 1.5}, "'player_1'"),  # not an integer
    ]:
        message = bad_action_message(env, actions)
        assert needle in message and "step 1" in message
        assert env.spiel_state.history() == history
    obs, _rewards, *_ = env.step({"player_1": 0})
    assert list(obs) == ["player_0"] and env.spiel_state.history() == [4, 0]


def test_bad_actions_in_a_simultaneous_game_raise_and_leave_env_usable() -> None:
    env = corral.make("openspiel/goofspiel", num_cards=4)
    env.reset(seed=0)
    env.step({"player_0": 0, "player_1": 3})
    history = env.spiel_state.history()
    for actions, needle in [
        ({"player_0": 1}, "'player_1'"),  # missing
        ({"player_0": 1, "player_1": 3}, "'player_1'"),  # card already played
        ({"player_0": 4, "player_1": 1}, "'player_0'"),  # out of range
    ]:
        message = bad_action_message(env, actions)
        assert needle in message and "step 1" in message
        assert env.spiel_state.history() == history
    obs, *_ = env.step({"player_0": 1, "player_1": 1})
    assert sorted(obs) == ["player_0", "player_1"]


def test_step_after_the_end_raises_episode_over() -> None:
    env = corral.make("openspiel/matrix_rps")
    env.reset(seed=0)
    env.step({"player_0": 0, "player_1": 1})
    with pytest.raises(corral.EpisodeOverError):
        env.step({"player_0": 0, "player_1": 1})


def test_raw_game_is_adapted_and_parameters_reach_the_game() -> None:
    env = corral.adapt(pyspiel.load_game("kuhn_poker"))
    assert isinstance(env, OpenSpielEnv) and env.possible_agents == ["player_0", "player_1"]
    three = corral.make("openspiel/kuhn_poker", players=3)
    assert three.possible_agents == ["player_0", "player_1", "player_2"]
    assert three.game.get_parameters()["players"] == 3
    with pytest.raises(TypeError):
        OpenSpielEnv(pyspiel.load_game("kuhn_poker"), players=3)
    with pytest.raises(ValueError, match=r"holds its parameters already"):
        corral.make("openspiel/kuhn_poker(players=3)", players=4)


def test_listed_and_namespace_ids() -> None:
    assert "openspiel/leduc_poker" in corral.registered_ids("openspiel")
    env = corral.make("openspiel/oshi_zumo")  # not listed: built through the namespace
    assert env.game.get_type().short_name == "oshi_zumo"
    obs, _ = env.reset(seed=0)
    assert sorted(obs) == ["player_0", "player_1"]


def test_render_ansi_shows_the_state() -> None:
    env = corral.make("openspiel/tic_tac_toe", render_mode="ansi")
    env.reset(seed=0)
    env.step({"player_0": 0})
    assert env.render() == str(env.spiel_state)
    assert "x" in env.render()


def test_episode_limit_is_the_games_max_length() -> None:
    env = corral.make("openspiel/kuhn_poker")
    assert env.max_episode_steps == 3 == env.game.max_game_length()


@pytest.mark.parametrize(
    ("game", "zero_sum", "lockstep"),
    [("kuhn_poker", True, False), ("matrix_rps", True, None), ("matrix_pd", False, None)],
)
def test_metadata_says_from_the_game_type_whether_it_is_zero_sum_and_turn_based(
    game: str, zero_sum: bool, lockstep: bool | None
) -> None:
    env = corral.make(f"openspiel/{game}")
    assert env.metadata["zero_sum"] is zero_sum and env.metadata["name"] == game
    assert env.metadata.get("lockstep") is lockstep  # sequential games of several players: False
