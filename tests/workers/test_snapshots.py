"""Self-play and policy maps in a rollout worker, in the test's own process (no Ray): the
pool's snapshots sent once by id, and a worker given the pool's snapshot collecting exactly
the single-process collector's first rollout; a policy map function seats the worker's envs
as one collector of all the run's envs seats them."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="rollout workers act with torch policies")
pytest.importorskip("pettingzoo", reason="the games are PettingZoo's tic-tac-toe")

from support.players import seats
from support.rollouts import assert_rollouts_equal

from corral.algos.selfplay import SnapshotPool
from corral.data.rollouts import Rollout
from corral.errors import ConfigError
from corral.training import load_config
from corral.training.collector import Collector
from corral.training.policy_map import MAIN
from corral.training.runner import build_players, build_venv, seating, uses_state
from corral.training.self_play import OPPONENT
from corral.workers.rollout_worker import RolloutWorker
from corral.workers.snapshots import PoolSync, SnapshotCopies, SnapshotSender

TICTACTOE = "pettingzoo/classic/tictactoe_v3"
E = 4
T = 8  # vector steps per rollout: train_freq / E


def dqn(**settings: Any) -> Any:
    base = {"num_envs": E, "train_freq": T * E, "device": "cpu", "seed": 3}
    return load_config("dqn", TICTACTOE, {**base, **settings})


def other_snapshot(config: Any) -> Any:
    """A snapshot of a learner of another seed: a past copy unlike the learner."""
    venv = build_venv(config.run, num_envs=1)
    try:
        other = dataclasses.replace(config, algo_config=config.algo_config.replace(seed=99))
        learners, _ = build_players(other, venv)
    finally:
        venv.close()
    return learners[MAIN].snapshot()


def single_process_rollout(config: Any, members: list[Any]) -> tuple[dict[str, Rollout], Any]:
    """The first rollout of one collector of all the run's envs, its pool holding
    ``members``, and the weights its learner acted with; plus what it produced."""
    venv = build_venv(config.run, state=uses_state(config))
    try:
        learners, fixed = build_players(config, venv)
        for member in members:
            fixed[OPPONENT].policy.add(member)
        seen: list[Any] = []
        learner = learners[MAIN]
        learner.learn = lambda rollouts: seen.append(rollouts) or {}  # type: ignore[method-assign]
        seats = seating(config, venv, learning=True)
        collector = Collector(venv, learners, fixed, seed=config.run.seed, seating=seats)
        progress = collector.run(T * E)
        weights = learner.policy.weights()
    finally:
        venv.close()
    (rollouts,) = seen
    return rollouts, (weights, progress)


def test_a_worker_given_the_pool_s_snapshot_collects_the_single_process_first_rollout() -> None:
    config = dqn(self_play=True, learning_starts=10_000)
    snapshot = other_snapshot(config)
    want, (weights, _) = single_process_rollout(config, [snapshot])
    worker = RolloutWorker(config, 0, range(E), seed=config.run.seed)
    try:
        pool = worker.collector.fixed[OPPONENT].policy
        assert isinstance(pool, SnapshotPool)
        sample = worker.sample(weights, snapshot, pools={OPPONENT: PoolSync((7,), (7,))})
        assert pool.members == [snapshot] and worker.snapshots.loaded == [7]
    finally:
        worker.close()
    got = sample.rollouts[MAIN]
    for g in want:
        assert_rollouts_equal(got[g], want[g], g)
    # the learner's own seat per episode was recorded: it learns its own decisions only
    assert not got["player"].extras["learner"].all()
    # against an empty pool (random play) the rollout is another one
    empty, _ = single_process_rollout(config, [])
    assert not np.array_equal(empty["player"].action, want["player"].action)


class Members:
    """A pool as the sender and the copies see it: its members."""

    def __init__(self) -> None:
        self.members: list[Any] = []


def test_a_worker_s_copy_of_the_pool_follows_the_driver_s_loading_each_snapshot_once() -> None:
    driver = Members()
    store: dict[str, Any] = {}  # the object store: reference -> snapshot

    def put(snapshot: Any) -> str:
        store[f"ref{len(store)}"] = snapshot
        return f"ref{len(store) - 1}"

    sender = SnapshotSender({OPPONENT: driver}, put)  # type: ignore[dict-item]
    workers = [Members(), Members()]
    copies = [SnapshotCopies({OPPONENT: w}) for w in workers]  # type: ignore[dict-item]

    def send(index: int) -> PoolSync:
        syncs, refs = sender.for_worker(index)
        copies[index].load(syncs, [store[r] for r in refs])
        return syncs[OPPONENT]

    a, b, c = {"version": 1}, {"version": 2}, {"version": 3}
    driver.members = [a, b]
    assert send(0) == PoolSync((0, 1), (0, 1)) and workers[0].members == [a, b]
    assert send(0) == PoolSync((0, 1), ())  # nothing new: nothing sent
    driver.members = [b, c]  # the driver's pool dropped its oldest and added one
    assert send(0) == PoolSync((1, 2), (2,)) and workers[0].members == [b, c]
    assert send(1) == PoolSync((1, 2), (1, 2)) and workers[1].members == [b, c]
    assert list(store.values()) == [a, b, c] and sender.puts == 3  # each put once
    assert copies[0].loaded == [0, 1, 2] and copies[1].loaded == [1, 2]  # each loaded once
    sender.forget(0)  # a worker started anew holds nothing: it is sent every member
    assert sender.for_worker(0)[0] == {OPPONENT: PoolSync((1, 2), (1, 2))}


def test_a_worker_refuses_snapshots_that_do_not_match_its_pools() -> None:
    copies = SnapshotCopies({OPPONENT: Members()})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"name 1 new snapshots, 0 came"):
        copies.load({OPPONENT: PoolSync((0,), (0,))}, [])
    with pytest.raises(ValueError, match=r"holds the snapshots \[3\], which this worker"):
        copies.load({OPPONENT: PoolSync((3,), ())}, [])
    with pytest.raises(ValueError, match=r"pools \['league'\]; this worker's pools"):
        copies.load({"league": PoolSync((), ())}, [])


def test_a_worker_s_sample_counts_the_snapshots_among_its_weights() -> None:
    config = dqn(self_play=True)
    worker = RolloutWorker(config, 0, range(2), seed=0)
    try:
        weights = worker.learners[MAIN].policy.weights()
        with pytest.raises(ValueError, match=r"then the 1 new snapshot\(s\) its pools name; got 1"):
            worker.sample(weights, pools={OPPONENT: PoolSync((0,), (0,))})
    finally:
        worker.close()


def test_a_policy_map_function_seats_and_counts_a_worker_s_envs_as_one_process_does() -> None:
    policies = {"learner": "dqn", "opponent": "fixed:random"}
    config = dqn(policies=policies, policy_map=seats, learning_starts=10_000)
    venv = build_venv(config.run)
    try:
        learners, fixed = build_players(config, venv)
        seen: list[Any] = []
        learners["learner"].learn = lambda r: seen.append(r) or {}  # type: ignore[method-assign]
        weights = learners["learner"].policy.weights()
        seats_ = seating(config, venv, learning=True)
        progress = Collector(venv, learners, fixed, seed=0, seating=seats_).run(T * E)
    finally:
        venv.close()
    worker = RolloutWorker(config, 0, range(E), seed=0)
    try:
        sample = worker.sample(weights)
    finally:
        worker.close()
    got, (want,) = sample.rollouts["learner"], seen
    assert_rollouts_equal(got["player"], want["player"], "player")
    # the learner's returns, counted in its own seats, and every agent's as one process does
    assert progress.episode_returns and sample.progress.episode_returns == progress.episode_returns
    assert sample.progress.agent_returns == progress.agent_returns
    # a worker's shard is seated as those envs are in one collector of all the run's envs
    shard = RolloutWorker(config, 1, range(2, 4), seed=0)
    try:
        seated = shard.collector.seating
        assert seated is not None
        np.testing.assert_array_equal(seated.episode, [2, 3])
        assert seated.owned["learner"]["player"].tolist() == [
            [True, False],
            [False, True],
        ]
    finally:
        shard.close()


def test_fixed_and_scripted_policies_play_in_a_worker_as_in_one_process() -> None:
    policies = {"player_2": "fixed:support.players:first_legal"}
    config = dqn(group_map="agent", policies=policies, learning_starts=10_000)
    want, (weights, progress) = single_process_rollout(config, [])
    worker = RolloutWorker(config, 0, range(E), seed=config.run.seed)
    try:
        sample = worker.sample(weights)
    finally:
        worker.close()
    assert list(sample.rollouts) == [MAIN] and list(want) == ["player_1"]
    assert_rollouts_equal(sample.rollouts[MAIN]["player_1"], want["player_1"], "player_1")
    assert sample.progress.agent_returns == progress.agent_returns


def test_learners_of_different_rollout_steps_are_refused_in_a_worker() -> None:
    policies = {"learner": "dqn", "opponent": "dqn"}
    config = dqn(policies=policies, policy_map=seats)
    other = config.algo_config.replace(train_freq=2 * T * E)  # as a learner of its own
    config = dataclasses.replace(
        config, policy_configs={**config.policy_configs, "opponent": other}
    )
    with pytest.raises(ConfigError, match=r"same rollout_steps.*\{'learner': 8, 'opponent': 16\}"):
        RolloutWorker(config, 0, range(E), seed=0)
