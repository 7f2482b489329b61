"""Training on the Ray backend: evaluation beside envs that hold every CPU, workers the
cluster cannot hold, backend settings from the command line, and Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("yaml")
pytest.importorskip("torch")
pytest.importorskip("ray")

import ray
from support.actors import all_cpus_free_within

import corral
from corral import cli
from corral.errors import WorkerStartError
from corral.training import Runner, load_config
from corral.training.metrics import read_metrics
from corral.vector import make_vec
from corral.vector.ray_backend import _RaySession

CPUS = 2  # of the module's Ray


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray of CPUS CPUs for the whole module, started as a user would."""
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=CPUS, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def tiny_mappo(tmp_path: Path, **settings: Any) -> Any:
    base = {
        "backend": "ray",
        "num_envs": 2 * CPUS,
        "total_steps": 64,
        "eval_every": 32,
        "eval_episodes": 2,
        "log_every": 32,
        "checkpoint_every": 0,
        "rollout_steps": 8,
        "epochs": 1,
        "hidden": (8,),
        "env_kwargs": {"max_cycles": 5},
        "device": "cpu",
        "tensorboard": False,
        "start_timeout": 60,  # a regression fails in bounded time instead of hanging
        "run_dir": str(tmp_path / "run"),
    }
    return load_config("mappo", "corral/tag", {**base, **settings})


def test_a_run_whose_envs_hold_every_cpu_evaluates_and_completes(tmp_path: Path) -> None:
    with Runner(tiny_mappo(tmp_path), progress=False) as runner:
        actors = runner.venv._backend.shards
        assert len(actors) == CPUS  # the training envs' workers take every CPU of the Ray
        results = runner.train()
        evaluation = runner.eval_venv._backend  # one actor of its own that reserves no CPU
        assert runner.eval_venv.backend_name == "ray" and len(evaluation.shards) == 1
        assert evaluation.num_cpus_per_worker == 0
    assert results.env_steps == 64
    evals = [r["env_steps"] for r in read_metrics(tmp_path / "run") if "eval_return" in r]
    assert evals == [0, 32, 64]
    assert all_cpus_free_within(ray, 30)


def test_backend_settings_from_the_command_line_reach_the_workers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[Any] = []
    original = Runner.__init__

    def spy(self: Runner, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        built.append(self.venv._backend)

    monkeypatch.setattr(Runner, "__init__", spy)
    command = ["train", "mappo", "--env", "corral/tag", "--backend", "ray", "--num-envs", "3"]
    command += ["--total-steps", "24", "--run-dir", str(tmp_path / "r"), "--no-progress"]
    command += ["--set", "envs_per_worker=2", "num_cpus_per_worker=0.5", "timeout=90"]
    command += ["rollout_steps=8", "epochs=1", "hidden=8", "eval_every=0", "eval_episodes=1"]
    command += ["env_kwargs.max_cycles=5", "device=cpu", "tensorboard=false"]
    code = cli.main(command)
    assert code == 0, capsys.readouterr().err
    backend = built[0]
    assert [s.envs for s in backend.shards] == [range(0, 2), range(2, 3)]
    assert backend.num_cpus_per_worker == 0.5 and backend.timeout == 90
    assert "timeout: 90" in (tmp_path / "r" / "config.yaml").read_text()


def test_more_workers_than_cpus_fail_saying_what_is_short(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    started = time.monotonic()
    command = ["train", "mappo", "--env", "corral/tag", "--backend", "ray", "--num-envs", "4"]
    command += ["--run-dir", str(tmp_path / "r"), "--no-progress"]
    command += ["--set", f"num_workers={CPUS + 1}", "start_timeout=5", "device=cpu"]
    code = cli.main(command)
    err = capsys.readouterr().err
    assert code == 2
    assert time.monotonic() - started < 30
    assert f"{CPUS + 1} Ray workers for 4 envs did not start within 5.0 s" in err
    assert f"they need {CPUS + 1} CPUs; the Ray cluster has {CPUS} CPUs" in err
    assert "num_workers=" in err and "envs_per_worker" in err and "ray_address" in err
    assert "Traceback" not in err
    assert all_cpus_free_within(ray, 30)  # the workers that did start are gone


def test_a_ray_of_our_own_that_cannot_hold_the_workers_fails_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class SmallRay:
        """A Ray that corral started (users > 0) with 2 CPUs, 1 of them free."""

        def is_initialized(self) -> bool:
            return True

        def cluster_resources(self) -> dict[str, float]:
            return {"CPU": 2.0}

        def available_resources(self) -> dict[str, float]:
            return {"CPU": 1.0}

        def shutdown(self) -> None:
            raise AssertionError("another backend still uses this Ray")

    monkeypatch.setattr(_RaySession, "users", 1)
    monkeypatch.setattr("corral.vector.ray_backend.import_ray", SmallRay)
    with pytest.raises(WorkerStartError) as info:
        make_vec("corral/rps", 6, "ray", num_workers=3)
    assert str(info.value).startswith(
        "3 Ray workers for 6 envs cannot start: at 1 CPU each they need 3 CPUs; "
        "the Ray cluster has 2 CPUs, 1 free when they were started. "
        "To fix: start fewer workers (num_workers=1, "
    )
    assert _RaySession.users == 1  # its hold on the Ray was let go


def test_ctrl_c_while_workers_wait_for_cpus_kills_them_at_once(ctrl_c) -> None:
    interrupt = threading.Timer(2, os.kill, (os.getpid(), signal.SIGINT))
    interrupt.start()
    started = time.monotonic()
    try:
        # The workers wait for CPUs until Ctrl-C; the start timeout only bounds the test
        # where the signal is lost, which would otherwise hang it.
        with pytest.raises(KeyboardInterrupt):
            make_vec("corral/rps", 4, "ray", num_workers=CPUS + 1, start_timeout=60)
    finally:
        interrupt.join()
    assert time.monotonic() - started < 10
    assert all_cpus_free_within(ray, 30)


def heed_ctrl_c() -> None:
    """For ``subprocess.Popen(preexec_fn=...)``: the child starts with SIGINT's default
    disposition (Python then turns it into ``KeyboardInterrupt``), not a SIG_IGN inherited
    from a suite run as a shell's background job."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_ends_a_ray_training_run_within_seconds(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "corral", "train", "mappo", "--env", "corral/tag"]
    command += ["--backend", "ray", "--num-envs", "4", "--total-steps", "1e7", "--no-progress"]
    command += ["--run-dir", str(tmp_path / "r"), "--set", "log_every=100", "device=cpu"]
    # rollouts of 4 x 25 env steps: the evaluation's checkpoint at 200 is written before 400
    command += ["eval_every=200", "eval_episodes=2", "tensorboard=false", "rollout_steps=25"]
    path = os.pathsep.join(
        [str(Path(corral.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    )
    env = {**os.environ, "PYTHONPATH": path}
    lines: list[str] = []
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's Ctrl-C reaches it
        preexec_fn=heed_ctrl_c,
        env=env,
    ) as process:
        reader = threading.Thread(target=lambda: lines.extend(process.stdout), daemon=True)
        reader.start()
        try:
            deadline = time.monotonic() + 120
            while not any("steps 400/" in line for line in lines):
                assert process.poll() is None and time.monotonic() < deadline, "".join(lines)
                time.sleep(0.1)
            os.killpg(process.pid, signal.SIGINT)
            sent = time.monotonic()
            code = process.wait(timeout=30)
            took = time.monotonic() - sent
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        reader.join(5)
    output = "".join(lines)
    assert code == 130, output
    assert took < 10, output
    assert "interrupted: resume from the last checkpoint with corral train --resume" in output
    assert "Traceback" not in output
    table = subprocess.run(
        ["ps", "-o", "pid=,stat=,args=", "-s", str(process.pid)], capture_output=True, text=True
    )
    # a zombie is dead; only a parent or init that does not reap it leaves it listed
    left = [line for line in table.stdout.splitlines() if line.split()[1][0] != "Z"]
    assert not left, "processes left behind:\n" + "\n".join(left)
