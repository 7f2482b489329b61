"""The Policy/Learner split (corral.algos.policy), on MAPPO: acting has no side effects,
weights travel by pickle, and the learner's counters come from the rollouts it learns from."""

from __future__ import annotations

import copy
import pickle
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from oracles.decisions import DecisionCounter  # noqa: E402

import corral  # noqa: E402
from corral.algos.mappo import MAPPO, MAPPOLearner, MAPPOPolicy  # noqa: E402
from corral.training.collector import Collector  # noqa: E402
from corral.training.policy_map import MAIN  # noqa: E402
from corral.training.self_play import self_play  # noqa: E402

TICTACTOE = "pettingzoo/classic/tictactoe_v3"


def trained(env_id: str = "corral/rps", updates: int = 2, **settings) -> tuple:
    """A MAPPO after ``updates`` rollouts of 5 vector steps of 4 envs, its venv and collector."""
    venv = corral.make_vec(env_id, 4, seed=0, state=True)
    config = MAPPO.Config(rollout_steps=5, epochs=1, seed=0, **settings)
    algo = MAPPO(venv, config)
    collector = Collector(venv, algo, seed=0)
    collector.run(updates * 5 * venv.num_envs)
    assert algo.updates == updates
    return venv, algo, collector


def same(a, b) -> bool:
    """Whether two nests of dicts of arrays or tensors hold equal values."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(np.array_equal(np.asarray(a), np.asarray(b)))


def test_the_split_parts_of_mappo():
    venv, algo, _ = trained(updates=0)
    assert isinstance(algo.policy, MAPPOPolicy) and isinstance(algo, MAPPOLearner)
    # the algorithm is its learner: nothing passes acting through to the policy
    assert not any(hasattr(algo, name) for name in ("act", "bootstrap_values", "final_values"))
    venv.close()


def test_acting_changes_no_counter_and_no_learning_state():
    venv, algo, collector = trained()
    policy, learner = algo.policy, algo
    batch = collector.batch
    decisions = batch.decision
    kept = copy.deepcopy(decisions)
    counters = {name: getattr(learner, name) for name in ("env_steps", "decisions", "updates")}
    weights = policy.weights()
    start = policy.generator.get_state()
    first = algo.policy.act(batch, explore=True, decisions=decisions)
    after_first = policy.generator.get_state()
    policy.generator.set_state(start)
    second = algo.policy.act(batch, explore=True, decisions=decisions)
    # the same generator state gives the same actions and extras, decision indices included
    assert same(first[0], second[0]) and same(first[1], second[1])
    assert torch.equal(policy.generator.get_state(), after_first)
    assert not torch.equal(after_first, start)  # it did sample
    assert same(first[1]["decision"], kept) and same(decisions, kept)
    assert {name: getattr(learner, name) for name in counters} == counters
    assert same(policy.weights(), weights)
    assert policy.version == 2 == algo.updates
    venv.close()


def test_the_policy_reads_each_agents_decision_index_from_the_batch():
    """Acting, bootstrap values and final values read ``Batch.decision`` (and, in the envs
    that ended, ``episode_decisions``): the same numbers as given the collector's count of
    the batches (the oracle), on an env whose agents act and die at their own pace."""
    venv = corral.make_vec("corral/tag", 4, seed=0)
    config = MAPPO.Config(seed=0, bootstrap_truncated=True, time_scale=0.25)
    policy = MAPPO(venv, config).policy
    oracle, rng = DecisionCounter(), np.random.default_rng(0)
    batch, ended, later = venv.reset(seed=0), 0, 0
    for _ in range(40):
        index = oracle.step(batch)
        start = policy.generator.get_state()
        read = policy.act(batch, explore=True)
        policy.generator.set_state(start)
        given = policy.act(batch, explore=True, decisions=index)
        given[1].pop("decision")  # the extra of indices given, as before
        assert same(read[0], given[0]) and same(read[1], given[1])
        assert same(policy.bootstrap_values(batch), policy.bootstrap_values(batch, index))
        batch = venv.step(venv.sample_actions(batch, rng))
        assert same(policy.final_values(batch), policy.final_values(batch, oracle.made))
        ended += int(batch.done.sum())
        later += int((batch.done[:, None] & (batch.episode_decisions["prey"] > 0)).sum())
    assert ended and later  # episodes ended after decisions: episode_decisions was read
    venv.close()


def test_exploring_on_a_batch_without_decision_indices_is_refused_with_what_to_pass():
    venv, algo, _ = trained(updates=0)
    batch = vars(venv.reset(seed=1)) | {"decision": None}
    batch = SimpleNamespace(**batch)  # not a VectorEnv's batch
    with pytest.raises(ValueError, match=r"no Batch.decision.*pass decisions="):
        algo.policy.act(batch, explore=True)
    algo.policy.act(batch, explore=False)  # greedy acting needs no value
    venv.close()


def test_weights_pickle_and_make_a_fresh_policy_act_the_same():
    venv, algo, collector = trained()
    raw = algo.policy.weights()
    weights = pickle.loads(pickle.dumps(raw))
    assert weights["version"] == 2
    tensors = [t for per_group in weights["params"].values() for t in per_group.values()]
    assert tensors and all(t.device.type == "cpu" for t in tensors)

    fresh = MAPPO(venv, algo.config.replace(seed=123))
    batch = collector.batch
    decisions = batch.decision
    untrained = fresh.policy.bootstrap_values(batch, decisions)["player"]
    fresh.policy.load_weights(weights)
    assert fresh.policy.version == 2
    fresh.policy.generator.set_state(algo.policy.generator.get_state())
    for explore in (False, True):
        mine = algo.policy.act(batch, explore=explore, decisions=decisions)
        theirs = fresh.policy.act(batch, explore=explore, decisions=decisions)
        assert same(mine[0], theirs[0]) and same(mine[1], theirs[1])
    # the loaded weights made the difference
    assert not np.array_equal(untrained, fresh.policy.bootstrap_values(batch, decisions)["player"])
    # the weights are copies: learning on leaves them as they were
    collector.run(5 * venv.num_envs)
    assert algo.policy.version == 3 and fresh.policy.version == 2
    assert not same(algo.policy.weights()["params"], weights["params"])
    assert same(fresh.policy.weights()["params"], weights["params"])
    assert same(raw, weights)
    venv.close()


@pytest.mark.parametrize(
    ("env_id", "settings"),
    [("corral/rps", {}), (TICTACTOE, {"self_play": True})],
    ids=["turn-based", "self-play"],
)
def test_the_counters_are_what_the_rollouts_held(env_id, settings):
    """Env steps are T * E per rollout; decisions the acting agents of the steps learned from
    (the learner's seats only under self-play): in turn-based games, far from env steps
    times agents, and rollouts of 5 steps cut decisions that carry over."""
    if env_id == TICTACTOE:
        pytest.importorskip("pettingzoo")
    venv = corral.make_vec(env_id, 4, seed=0, state=env_id != TICTACTOE)
    algo = MAPPO(venv, MAPPO.Config(rollout_steps=5, epochs=1, seed=0, **settings))
    acted = []
    players = self_play(venv, algo) if settings.get("self_play") else {}
    collector = Collector(venv, algo, seed=0, **players)
    actions_of = collector.actions

    def recording(batch, explore):
        actions, extras = actions_of(batch, explore)
        acting = batch.acting["player"].copy()
        if "learner" in extras[MAIN]:
            acting &= extras[MAIN]["learner"]["player"]
        acted.append(acting)
        return actions, extras

    collector.actions = recording
    for updates in (1, 3):
        collector.run((updates - algo.updates) * 5 * venv.num_envs)
        assert algo.updates == updates == algo.updates
        assert len(acted) == 5 * updates
        assert algo.env_steps == 5 * updates * venv.num_envs
        assert algo.decisions == int(np.sum(acted))
    agents = len(venv.groups["player"])
    assert algo.decisions < algo.env_steps * agents / 1.5
    venv.close()


def test_counters_and_version_survive_a_state_dict_round_trip():
    venv, algo, _ = trained()
    clone = MAPPO(venv, algo.config.replace(seed=5))
    clone.load_state_dict(algo.state_dict())
    for name in ("env_steps", "decisions", "updates"):
        assert getattr(clone, name) == getattr(algo, name) > 0
    assert clone.policy.version == algo.policy.version == 2
    venv.close()


def test_a_state_dict_from_before_the_split_is_refused():
    # it counted decisions in act ("decision_count") and had no env_steps, decisions, version:
    # nothing is filled in (the runner turns the KeyError into one CheckpointError)
    venv, algo, _ = trained()
    state = algo.state_dict()
    for name in ("env_steps", "decisions", "version"):
        del state[name]
    state["decision_count"] = {"player": torch.zeros(4, 2, dtype=torch.int64)}
    clone = MAPPO(venv, algo.config.replace(seed=5))
    with pytest.raises(KeyError, match="env_steps"):
        clone.load_state_dict(state)
    venv.close()


def test_the_batch_and_the_oracle_count_each_agents_decisions_in_its_episode():
    venv = corral.make_vec("corral/rps", 2, seed=0, env_kwargs={"num_rounds": 2})
    counter = DecisionCounter()
    batch = venv.reset(seed=0)
    seen, counted, rng = [], [], np.random.default_rng(0)
    for _ in range(10):
        seen.append(batch.decision["player"].copy())
        counted.append(counter.step(batch)["player"].copy())
        batch = venv.step(venv.sample_actions(batch, rng))
    # two players moving in turn for 2 rounds: episodes of 4 steps
    expected = [[0, 0], [1, 0], [1, 1], [2, 1], [0, 0], [1, 0], [1, 1], [2, 1], [0, 0], [1, 0]]
    for env in range(2):
        assert [s[env].tolist() for s in seen] == expected
        assert [s[env].tolist() for s in counted] == expected
    venv.close()
