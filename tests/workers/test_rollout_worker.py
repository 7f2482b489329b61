"""A rollout worker in the test's own process (no Ray): the same first rollout as the
single-process collector, envs seeded as the run's, weights loaded only when newer."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="rollout workers act with torch policies")
pytest.importorskip("mpe2", reason="the differential tests run mpe2's simple_spread")

from support.rollouts import assert_rollouts_equal

from corral.data.rollouts import Rollout, concat_envs
from corral.training import load_config
from corral.training.collector import Collector, Progress
from corral.training.policy_map import MAIN
from corral.training.runner import build_players, build_venv, uses_state
from corral.workers.rollout_worker import RolloutWorker, policy_seed
from corral.workers.worker_set import add_sample

ENV = "mpe2/simple_spread_v3"
T = 5  # rollout_steps


def mappo(num_envs: int, **settings: Any) -> Any:
    base = {"num_envs": num_envs, "rollout_steps": T, "device": "cpu", "seed": 3}
    return load_config("mappo", ENV, {**base, **settings})


def first_rollout(config: Any) -> tuple[dict[str, Rollout], Any]:
    """The first rollout the single-process path learns from (today's Collector.run), and
    the weights it acted with."""
    venv = build_venv(config.run, state=uses_state(config))
    try:
        learners, fixed = build_players(config, venv)
        learner = learners[MAIN]
        weights = learner.policy.weights()
        seen: list[dict[str, Rollout]] = []
        learner.learn = lambda rollouts: seen.append(rollouts) or {}  # type: ignore[method-assign]
        collector = Collector(venv, learners, fixed, seed=config.run.seed)
        collector.run(config.algo_config.rollout_steps * venv.num_envs)
    finally:
        venv.close()
    (rollouts,) = seen
    return rollouts, weights


def test_one_worker_collects_exactly_the_single_process_first_rollout() -> None:
    config = mappo(4)
    want, weights = first_rollout(config)
    worker = RolloutWorker(config, 0, range(4), seed=config.run.seed)
    try:
        sample = worker.sample(weights)
    finally:
        worker.close()
    assert sample.versions == {MAIN: 0}
    assert sample.progress.env_steps == T * 4
    assert sample.seconds > 0  # the worker's own time, apart from the transfer
    got = sample.rollouts[MAIN]
    assert got.keys() == want.keys()
    for g in want:
        assert_rollouts_equal(got[g], want[g], g)
    assert "log_prob" in got["agent"].extras  # log-probs and values compared too
    assert got["agent"].value is not None


def test_a_recurrent_policy_keeps_its_memories_in_the_worker_as_in_one_process() -> None:
    # corral/memory-turns: the memories advance only where an agent acts, over several episodes
    config = load_config(
        "mappo",
        "corral/memory-turns",
        {"num_envs": 2, "rollout_steps": 12, "device": "cpu", "seed": 5, "recurrent": True},
    )
    want, weights = first_rollout(config)
    worker = RolloutWorker(config, 0, range(2), seed=config.run.seed)
    try:
        got = worker.sample(weights).rollouts[MAIN]
    finally:
        worker.close()
    for g in want:
        assert "actor_hidden" in got[g].extras  # the memories each decision started from
        assert_rollouts_equal(got[g], want[g], g)


def test_two_workers_observe_what_one_process_of_all_their_envs_observes() -> None:
    config = mappo(4, runners=2)
    want, weights = first_rollout(mappo(4))
    samples = []
    for i, envs in enumerate(config.run.runner_envs()):
        worker = RolloutWorker(config, i, envs, seed=config.run.seed)
        try:
            samples.append(worker.sample(weights))
        finally:
            worker.close()
    for g in want:
        joined = concat_envs([s.rollouts[MAIN][g] for s in samples])
        # worker 1 samples its actions from a stream of its own, so after the first step
        # its envs' states differ from the single process's: the first observations agree
        np.testing.assert_array_equal(joined.obs[0], want[g].obs[0])
        assert joined.obs.shape == want[g].obs.shape
        assert joined.next_value.shape == want[g].next_value.shape


def test_a_worker_loads_only_weights_newer_than_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    config = mappo(2)
    worker = RolloutWorker(config, 0, range(2), seed=0)
    try:
        policy = worker.learners[MAIN].policy
        loaded: list[int] = []
        original = policy.load_weights
        monkeypatch.setattr(
            policy, "load_weights", lambda w: loaded.append(w["version"]) or original(w)
        )
        weights = policy.weights()
        for version in (0, 0, 2, 1, 2, 3):
            worker.sample({**weights, "version": version})
        assert loaded == [0, 2, 3]
        assert worker.versions == {MAIN: 3}
        with pytest.raises(ValueError, match=r"one each; got 2"):
            worker.sample(weights, weights)
    finally:
        worker.close()


def test_worker_policy_streams_differ_but_worker_zero_keeps_the_runs() -> None:
    seeds = [policy_seed(3, i) for i in range(4)]
    assert seeds[0] == 3
    assert len(set(seeds)) == 4


def test_a_replacement_starts_new_episodes_from_seeds_of_its_restart_number() -> None:
    """A lost worker's replacement does not replay its predecessor's episodes: its envs and
    policies start from seeds drawn from (seed, index, restart), the same each time."""
    config = mappo(2, runners=2)
    weights = first_rollout(mappo(2))[1]

    def first_obs(restart: int) -> np.ndarray:
        worker = RolloutWorker(config, 1, range(1, 2), seed=config.run.seed, restart=restart)
        try:
            return worker.sample(weights).rollouts[MAIN]["agent"].obs[0]
        finally:
            worker.close()

    original, replaced = first_obs(0), first_obs(1)
    assert not np.array_equal(original, replaced)
    np.testing.assert_array_equal(first_obs(1), replaced)
    assert not np.array_equal(first_obs(2), replaced)
    assert policy_seed(3, 0, restart=1) != 3


def test_a_worker_s_env_error_names_the_run_s_env() -> None:
    """A worker's envs are the run's envs 2 and 3: its env 1's fault is the run's env 3's."""
    from corral.errors import EnvError

    config = mappo(4)
    _, weights = first_rollout(config)
    worker = RolloutWorker(config, 1, range(2, 4), seed=config.run.seed)
    try:

        def fails() -> Any:
            raise EnvError(1, "step() raised RuntimeError: boom", copies=range(1, 2))

        worker.collector.sample = fails  # type: ignore[method-assign]
        with pytest.raises(EnvError) as info:
            worker.sample(weights)
    finally:
        worker.close()
    err = info.value
    assert err.env_index == 3 and str(err).startswith("env 3: step() raised RuntimeError: boom")
    assert err.copies == range(3, 4) and err.faults == [err]


def test_a_worker_s_env_restart_is_sent_back_naming_the_run_s_env() -> None:
    """With on_env_error=restart the vector env warns of its env 1 (the worker's): the
    sample carries the warning for the driver, naming the run's env 3, and pickles."""
    import pickle
    import warnings

    from corral.errors import EnvError, EnvRestartWarning

    config = mappo(4)
    _, weights = first_rollout(config)
    worker = RolloutWorker(config, 1, range(2, 4), seed=config.run.seed)
    try:
        sample = worker.collector.sample

        def restarts() -> Any:
            fault = EnvError(1, "step() raised RuntimeError: boom", restarted=True)
            warnings.warn(EnvRestartWarning(fault), stacklevel=1)
            return sample()

        worker.collector.sample = restarts  # type: ignore[method-assign]
        with warnings.catch_warnings():
            warnings.simplefilter("error", EnvRestartWarning)  # none escapes in the worker
            got = pickle.loads(pickle.dumps(worker.sample(weights)))
    finally:
        worker.close()
    (restart,) = got.restarts
    assert str(restart).startswith("env 3 failed and was restarted; its episode ends truncated")
    assert restart.fault.env_index == 3 and "RuntimeError: boom" in str(restart)
    # the driver adds the sample to its progress and warns, as a run in one process does
    total = Progress()
    with pytest.warns(EnvRestartWarning, match="^env 3 failed and was restarted"):
        add_sample(total, got)
    assert total.env_steps == got.progress.env_steps == T * 2
