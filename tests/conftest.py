"""Fixtures shared by the test modules."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable, Iterator

import pytest

from corral import device_path, registry


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Ids, namespaces and entry points registered or loaded inside the test are forgotten
    after it."""
    registry._load_builtins()  # the builtins must be in the copy, not loaded into it
    monkeypatch.setattr(registry, "_specs", dict(registry._specs))
    monkeypatch.setattr(registry, "_namespaces", dict(registry._namespaces))
    monkeypatch.setattr(registry, "_plugins", set(registry._plugins))
    yield


@pytest.fixture
def as_on_a_gpu() -> Iterator[None]:
    """The Places built in the test take the device path on CPU tensors, as on a GPU
    (:func:`corral.device_path`): the vector layer and the natively batched envs compute in
    torch, reading nothing back per step."""
    with device_path():
        yield


@pytest.fixture
def ctrl_c() -> Iterator[None]:
    """Ctrl-C (SIGINT) raises ``KeyboardInterrupt`` in the test, as in a terminal, also
    where the suite runs with it ignored (a shell's background job inherits SIG_IGN)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def ray_session() -> Iterator[Callable[[], None]]:
    """A local Ray for the module, started by the first test that calls it; shut down after."""
    started = []

    def start() -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
            started.append(ray)

    yield start
    for ray in started:
        ray.shutdown()


RAY_TEST = re.compile(r"(?<![a-z])ray(?![a-z])|^tests/workers/")
"""A test that starts Ray: ``ray`` as a word of its id (``test_train_ray``, ``[ray-3]``,
``docs/ray.md``), or one of the rollout workers' tests."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the tests that start Ray in one group, which ``pytest -n N --dist loadgroup``
    (``make test``) runs in one process, one after another: two Rays at once on 2 cores
    would starve each other's start. Skip tests marked ``slow`` (long learning runs) when
    ``CI=true``."""
    ray_group = pytest.mark.xdist_group("ray")
    for item in items:
        uses_ray = "ray_session" in getattr(item, "fixturenames", ())
        if uses_ray or RAY_TEST.search(item.nodeid.lower()):
            item.add_marker(ray_group)
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    skip = pytest.mark.skip(reason="slow learning run: skipped under CI=true, run it by hand")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
