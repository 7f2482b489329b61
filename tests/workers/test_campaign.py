"""The rest of the fault campaign, on a ``corral train ... --runners 2`` process with a local
Ray of its own: Ctrl-C ends the run (rc 130) and Ray and every rollout worker within
seconds; a driver killed outright takes them all with it (the reaper ends its Ray). The
pids come from the envs, which note the process that built them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import paths
from support.faulty_envs import ENTRY, noted_pids
from support.processes import command_line, descendants, kill_all, wait_until_gone

pytest.importorskip("torch", reason="rollout workers act with torch policies")
pytest.importorskip("ray", reason="rollout workers are Ray actors")

pytestmark = [
    pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process table from /proc"),
    pytest.mark.slow,  # a Ray of its own and two workers: half a minute each
]

READY_S = 180.0
"""Most seconds the driver may take to start Ray, its workers and log its first row."""


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[subprocess.Popen]:
    """``corral train mappo --runners 2`` on a long run, ready: it logged a metrics row and
    both workers noted their pids; killed with every process below it after the test."""
    pids = tmp_path / "pids"
    pids.mkdir()
    path = [str(paths.TESTS), str(paths.SRC), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    argv = [
        *(sys.executable, "-m", "corral", "train", "mappo", "--env", ENTRY),
        *("--runners", "2", "--num-envs", "2", "--total-steps", "100000000"),
        *("--device", "cpu", "--run-dir", str(tmp_path / "run"), "--no-progress"),
        *("--set", "rollout_steps=5", "log_every=10", "eval_every=0", "checkpoint_every=0"),
        *(f"env_kwargs.pids={pids}", "tensorboard=false"),
    ]
    log = (tmp_path / "driver.log").open("w")
    proc = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # Ctrl-C raises KeyboardInterrupt in it even where this suite runs with SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    below: set[int] = set()
    try:
        deadline = time.monotonic() + READY_S
        while not ready(tmp_path, proc.pid):
            below |= descendants(proc.pid)
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the driver was not ready: {(tmp_path / 'driver.log').read_text()}")
            time.sleep(0.5)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log.close()
        kill_all(below | set(noted_pids(pids)))


def ready(tmp_path: Path, driver: int) -> bool:
    metrics = tmp_path / "run" / "metrics.csv"
    rows = metrics.read_text().count("\n") if metrics.exists() else 0
    return rows >= 2 and len(workers(tmp_path, driver)) == 2


def workers(tmp_path: Path, driver: int) -> set[int]:
    """The rollout workers' pids (the driver's own env left out)."""
    return set(noted_pids(tmp_path / "pids")) - {driver}


def test_ctrl_c_ends_the_run_ray_and_every_worker_within_seconds(
    driver: subprocess.Popen, tmp_path: Path
) -> None:
    started = workers(tmp_path, driver.pid)
    processes = descendants(driver.pid) | started
    assert started <= processes and len(processes) > len(started)  # under the driver's Ray
    driver.send_signal(signal.SIGINT)
    assert driver.wait(timeout=30) == 130
    left = wait_until_gone(processes, seconds=20)
    assert not left, [command_line(p) for p in left]


def test_a_killed_driver_takes_ray_and_every_worker_with_it(
    driver: subprocess.Popen, tmp_path: Path
) -> None:
    started = workers(tmp_path, driver.pid)
    processes = descendants(driver.pid) | started
    assert started <= processes and len(processes) > len(started)  # Ray's own ones too
    driver.kill()
    driver.wait(timeout=10)
    left = wait_until_gone(processes, seconds=30)
    assert not left, [command_line(p) for p in left]
