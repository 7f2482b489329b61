"""mdp/...: small MDPs and matrix games whose optimal values are verified independently."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import corral
from corral.envs.mdp import MatrixGame, TabularMDP

# The optimal returns the docstrings promise; the tests below derive them again.
DOCUMENTED = {
    "mdp/one_round_dmdp": 1.0,
    "mdp/two_round_dmdp": 3.0,
    "mdp/one_round_nmdp": 0.75,
    "mdp/two_round_nmdp": 1.8,
    "mdp/multi_round_nmdp": 3.456,
    "mdp/climbing": 11.0,
    "mdp/penalty": 10.0,
    "mdp/matching_pennies": 0.0,
}
TABULAR = [i for i in DOCUMENTED if "round" in i]
DETERMINISTIC = ["mdp/one_round_dmdp", "mdp/two_round_dmdp"]
MATRIX = [i for i in DOCUMENTED if i not in TABULAR]


def test_every_mdp_id_is_covered() -> None:
    assert set(corral.registered_ids("mdp")) == set(DOCUMENTED)


@pytest.mark.parametrize("env_id", list(DOCUMENTED))
def test_user_loop_and_documented_optimum(env_id: str) -> None:
    env = corral.make(env_id)
    for seed in range(5):
        obs, infos = env.reset(seed=seed)
        returns = dict.fromkeys(env.possible_agents, 0.0)
        while env.agents:
            for agent in obs:
                assert env.observation_space(agent).contains(obs[agent])
            alive = list(env.agents)
            actions = {a: env.action_space(a).sample(mask=infos[a].get("action_mask")) for a in obs}
            obs, rewards, terms, truncs, infos = env.step(actions)
            assert set(rewards) == set(terms) == set(alive)
            for agent in alive:
                returns[agent] += rewards[agent]
        assert obs == {} and all(terms.values()) and not any(truncs.values())
        assert all("final_obs" in infos[a] for a in alive)
    assert set(env.optimal_return) == set(env.possible_agents)
    assert env.optimal_return[env.possible_agents[0]] == pytest.approx(DOCUMENTED[env_id])


def deterministic_policies(env: TabularMDP):
    live = np.flatnonzero(~env.terminal)
    for choice in itertools.product(range(env.action_space("agent_0").n), repeat=len(live)):
        policy = np.zeros(len(env.terminal), dtype=int)
        policy[live] = choice
        yield policy


def expected_return(env: TabularMDP, policy: np.ndarray) -> float:
    """Exact expected return by pushing the state distribution forward through the tables."""
    occupancy, total = env.initial.copy(), 0.0
    for _ in range(len(occupancy)):
        step = np.zeros_like(occupancy)
        for state in np.flatnonzero((occupancy > 0) & ~env.terminal):
            p = env.transitions[state, policy[state]]
            total += occupancy[state] * p @ env.rewards[state, policy[state]]
            step += occupancy[state] * p
        occupancy = step
    return total


@pytest.mark.parametrize("env_id", TABULAR)
def test_optimal_return_is_the_best_policy_value(env_id: str) -> None:
    env = corral.make(env_id)
    values = [expected_return(env, policy) for policy in deterministic_policies(env)]
    assert max(values) == pytest.approx(env.optimal_return["agent_0"])
    assert max(values) == pytest.approx(DOCUMENTED[env_id])
    runner_up = max(v for v in values if v < max(values) - 1e-9)
    assert runner_up < max(values) - 0.1, "a learner can tell the optimum apart"


def run_policy(env, policy: np.ndarray, seed: int | None) -> float:
    obs, _ = env.reset(seed=seed)
    total = 0.0
    while env.agents:
        state = int(np.argmax(obs["agent_0"]))
        obs, rewards, *_ = env.step({"agent_0": int(policy[state])})
        total += rewards["agent_0"]
    return total


@pytest.mark.parametrize("env_id", DETERMINISTIC)
def test_deterministic_optimum_by_brute_force_with_the_env(env_id: str) -> None:
    env = corral.make(env_id)
    best = max(run_policy(env, policy, seed=0) for policy in deterministic_policies(env))
    assert best == env.optimal_return["agent_0"] == DOCUMENTED[env_id]


@pytest.mark.parametrize("env_id", TABULAR)
def test_env_samples_match_the_tables(env_id: str) -> None:
    env = corral.make(env_id)
    policy = max(deterministic_policies(env), key=lambda p: expected_return(env, p))
    env.reset(seed=0)
    returns = [run_policy(env, policy, seed=None) for _ in range(3000)]
    stderr = max(np.std(returns) / np.sqrt(len(returns)), 1e-9)
    assert abs(np.mean(returns) - env.optimal_return["agent_0"]) < 4 * stderr + 1e-9


def joint_payoffs(env) -> dict[tuple[int, ...], dict[str, float]]:
    """Each joint action's rewards, by playing it in the env."""
    sizes = [env.action_space(a).n for a in env.possible_agents]
    table = {}
    for joint in itertools.product(*map(range, sizes)):
        env.reset()
        _, rewards, *_ = env.step(dict(zip(env.possible_agents, joint, strict=True)))
        table[joint] = rewards
    return table


@pytest.mark.parametrize(("env_id", "best_joint"), [("mdp/climbing", [(0, 0)]),
                                                    ("mdp/penalty", [(0, 0), (2, 2)])])  # fmt: skip
def test_cooperative_optimum_by_enumeration(env_id: str, best_joint) -> None:
    env = corral.make(env_id)
    table = joint_payoffs(env)
    assert all(r["player_0"] == r["player_1"] for r in table.values()), "common payoff"
    best = max(r["player_0"] for r in table.values())
    assert [j for j, r in table.items() if r["player_0"] == best] == best_joint
    assert env.optimal_return == {"player_0": best, "player_1": best}


def test_penalty_parameter() -> None:
    table = joint_payoffs(corral.make("mdp/penalty", k=-7.0))
    assert table[0, 2]["player_0"] == table[2, 0]["player_1"] == -7.0
    with pytest.raises(ValueError, match="k must be <= 0"):
        corral.make("mdp/penalty", k=1.0)


def test_matching_pennies_value_is_guaranteed_by_uniform_play() -> None:
    env = corral.make("mdp/matching_pennies")
    table = joint_payoffs(env)
    assert all(r["player_0"] == -r["player_1"] for r in table.values()), "zero-sum"
    # Uniform play guarantees each player the value against every reply, so it is the minimax value.
    for reply in range(2):
        row = np.mean([table[mine, reply]["player_0"] for mine in range(2)])
        col = np.mean([table[reply, mine]["player_1"] for mine in range(2)])
        assert row >= env.optimal_return["player_0"] and col >= env.optimal_return["player_1"]
    assert env.optimal_return == {"player_0": 0.0, "player_1": 0.0}


def test_tabular_mdp_rejects_bad_tables() -> None:
    loop = {(0, 0): [(1.0, 1, 0.0)], (1, 0): [(1.0, 0, 0.0)]}
    with pytest.raises(ValueError, match="cycle"):
        TabularMDP.from_outcomes(loop, 3, 1, [2])
    with pytest.raises(ValueError, match="probability distribution"):
        TabularMDP.from_outcomes({(0, 0): [(0.5, 1, 0.0)]}, 2, 1, [1])
    with pytest.raises(ValueError, match="shape"):
        TabularMDP(np.zeros((2, 2)), np.zeros((2, 2)), [1])
    with pytest.raises(ValueError, match="two rewards"):
        TabularMDP.from_outcomes({(0, 0): [(0.5, 1, 1.0), (0.5, 1, 2.0)]}, 2, 1, [1])
    with pytest.raises(ValueError, match="cannot start in a terminal"):
        TabularMDP.from_outcomes({(0, 0): [(1.0, 1, 0.0)]}, 2, 1, [1], initial_state=1)
    with pytest.raises(ValueError, match="payoffs"):
        MatrixGame(np.zeros((2, 3)))


def test_optimal_return_of_other_games() -> None:
    battle_of_sexes = [[[2, 0], [0, 1]], [[1, 0], [0, 2]]]
    assert MatrixGame(battle_of_sexes).optimal_return is None
    assert MatrixGame(battle_of_sexes, value=[2 / 3, 2 / 3]).optimal_return == {
        "player_0": 2 / 3,
        "player_1": 2 / 3,
    }
    three_players = np.ones((3, 2, 2, 2)) * np.arange(8).reshape(2, 2, 2)
    assert MatrixGame(three_players).optimal_return == dict.fromkeys(
        ["player_0", "player_1", "player_2"], 7.0
    )


@pytest.mark.parametrize("env_id", ["mdp/two_round_dmdp", "mdp/climbing"])
def test_bad_actions_raise_and_leave_env_usable(env_id: str) -> None:
    env = corral.make(env_id)
    obs, _ = env.reset(seed=0)
    agent = next(iter(obs))
    n = env.action_space(agent).n
    with pytest.raises(corral.InvalidActionError, match=f"step 0: agent '{agent}'"):
        env.step({**dict.fromkeys(obs, 0), agent: n})
    with pytest.raises(corral.InvalidActionError, match="must act"):
        env.step({})
    _, rewards, *_ = env.step(dict.fromkeys(obs, 0))
    assert rewards[agent] == {"mdp/two_round_dmdp": 0.0, "mdp/climbing": 11.0}[env_id]


def test_seeded_stochastic_episodes_repeat() -> None:
    env = corral.make("mdp/multi_round_nmdp")

    def returns(seed: int) -> list[float]:
        env.reset(seed=seed)
        return [run_policy(env, np.ones(6, dtype=int), seed=None) for _ in range(50)]

    assert returns(1) == returns(1) and returns(1) != returns(2)


def test_render_ansi() -> None:
    env = corral.make("mdp/two_round_dmdp", render_mode="ansi")
    env.reset(seed=0)
    env.step({"agent_0": 1})
    assert env.render() == "step 1: state 2\n"
    game = corral.make("mdp/climbing", render_mode="ansi")
    game.reset()
    game.step({"player_0": 0, "player_1": 1})
    assert game.render() == "joint action [0, 1]: payoffs [-30.0, -30.0]\n"


@pytest.mark.parametrize("env_id", ["mdp/two_round_nmdp", "mdp/climbing"])
def test_the_batched_envs_say_they_cannot_render_and_point_to_the_dict_env(env_id: str) -> None:
    """They have no render(): they listed the dict env's render modes, so a vector env of them
    was built with render_mode="ansi" and failed at its first render()."""
    with corral.make_vec(env_id, 2, seed=0) as venv:
        assert venv.metadata["render_modes"] == []
    with pytest.raises(ValueError, match=r"native=False"):
        corral.make_vec(env_id, 2, seed=0, env_kwargs={"render_mode": "ansi"})
    with corral.make_vec(env_id, 2, seed=0, native=False, env_kwargs={"render_mode": "ansi"}) as v:
        v.reset(seed=0)
        assert all(isinstance(text, str) and text for text in v.render())
