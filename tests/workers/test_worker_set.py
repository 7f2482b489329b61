"""Rollout workers on a local Ray: a run with ``--runners`` writes its metrics as any run,
puts the weights into the object store once per update, ends every actor and resumes with
the saved version; and what runners refuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="rollout workers act with torch policies")
pytest.importorskip("mpe2", reason="the runs train on mpe2's simple_spread")
pytest.importorskip("ray", reason="rollout workers are Ray actors")

import ray
from support.actors import all_cpus_free_within

from corral import cli
from corral.errors import ConfigError, WorkerTimeoutError
from corral.training import Runner, checkpoint, load_config
from corral.training.metrics import read_metrics

CPUS = 4  # of the module's Ray: 2-3 one-CPU workers fit on this 2-core machine
ENV = "mpe2/simple_spread_v3"


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module's tests that need one."""
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=CPUS, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def settings(tmp_path: Path, **more: Any) -> dict[str, Any]:
    base = {
        "num_envs": 4,
        "runners": 2,
        "total_steps": 40,
        "eval_every": 0,
        "eval_episodes": 2,
        "log_every": 20,
        "checkpoint_every": 0,
        "device": "cpu",
        "run_dir": str(tmp_path / "run"),
        "tensorboard": False,
    }
    return {**base, **more}


def weights_counter(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The version of each policy's weights put into Ray's object store from now on."""
    put = ray.put
    versions: list[int] = []

    def counting_put(value: Any, **kwargs: Any) -> Any:
        if isinstance(value, dict) and "params" in value:
            versions.append(value["version"])
        return put(value, **kwargs)

    monkeypatch.setattr(ray, "put", counting_put)
    return versions


@pytest.mark.usefixtures("local_ray")
def test_a_run_with_runners_writes_its_metrics_puts_weights_once_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    put = weights_counter(monkeypatch)
    rc = cli.main(
        [
            *("train", "mappo", "--env", ENV, "--runners", "2", "--num-envs", "4"),
            *("--total-steps", "40", "--device", "cpu", "--run-dir", str(run_dir)),
            *("--no-progress", "--set", "rollout_steps=5", "eval_every=0", "eval_episodes=2"),
            "log_every=20",
        ]
    )
    assert rc == 0
    assert put == [0, 1]  # once per update, the one reference shared by both workers
    rows = read_metrics(run_dir)
    assert [r["env_steps"] for r in rows] == [20, 40]  # 2 workers x 2 envs x 5 steps each
    for row in rows:
        assert row["runner_version_lag"] == 0
        assert row["rollout_bytes"] > 1000
        assert 0 < row["learner_wait_share"] <= 1
        assert "agent/policy_loss" in row
    assert "eval_return" in rows[-1]
    assert all_cpus_free_within(ray, 10), "an actor outlived the run"
    # resumed: new workers act with the saved version, which the learner continues
    rc = cli.main(["train", "--resume", str(run_dir), "--total-steps", "60", "--no-progress"])
    assert rc == 0
    assert put == [0, 1, 2]
    assert [r["env_steps"] for r in read_metrics(run_dir)] == [20, 40, 60]
    assert checkpoint.load(run_dir / "checkpoint.pt")["learners"]["main"]["version"] == 3
    assert all_cpus_free_within(ray, 10), "an actor outlived the resumed run"


@pytest.mark.usefixtures("local_ray")
def test_a_run_shorter_than_the_workers_round_updates_once_and_says_what_it_takes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """2 workers x 2 envs x 5 steps: a round of 20 env steps, one update, even where
    total_steps is 10; the run says it takes 20, and not that no update will happen."""
    config = load_config("mappo", ENV, settings(tmp_path, total_steps=10, rollout_steps=5))
    with caplog.at_level("WARNING", logger="corral"), Runner(config, progress=False) as runner:
        assert runner.workers is not None and runner.workers.sample_steps == [10, 10]
        runner.train()
    said = caplog.text
    assert "no update will happen" not in said
    assert "whole rounds of 20 env steps" in said and "the run takes 20 env steps" in said
    rows = read_metrics(tmp_path / "run")
    assert rows[-1]["env_steps"] == 20 and "agent/policy_loss" in rows[-1]


@pytest.mark.usefixtures("local_ray")
def test_an_asynchronous_run_drops_stale_rollouts_and_ctrl_c_ends_its_actors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DQN's two workers (one env each) sample 5 steps per rollout while the learner learns
    from each rollout as it arrives: with max_staleness 0 one that arrives a version late
    is dropped. Ctrl-C in the learner ends the run and both actors."""
    more = {"num_envs": 2, "train_freq": 5, "learning_starts": 0, "batch_size": 4}
    config = load_config("dqn", ENV, settings(tmp_path, max_staleness=0, total_steps=200, **more))
    put = weights_counter(monkeypatch)
    with pytest.raises(KeyboardInterrupt), Runner(config, progress=False) as runner:
        assert ray.available_resources().get("CPU", 0) == CPUS - 2  # its two workers
        learn, learned = runner.algo.learn, []

        def interrupted(rollouts: Any) -> Any:
            if len(learned) == 10:  # 50 env steps learned from, more with those dropped
                raise KeyboardInterrupt  # Ctrl-C while the learner learns
            learned.append(runner.algo.policy.version)
            return learn(rollouts)

        runner.algo.learn = interrupted  # type: ignore[method-assign]
        runner.train()
    assert put == sorted(set(put)) and len(put) >= 10  # each version put once
    rows = read_metrics(tmp_path / "run")
    assert [r["env_steps"] for r in rows][:2] == [20, 40]
    assert all(r["runner_version_lag"] == 0 for r in rows)
    assert sum(r.get("rollouts_dropped", 0) for r in rows) > 0
    assert all_cpus_free_within(ray, 10), "an actor outlived the interrupted run"


@pytest.mark.usefixtures("local_ray")
def test_more_runners_than_the_cluster_holds_fail_saying_what_is_short(tmp_path: Path) -> None:
    """One worker more than the module's Ray has CPUs: the fifth cannot be scheduled, and the
    start timeout says so (not only that the workers were late) and how to fix it."""
    runners = CPUS + 1
    more = {"runners": runners, "num_envs": runners, "start_timeout": 3}
    config = load_config("mappo", "corral/tag", settings(tmp_path, **more))
    with pytest.raises(WorkerTimeoutError) as caught:
        Runner(config, progress=False)
    said = str(caught.value)
    assert f"{runners} rollout workers did not start within 3.0s (start_timeout)" in said
    assert f"they need {runners} CPUs; the Ray cluster has {CPUS} CPUs, {CPUS} free" in said
    assert f"runners={CPUS}" in said and "envs_per_runner" in said and "ray_address" in said
    assert "raise start_timeout" not in said  # the CPUs, not the time, are short
    assert all_cpus_free_within(ray, 30), "an actor outlived the failed start"


def test_learners_of_both_kinds_are_refused_without_a_run_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = tmp_path / "mixed"
    rc = cli.main(
        [
            *("train", "dqn", "--env", "mpe2/simple_adversary_v3", "--runners", "2"),
            *("--policies", "adversary=mappo", "--device", "cpu"),
            *("--run-dir", str(run_dir), "--no-progress"),
        ]
    )
    assert rc == 2
    assert "learners of one kind at a time" in capsys.readouterr().err
    assert not run_dir.exists()


@pytest.mark.parametrize("algo", ["dqn", "vdn"])
def test_recurrent_learners_from_replay_are_refused_without_a_run_dir(
    algo: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Their sequence memory has one stream per env of the learner's process (one env with
    runners): the workers' samples shared it, joining chunks of two envs' steps."""
    run_dir = tmp_path / "recurrent"
    rc = cli.main(
        [
            *("train", algo, "--env", ENV, "--runners", "2", "--num-envs", "2"),
            *("--device", "cpu", "--run-dir", str(run_dir), "--no-progress"),
            *("--set", "recurrent=true"),
        ]
    )
    assert rc == 2
    said = capsys.readouterr().err
    assert "recurrent learners from replay" in said and "['main']" in said
    assert "set runners=0 or recurrent=false" in said
    assert not run_dir.exists()


def test_runners_with_the_ray_backend_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"runners=2 with backend 'ray'.*leave backend"):
        load_config("mappo", ENV, {"runners": 2, "backend": "ray"})


def test_a_negative_count_of_runners_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"runners"):
        load_config("mappo", ENV, {"runners": -1})


def test_fewer_envs_than_runners_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"runners=3 needs at least one env each"):
        load_config("mappo", ENV, {"runners": 3, "num_envs": 2})


def test_runners_without_ray_say_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.errors import MissingDependencyError
    from corral.workers import worker_set

    def no_ray() -> Any:
        raise MissingDependencyError("the 'ray' vector backend needs Ray")

    monkeypatch.setattr(worker_set, "import_ray", no_ray)
    config = load_config("mappo", ENV, settings(tmp_path))
    with pytest.raises(MissingDependencyError, match=r"rollout workers \(runners > 0\) need Ray"):
        Runner(config, progress=False)
    assert not (tmp_path / "run").exists()
