"""VDN and QMIX: mixers, masked acting, team TD targets, resuming, the cooperative matrix games."""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support.q_settings import FAST_TABLES  # noqa: E402

import corral  # noqa: E402
from corral.algos import algorithm_class  # noqa: E402
from corral.algos.mixers import QMixer, VDNMixer, box_bounds, unit_bounds  # noqa: E402
from corral.algos.value_decomposition import QMIX, VDN, Config, joint_steps  # noqa: E402
from corral.data.rollouts import RolloutBuilder  # noqa: E402
from corral.errors import UnsupportedEnvError  # noqa: E402
from corral.training import checkpoint as ckpt  # noqa: E402
from corral.training.collector import Collector, evaluate  # noqa: E402

slow = pytest.mark.skipif(os.environ.get("CI") == "true", reason="slow: a learning run")

FAST = Config(**FAST_TABLES)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _train(cls: type, env_id: str, config: Config, env_steps: int, **kwargs) -> tuple:
    venv = corral.make_vec(env_id, 8, seed=config.seed, state=True, **kwargs)
    algo = cls(venv, config)
    Collector(venv, algo, seed=config.seed).run(env_steps)
    return venv, algo


def _joint(algo) -> tuple[int, ...]:
    """The greedy joint action of a matrix game's two players (one constant observation)."""
    return tuple(int(a) for a in algo.policy.greedy("player", np.zeros((2, 1), np.float32), None))


# -- mixers --------------------------------------------------------------------------------


def test_qmix_is_monotonic_in_every_agents_value() -> None:
    torch.manual_seed(0)
    mixer = QMixer(n_agents=4, state_dim=6, embed=8, hypernet_hidden=16)
    q = torch.randn(256, 4, requires_grad=True) * 10
    state = torch.randn(256, 6) * 3
    (grad,) = torch.autograd.grad(mixer(q, state).sum(), q)
    assert grad.shape == (256, 4)
    assert (grad >= 0).all()
    assert (grad > 0).any()  # not a constant mixer


def test_unit_bounds_map_wide_finite_bounds_onto_minus_one_to_one_and_leave_the_rest() -> None:
    low = np.array([-1.0, 0.0, -np.inf, -0.5, 2.0])
    high = np.array([7.0, 4.0, np.inf, 1.0, 2.0])  # wide, wide, unbounded, narrow, empty
    offset, scale = unit_bounds((low, high), 5)
    x = torch.tensor([[-1.0, 0.0, 123.0, -0.5, 2.0], [7.0, 4.0, -9.0, 1.0, 2.0]])
    torch.testing.assert_close(
        (x - offset) * scale,
        torch.tensor([[-1.0, -1.0, 123.0, -0.5, 2.0], [1.0, 1.0, -9.0, 1.0, 2.0]]),
    )
    torch.testing.assert_close(unit_bounds(None, 3), (torch.zeros(3), torch.ones(3)))
    with pytest.raises(ValueError, match="expected"):
        unit_bounds((low, high), 4)


def test_qmix_on_a_bounded_state_mixes_as_on_the_state_rescaled() -> None:
    """Differential: a mixer given LBF-like bounds (coordinates -1..7, levels 0..4) gives,
    on a raw state, what the same weights give without bounds on the rescaled state."""
    space = gymnasium.spaces.Box(np.float32([-1, -1, 0]), np.float32([7, 7, 4]))
    bounds = box_bounds(space, copies=2)
    assert bounds is not None and bounds[0].shape == (6,)
    torch.manual_seed(0)
    bounded = QMixer(2, 6, 8, 16, bounds)
    plain = QMixer(2, 6, 8, 16)
    plain.load_state_dict(bounded.state_dict())  # the bounds are not part of the weights
    state = torch.tensor([[3.0, 7.0, 4.0, -1.0, 0.0, 1.0]])
    rescaled = torch.tensor([[0.0, 1.0, 1.0, -1.0, -0.75, -0.5]])
    q = torch.randn(1, 2)
    torch.testing.assert_close(bounded(q, state), plain(q, rescaled))
    assert box_bounds(gymnasium.spaces.Discrete(3)) is None


def test_qmix_needs_a_state_and_vdn_sums() -> None:
    q = torch.tensor([[1.0, 2.0, -4.0], [0.5, 0.0, 0.25]])
    torch.testing.assert_close(VDNMixer()(q), torch.tensor([-1.0, 0.75]))
    with pytest.raises(ValueError, match="global state"):
        QMixer(3, 2, 4, 4)(q)


def test_vdn_q_tot_is_the_sum_of_the_chosen_actions_values() -> None:
    venv = corral.make_vec("mdp/climbing", 2, seed=0)
    algo = VDN(venv, FAST)
    obs = np.zeros((5, 2, 1), np.float32)
    rows = {"obs": obs, "action": np.array([[0, 1], [2, 2], [1, 0], [0, 0], [1, 2]]),
            "acting": np.ones((5, 2), bool)}  # fmt: skip
    q = algo.policy.q["player"](algo.policy.q_input("player", obs))
    expected = q.gather(-1, torch.as_tensor(rows["action"])[..., None]).squeeze(-1).sum(-1)
    torch.testing.assert_close(algo.q_tot("player", rows), expected)
    # an agent that did not act adds nothing
    rows["acting"][:, 1] = False
    torch.testing.assert_close(algo.q_tot("player", rows), q[:, 0].gather(
        -1, torch.as_tensor(rows["action"][:, :1])).squeeze(-1))  # fmt: skip
    venv.close()


# -- acting and targets --------------------------------------------------------------------


@pytest.mark.parametrize("explore", [True, False])
@pytest.mark.parametrize("cls", [VDN, QMIX])
def test_an_illegal_action_is_never_chosen(cls: type, explore: bool) -> None:
    venv = corral.make_vec("mdp/climbing", 4, seed=0, state=True)
    algo = cls(venv, FAST)
    algo.policy.epsilon = 1.0 if explore else 0.0
    batch = venv.reset(seed=0)
    mask = np.zeros((4, 2, 3), bool)
    mask[:, 0, 1] = True  # player_0 may only play 1
    mask[:, 1, [0, 2]] = True  # player_1 never 1
    batch.action_mask["player"] = mask
    seen = set()
    for _ in range(50):
        actions, _ = algo.policy.act(batch, explore=explore)
        seen |= {tuple(a) for a in actions["player"]}
    assert all(a0 == 1 and a1 in (0, 2) for a0, a1 in seen)
    if explore:
        assert {a1 for _, a1 in seen} == {0, 2}
    venv.close()


def test_td_target_matches_a_hand_computed_one() -> None:
    venv = corral.make_vec("mdp/climbing", 2, seed=0, state=True)
    algo = QMIX(venv, FAST.replace(gamma=0.5))
    online, target = algo.policy.q["player"], algo.target["player"]
    with torch.no_grad():  # make the target agent network differ from the online one
        for p in target.parameters():
            p.add_(0.3)
    next_obs = np.zeros((3, 2, 1), np.float32)
    next_mask = np.array([[[1, 1, 1], [0, 1, 1]], [[1, 0, 0], [1, 1, 1]], [[0, 0, 0], [1, 1, 1]]])
    rows = {
        "reward": np.array([1.0, -2.0, 4.0], np.float32),
        "next_obs": next_obs,
        "next_action_mask": next_mask.astype(bool),
        "next_live": np.array([[True, True], [True, False], [True, True]]),
        "terminal": np.array([False, False, True]),
        "next_state": np.zeros((3, 1), np.float32),
    }
    got = algo.targets("player", rows)
    x = algo.policy.q_input("player", next_obs)
    with torch.no_grad():
        q_on, q_tg = online(x).numpy(), target(x).numpy()
        expected = []
        for b in range(3):
            per_agent = []
            for i in range(2):
                legal = next_mask[b, i].astype(bool)
                legal = legal if legal.any() else np.ones(3, bool)  # none legal: all count
                best = np.flatnonzero(legal)[np.argmax(q_on[b, i][legal])]
                per_agent.append(q_tg[b, i, best] if rows["next_live"][b, i] else 0.0)
            mixed = algo.target_mixer["player"](
                torch.tensor([per_agent], dtype=torch.float32), torch.zeros(1, 1)
            ).item()
            expected.append(rows["reward"][b] + (0.0 if rows["terminal"][b] else 0.5 * mixed))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5)
    venv.close()


def test_joint_steps_hold_one_row_per_env_step_with_the_mean_reward_and_bootstraps() -> None:
    pytest.importorskip("mpe2")
    kwargs = {"N": 3, "max_cycles": 3}
    venv = corral.make_vec("mpe2/simple_spread_v3", 2, seed=0, state=True, env_kwargs=kwargs)
    builder = RolloutBuilder(venv, steps=3, record_next=True)
    batch = venv.reset(seed=0)
    rng = np.random.default_rng(0)
    rewards = []
    for _ in range(3):
        actions = venv.sample_actions(batch, rng)
        builder.act(batch, actions)
        batch = venv.step(actions)
        rewards.append(batch.reward["agent"].mean(-1))
        builder.observe(batch)
    (rollout,) = builder.finish().values()
    rows, keep = joint_steps(rollout, with_state=True)
    assert keep.all() and rows["obs"].shape[:2] == (6, 3)
    np.testing.assert_allclose(rows["reward"], np.concatenate(rewards))
    # max_cycles=3: the last step truncates; every agent bootstraps, none is terminal
    assert rows["next_live"].all() and not rows["terminal"].any()
    venv.close()


def test_an_agent_gone_before_a_truncation_does_not_go_on() -> None:
    """The env's truncation marks every agent truncated, the dead too: one that terminated
    before it bootstrapped its target value in the truncated row (it adds 0 to ``Q_tot``
    once gone). Rows built by hand: ``joint_steps`` is the rule, whatever env made them."""
    venv = corral.make_vec("corral/tag", 1, seed=0, native=False)
    builder = RolloutBuilder(venv, steps=1, record_next=True)
    batch = venv.reset(seed=0)
    actions = {g: np.zeros(a.shape, np.int64) for g, a in batch.acting.items()}
    builder.act(batch, actions)
    builder.observe(venv.step(actions))
    rollout = builder.finish()["prey"]
    venv.close()
    assert rollout.acting.shape == (1, 1, 2)  # two prey
    # prey_1 gone before this step (neither alive nor acting), the episode truncated in it
    rollout.alive[0, 0, 1] = rollout.acting[0, 0, 1] = rollout.terminated[0, 0, 1] = False
    rollout.truncated[0, 0, :] = True
    rows, _ = joint_steps(rollout, with_state=False)
    assert rows["next_live"].tolist() == [[True, False]] and not rows["terminal"].any()


def test_a_truncated_row_bootstraps_from_the_final_observation_and_state() -> None:
    """simple_spread's observation starts with the agent's velocity and position, and mpe2
    moves an agent by the velocity it had (dt 0.1): every row's next position, the truncated
    rows' final one included, is its position plus 0.1 times its velocity, which a reset's
    observation is not; the state is the observations joined, so next_state is the final
    state."""
    pytest.importorskip("mpe2")
    kwargs = {"N": 3, "max_cycles": 3}
    venv = corral.make_vec("mpe2/simple_spread_v3", 2, seed=0, state=True, env_kwargs=kwargs)
    builder = RolloutBuilder(venv, steps=6, record_next=True)
    batch = venv.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(6):
        actions = venv.sample_actions(batch, rng)
        builder.act(batch, actions)
        batch = venv.step(actions)
        builder.observe(batch)
    (rollout,) = builder.finish().values()
    rows, _ = joint_steps(rollout, with_state=True, flat=False)
    obs, nxt = rows["obs"], rows["next_obs"]
    np.testing.assert_allclose(nxt[..., 2:4], obs[..., 2:4] + 0.1 * obs[..., 0:2], atol=1e-5)
    truncated = np.asarray(rollout.truncated).all(-1)
    assert truncated[2].all() and truncated[5].all() and truncated.sum() == 4
    assert not np.allclose(nxt[2], obs[3])  # the final observation, not the reset's
    np.testing.assert_allclose(rows["next_state"], nxt.reshape(6, 2, -1))
    np.testing.assert_allclose(rows["state"], obs.reshape(6, 2, -1))
    venv.close()


def test_qmix_without_a_state_mixes_on_the_groups_observations_joined() -> None:
    venv = corral.make_vec("mdp/two_round_dmdp", 4, seed=0)  # no state=True: no state
    assert venv.state_space is None
    algo = QMIX(venv, FAST.replace(learning_starts=16, train_freq=4))
    group, agents = next(iter(algo.groups.items()))
    obs_dim = int(np.prod(algo.observation_space[group].shape))
    mixer = algo.mixer[group]
    assert mixer.hyper_b1.in_features == len(agents) * obs_dim  # the observations joined
    # the mixer reads them rescaled by the observation space's bounds, once per agent
    space = algo.observation_space[group]
    expected_bounds = unit_bounds(box_bounds(space, copies=len(agents)), len(agents) * obs_dim)
    torch.testing.assert_close((mixer.state_offset, mixer.state_scale), expected_bounds)
    Collector(venv, algo, seed=0).run(200)
    assert algo.gradient_step > 0
    # the mixer's input is each row's observations, flattened: a state made from them
    rows = algo.buffer[group].sample(5)
    state = algo._state(group, rows, "state")
    expected = torch.as_tensor(rows["obs"], dtype=torch.float32).reshape(5, -1)
    torch.testing.assert_close(state, expected)
    next_state = algo._state(group, rows, "next_state")
    torch.testing.assert_close(
        next_state, torch.as_tensor(rows["next_obs"], dtype=torch.float32).reshape(5, -1)
    )
    VDN(venv).policy.act(venv.reset(seed=0))  # VDN needs no state at all
    venv.close()


def test_vdn_and_qmix_are_registered_and_need_discrete_lockstep_envs() -> None:
    assert algorithm_class("vdn") is VDN and algorithm_class("qmix") is QMIX
    assert VDN.needs_lockstep and QMIX.uses_state and not VDN.uses_state
    pytest.importorskip("mpe2")
    kwargs = {"N": 3, "max_cycles": 5, "continuous_actions": True}
    venv = corral.make_vec("mpe2/simple_spread_v3", 2, seed=0, state=True, env_kwargs=kwargs)
    with pytest.raises(UnsupportedEnvError, match="VDN needs Discrete action spaces"):
        VDN(venv)
    venv.close()


@pytest.mark.parametrize("cls", [VDN, QMIX])
@pytest.mark.parametrize("array", ["numpy", "torch"])
def test_a_turn_based_env_that_does_not_say_so_raises_naming_the_agent(
    cls: type, array: str
) -> None:
    """An env without ``metadata["lockstep"]`` is held to it as it plays (as MADDPG holds
    it): VDN and QMIX trained silently on turns, mixing one agent's value with another's."""
    from corral.envs.rps import RockPaperScissors

    class Undeclared(RockPaperScissors):
        metadata = {"render_modes": []}

    venv = corral.VectorEnv([Undeclared] * 2, seed=0, array=array, state=cls is QMIX)
    algo = cls(venv, cls.Config(learning_starts=4, batch_size=4, train_freq=2))
    named = rf"{cls.__name__} needs.*in env 0 agent .player_[01]. of group .player."
    with pytest.raises(UnsupportedEnvError, match=named):
        Collector(venv, algo, seed=0).run(40)
    venv.close()


# -- checkpoints ---------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [VDN, QMIX])
def test_state_dict_round_trip_resumes_learning_exactly(cls: type, tmp_path: Path) -> None:
    config = FAST.replace(learning_starts=50, seed=1)
    algo = _train(cls, "mdp/two_round_dmdp", config, 400)[1]
    saved = tmp_path / "checkpoint.pt"
    ckpt.save(saved, {"algo": algo.state_dict(), "replay": algo.replay_state_dict()})
    venv = corral.make_vec("mdp/two_round_dmdp", 8, seed=1, state=True)
    resumed = cls(venv, config.replace(seed=7))
    checkpoint = ckpt.load(saved)
    resumed.load_state_dict(checkpoint["algo"])
    resumed.load_replay_state_dict(checkpoint["replay"])
    assert resumed.stored() == algo.stored() and resumed.env_steps == algo.env_steps == 400

    runs = []
    for learner in (algo, resumed):
        learner_venv = corral.make_vec("mdp/two_round_dmdp", 8, seed=1, state=True)
        progress = Collector(learner_venv, learner, seed=9).run(200)
        batch = learner_venv.reset(seed=2)
        runs.append((progress.updates, learner.policy.act(batch, explore=True)[0]["agent"]))
    (updates, actions), (resumed_updates, resumed_actions) = runs
    assert updates and updates == resumed_updates
    np.testing.assert_array_equal(actions, resumed_actions)
    for name, tensor in algo.state_dict()["mixer"]["agent"].items():
        torch.testing.assert_close(resumed.state_dict()["mixer"]["agent"][name], tensor)


# -- the cooperative matrix games ----------------------------------------------------------
#
# Published behaviour: Papoudakis et al. 2021, "Benchmarking Multi-Agent Deep Reinforcement
# Learning Algorithms in Cooperative Tasks" (EPyMARL; NeurIPS Datasets and Benchmarks), table of
# maximum returns over 25-step episodes: on the climbing game VDN and QMIX reach 175 = 25 * 7,
# the joint action (1, 1), not the optimum 11 (0, 0) (the payoff is not monotonic in each
# agent's action: QMIX's mixers cannot represent it, Rashid et al. 2020, "Weighted QMIX",
# sec. 1); on the penalty game (k = -100) both reach 250 = 25 * 10, one of the two optima.


@pytest.mark.parametrize("cls", [VDN, QMIX])
def test_climbing_game_smoke_stays_off_the_optimum(cls: type) -> None:
    venv, algo = _train(cls, "mdp/climbing", FAST, 1_500)
    assert _joint(algo) != (0, 0)
    result = evaluate(venv, algo, 4, seed=1)
    assert max(result.episode_returns) < 11
    venv.close()


@slow
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cls", [VDN, QMIX])
def test_climbing_game_climbs_to_the_published_joint_action(cls: type, seed: int) -> None:
    """Climbing game: VDN and QMIX settle on (1, 1), payoff 7, as published (Papoudakis et al.
    2021, EPyMARL's matrix-game table: 175 over 25 steps), never on the optimum (0, 0).

    A small replay memory keeps the rows near the current policy, whose shift from (2, 2)
    (best against a uniform partner) through (1, 2) to (1, 1) is the climb; after 6,000 env
    steps QMIX is at (1, 1) for seeds 0-2 and VDN for seed 0, one step short, at (1, 2), for
    seeds 1 and 2."""
    config = FAST.replace(seed=seed, buffer_size=1_000)
    venv, algo = _train(cls, "mdp/climbing", config, 6_000)
    if cls is QMIX or seed == 0:
        assert _joint(algo) == (1, 1)
    else:
        assert _joint(algo) in {(1, 1), (1, 2), (2, 1)}
    venv.close()


@pytest.mark.parametrize("cls", [VDN, QMIX])
def test_penalty_game_reaches_an_optimum(cls: type) -> None:
    """Penalty game (k = -100): VDN and QMIX coordinate on (0, 0) or (2, 2), payoff 10, as
    published (Papoudakis et al. 2021: 250 over 25 steps)."""
    venv, algo = _train(cls, "mdp/penalty", FAST, 3_000)
    assert _joint(algo) in {(0, 0), (2, 2)}
    assert evaluate(venv, algo, 4, seed=1).episode_returns == [10.0] * 4
    venv.close()
