"""The Policy/Learner split (corral.algos.policy) on the replay learners, DQN and MADDPG:
acting has no side effects, weights (exploration included) travel by pickle, and the
learner's counters come from the rollouts it learns from."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import corral  # noqa: E402
from corral.algos.dqn import DQN, DQNLearner, DQNPolicy, epsilon_at  # noqa: E402
from corral.algos.maddpg import MADDPG, MADDPGLearner, MADDPGPolicy, exploration_at  # noqa: E402
from corral.arrays import to_numpy  # noqa: E402
from corral.training.collector import Collector  # noqa: E402
from corral.training.policy_map import MAIN  # noqa: E402
from corral.training.self_play import OPPONENT, self_play  # noqa: E402

TICTACTOE = "pettingzoo/classic/tictactoe_v3"
SPREAD = "mpe2/simple_spread_v3"
ROLLOUTS = 6


def make_venv(env_id: str, array: str = "numpy", **kwargs):
    if env_id == SPREAD:
        return corral.make_vec(
            SPREAD, 4, seed=0, native=True, array=array, state=True, env_kwargs=kwargs
        )
    if env_id == TICTACTOE:
        pytest.importorskip("pettingzoo")
    return corral.make_vec(env_id, 4, seed=0, array=array)


def make_algo(name: str, venv, seed: int = 0, **settings):
    """A DQN or MADDPG whose rollouts last 2 vector steps of 4 envs and which learns at once,
    exploring fast enough that its exploration has moved after a few rollouts."""
    common = {"hidden": (16,), "batch_size": 8, "learning_starts": 8, "train_freq": 8}
    if name == "dqn":
        config = DQN.Config(seed=seed, epsilon_decay_steps=100, **common, **settings)
        return DQN(venv, config)
    config = MADDPG.Config(seed=seed, explore_decay_steps=100, **common, **settings)
    return MADDPG(venv, config)


CASES = {
    "dqn-rps": ("dqn", "corral/rps", "numpy", {}),
    "dqn-tag-torch": ("dqn", "corral/tag", "torch", {}),
    "maddpg-spread": ("maddpg", SPREAD, "numpy", {"continuous_actions": True}),
    "maddpg-spread-discrete-torch": ("maddpg", SPREAD, "torch", {}),
}


def trained(case: str, rollouts: int = ROLLOUTS):
    name, env_id, array, env_kwargs = CASES[case]
    venv = make_venv(env_id, array, **env_kwargs)
    algo = make_algo(name, venv)
    collector = Collector(venv, algo, seed=0)
    collector.run(rollouts * algo.rollout_steps * venv.num_envs)
    assert algo.updates == rollouts
    return venv, algo, collector


def generators(policy) -> tuple:
    return policy.rng.bit_generator.state, policy.torch_rng.get_state()


def set_generators(policy, state) -> None:
    policy.rng.bit_generator.state = state[0]
    policy.torch_rng.set_state(state[1])


def exploration(policy) -> tuple[float, ...]:
    if isinstance(policy, DQNPolicy):
        return (policy.epsilon,)
    return policy.noise_std, policy.epsilon


def same(a, b) -> bool:
    """Whether two nests of dicts of arrays, tensors or numbers hold equal values."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(np.array_equal(to_numpy(a), to_numpy(b)))


def test_the_split_parts_of_dqn_and_maddpg():
    venv = make_venv("corral/rps")
    dqn = make_algo("dqn", venv)
    assert isinstance(dqn.policy, DQNPolicy) and isinstance(dqn, DQNLearner)
    # the algorithm is its learner: nothing passes acting through to the policy
    assert not any(hasattr(dqn, name) for name in ("act", "bootstrap_values", "final_values"))
    spread = make_venv(SPREAD)
    maddpg = make_algo("maddpg", spread)
    assert isinstance(maddpg.policy, MADDPGPolicy) and isinstance(maddpg, MADDPGLearner)
    assert not any(hasattr(maddpg, name) for name in ("act", "bootstrap_values", "final_values"))
    venv.close()
    spread.close()


@pytest.mark.parametrize("case", list(CASES))
def test_acting_changes_no_counter_and_no_learning_state(case):
    venv, algo, collector = trained(case)
    policy, learner = algo.policy, algo
    batch = collector.batch
    counters = {name: getattr(learner, name) for name in ("env_steps", "decisions", "updates")}
    weights = policy.weights()
    start = generators(policy)
    first, _ = algo.policy.act(batch, explore=True)
    after_first = generators(policy)
    set_generators(policy, start)
    second, _ = algo.policy.act(batch, explore=True)
    # the same generator state gives the same actions, and it did draw
    assert same(first, second)
    assert same(generators(policy)[1], after_first[1]) and generators(policy)[0] == after_first[0]
    assert not (same(start[1], after_first[1]) and start[0] == after_first[0])
    assert {name: getattr(learner, name) for name in counters} == counters
    assert same(policy.weights(), weights)  # networks, exploration and version
    assert policy.version == ROLLOUTS
    venv.close()


@pytest.mark.parametrize("case", list(CASES))
def test_weights_pickle_and_make_a_fresh_policy_act_the_same(case):
    venv, algo, collector = trained(case)
    raw = algo.policy.weights()
    weights = pickle.loads(pickle.dumps(raw))
    assert weights["version"] == ROLLOUTS
    tensors = [
        t
        for per_group in next(iter(weights["params"].values())).values()
        for t in per_group.values()
    ]
    assert tensors and all(t.device.type == "cpu" for t in tensors)

    fresh = make_algo(CASES[case][0], venv, seed=123)
    # the trained policy explores less than a fresh one: the weights must carry that
    assert exploration(fresh.policy) != exploration(algo.policy)
    fresh.policy.load_weights(weights)
    assert fresh.policy.version == ROLLOUTS
    assert exploration(fresh.policy) == exploration(algo.policy)
    batch = collector.batch
    for explore in (False, True):
        state = generators(algo.policy)
        set_generators(fresh.policy, state)
        mine, _ = algo.policy.act(batch, explore=explore)
        theirs, _ = fresh.policy.act(batch, explore=explore)
        assert same(mine, theirs)
    # the weights are copies: learning on leaves them as they were
    collector.run(2 * algo.rollout_steps * venv.num_envs)
    assert algo.policy.version == ROLLOUTS + 2 and fresh.policy.version == ROLLOUTS
    assert not same(algo.policy.weights()["params"], weights["params"])
    assert same(fresh.policy.weights()["params"], weights["params"])
    assert same(raw, weights)
    venv.close()


@pytest.mark.parametrize("case", ["dqn-rps", "dqn-tag-torch", "maddpg-spread"])
def test_the_policy_explores_as_much_as_its_learner_set(case):
    venv, algo, collector = trained(case)
    policy, batch = algo.policy, collector.batch
    greedy, _ = policy.act(batch, explore=False)
    learned = exploration(policy)
    if case.startswith("dqn"):
        assert learned == (epsilon_at(algo.config, algo.env_steps),)
        policy.epsilon = 0.0
    else:
        assert learned == exploration_at(algo.config, algo.env_steps)
        policy.noise_std = 0.0
    assert same(policy.act(batch, explore=True)[0], greedy)
    if case.startswith("dqn"):
        policy.epsilon = 1.0
    else:
        policy.noise_std = 1.0
    assert not same(policy.act(batch, explore=True)[0], greedy)
    venv.close()


@pytest.mark.parametrize(
    ("name", "env_id", "settings"),
    [
        ("dqn", "corral/rps", {}),
        ("dqn", TICTACTOE, {}),
        ("dqn", TICTACTOE, {"self_play": True, "snapshot_interval": 2}),
        ("maddpg", SPREAD, {}),
    ],
    ids=["dqn-rps", "dqn-tictactoe", "dqn-tictactoe-self-play", "maddpg-spread"],
)
def test_the_counters_are_what_the_rollouts_held(name, env_id, settings):
    """Env steps are T * E per rollout; decisions the acting agents of the steps learned from
    (the learner's seats only under self-play): in turn-based games, far from env steps times
    agents; rollouts of 2 steps cut decisions that carry over. The exploration the policy
    acts with follows the env steps learned from."""
    venv = make_venv(env_id)
    algo = make_algo(name, venv, **settings)
    acted = []
    players = self_play(venv, algo) if settings.get("self_play") else {}
    collector = Collector(venv, algo, seed=0, **players)
    actions_of = collector.actions

    def recording(batch, explore):
        actions, extras = actions_of(batch, explore)
        acting = {g: a.copy() for g, a in batch.acting.items()}
        if "learner" in extras[MAIN]:
            acting = {g: a & extras[MAIN]["learner"][g] for g, a in acting.items()}
        acted.append(sum(int(a.sum()) for a in acting.values()))
        return actions, extras

    collector.actions = recording
    steps = algo.rollout_steps
    assert steps == 2
    for rollouts in (1, 5):
        collector.run((rollouts - algo.updates) * steps * venv.num_envs)
        learner = algo
        assert learner.updates == rollouts == algo.policy.version
        assert len(acted) == steps * rollouts
        assert learner.env_steps == steps * rollouts * venv.num_envs
        assert learner.decisions == sum(acted)
        if name == "dqn":
            assert algo.policy.epsilon == epsilon_at(algo.config, learner.env_steps) < 1
        else:
            assert exploration(algo.policy) == exploration_at(algo.config, learner.env_steps)
    agents = sum(len(members) for members in venv.groups.values())
    if env_id == SPREAD:
        assert algo.decisions == algo.env_steps * agents
    else:
        assert algo.decisions < algo.env_steps * agents / 1.5
    if settings.get("self_play"):
        assert algo.gradient_step > 0 and collector.fixed[OPPONENT].policy.members
    venv.close()


@pytest.mark.parametrize("case", ["dqn-rps", "maddpg-spread"])
def test_counters_exploration_and_version_survive_a_state_dict_round_trip(case):
    venv, algo, _ = trained(case)
    clone = make_algo(CASES[case][0], venv, seed=5)
    clone.load_state_dict(algo.state_dict())
    for name in ("env_steps", "decisions", "updates"):
        assert getattr(clone, name) == getattr(algo, name) > 0
    assert clone.policy.version == algo.policy.version == ROLLOUTS
    assert exploration(clone.policy) == exploration(algo.policy)
    assert same(clone.policy.weights(), algo.policy.weights())
    venv.close()


@pytest.mark.parametrize("case", ["dqn-rps", "maddpg-spread"])
def test_a_state_dict_from_before_the_split_is_refused(case):
    # it had env_steps (which set the exploration) but no decisions, updates or version:
    # nothing is filled in (the runner turns the KeyError into one CheckpointError)
    venv, algo, _ = trained(case)
    state = algo.state_dict()
    for name in ("decisions", "updates", "version"):
        del state[name]
    clone = make_algo(CASES[case][0], venv, seed=5)
    with pytest.raises(KeyError, match="updates"):
        clone.load_state_dict(state)
    venv.close()
