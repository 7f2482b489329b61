"""MADDPG: learning on small MDPs and matrix games, MPE smoke runs, errors, checkpoints."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gymnasium import spaces

torch = pytest.importorskip("torch")

import corral  # noqa: E402
from corral.algos.maddpg import MADDPG  # noqa: E402
from corral.env import MultiAgentEnv, validate_actions  # noqa: E402
from corral.envs.rps import RockPaperScissors  # noqa: E402
from corral.errors import UnsupportedEnvError  # noqa: E402
from corral.training import checkpoint as ckpt  # noqa: E402
from corral.training.collector import Collector, evaluate  # noqa: E402

torch.set_num_threads(1)

MDP_CONFIG = dict(
    gamma=1.0,
    hidden=(32, 32),
    lr=1e-2,
    critic_lr=3e-3,
    tau=0.05,
    batch_size=128,
    learning_starts=200,
    train_freq=8,
    epsilon=0.5,
    explore_decay_steps=3000,
)


def _train(env_id: str, env_steps: int, seed: int, **config) -> tuple[MADDPG, object]:
    venv = corral.make_vec(env_id, 8, seed=seed)
    algo = MADDPG(venv, MADDPG.Config(seed=seed, **{**MDP_CONFIG, **config}))
    Collector(venv, algo, seed=seed).run(env_steps)
    return algo, venv


def _greedy_policy_value(algo: MADDPG, env) -> float:
    """The exact expected return of ``algo``'s greedy policy, from the MDP's tables."""
    num_states, num_actions = env.transitions.shape[:2]
    every_state = SimpleNamespace(
        obs={"agent": np.eye(num_states, dtype=np.float32)[:, None]},
        acting={"agent": np.ones((num_states, 1), dtype=bool)},
        action_mask={"agent": np.ones((num_states, 1, num_actions), dtype=np.int8)},
    )
    policy = algo.policy.act(every_state, explore=False)[0]["agent"][:, 0]
    values = np.zeros(num_states)
    for _ in range(num_states):
        q = (env.transitions * (env.rewards + values)).sum(axis=-1)
        values = np.where(env.terminal, 0.0, q[np.arange(num_states), policy])
    return float(env.initial @ values)


@pytest.mark.parametrize(
    ("env_id", "env_steps"),
    [
        ("mdp/one_round_dmdp", 1000),
        ("mdp/two_round_dmdp", 2000),
        ("mdp/one_round_nmdp", 2000),
        ("mdp/two_round_nmdp", 3000),
        ("mdp/multi_round_nmdp", 4000),
    ],
)
def test_greedy_policy_is_optimal_on_single_agent_mdps(env_id: str, env_steps: int) -> None:
    # Discrete actions through the straight-through Gumbel-softmax. Chance events make sampled
    # returns noisy, so the greedy policy's expected return is computed from the env's tables.
    algo, venv = _train(env_id, env_steps, seed=0)
    env = corral.make(env_id)
    optimum = env.optimal_return["agent_0"]
    assert _greedy_policy_value(algo, env) == pytest.approx(optimum)
    returns = evaluate(venv, algo, episodes=8, seed=1).episode_returns
    if np.isin(env.transitions, (0.0, 1.0)).all():  # deterministic: each episode earns it
        assert returns == pytest.approx([optimum] * 8)


@pytest.mark.parametrize("env_id", ["mdp/climbing", "mdp/penalty"])
def test_matrix_games_settle_on_the_best_reply_to_a_random_partner(env_id: str) -> None:
    # The optimal joint action is out of reach. Each actor climbs the critic's gradient
    # against its partner's replayed, exploring actions, so both settle on the action that
    # is best against a uniformly random partner (relative overgeneralisation): 5 instead
    # of 11 in the climbing game, 2 instead of 10 in the penalty game.
    algo, venv = _train(env_id, 2000, seed=0)
    payoffs = corral.make(env_id).payoffs
    safe = (int(payoffs[0].mean(axis=1).argmax()), int(payoffs[1].mean(axis=0).argmax()))
    greedy = algo.policy.act(venv.reset(seed=3), explore=False)[0]["player"]
    assert (greedy == safe).all()
    returns = evaluate(venv, algo, episodes=8, seed=1).episode_returns
    assert returns == pytest.approx([payoffs[(0, *safe)]] * 8)


def test_learns_the_best_reply_to_a_fixed_partner() -> None:
    # The partner's group is played by a fixed policy, so it is part of the environment.
    venv = corral.make_vec("mdp/climbing", 8, seed=0, group_map="agent")
    algo = MADDPG(venv, MADDPG.Config(**MDP_CONFIG), learn_groups=["player_0"])
    partner = {"player_1": lambda obs, mask, rng: np.zeros(obs.shape[:2], dtype=np.int64)}
    Collector(venv, algo, fixed=partner, seed=0).run(1000)
    returns = evaluate(venv, algo, episodes=8, fixed=partner, seed=1).episode_returns
    assert returns == pytest.approx([corral.make("mdp/climbing").optimal_return["player_0"]] * 8)


class TargetGame(MultiAgentEnv):
    """One simultaneous step: ``agent_i`` sees its one-hot index and picks a point in
    ``[-1, 2]``; both are paid ``-sum_i (a_i - TARGETS[i])**2``. Optimal return 0."""

    metadata = {"render_modes": [], "name": "target_game"}
    possible_agents = ["agent_0", "agent_1"]
    TARGETS = (1.3, -0.4)
    optimal_return = {"agent_0": 0.0, "agent_1": 0.0}

    def __init__(self) -> None:
        self.agents: list[str] = []

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 1.0, shape=(2,), dtype=np.float32)

    def action_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-1.0, 2.0, shape=(1,), dtype=np.float32)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        one_hots = np.eye(2, dtype=np.float32)
        return dict(zip(self.agents, one_hots, strict=True)), {a: {} for a in self.agents}

    def step(self, actions):
        validate_actions(actions, self.agents, self.action_space, {}, 0)
        reward = -sum(
            (float(actions[a][0]) - t) ** 2
            for a, t in zip(self.possible_agents, self.TARGETS, strict=True)
        )
        agents, self.agents = self.agents, []
        return (
            {},
            dict.fromkeys(agents, reward),
            dict.fromkeys(agents, True),
            dict.fromkeys(agents, False),
            {a: {"final_obs": np.zeros(2, dtype=np.float32)} for a in agents},
        )


def test_continuous_actions_reach_the_optimum_of_a_coordination_game() -> None:
    # Both agents share one actor and are told apart by their observations; each agent's
    # reward depends on both actions, which only the centralised critic sees.
    venv = corral.VectorEnv([TargetGame] * 8, seed=0)
    config = MADDPG.Config(
        lr=1e-3, critic_lr=3e-3, batch_size=128, learning_starts=200, train_freq=4,
        explore_decay_steps=2000,
    )  # fmt: skip
    algo = MADDPG(venv, config)
    Collector(venv, algo, seed=0).run(3000)
    greedy = algo.policy.act(venv.reset(seed=1), explore=False)[0]["agent"]
    np.testing.assert_allclose(
        greedy[..., 0], np.broadcast_to(TargetGame.TARGETS, (8, 2)), atol=0.1
    )
    returns = evaluate(venv, algo, episodes=8, seed=1).episode_returns
    assert returns == pytest.approx([TargetGame.optimal_return["agent_0"]] * 8, abs=0.02)


@pytest.mark.parametrize("continuous", [True, False])
def test_simple_spread_smoke_run(continuous: bool) -> None:
    pytest.importorskip("mpe2")
    venv = corral.make_vec(
        "mpe2/simple_spread_v3",
        4,
        seed=0,
        env_kwargs={"continuous_actions": continuous, "max_cycles": 25},
        state=continuous,  # the critic sees the env state, or else every agent's observation
    )
    config = MADDPG.Config(batch_size=32, learning_starts=100, train_freq=20, hidden=(32, 32))
    algo = MADDPG(venv, config)
    assert algo.uses_state == continuous
    space = venv.action_space("agent")
    progress = Collector(venv, algo, seed=0).run(400)
    updates = progress.updates
    assert updates, "no update ran"
    for metrics in updates:
        assert metrics.keys() >= {"critic_loss/agent", "actor_loss/agent", "q/agent"}
        assert all(np.isfinite(v) for v in metrics.values())
    assert progress.episode_returns and np.isfinite(progress.episode_returns).all()
    batch = venv.reset(seed=5)
    for explore in (True, False):
        actions = algo.policy.act(batch, explore=explore)[0]["agent"]
        assert actions.shape == (4, 3, *space.shape)
        assert all(space.contains(a) for a in actions.reshape(-1, *space.shape))
    venv.step({"agent": actions})
    venv.close()


def test_discrete_actions_respect_the_action_mask() -> None:
    venv = corral.make_vec("mdp/penalty", 2, seed=0)
    algo = MADDPG(venv, MADDPG.Config(epsilon=1.0))
    mask = np.zeros((50, 2, 3), dtype=np.int8)
    mask[..., 1] = 1
    mask[:25, :, 2] = 1
    batch = SimpleNamespace(
        obs={"player": np.zeros((50, 2, 1), dtype=np.float32)},
        acting={"player": np.ones((50, 2), dtype=bool)},
        action_mask={"player": mask},
    )
    for explore in (True, False):
        actions = algo.policy.act(batch, explore=explore)[0]["player"]
        assert mask[np.arange(50)[:, None], np.arange(2), actions].all()
    assert set(algo.policy.act(batch, explore=True)[0]["player"][:25].ravel()) == {1, 2}


@pytest.mark.parametrize(
    "env_id", ["corral/rps", "corral/rps4", "corral/tag", "pettingzoo/classic/tictactoe_v3"]
)
def test_envs_that_are_not_lockstep_are_refused_when_it_is_built(env_id: str) -> None:
    if env_id.startswith("pettingzoo"):
        pytest.importorskip("pettingzoo")
    venv = corral.make_vec(env_id, 2, seed=0)
    with pytest.raises(UnsupportedEnvError, match=r"MADDPG needs every agent to act"):
        MADDPG(venv)
    venv.close()


def test_unbounded_box_actions_are_refused_as_an_unsupported_env() -> None:
    unbounded = spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)

    class Unbounded(TargetGame):
        def action_space(self, agent: str) -> spaces.Box:
            return unbounded

    venv = corral.VectorEnv([Unbounded] * 2, seed=0)
    with pytest.raises(UnsupportedEnvError, match=r"bounded Box actions.*'agent'.*MAPPO and IPPO"):
        MADDPG(venv)
    venv.close()


def test_a_turn_based_env_that_does_not_say_so_raises_at_its_first_step() -> None:
    class Undeclared(RockPaperScissors):
        metadata = {"render_modes": []}

    venv = corral.VectorEnv([Undeclared] * 2, seed=0)
    algo = MADDPG(venv)
    with pytest.raises(UnsupportedEnvError, match=r"simultaneous moves.*player_1"):
        Collector(venv, algo, seed=0).run(10)


def test_a_resume_without_the_memory_refills_learning_starts_rows_before_learning() -> None:
    """``checkpoint_replay=false``: the memory is not saved. MADDPG counted ``learning_starts``
    in env steps (restored), so it learned again from the first ``batch_size`` rows; DQN and
    the docs refill ``learning_starts`` first."""
    algo, _ = _train("mdp/two_round_dmdp", 400, seed=1)
    venv = corral.make_vec("mdp/two_round_dmdp", 8, seed=1)
    resumed = MADDPG(venv, MADDPG.Config(seed=1, **MDP_CONFIG))
    resumed.load_state_dict(algo.state_dict())  # no load_replay_state_dict: no memory
    assert resumed.env_steps == 400 and resumed.stored == 0
    assert resumed.first_update().env_steps >= MDP_CONFIG["learning_starts"]
    before = [p.detach().clone() for p in resumed.critic["agent"].parameters()]
    Collector(venv, resumed, seed=2).run(160)  # 160 rows: more than batch_size, fewer than 200
    assert resumed.stored == 160
    after = list(resumed.critic["agent"].parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))  # no step yet
    Collector(venv, resumed, seed=3).run(80)
    assert not all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    venv.close()


def test_state_dict_round_trip_resumes_learning_exactly(tmp_path: Path) -> None:
    algo, _ = _train("mdp/two_round_dmdp", 600, seed=1)
    saved = tmp_path / "checkpoint.pt"
    ckpt.save(saved, {"algo": algo.state_dict(), "replay": algo.replay_state_dict()})
    venv = corral.make_vec("mdp/two_round_dmdp", 8, seed=1)
    resumed = MADDPG(venv, MADDPG.Config(seed=7, **MDP_CONFIG))
    checkpoint = ckpt.load(saved)
    resumed.load_state_dict(checkpoint["algo"])
    resumed.load_replay_state_dict(checkpoint["replay"])
    assert len(resumed.buffer) == len(algo.buffer) == 600
    assert resumed.env_steps == algo.env_steps == 600

    runs = []
    for learner in (algo, resumed):
        learner_venv = corral.make_vec("mdp/two_round_dmdp", 8, seed=1)
        progress = Collector(learner_venv, learner, seed=9).run(200)
        batch = learner_venv.reset(seed=2)
        runs.append((progress.updates, learner.policy.act(batch, explore=True)[0]["agent"]))
    (updates, actions), (resumed_updates, resumed_actions) = runs
    assert updates and updates == resumed_updates
    np.testing.assert_array_equal(actions, resumed_actions)


def test_critics_see_each_agents_own_observation_and_activation_is_chosen() -> None:
    pytest.importorskip("mpe2")
    kwargs = {"N": 3, "max_cycles": 25, "continuous_actions": True}
    venv = corral.make_vec("mpe2/simple_spread_v3", 2, seed=0, state=True, env_kwargs=kwargs)
    obs_dim = venv.observation_space("agent").shape[0]
    widths = {}
    for own in (True, False):
        algo = MADDPG(venv, MADDPG.Config(critic_own_obs=own, activation="relu"))
        critic = algo.critic["agent"]
        widths[own] = critic[0].in_features
        assert any(isinstance(layer, torch.nn.ReLU) for layer in critic)
        assert not any(isinstance(layer, torch.nn.Tanh) for layer in algo.policy.actor["agent"])
        updates = Collector(venv, algo, seed=0).run(algo.config.learning_starts + 64).updates
        assert updates and all(np.isfinite(v) for u in updates for v in u.values())
    # state, the others' actions, the agent's index and own action; plus its observation
    assert widths[True] - widths[False] == obs_dim
    with pytest.raises(ValueError, match=r"activation must be one of \['relu', 'tanh'\]"):
        MADDPG(venv, MADDPG.Config(activation="gelu"))
    venv.close()


def test_learning_rates_decay_linearly_and_resume_with_the_step_count() -> None:
    venv = corral.make_vec("mdp/one_round_dmdp", 4, seed=0)
    config = MADDPG.Config(lr=1e-2, critic_lr=4e-3, lr_decay_steps=1000, lr_final_frac=0.2)
    algo = MADDPG(venv, config.replace(learning_starts=0, batch_size=8, train_freq=4))
    updates = Collector(venv, algo, seed=0).run(500).updates
    assert updates[-1]["lr_scale"] == pytest.approx(1 - 0.5 * 0.8)
    assert algo.actor_opt["agent"].param_groups[0]["lr"] == pytest.approx(1e-2 * 0.6)
    assert algo.critic_opt["agent"].param_groups[0]["lr"] == pytest.approx(4e-3 * 0.6)
    restored = MADDPG(venv, algo.config)
    restored.load_state_dict(algo.state_dict())
    assert restored.lr_scale() == pytest.approx(0.6)
    Collector(venv, algo, seed=0).run(1000)
    assert algo.lr_scale() == pytest.approx(0.2)  # kept after lr_decay_steps
    assert MADDPG(venv).lr_scale() == 1.0
