"""The policy map on rollout workers, on a local Ray: self-play with the pool on the driver
(each snapshot put once, loaded once by each worker), in asynchronous (DQN) and synchronous
(MAPPO) mode; fixed and scripted opponents and a policy map function in the workers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="rollout workers act with torch policies")
pytest.importorskip("pettingzoo", reason="the games are PettingZoo's tic-tac-toe")
pytest.importorskip("ray", reason="rollout workers are Ray actors")

import ray

from corral import cli
from corral.errors import ConfigError
from corral.training import Runner, load_config
from corral.training.metrics import read_metrics
from corral.training.self_play import OPPONENT
from corral.workers.worker_set import WorkerActor

CPUS = 4
TICTACTOE = "pettingzoo/classic/tictactoe_v3"
WORKER_COLUMNS = {
    "runner_version_lag",
    "rollout_bytes",
    "learner_wait_s",
    "learner_wait_share",
    "runner_restarts",
}
"""The columns a run with rollout workers adds to a single-process run's."""


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module's tests, whose workers import ``support`` (tests/) as
    pytest's process does: a ``module:attr`` must be importable where the workers run."""
    started = not ray.is_initialized()
    if started:
        before = os.environ.get("PYTHONPATH")
        tests = str(Path(__file__).parents[1])
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (tests, before) if p)
        try:
            ray.init(address="local", num_cpus=CPUS, include_dashboard=False, log_to_driver=False)
        finally:
            if before is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = before
    yield
    if started:
        ray.shutdown()


def settings(tmp_path: Path, name: str, **more: Any) -> dict[str, Any]:
    base = {
        "num_envs": 4,
        "runners": 2,
        "eval_every": 0,
        "eval_episodes": 2,
        "checkpoint_every": 0,
        "device": "cpu",
        "run_dir": str(tmp_path / name),
        "tensorboard": False,
    }
    return {**base, **more}


def columns(rows: list[dict[str, Any]]) -> set[str]:
    return {key for row in rows for key in row}


def on_workers(runner: Runner, read: Any) -> list[Any]:
    """``read(worker)`` of each of the runner's rollout workers (a :class:`RolloutWorker`)."""
    assert runner.workers is not None
    return ray.get([h.__ray_call__.remote(read) for h in runner.workers.handles])


@pytest.mark.usefixtures("local_ray")
def test_dqn_self_play_on_workers_grows_the_driver_s_pool_and_sends_each_snapshot_once(
    tmp_path: Path,
) -> None:
    more = {"self_play": True, "train_freq": 8, "learning_starts": 0, "batch_size": 8}
    more |= {"snapshot_interval": 1, "pool_size": 50, "total_steps": 96, "log_every": 32}
    config = load_config("dqn", TICTACTOE, settings(tmp_path, "workers", **more))
    with Runner(config, progress=False) as runner:
        pool = runner.collector.fixed[OPPONENT].policy
        assert runner.workers is not None and runner.workers.asynchronous
        results = runner.train()
        sender = runner.workers.snapshots
        loaded = on_workers(runner, lambda w: w.snapshots.loaded)
        sizes = on_workers(runner, lambda w: len(w.collector.fixed[OPPONENT].policy.members))
    added = len(pool.members)  # none dropped: pool_size is large
    assert added >= 4, "the learner's snapshots join the pool on the driver"
    assert sender.puts == added  # each put into the object store once
    for ids in loaded:  # each loaded once, in the order they joined
        assert ids == sorted(set(ids))
    assert max(len(ids) for ids in loaded) == added  # the last worker sent to holds them all
    assert max(sizes) == added
    rows = results.metrics
    pools = [r["selfplay/pool"] for r in rows]  # each row's mean over its updates
    assert pools == sorted(pools) and 1 < pools[-1] <= added
    assert "selfplay/return" in columns(rows)
    assert all(r["selfplay/return"] == r["train_return"] for r in rows if "train_return" in r)
    single = load_config("dqn", TICTACTOE, settings(tmp_path, "single", **more, runners=0))
    with Runner(single, progress=False) as runner:
        alone = runner.train().metrics
    assert columns(rows) - {"rollouts_dropped"} == columns(alone) | WORKER_COLUMNS


@pytest.mark.usefixtures("local_ray")
def test_mappo_self_play_on_workers_sends_the_pool_synchronously(tmp_path: Path) -> None:
    more = {"self_play": True, "rollout_steps": 2, "epochs": 1, "snapshot_interval": 1}
    more |= {"pool_size": 2, "total_steps": 48, "log_every": 16}
    config = load_config("mappo", "corral/rps", settings(tmp_path, "sync", **more))
    with Runner(config, progress=False) as runner:
        pool = runner.collector.fixed[OPPONENT].policy
        assert runner.workers is not None and not runner.workers.asynchronous
        results = runner.train()
        sender = runner.workers.snapshots
        loaded = on_workers(runner, lambda w: w.snapshots.loaded)
        versions = on_workers(
            runner, lambda w: [m["version"] for m in w.collector.fixed[OPPONENT].policy.members]
        )
    # 6 updates, a snapshot after each; every worker samples with the pool of the update
    # before, so the 6th snapshot, made after the last sample, is never put
    assert runner.algo.policy.version == 6 and sender.puts == 5
    assert [m["version"] for m in pool.members] == [5, 6]
    assert loaded == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    assert versions == [[4, 5], [4, 5]]
    assert [r["selfplay/pool"] for r in results.metrics] == [1.5, 2, 2]  # means of 2 updates


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CI") == "true", reason="a third run on workers (10 s)")
@pytest.mark.usefixtures("local_ray")
def test_a_scripted_opponent_seated_by_a_policy_map_function_plays_in_the_workers(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "mapped"
    rc = cli.main(
        [
            *("train", "dqn", "--env", TICTACTOE, "--run-dir", str(run_dir), "--no-progress"),
            *("--num-envs", "4", "--runners", "2", "--device", "cpu", "--total-steps", "64"),
            *("--policies", "learner=dqn,opponent=fixed:support.players:first_legal"),
            *("--set", "policy_map=support.players:seats", "train_freq=16", "learning_starts=0"),
            *("batch_size=8", "eval_every=0", "log_every=32", "tensorboard=false"),
        ]
    )
    assert rc == 0
    rows = read_metrics(run_dir)
    assert [r["env_steps"] for r in rows] == [32, 64]
    assert {"learner/loss/player", "train_return"} <= columns(rows)


def test_a_worker_that_cannot_import_the_config_s_policy_map_says_so_when_ready() -> None:
    """Built in a Ray actor, a worker keeps the error of building it for ``ready()`` (Ray
    would report it as the actor's death, with the traceback as text)."""
    policies = {"learner": "dqn", "opponent": "fixed:random"}
    config = load_config("dqn", TICTACTOE, {"num_envs": 2, "device": "cpu", "policies": policies})
    config.run.policy_map = "not_on_this_node:seats"  # importable on the driver only
    worker = WorkerActor(config, 0, range(2), seed=0)
    try:
        with pytest.raises(
            ConfigError, match=r"policy_map 'not_on_this_node:seats' is no function"
        ):
            worker.ready()
    finally:
        worker.close()
