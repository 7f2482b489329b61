"""The vector backends a test runs on, and a worker killed from outside."""

from __future__ import annotations

import importlib.util
import os
import signal
import time

import pytest

from corral.vector import VectorEnv


def _backend_params() -> list:
    params = []
    for name, module in (("sync", None), ("subproc", None), ("ray", "ray")):
        marks = []
        if module and importlib.util.find_spec(module) is None:
            marks.append(pytest.mark.skip(reason=f"{module} is not installed"))
        params.append(pytest.param(name, marks=marks))
    return params


BACKENDS = _backend_params()


def kill_worker(venv: VectorEnv, index: int) -> None:
    """End worker ``index`` from outside, and wait until it is dead."""
    backend = venv._backend
    if venv.backend_name == "subproc":
        os.kill(backend.worker_pids[index], signal.SIGKILL)
        return
    import ray

    actor = backend.shards[index].handle
    ray.kill(actor)
    deadline = time.monotonic() + 30  # ray.kill is asynchronous
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=30)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.1)
    raise AssertionError(f"worker {index} still answers 30 s after ray.kill")
