"""The Ray backend against a local Ray: same batches as ``sync``, errors, restarts, calls."""

from __future__ import annotations

import gc
import sys
import time
from dataclasses import fields
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

import corral
from corral.envs.rps import RockPaperScissors
from corral.errors import (
    ConfigError,
    EnvError,
    MissingDependencyError,
    VectorStateError,
    WorkerRestartWarning,
)
from corral.vector import VectorEnv, make_vec, reaper
from corral.vector.ray_backend import _RaySession

ray = pytest.importorskip("ray")

# Options that fit two actors on the two CPUs of the test Ray, with room to replace one.
RAY = {"num_workers": 2, "num_cpus_per_worker": 0.5}


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    """One local Ray for the whole module; envs defined here travel by value."""
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    # Ray workers cannot import this test module, so pickle its classes by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    if started:
        ray.shutdown()


def _random_actions(venv: VectorEnv, batch: Any, rng: np.random.Generator) -> dict:
    """Uniformly random legal actions for every (discrete) group."""
    actions = {}
    for g in venv.groups:
        keys = rng.random(batch.action_mask[g].shape)
        actions[g] = np.argmax(np.where(batch.action_mask[g], keys, -1.0), axis=-1)
    return actions


def _assert_same(x: Any, y: Any, where: str) -> None:
    if isinstance(x, dict):
        assert x.keys() == y.keys(), where
        for key in x:
            _assert_same(x[key], y[key], f"{where}[{key}]")
    elif x is None:
        assert y is None, where
    else:
        assert x.dtype == y.dtype, where
        np.testing.assert_array_equal(x, y, err_msg=where)


def _assert_batches_equal(x: Any, y: Any, step: int) -> None:
    for field in fields(x):
        _assert_same(getattr(x, field.name), getattr(y, field.name), f"step {step}: {field.name}")


@pytest.mark.parametrize(
    ("id", "kwargs"),
    [
        ("corral/rps", {}),
        ("corral/tag", {}),
        ("pettingzoo/classic/connect_four_v3", {}),
        ("mpe2/simple_spread_v3", {"N": 3, "max_cycles": 10}),
    ],
)
def test_batches_are_bit_identical_to_sync(id: str, kwargs: dict) -> None:
    try:
        sync = make_vec(id, 3, "sync", seed=7, env_kwargs=kwargs)
    except MissingDependencyError as err:
        pytest.skip(str(err))
    remote = make_vec(id, 3, "ray", seed=7, env_kwargs=kwargs, **RAY)
    with sync, remote:
        assert [s.envs for s in remote._backend.shards] == [range(0, 2), range(2, 3)]
        a, b = sync.reset(), remote.reset()
        _assert_batches_equal(a, b, 0)
        rng = np.random.default_rng(0)
        for step in range(1, 31):
            actions = _random_actions(sync, a, rng)
            a, b = sync.step(actions), remote.step(actions)
            _assert_batches_equal(a, b, step)


class _RuntimeRPS(RockPaperScissors):
    """An env class of this module, registered under an id only while a test runs."""


@ray.remote(num_cpus=0)
def _worker_knows(id: str) -> bool:
    return id in corral.registered_ids()


@pytest.mark.parametrize("native", [False, True], ids=["dict", "natively-batched"])
def test_ids_registered_at_run_time_work_in_the_workers(
    isolated_registry: None, native: bool
) -> None:
    if native:  # the id of a natively batched env of corral's, registered anew
        corral.register("test/runtime", batched=corral.registry.spec("corral/tag").batched)
    else:
        corral.register("test/runtime", _RuntimeRPS)
    assert not ray.get(_worker_knows.remote("test/runtime"))  # the registry stays here
    sync = make_vec("test/runtime", 3, "sync", seed=3)
    remote = make_vec("test/runtime", 3, "ray", seed=3, **RAY)  # the spec travels
    with sync, remote:
        a, b = sync.reset(), remote.reset()
        _assert_batches_equal(a, b, 0)
        rng = np.random.default_rng(0)
        for step in range(1, 11):
            actions = _random_actions(sync, a, rng)
            a, b = sync.step(actions), remote.step(actions)
            _assert_batches_equal(a, b, step)


class _LabelledRPS:
    """Rock-paper-scissors that knows its env index, with methods and attributes to call."""

    def __init__(self, index: int) -> None:
        self.env = corral.make("corral/rps")
        self.index = index
        self.label = "start"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def explode(self) -> None:
        raise ZeroDivisionError("the env broke on purpose")

    def scaled(self, x: int, factor: int = 1) -> int:
        return (x + self.index) * factor


def test_call_get_attr_and_set_attr_span_every_actor() -> None:
    fns = [lambda i=i: _LabelledRPS(i) for i in range(3)]
    with VectorEnv(fns, "ray", seed=0, **RAY) as venv:
        assert venv.get_attr("index") == [0, 1, 2]
        assert venv.call("scaled", 10, factor=2) == [20, 22, 24]
        venv.set_attr("label", ["a", "b", "c"])
        assert venv.get_attr("label") == ["a", "b", "c"]
        venv.set_attr("label", "same")
        assert venv.get_attr("label") == ["same"] * 3
        with pytest.raises(EnvError, match=r"env 0: explode\(\) raised ZeroDivisionError"):
            venv.call("explode")


def test_close_twice_keeps_the_users_ray_and_refuses_later_calls() -> None:
    venv = make_vec("corral/rps", 2, "ray", seed=0, **RAY)
    actors = [s.handle for s in venv._backend.shards]
    venv.reset()
    venv.close()
    venv.close()
    assert ray.is_initialized()  # started by the test, so the backend must leave it running
    assert _RaySession.reaper is None  # nor reap it when this process dies
    assert _dies_within(actors[0], seconds=30)  # ray.kill is asynchronous
    with pytest.raises(VectorStateError, match="closed"):
        venv.reset()


def test_a_closed_backend_holds_no_ray_object() -> None:
    # Those that outlive the Ray they belong to keep its connections open in this process
    # once a Ray of our own shuts down (see test_orphans for the sockets themselves).
    venv = make_vec("corral/rps", 2, "ray", seed=0, **RAY)
    venv.reset()
    venv.get_attr("metadata")
    venv.close()
    kinds = (ray.actor.ActorHandle, ray.actor.ActorClass, ray.ObjectRef)
    assert [x for x in _reachable(venv._backend) if isinstance(x, kinds)] == []


def _reachable(root: Any) -> list[Any]:
    """The objects ``root`` refers to, directly or not, short of modules and classes."""
    seen, todo, found = {id(root)}, [root], []
    while todo:
        for x in gc.get_referents(todo.pop()):
            if id(x) in seen or isinstance(x, (ModuleType, type)):
                continue
            seen.add(id(x))
            found.append(x)
            todo.append(x)
    return found


def _dies_within(actor: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=seconds)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.1)
    return False


def test_dead_worker_is_replaced_and_its_episodes_end_truncated() -> None:
    sync = make_vec("corral/rps", 3, "sync", seed=1)
    remote = make_vec("corral/rps", 3, "ray", seed=1, **RAY)
    with sync, remote:
        a, b = sync.reset(), remote.reset()
        rng = np.random.default_rng(1)
        actions = _random_actions(sync, a, rng)
        a, b = sync.step(actions), remote.step(actions)
        earned = b.reward["player"].copy()
        actions = _random_actions(sync, a, rng)  # the second move of the round pays
        a, b = sync.step(actions), remote.step(actions)
        earned += b.reward["player"]
        assert earned.any()
        alive_before = b.alive["player"].copy()
        obs_before = b.obs["player"].copy()
        actor = remote._backend.shards[0].handle
        ray.kill(actor)
        assert _dies_within(actor, seconds=30)  # ray.kill is asynchronous
        actions = _random_actions(sync, a, rng)
        with pytest.warns(WorkerRestartWarning, match=r"worker 0 \(envs 0-1\) died during step"):
            b = remote.step(actions)
        a = sync.step(actions)
        assert b.worker_restarts.tolist() == [1, 1, 0]
        assert b.done[:2].all()
        np.testing.assert_array_equal(b.truncated["player"][:2], alive_before[:2])
        np.testing.assert_array_equal(b.final_obs["player"][:2], obs_before[:2])
        # the cut episodes' totals outlive the dead actor
        np.testing.assert_array_equal(b.episode_return["player"][:2], earned[:2])
        assert b.episode_length[:2].tolist() == [2, 2]
        assert b.alive["player"][:2].all()  # a fresh episode
        for field in ("done", "reward", "truncated", "terminated", "acting"):
            x, y = getattr(a, field), getattr(b, field)
            x, y = (x["player"], y["player"]) if isinstance(x, dict) else (x, y)
            np.testing.assert_array_equal(x[2], y[2], err_msg=field)  # env 2 is untouched
        b = remote.step(_random_actions(remote, b, rng))
        assert b.worker_restarts.tolist() == [1, 1, 0]
        assert not b.truncated["player"].any()


class _FakeRay:
    def __init__(self, initialized: bool) -> None:
        self.initialized = initialized
        self.inits: list[dict] = []
        self.cluster_flags: list[bool] = []  # Ray's flag while it started
        constants = SimpleNamespace(ENABLE_RAY_CLUSTER=True, PROCESS_TYPE_RAYLET="raylet")
        self._private = SimpleNamespace(ray_constants=constants, worker=SimpleNamespace())

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, **kwargs: Any) -> None:
        self.initialized = True
        self.inits.append(kwargs)
        self.cluster_flags.append(self._private.ray_constants.ENABLE_RAY_CLUSTER)
        processes = {"raylet": [7], "gcs_server": [5]}
        self._private.worker._global_node = SimpleNamespace(
            all_processes={
                kind: [SimpleNamespace(process=SimpleNamespace(pid=pid)) for pid in pids]
                for kind, pids in processes.items()
            }
        )

    def shutdown(self) -> None:
        self.initialized = False

    def get_runtime_context(self) -> SimpleNamespace:
        return SimpleNamespace(gcs_address="127.0.0.1:6379")


def test_ray_started_by_the_backend_is_shut_down_by_its_last_user(monkeypatch) -> None:
    monkeypatch.setattr(_RaySession, "users", 0)
    reapers = []
    monkeypatch.setattr(
        reaper, "start", lambda held, children_of: reapers.append((held, children_of)) or held
    )
    monkeypatch.setattr(reaper, "dismiss", lambda held: reapers.remove((held, 7)))
    fake = _FakeRay(initialized=False)
    assert _RaySession.acquire(fake, "ray://head:10001", 2)
    assert fake.inits == [{"address": "ray://head:10001"}]
    assert _RaySession.acquire(fake, None, 2)  # a second backend on the same Ray
    _RaySession.release(fake)
    assert fake.initialized
    _RaySession.release(fake)
    assert not fake.initialized
    assert reapers == []  # a cluster's processes are not the driver's to reap
    assert _RaySession.acquire(fake, None, 3)  # no address: a Ray of its own on this machine
    assert fake.inits[-1] == {
        "address": "local",
        "num_cpus": 3,
        "include_dashboard": False,
        "_node_ip_address": "127.0.0.1",
    }
    assert fake.cluster_flags[-1] is False  # so Ray keeps the loopback address
    assert fake._private.ray_constants.ENABLE_RAY_CLUSTER is True  # and it is restored
    assert reapers == [([7, 7, 5], 7)]  # the raylet first, and its children
    _RaySession.release(fake)
    assert not fake.initialized
    assert reapers == [] and _RaySession.reaper is None


def test_ray_started_by_the_user_is_left_running(monkeypatch) -> None:
    monkeypatch.setattr(_RaySession, "users", 0)
    fake = _FakeRay(initialized=True)
    assert not _RaySession.acquire(fake, None, 2)
    assert fake.inits == []


def test_a_ray_of_our_own_in_use_is_not_left_for_another_address(monkeypatch) -> None:
    monkeypatch.setattr(_RaySession, "users", 0)
    monkeypatch.setattr(reaper, "start", lambda held, children_of: held)
    monkeypatch.setattr(reaper, "dismiss", lambda held: None)
    fake = _FakeRay(initialized=False)
    assert _RaySession.acquire(fake, None, 2)  # a local Ray of our own, in use
    with pytest.raises(ConfigError, match=r"ray_address='head:6379'.*close those vector envs"):
        _RaySession.acquire(fake, "head:6379", 2)
    assert _RaySession.users == 1 and len(fake.inits) == 1  # nothing joined, nothing counted
    _RaySession.release(fake)
    assert _RaySession.acquire(fake, "head:6379", 2)  # once closed, the cluster is joined
    assert fake.inits[-1] == {"address": "head:6379"}
    assert _RaySession.acquire(fake, "head:6379", 2)  # the same address: the same Ray
    assert _RaySession.users == 2 and len(fake.inits) == 2
    _RaySession.release(fake)
    _RaySession.release(fake)
    assert not fake.initialized


def test_a_ray_address_other_than_the_users_ray_is_refused() -> None:
    running = ray.get_runtime_context().gcs_address
    with pytest.raises(ConfigError, match=r"ray_address='10\.0\.0\.1:6379'.*ray\.shutdown"):
        make_vec("corral/rps", 2, "ray", ray_address="10.0.0.1:6379", **RAY)
    assert ray.is_initialized() and ray.get_runtime_context().gcs_address == running
    with make_vec("corral/rps", 2, "ray", ray_address=running, **RAY) as venv:  # that Ray
        venv.reset(seed=0)
    assert ray.is_initialized()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"num_cpus_per_worker": "abc"}, "num_cpus_per_worker must be a number"),
        ({"num_cpus_per_worker": -1}, "num_cpus_per_worker must be a number"),
        ({"num_cpus_per_worker": float("inf")}, "num_cpus_per_worker must be a number"),
        ({"num_cpus_per_worker": 0}, "give num_workers or envs_per_worker"),
        ({"num_workers": 2, "ray_address": 6379}, "ray_address must be a Ray address"),
    ],
)
def test_bad_options_are_refused_before_ray_is_joined(
    monkeypatch, options: dict, match: str
) -> None:
    joined = []
    monkeypatch.setattr(_RaySession, "acquire", lambda *args: joined.append(args))
    with pytest.raises(ConfigError, match=match):
        make_vec("corral/rps", 2, "ray", **options)
    assert joined == []


def test_missing_ray_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'corral\[ray\]'"):
        make_vec("corral/rps", 2, "ray")
