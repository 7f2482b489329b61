"""DQN: masked double-DQN targets, legal acting, learning the small games, self-play."""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.q_settings import FAST_TABLES  # noqa: E402

import corral  # noqa: E402
from corral.algos.dqn import DQN, Config, double_q_target  # noqa: E402
from corral.algos.networks import as_input  # noqa: E402
from corral.algos.selfplay import SnapshotPool  # noqa: E402
from corral.data.rollouts import decision_rows  # noqa: E402
from corral.errors import UnsupportedEnvError  # noqa: E402
from corral.training.collector import Collector, evaluate  # noqa: E402
from corral.training.policy_map import MAIN  # noqa: E402
from corral.training.self_play import OPPONENT, self_play  # noqa: E402
from corral.training.selfplay_eval import evaluate_vs_random  # noqa: E402

TICTACTOE = "pettingzoo/classic/tictactoe_v3"
ROCK, PAPER = 0, 1

# Small tables learn fast with a big step size. gamma 1: optimal_return is undiscounted.
# huber_delta 10: with the usual 1, rewards spread over more than 2 (one_round_nmdp pays 2 or
# -0.5) leave a flat stretch of the loss around the mean, and the estimate stops anywhere on it.
FAST = Config(**FAST_TABLES)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _train(env_id: str, config: Config, env_steps: int, **vec_kwargs) -> tuple:
    venv = corral.make_vec(env_id, 8, seed=config.seed, **vec_kwargs)
    algo = DQN(venv, config)
    Collector(venv, algo, seed=config.seed).run(env_steps)
    return venv, algo


# -- targets -------------------------------------------------------------------------------


def test_double_q_target_takes_the_online_argmax_over_legal_actions_only() -> None:
    reward = torch.tensor([1.0, 1.0, 1.0, 1.0])
    terminated = torch.tensor([False, True, False, False])
    next_q = torch.tensor([[9.0, 1.0, 3.0], [9.0, 1.0, 3.0], [0.0, 2.0, 1.0], [0.0, 2.0, 1.0]])
    next_q_target = torch.tensor(
        [[100.0, 30.0, 20.0], [100.0, 30.0, 20.0], [7.0, 8.0, 9.0], [7.0, 8.0, 9.0]]
    )
    next_mask = torch.tensor(
        [[False, True, True], [False, True, True], [True, True, True], [False, False, False]]
    )
    got = double_q_target(reward, terminated, next_q, next_q_target, next_mask, gamma=0.5)
    # Row 0: the online net's best legal action is 2 (not the illegal 0), valued by the target
    # net (20, not its own legal max 30). Row 1 is terminal: no bootstrap. Row 2 is not
    # terminated (a truncated row): it bootstraps. Row 3 has no legal action: all count.
    assert got.tolist() == [1.0 + 0.5 * 20.0, 1.0, 1.0 + 0.5 * 8.0, 1.0 + 0.5 * 8.0]


def test_truncated_transitions_bootstrap_and_terminated_ones_do_not() -> None:
    venv = corral.make_vec("corral/rps", 1, seed=0)
    algo = DQN(venv, Config(gamma=0.9))
    next_obs = np.random.default_rng(0).random((3, 7)).astype(np.float32)
    t = {
        "reward": np.array([1.0, 1.0, -1.0]),
        "next_obs": next_obs,
        "terminated": np.array([True, False, False]),
        "truncated": np.array([False, True, False]),
        "next_action_mask": np.array([[1, 1, 1], [0, 1, 1], [1, 0, 0]], dtype=bool),
    }
    with torch.no_grad():
        online = algo.policy.q["player"](torch.as_tensor(next_obs))
        target = algo.target["player"](torch.as_tensor(next_obs))
    best_legal_of_row_1 = 1 + int(online[1, 1:].argmax())
    expected = [
        1.0,
        1.0 + 0.9 * float(target[1, best_legal_of_row_1]),
        -1.0 + 0.9 * float(target[2, 0]),
    ]
    assert algo.targets("player", t).tolist() == pytest.approx(expected, rel=1e-6)
    venv.close()


# -- acting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("explore", [True, False])
def test_no_illegal_action_is_ever_chosen_on_tictactoe(explore: bool) -> None:
    pytest.importorskip("pettingzoo")
    venv = corral.make_vec(TICTACTOE, 8, seed=0)
    algo = DQN(venv, Config(epsilon_start=0.5, epsilon_end=0.5))
    batch = venv.reset(seed=0)
    unmasked_illegal = 0
    for _ in range(150):
        actions, _ = algo.policy.act(batch, explore=explore)
        acting, mask = batch.acting["player"], batch.action_mask["player"]
        chosen = np.take_along_axis(mask, actions["player"][..., None], -1)[..., 0]
        assert chosen[acting].all()
        with torch.no_grad():
            raw = algo.policy.q["player"](
                as_input(batch.obs["player"], algo.observation_space["player"], "cpu")
            )
        raw_best = raw.argmax(-1).numpy()
        unmasked_illegal += int((~np.take_along_axis(mask, raw_best[..., None], -1))[acting].sum())
        batch = venv.step(actions)
    assert unmasked_illegal > 0  # without the mask the network would have chosen illegal moves
    venv.close()


@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_greedy_acting_draws_nothing_from_the_policys_generators(array: str) -> None:
    """Acting with epsilon 0 (greedy, or an exploring policy whose epsilon reached 0) has no
    coin to toss: neither generator moves, and the actions are the greedy ones."""
    venv = corral.make_vec("corral/rps", 4, seed=0, array=array)
    algo = DQN(venv, Config(epsilon_start=0.0, epsilon_end=0.0))
    policy = algo.policy
    batch = venv.reset(seed=0)
    before = policy.rng.bit_generator.state, policy.torch_rng.get_state()
    for explore in (False, True):
        actions, _ = policy.act(batch, explore=explore)
        for g, chosen in actions.items():
            greedy = policy.greedy(g, batch.obs[g], batch.action_mask[g])
            assert (np.asarray(chosen) == np.asarray(greedy)).all()
    assert policy.rng.bit_generator.state == before[0]
    assert torch.equal(policy.torch_rng.get_state(), before[1])
    venv.close()


def test_only_discrete_action_spaces_are_accepted() -> None:
    from gymnasium import spaces

    box = spaces.Box(-1.0, 1.0, (2,))
    venv = SimpleNamespace(
        groups={"agent": ("agent_0",)},
        num_envs=1,
        observation_space=lambda g: box,
        action_space=lambda g: box,
        state_space=None,
    )
    with pytest.raises(UnsupportedEnvError, match=r"Discrete action spaces.*'agent'"):
        DQN(venv)


def test_self_play_needs_two_seats() -> None:
    venv = corral.make_vec("mdp/one_round_dmdp", 1)
    with pytest.raises(ValueError, match="two seats"):
        self_play(venv, DQN(venv, Config(self_play=True)))
    venv.close()


# -- learning --------------------------------------------------------------------------------


def _greedy_policy_value(env, algo: DQN) -> float:
    """The exact expected return of the greedy policy, by backward induction over the tables."""
    num_states = env.transitions.shape[0]
    action = algo.policy.greedy("agent", np.eye(num_states, dtype=np.float32), None)
    values = np.zeros(num_states)
    for _ in range(num_states):
        q = (env.transitions * (env.rewards + values)).sum(axis=-1)
        values = np.where(env.terminal, 0.0, q[np.arange(num_states), action])
    return float(env.initial @ values)


@pytest.mark.parametrize(
    "env_id",
    [
        "mdp/one_round_dmdp",
        "mdp/two_round_dmdp",
        "mdp/one_round_nmdp",
        "mdp/two_round_nmdp",
        "mdp/multi_round_nmdp",
    ],
)
def test_dqn_finds_the_optimal_policy_of_the_small_mdps(env_id: str) -> None:
    venv, algo = _train(env_id, FAST, 3_000)
    env = corral.make(env_id)
    # The greedy policy's value from the tables, not sampled episodes: stochastic MDPs would
    # need thousands of episodes to tell 3.456 from 2.88.
    assert _greedy_policy_value(env, algo) == pytest.approx(env.optimal_return["agent_0"])
    venv.close()


def test_dqn_coordinates_on_an_optimum_of_the_penalty_game_with_a_mild_penalty() -> None:
    # One network shared by both players. With k = -5 a partner exploring uniformly still
    # makes action 0 (or 2) look best; with the default k = -100 it does not, and the
    # learners may settle on the safe (1, 1) (relative overgeneralisation).
    kwargs = {"k": -5.0}
    venv, algo = _train("mdp/penalty", FAST, 3_000, env_kwargs=kwargs)
    result = evaluate(venv, algo, 8, seed=1)
    optimum = corral.make("mdp/penalty", **kwargs).optimal_return["player_0"]
    assert result.episode_returns == [optimum] * 8
    venv.close()


def test_dqn_settles_below_the_optimum_of_the_climbing_game() -> None:
    # What is true for independent learners (the env's docstring): relative
    # overgeneralisation leads them to (1, 1) or (2, 2), not to the optimal (0, 0).
    venv, algo = _train("mdp/climbing", FAST, 3_000)
    joint = tuple(int(a) for a in algo.policy.greedy("player", np.zeros((2, 1), np.float32), None))
    assert joint in {(1, 1), (2, 2)}
    result = evaluate(venv, algo, 4, seed=1)
    assert max(result.episode_returns) < corral.make("mdp/climbing").optimal_return["player_0"]
    venv.close()


@pytest.mark.parametrize("learner", ["player_0", "player_1"])
def test_dqn_learns_paper_against_rock_in_either_seat_of_rps(learner: str) -> None:
    num_rounds = 2
    other = "player_1" if learner == "player_0" else "player_0"

    def rock(obs: np.ndarray, mask: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
        return np.full(obs.shape[:2], ROCK)

    config = FAST.replace(gamma=0.9, epsilon_decay_steps=1_000)
    venv = corral.make_vec(
        "corral/rps", 8, seed=0, group_map="agent", env_kwargs={"num_rounds": num_rounds}
    )
    algo = DQN(venv, config, learn_groups=[learner])
    Collector(venv, algo, fixed={other: rock}, seed=0).run(1_500)
    result = evaluate(venv, algo, 8, fixed={other: rock}, seed=1)
    assert result.episode_returns == [float(num_rounds)] * 8  # a win every round
    batch = venv.reset(seed=2)
    acting = batch.acting[learner]
    assert (algo.policy.act(batch, explore=False)[0][learner][acting] == PAPER).all()
    venv.close()


# -- self-play ---------------------------------------------------------------------------------


def _self_play(env_id: str, config: Config, env_steps: int) -> tuple:
    """A DQN trained ``env_steps`` in self-play, its collector and its snapshot pool."""
    venv = corral.make_vec(env_id, 8, seed=config.seed)
    algo = DQN(venv, config)
    collector = Collector(venv, algo, seed=config.seed, **self_play(venv, algo))
    progress = collector.run(env_steps)
    return venv, algo, collector, collector.fixed[OPPONENT].policy, progress


def test_the_pool_keeps_the_newest_snapshots_and_draws_where_episodes_begin() -> None:
    venv = corral.make_vec("corral/rps", 2, seed=0)
    algo = DQN(venv, FAST.replace(self_play=True))
    pool = SnapshotPool(
        algo, {"player": venv.action_space("player")}, pool_size=2, snapshot_interval=1, seed=0
    )
    batch = venv.reset(seed=0)
    pool.act(batch)
    assert pool.opponent == [None, None]  # empty pool: random legal play
    snapshots = [algo.snapshot() for _ in range(3)]
    for snapshot in snapshots:
        pool.add(snapshot)
    assert pool.members == snapshots[1:]
    pool.act(batch)  # no episode began: the same opponents
    assert pool.opponent == [None, None]
    batch.done[:] = [False, True]
    pool.act(batch)
    assert pool.opponent[0] is None and any(pool.opponent[1] is s for s in snapshots[1:])
    venv.close()


def test_selfplay_smoke_on_tictactoe_stores_only_learner_transitions_and_uses_the_pool() -> None:
    pytest.importorskip("pettingzoo")
    config = Config(
        learning_starts=100,
        batch_size=32,
        epsilon_decay_steps=1_000,
        self_play=True,
        pool_size=3,
        snapshot_interval=40,
    )
    venv = corral.make_vec(TICTACTOE, 8, seed=0)
    algo = DQN(venv, config)
    observed = []
    learn = algo.learn
    algo.learn = lambda rollouts: (observed.append(rollouts["player"]), learn(rollouts))[1]
    collector = Collector(venv, algo, seed=0, **self_play(venv, algo))
    seats = []
    owned = collector.seating.owned
    updates = collector.run(
        2_000, on_step=lambda _: seats.append(owned[MAIN]["player"].copy())
    ).updates
    learner = np.concatenate([decision_rows(r, ["learner"])["learner"] for r in observed])
    assert 0 < learner.sum() < len(learner)  # the opponent's moves were transitions too
    assert len(algo.buffer["player"]) == learner.sum()
    pool = collector.fixed[OPPONENT].policy
    assert len(pool.members) == 3
    assert any(o is not None for o in pool.opponent)
    assert (np.concatenate(seats).sum(axis=0) > 10).all()  # it moved first and second
    assert [u["selfplay/pool"] for u in updates][-1] == 3
    venv.close()


def test_evaluate_vs_random_scores_the_requested_seat() -> None:
    pytest.importorskip("pettingzoo")

    class RandomPlayer:
        groups = {"player": ("player_1", "player_2")}
        rng = np.random.default_rng(0)

        def act(self, batch, *, explore: bool = True) -> tuple[dict, dict]:
            mask = batch.action_mask["player"]
            return {"player": np.where(mask, self.rng.random(mask.shape), -1.0).argmax(-1)}, {}

    # Random against random tic-tac-toe: the first mover wins 58.5% and loses 28.8% of games.
    first = evaluate_vs_random(RandomPlayer(), TICTACTOE, 600, seat=0, num_envs=50)
    second = evaluate_vs_random(RandomPlayer(), TICTACTOE, 600, seat=1, num_envs=50)
    assert first == pytest.approx(0.297, abs=0.12)
    assert second == pytest.approx(-0.297, abs=0.12)


# -- checkpoints -----------------------------------------------------------------------------


def test_state_dict_round_trip_restores_greedy_actions_counters_and_pool() -> None:
    config = FAST.replace(self_play=True, snapshot_interval=50, gamma=0.9)
    venv, algo, _, pool, _ = _self_play("corral/rps", config, 1_000)
    file = io.BytesIO()
    torch.save({"algo": algo.state_dict(), "pool": pool.state_dict()}, file)
    file.seek(0)
    saved = torch.load(file)
    other = DQN(venv, config.replace(seed=1))
    other.load_state_dict(saved["algo"])
    obs = np.random.default_rng(0).random((64, 7)).astype(np.float32)
    mask = np.random.default_rng(1).random((64, 3)) < 0.7
    assert (
        other.policy.greedy("player", obs, mask) == algo.policy.greedy("player", obs, mask)
    ).all()
    assert (other.env_steps, other.gradient_step, other.epsilon()) == (
        algo.env_steps,
        algo.gradient_step,
        algo.epsilon(),
    )
    assert other.policy.rng.bit_generator.state == algo.policy.rng.bit_generator.state
    copied = self_play(venv, other)["fixed"][OPPONENT].policy
    copied.load_state_dict(saved["pool"])
    assert len(copied.members) == len(pool.members) > 0
    assert copied.clock == pool.clock == algo.gradient_step
    pool.load_state_dict(saved["pool"])  # both draw every env's opponent anew
    batch = venv.reset(seed=4)
    for _ in range(3):
        assert np.array_equal(copied.act(batch)[0]["player"], pool.act(batch)[0]["player"])
    drawn = [[-1 if m is None else p.members.index(m) for m in p.opponent] for p in (copied, pool)]
    assert drawn[0] == drawn[1] and max(drawn[0]) >= 0
    venv.close()


def test_greedy_acting_plays_every_seat_and_leaves_the_self_play_seats_alone() -> None:
    config = FAST.replace(self_play=True, snapshot_interval=50)
    venv, algo, collector, pool, _ = _self_play("corral/rps", config, 600)
    seats = {g: m.copy() for g, m in collector.seating.owned[MAIN].items()}
    opponents = list(pool.opponent)
    done = evaluate(venv, algo, 8, seed=3)  # as evaluations of a self-play run play
    assert len(done.episode_returns) == 8
    batch = venv.reset(seed=3)
    actions, extras = algo.policy.act(batch, explore=False)
    assert extras == {}
    np.testing.assert_array_equal(
        actions["player"],
        algo.policy.greedy("player", batch.obs["player"], batch.action_mask["player"]),
    )
    assert all(np.array_equal(collector.seating.owned[MAIN][g], m) for g, m in seats.items())
    assert pool.opponent == opponents
    venv.close()
