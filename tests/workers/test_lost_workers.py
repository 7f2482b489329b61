"""Lost rollout workers on a local Ray: a worker whose process dies mid-rollout, or that hangs
past ``sample_timeout``, is replaced and its sample counted as lost while training goes on
(synchronously and asynchronously); a resumed run keeps the counts; ``runner_restarts=False``
and a worker lost again and again stop the run naming it; an env that raises in a worker
follows ``on_env_error``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="rollout workers act with torch policies")
pytest.importorskip("ray", reason="rollout workers are Ray actors")

import ray
from support.actors import all_cpus_free_within, runtime_env_for_tests
from support.faulty_envs import ENTRY

from corral.errors import EnvError, EnvRestartWarning, WorkerDiedError
from corral.training import Runner, checkpoint, load_config, train
from corral.training.metrics import read_metrics
from corral.workers.worker_set import MAX_LOSSES_IN_ROW

CPUS = 4  # of the module's Ray: 2-3 one-CPU workers fit on this 2-core machine


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray for the module, whose workers import the test envs."""
    if ray.is_initialized():
        pytest.skip("another Ray is running in this process: these tests start their own")
    ray.init(
        address="local",  # a Ray of its own, even where another runs on this machine
        num_cpus=CPUS,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=runtime_env_for_tests(),
    )
    yield
    ray.shutdown()


def settings(
    tmp_path: Path, fault: str | None, *, at: int = 3, once: bool = True, **more: Any
) -> dict[str, Any]:
    """Two workers of two envs each, 5-step rollouts (20 env steps an update); the first env
    to reach its ``at``-th step does ``fault`` (every env, unless ``once``)."""
    marker = str(tmp_path / "faulted") if once else None
    env_kwargs = {"fault": fault, "at": at, "marker": marker}
    base = {
        "num_envs": 4,
        "runners": 2,
        "rollout_steps": 5,
        "total_steps": 80,
        "eval_every": 0,
        "eval_episodes": 1,
        "log_every": 20,
        "checkpoint_every": 0,
        "device": "cpu",
        "run_dir": str(tmp_path / "run"),
        "tensorboard": False,
        "env_kwargs": env_kwargs,
    }
    if "train_freq" in more:  # a replay learner's rollouts are train_freq steps long
        del base["rollout_steps"]
    return {**base, **more}


def run(config: Any) -> Path:
    """Train ``config``'s run; its directory."""
    with Runner(config, progress=False) as runner:
        runner.train()
        return runner.run_dir


def total(rows: list[dict[str, float]], column: str) -> float:
    return sum(r.get(column, 0) for r in rows)


@pytest.mark.slow  # two runs and a replacement: 40 s here; the cluster tests kill a worker in CI
def test_a_worker_dying_mid_rollout_is_replaced_and_a_resume_keeps_the_counts(
    tmp_path: Path,
) -> None:
    config = load_config("mappo", ENTRY, settings(tmp_path, "die"))
    run_dir = run(config)
    assert (tmp_path / "faulted").exists()  # a worker did die at its env's third step
    rows = read_metrics(run_dir)
    # the update waits for the replacement's sample: every update learns from 4 envs
    assert [r["env_steps"] for r in rows] == [20, 40, 60, 80]
    assert rows[-1]["runner_restarts"] == 1
    assert total(rows, "rollouts_lost") == 1
    assert all("agent/policy_loss" in r for r in rows)
    saved = checkpoint.load(run_dir / "checkpoint.pt")
    assert saved["runner_counts"] == {
        "runner_restarts": 1,
        "rollouts_lost": 1,
        "rollouts_dropped": 0,
    }
    version = saved["learners"]["main"]["version"]
    assert all_cpus_free_within(ray, 10), "an actor outlived the run"
    # resumed: the counts go on from the checkpoint's, the learner from its version
    train(config.algo, progress=False, resume=run_dir, total_steps=100, allow_imports=[ENTRY])
    rows = read_metrics(run_dir)
    assert [r["env_steps"] for r in rows][-1] == 100
    assert rows[-1]["runner_restarts"] == 1
    saved = checkpoint.load(run_dir / "checkpoint.pt")
    assert saved["runner_counts"]["rollouts_lost"] == 1
    assert saved["learners"]["main"]["version"] == version + 1
    assert all_cpus_free_within(ray, 10), "an actor outlived the resumed run"


@pytest.mark.slow  # a 10 s sample_timeout and a replacement: 25 s here
def test_a_hung_worker_is_killed_at_sample_timeout_and_replaced(tmp_path: Path) -> None:
    config = load_config(
        "mappo", ENTRY, settings(tmp_path, "hang", total_steps=60, sample_timeout=10)
    )
    run(config)
    rows = read_metrics(tmp_path / "run")
    assert [r["env_steps"] for r in rows] == [20, 40, 60]
    assert rows[-1]["runner_restarts"] == 1
    assert total(rows, "rollouts_lost") == 1
    assert all_cpus_free_within(ray, 10), "the hung actor outlived the run"


def test_an_asynchronous_run_replaces_a_dead_worker_and_goes_on(tmp_path: Path) -> None:
    more: dict[str, Any] = {"num_envs": 2, "train_freq": 5, "learning_starts": 0, "batch_size": 4}
    config = load_config("dqn", ENTRY, settings(tmp_path, "die", total_steps=60, **more))
    run(config)
    rows = read_metrics(tmp_path / "run")
    assert (tmp_path / "faulted").exists()
    assert rows[-1]["env_steps"] >= 60
    assert rows[-1]["runner_restarts"] == 1
    assert total(rows, "rollouts_lost") == 1
    assert all_cpus_free_within(ray, 10), "an actor outlived the run"


def test_without_restarts_a_lost_worker_stops_the_run_naming_it(tmp_path: Path) -> None:
    config = load_config("mappo", ENTRY, settings(tmp_path, "die", runner_restarts=False))
    with pytest.raises(WorkerDiedError, match=r"rollout worker \d was lost in sample\(\).*"):
        run(config)
    assert all_cpus_free_within(ray, 10), "an actor outlived the run"


def test_a_replacement_that_cannot_be_built_stops_the_run_with_its_error(tmp_path: Path) -> None:
    """A worker dies; its replacement's envs refuse to be built (as on a node without a
    module): the run stops with the worker's EnvError naming the env and the cause, not
    Ray's wrapper of it."""
    given = settings(tmp_path, "die")
    given["env_kwargs"]["refuse_after"] = str(tmp_path / "faulted")
    config = load_config("mappo", ENTRY, given)
    # the lost worker's first env, by the run's index: worker 0's env 0 or worker 1's env 2
    said = r"env [02]: building the env raised ConfigError: this env"
    with pytest.raises(EnvError, match=said) as e:
        run(config)
    assert not isinstance(e.value, ray.exceptions.RayError)
    assert all_cpus_free_within(ray, 10), "an actor outlived the run"


@pytest.mark.slow  # three replacements: 30 s here
def test_a_worker_lost_again_and_again_stops_the_run_naming_it_and_the_cause(
    tmp_path: Path,
) -> None:
    more: dict[str, Any] = {"num_envs": 2, "runners": 2, "total_steps": 40}
    config = load_config("mappo", ENTRY, settings(tmp_path, "die", once=False, **more))
    with pytest.raises(
        WorkerDiedError,
        match=rf"rollout worker \d was lost {MAX_LOSSES_IN_ROW} times in a row, the last: "
        r"(RayActorError|ActorDiedError|ActorUnavailableError)",
    ):
        run(config)
    assert all_cpus_free_within(ray, 10), "an actor outlived the run"


@pytest.mark.parametrize("on_env_error", ["raise", "restart"])
def test_an_env_raising_in_a_worker_follows_on_env_error(tmp_path: Path, on_env_error: str) -> None:
    more: dict[str, Any] = {"on_env_error": on_env_error, "total_steps": 40}
    config = load_config("mappo", ENTRY, settings(tmp_path, "raise", **more))
    if on_env_error == "raise":
        with pytest.raises(EnvError, match=r"env \d.*the faulty env raised"):
            run(config)
    else:
        with pytest.warns(EnvRestartWarning, match=r"^env [0-3] failed and was restarted"):
            run(config)  # warned of in the run's process, not only in the worker's
        rows = read_metrics(tmp_path / "run")
        assert total(rows, "env_restarts") == 1
        assert rows[-1]["runner_restarts"] == 0  # the worker restarted the env itself
    assert all_cpus_free_within(ray, 10), "an actor outlived the run"
