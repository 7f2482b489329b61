"""Rollout workers on a real multi-node Ray cluster started on this machine (a head that
offers no CPU and two worker nodes of two CPUs each, so that every rollout worker runs on a
worker node): a run completes; killing a worker actor, and removing a whole node, mid-run
leave training going with the loss counted; one worker collects the single-process path's
first rollout. After each test no actor of the run holds a CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="rollout workers act with torch policies")
pytest.importorskip("ray", reason="the cluster tests start a Ray cluster")

import ray
from ray.cluster_utils import Cluster
from support.actors import all_cpus_free_within, runtime_env_for_tests
from support.batches import assert_batches_equal
from support.faulty_envs import ENTRY, noted_pids

from corral.training import Runner, load_config
from corral.training.metrics import read_metrics

NODE_CPUS = 2


@pytest.fixture(scope="module")
def cluster():
    """A head without CPUs (the driver joins it) and two worker nodes, for the module."""
    if ray.is_initialized():
        pytest.skip("another Ray is running in this process: these tests start a cluster")
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False},
    )
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=NODE_CPUS)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, runtime_env=runtime_env_for_tests())
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def settings(tmp_path: Path, **more: Any) -> dict[str, Any]:
    """Two workers of one env each, 5-step rollouts (10 env steps an update); each env notes
    its process's pid and node in ``tmp_path / "pids"``."""
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    base = {
        "num_envs": 2,
        "runners": 2,
        "rollout_steps": 5,
        "total_steps": 40,
        "eval_every": 0,
        "eval_episodes": 1,
        "log_every": 10,
        "checkpoint_every": 0,
        "device": "cpu",
        "run_dir": str(tmp_path / "run"),
        "tensorboard": False,
        "env_kwargs": {"pids": str(pids)},
    }
    return {**base, **more}


def worker_nodes(tmp_path: Path) -> dict[int, str]:
    """The node of each rollout worker process of the test's runs, by pid (the driver's
    own env left out)."""
    return {pid: node for pid, node in noted_pids(tmp_path / "pids").items() if node != driver()}


def driver() -> str:
    return ray.get_runtime_context().get_node_id()


def learning_with(runner: Runner, action: Any) -> None:
    """Runs ``action()`` in the learner's first update of ``runner``, before it learns."""
    learn, calls = runner.algo.learn, []

    def learn_after(rollouts: Any) -> Any:
        if not calls:
            action()
        calls.append(1)
        return learn(rollouts)

    runner.algo.learn = learn_after  # type: ignore[method-assign]


def test_a_run_of_two_runners_on_the_worker_nodes_survives_a_killed_worker_actor(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The run completes, its workers on the worker nodes; the worker killed before the
    second update is replaced, its sample lost and counted."""
    config = load_config("mappo", ENTRY, settings(tmp_path))
    with Runner(config, progress=False) as runner:
        workers = runner.workers
        assert workers is not None
        learning_with(runner, lambda: ray.kill(workers.handles[1], no_restart=True))
        runner.train()
    rows = read_metrics(tmp_path / "run")
    assert [r["env_steps"] for r in rows] == [10, 20, 30, 40]
    assert rows[-1]["runner_restarts"] == 1
    assert sum(r.get("rollouts_lost", 0) for r in rows) == 1
    placed = worker_nodes(tmp_path)
    assert len(placed) == 3  # the replacement built its env in a process of its own
    assert set(placed.values()) <= {node.node_id for node in cluster.worker_nodes}
    assert all_cpus_free_within(ray, 20), "an actor outlived the run"


def test_one_worker_on_the_cluster_collects_the_single_process_first_rollout(
    cluster: Cluster, tmp_path: Path
) -> None:
    def first_rollout(runners: int) -> Any:
        more = {"runners": runners, "total_steps": 10, "run_dir": str(tmp_path / f"r{runners}")}
        config = load_config("mappo", ENTRY, settings(tmp_path, **more))
        seen = []
        with Runner(config, progress=False) as runner:
            learn = runner.algo.learn
            runner.algo.learn = lambda r: seen.append(r) or learn(r)  # type: ignore[method-assign]
            runner.train()
        return seen[0]

    single, worker = first_rollout(0), first_rollout(1)
    assert worker.keys() == single.keys()
    for group in worker:  # the worker's NumPy arrays against the single process's
        assert_batches_equal(worker[group], single[group], group)
    assert all_cpus_free_within(ray, 20), "an actor outlived the run"


def test_removing_a_node_mid_run_starts_its_workers_on_the_node_left(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The module's last test: it leaves one worker node."""
    config = load_config("mappo", ENTRY, settings(tmp_path))
    removed: list[str] = []

    def remove_a_workers_node() -> None:
        node_id = next(iter(worker_nodes(tmp_path).values()))
        (node,) = [n for n in cluster.worker_nodes if n.node_id == node_id]
        cluster.remove_node(node)
        removed.append(node_id)

    with Runner(config, progress=False) as runner:
        learning_with(runner, remove_a_workers_node)
        runner.train()
    rows = read_metrics(tmp_path / "run")
    assert [r["env_steps"] for r in rows] == [10, 20, 30, 40]
    placed = worker_nodes(tmp_path)
    lost = sum(node in removed for node in placed.values())
    assert lost in (1, 2)  # the workers of the removed node
    assert rows[-1]["runner_restarts"] == lost
    assert sum(r.get("rollouts_lost", 0) for r in rows) == lost
    (left,) = [n.node_id for n in cluster.worker_nodes]
    assert list(placed.values()).count(left) == 2  # its worker(s) and the replacement(s)
    assert all_cpus_free_within(ray, 20), "an actor outlived the run"
