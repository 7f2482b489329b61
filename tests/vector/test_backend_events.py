"""The same event gets the same type on every backend, for dict envs and a natively batched env.

The events (:mod:`corral.vector.shards`): an env that raises (an :class:`EnvError`
with the env's own traceback); a worker that dies in a reset or step (replaced in
it, with a :class:`WorkerRestartWarning`); a worker that dies during or before
another call (a :class:`WorkerDiedError`, replaced at the next reset or step); a
worker that misses the timeout (a :class:`WorkerTimeoutError`). ``sync`` has no
workers: only the first applies there.

Every test runs four copies of ``mdp/two_round_dmdp`` (always action 1: episodes of
two steps, reward 1 each) on two workers, copies 0-1 and 2-3, as dict envs and as
the natively batched env. A fault strikes copy 2 (for the native env: the shard
that holds it) once.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest
from support.backends import kill_worker

import corral
from corral.errors import (
    EnvError,
    EnvRestartWarning,
    WorkerDiedError,
    WorkerRestartWarning,
    WorkerTimeoutError,
)
from corral.registry import spec
from corral.vector import VectorEnv
from corral.vector.shards import split_envs
from corral.vector.sources import NativeSource

# Workers started by forkserver or Ray cannot import this module: send its classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

ENV = "mdp/two_round_dmdp"
NUM_ENVS = 4
FAULTY = 2  # the copy a fault strikes; worker 1 runs copies 2 and 3
HANG_S = 60.0  # a hung env sleeps far past the timeout; its worker is stopped
TIMEOUT = 2.0

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAS_RAY, reason="ray is not installed")
BACKENDS = ["sync", "subproc", pytest.param("ray", marks=needs_ray)]
WORKER_BACKENDS = ["subproc", pytest.param("ray", marks=needs_ray)]
SOURCES = ["dict", "native"]


# -- faults ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """Copy ``FAULTY`` raises, dies (ends its process) or hangs at its ``at``-th ``when``
    (``"reset"``, ``"step"`` or ``"attr"``: reading ``probe``). Once only: the first
    strike creates the file ``flag``, which outlives worker processes."""

    kind: str
    when: str
    flag: Path
    at: int = 1

    def strike(self, when: str, copies: range, count: int) -> None:
        if when != self.when or FAULTY not in copies or count != self.at:
            return
        try:
            os.close(os.open(self.flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        if self.kind == "raise":
            injected_fault()
        elif self.kind == "die":
            os._exit(3)
        else:
            time.sleep(HANG_S)


def injected_fault() -> None:
    raise RuntimeError("injected fault")


class Counted:
    """Counts the resets, steps and ``probe`` reads of an env (or of a native shard)
    of ``copies``, and lets its fault strike."""

    def __init__(self, env: Any, copies: range, fault: Fault | None) -> None:
        self.env, self.copies, self.fault = env, copies, fault
        self.counts = {"reset": 0, "step": 0, "attr": 0}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def count(self, when: str) -> None:
        self.counts[when] += 1
        if self.fault is not None:
            self.fault.strike(when, self.copies, self.counts[when])

    def step(self, actions: Any) -> Any:
        self.count("step")
        return self.env.step(actions)

    @property
    def probe(self) -> int:
        """The first copy this env (or shard) holds."""
        self.count("attr")
        return self.copies[0]


class DictCopy(Counted):
    """Copy ``index`` as a dict env."""

    def __init__(self, index: int, fault: Fault | None) -> None:
        super().__init__(corral.make(ENV), range(index, index + 1), fault)

    def reset(self, seed: Any = None, options: Any = None) -> Any:
        self.count("reset")
        return self.env.reset(seed=seed, options=options)


class NativeShard(Counted):
    """Copies ``offset`` to ``offset + num_envs - 1`` as one natively batched env, on
    ``array`` (numpy, or torch on the CPU)."""

    def __init__(
        self, num_envs: int, offset: int, fault: Fault | None, array: str = "numpy"
    ) -> None:
        env = spec(ENV).make_batched(num_envs, array)
        super().__init__(env, range(offset, offset + num_envs), fault)

    def reset(self, seed: Any = None, where: Any = None, options: Any = None) -> Any:
        self.count("reset")
        return self.env.reset(seed=seed, where=where, options=options)


@dataclass(frozen=True)
class ShardedNative(NativeSource):
    """A native source whose shards know their first copy, so that a fault hits one."""

    def part(self, envs: range) -> ShardedNative:
        return ShardedNative(self.make, len(envs), self.state)

    def build(self, offset: int = 0) -> Any:
        return self.make(self.num_envs, offset)


def make_venv(
    backend: str,
    source: str,
    fault: Fault | None,
    ray_session: Any,
    array: str = "numpy",
    **options: Any,
) -> VectorEnv:
    """Four copies on ``backend`` (two workers), as dict envs or natively batched (on
    ``array``: its batches too)."""
    if source == "dict":
        envs: Any = [partial(DictCopy, i, fault) for i in range(NUM_ENVS)]
    else:
        envs = ShardedNative(partial(NativeShard, fault=fault, array=array), NUM_ENVS)
        options["array"] = array
    if backend == "ray":
        ray_session()
        import ray

        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        options["num_cpus_per_worker"] = 0.25  # replacements fit beside the test Ray's others
    if backend != "sync":
        options["num_workers"] = 2
    return VectorEnv(envs, backend, seed=0, **options)


ACTIONS = {"agent": np.ones((NUM_ENVS, 1), np.int64)}


def state_of(obs: Any) -> list[int]:
    """The MDP state of each copy (its one-hot observation)."""
    return np.asarray(obs["agent"])[:, 0].argmax(-1).tolist()


def shards_of(venv: VectorEnv) -> list[range]:
    """The copies each worker runs (``sync``: one shard of them all)."""
    shards = getattr(venv._backend, "shards", None)
    return [range(NUM_ENVS)] if shards is None else [s.envs for s in shards]


def faulty_shard(venv: VectorEnv) -> range:
    """The copies of the shard that holds copy ``FAULTY``."""
    return next(envs for envs in shards_of(venv) if FAULTY in envs)


def probes(venv: VectorEnv, source: str) -> list[int]:
    """What ``get_attr("probe")`` reads: each copy's index, or the first copy of its shard."""
    if source == "dict":
        return list(range(NUM_ENVS))
    return [envs.start for envs in shards_of(venv) for _ in envs]


def assert_worker_1_restarted(batch: Any) -> None:
    """The batch of the step (the second) in which worker 1 was replaced: copies 0-1 ended
    their episodes, copies 2-3 had theirs cut, truncated, after one step."""
    assert batch.worker_restarts.tolist() == [0, 0, 1, 1]
    assert batch.done.tolist() == [True] * 4
    assert batch.episode_cut.tolist() == [False, False, True, True]
    assert batch.terminated["agent"][:, 0].tolist() == [True, True, False, False]
    assert batch.truncated["agent"][:, 0].tolist() == [False, False, True, True]
    assert batch.reward["agent"][:, 0].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert batch.episode_return["agent"][:, 0].tolist() == [2.0, 2.0, 1.0, 1.0]
    assert batch.episode_length.tolist() == [2, 2, 1, 1]
    assert state_of(batch.final_obs) == [3, 3, 2, 2]
    assert state_of(batch.obs) == [0] * 4  # every copy begins a new episode


def assert_steps_on(venv: VectorEnv) -> None:
    """The next step is a first step of every copy, and no worker restarts."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", WorkerRestartWarning)
        batch = venv.step(ACTIONS)
    assert state_of(batch.obs) == [2] * 4
    assert batch.reward["agent"][:, 0].tolist() == [1.0] * 4
    assert batch.episode_cut.tolist() == [False] * 4


# -- an env that raises ---------------------------------------------------------------------


def assert_env_error(err: EnvError, venv: VectorEnv, source: str, what: str) -> None:
    """The env's fault, as every backend reports it: its index (a native shard's first copy:
    the whole shard failed) and its own traceback."""
    index = FAULTY if source == "dict" else faulty_shard(venv).start
    assert type(err) is EnvError
    assert err.env_index == index
    assert str(err).startswith(f"env {index}: {what} raised RuntimeError: injected fault")
    assert "in injected_fault" in err.remote_traceback  # the env's own frame
    assert err.last_line == "RuntimeError: injected fault"


def assert_cut_in_second_step(batch: Any, cut: range) -> None:
    """The batch of the second step, in which a fault cut the episodes of the copies ``cut``
    (truncated after one step, stats kept) and every other copy ended its own."""
    ended = [i not in cut for i in range(NUM_ENVS)]
    assert batch.worker_restarts.tolist() == [int(i in cut) for i in range(NUM_ENVS)]
    assert batch.done.tolist() == [True] * NUM_ENVS
    assert batch.episode_cut.tolist() == [i in cut for i in range(NUM_ENVS)]
    assert batch.terminated["agent"][:, 0].tolist() == ended
    assert batch.truncated["agent"][:, 0].tolist() == [not e for e in ended]
    assert batch.reward["agent"][:, 0].tolist() == [float(e) for e in ended]
    assert batch.episode_return["agent"][:, 0].tolist() == [1.0 + e for e in ended]
    assert batch.episode_length.tolist() == [1 + e for e in ended]
    assert state_of(batch.final_obs) == [2 + e for e in ended]
    assert state_of(batch.obs) == [0] * NUM_ENVS  # every copy begins a new episode


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_env_raising_in_a_step(backend: str, source: str, tmp_path: Path, ray_session) -> None:
    """The env is restarted (a native env: every copy of its shard, which cannot say which
    copy failed) and every other copy's step is complete."""
    fault = Fault("raise", "step", tmp_path / "flag", at=2)
    with make_venv(backend, source, fault, ray_session) as venv:
        venv.reset()
        venv.step(ACTIONS)
        with pytest.raises(EnvError) as info:
            venv.step(ACTIONS)
        err = info.value
        assert_env_error(err, venv, source, "step()")
        assert err.restarted
        assert_cut_in_second_step(
            err.batch, range(2, 3) if source == "dict" else faulty_shard(venv)
        )
        assert_steps_on(venv)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_env_raising_in_a_reset(backend: str, source: str, tmp_path: Path, ray_session) -> None:
    fault = Fault("raise", "reset", tmp_path / "flag")
    with make_venv(backend, source, fault, ray_session) as venv:
        with pytest.raises(EnvError) as info:
            venv.reset()
        assert_env_error(info.value, venv, source, "reset()")
        assert info.value.restarted == (source == "dict")


@pytest.mark.parametrize("on_env_error", ["raise", "restart"])
@pytest.mark.parametrize("array", ["numpy", "torch"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_native_env_raising_in_its_first_reset_is_reset_at_the_next_step(
    backend: str, array: str, on_env_error: str, tmp_path: Path, ray_session
) -> None:
    """Its copies have no episode (none acts) and its step is not called on them: the next
    step resets them instead, counted in worker_restarts; the other shard steps."""
    if array == "torch":
        pytest.importorskip("torch")
    fault = Fault("raise", "reset", tmp_path / "flag")
    options = {"on_env_error": on_env_error}
    with make_venv(backend, "native", fault, ray_session, array, **options) as venv:
        shard = faulty_shard(venv)
        others = [i for i in range(NUM_ENVS) if i not in shard]
        with pytest.raises(EnvError) as info:  # it could not restart: raised either way
            venv.reset()
        assert_env_error(info.value, venv, "native", "reset()")
        assert not info.value.restarted
        batch = info.value.batch
        alive = np.asarray(batch.alive["agent"])[:, 0].tolist()
        assert alive == [i not in shard for i in range(NUM_ENVS)]
        assert not np.asarray(batch.acting["agent"])[list(shard)].any()
        batch = venv.step(ACTIONS)
        assert venv.get_attr("counts")[FAULTY]["step"] == 0  # never stepped unreset copies
        assert np.asarray(batch.worker_restarts).tolist() == [int(i in shard) for i in range(4)]
        assert np.asarray(batch.alive["agent"]).all() and not np.asarray(batch.done).any()
        assert state_of(batch.obs) == [0 if i in shard else 2 for i in range(NUM_ENVS)]
        rewards = np.asarray(batch.reward["agent"])[:, 0].tolist()
        assert rewards == [float(i in others) for i in range(NUM_ENVS)]
        batch = venv.step(ACTIONS)
        assert venv.get_attr("counts")[FAULTY]["step"] == 1
        assert state_of(batch.obs) == [2 if i in shard else 0 for i in range(NUM_ENVS)]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_env_raising_in_a_call(backend: str, source: str, tmp_path: Path, ray_session) -> None:
    fault = Fault("raise", "attr", tmp_path / "flag")
    with make_venv(backend, source, fault, ray_session) as venv:
        venv.reset()
        with pytest.raises(EnvError) as info:
            venv.get_attr("probe")
        assert_env_error(info.value, venv, source, "reading attribute 'probe'")
        assert not info.value.restarted
        assert venv.get_attr("probe") == probes(venv, source)  # the env is still there


AUTORESET = 2
"""Episodes last two steps: the second reset of copy 2 (or of its native shard) is the
reset that restarts it in the second step, after its episode ended (its autoreset)."""


def assert_autoreset_cut(batch: Any, restarted: range) -> None:
    """The batch of the second step, in which every copy ended its episode, as it really
    ended, and the copies ``restarted`` were restarted after a fault in their autoreset."""
    assert batch.worker_restarts.tolist() == [int(i in restarted) for i in range(NUM_ENVS)]
    assert batch.done.tolist() == [True] * NUM_ENVS
    # restarted after its episode ended as the env ended it: not cut
    assert batch.episode_cut.tolist() == [False] * NUM_ENVS
    assert batch.terminated["agent"][:, 0].tolist() == [True] * NUM_ENVS
    assert batch.truncated["agent"][:, 0].tolist() == [False] * NUM_ENVS
    assert batch.reward["agent"][:, 0].tolist() == [1.0] * NUM_ENVS
    assert batch.episode_return["agent"][:, 0].tolist() == [2.0] * NUM_ENVS
    assert batch.episode_length.tolist() == [2] * NUM_ENVS
    assert state_of(batch.final_obs) == [3] * NUM_ENVS
    assert state_of(batch.obs) == [0] * NUM_ENVS  # every copy begins a new episode


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_env_raising_in_an_autoreset_keeps_the_step(
    backend: str, source: str, tmp_path: Path, ray_session
) -> None:
    """The step counts for every copy; the env (a native one: its shard) is restarted."""
    fault = Fault("raise", "reset", tmp_path / "flag", at=AUTORESET)
    with make_venv(backend, source, fault, ray_session) as venv:
        venv.reset()
        venv.step(ACTIONS)
        with pytest.raises(EnvError) as info:
            venv.step(ACTIONS)
        err = info.value
        assert_env_error(err, venv, source, "reset()")
        assert err.restarted
        assert_autoreset_cut(err.batch, range(2, 3) if source == "dict" else faulty_shard(venv))
        assert_steps_on(venv)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_native_env_raising_under_restart_warns_of_all_its_copies(
    backend: str, tmp_path: Path, ray_session
) -> None:
    fault = Fault("raise", "step", tmp_path / "flag", at=2)
    with make_venv(backend, "native", fault, ray_session, on_env_error="restart") as venv:
        venv.reset()
        venv.step(ACTIONS)
        with pytest.warns(EnvRestartWarning) as record:
            batch = venv.step(ACTIONS)
        shard = faulty_shard(venv)
    (warning,) = record
    copies = f"envs {shard[0]}-{shard[-1]}"
    assert f"{copies} (one natively batched env) failed and were restarted" in str(warning.message)
    assert "RuntimeError: injected fault" in str(warning.message)
    assert batch.worker_restarts[list(shard)].tolist() == [1] * len(shard)


# -- a worker that dies in a reset or step ----------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("backend", WORKER_BACKENDS)
def test_a_worker_dying_in_a_step_is_replaced_in_it(
    backend: str, source: str, tmp_path: Path, ray_session
) -> None:
    fault = Fault("die", "step", tmp_path / "flag", at=2)
    with make_venv(backend, source, fault, ray_session) as venv:
        venv.reset()
        venv.step(ACTIONS)
        with pytest.warns(WorkerRestartWarning) as record:
            batch = venv.step(ACTIONS)
        assert_worker_1_restarted(batch)
        assert_steps_on(venv)
    (warning,) = record
    assert str(warning.message).startswith("worker 1 (envs 2-3) died during step(): replaced")
    assert warning.filename == __file__  # it points at the caller's step()


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("backend", WORKER_BACKENDS)
def test_a_worker_dying_in_a_reset_is_replaced_in_it(
    backend: str, source: str, tmp_path: Path, ray_session
) -> None:
    fault = Fault("die", "reset", tmp_path / "flag")
    with make_venv(backend, source, fault, ray_session) as venv:
        with pytest.warns(WorkerRestartWarning, match=r"worker 1 \(envs 2-3\) died during reset"):
            batch = venv.reset()
        assert batch.worker_restarts.tolist() == [0, 0, 1, 1]
        assert not batch.done.any()  # a reset's batch ends no episode
        assert not batch.truncated["agent"].any()
        assert state_of(batch.obs) == [0] * 4
        assert_steps_on(venv)


# -- a worker that dies during or before another call ------------------------------------------


def assert_died_then_replaced(venv: VectorEnv, err: WorkerDiedError, why: str) -> None:
    """``err`` names worker 1's envs; it stays dead for calls until the next step replaces it."""
    assert type(err) is WorkerDiedError
    assert err.env_indices == [2, 3]
    assert "worker 1 (envs 2-3)" in str(err)
    with pytest.raises(WorkerDiedError, match=r"worker 1 \(envs 2-3\)"):
        venv.get_attr("max_episode_steps")
    with pytest.warns(WorkerRestartWarning, match=rf"worker 1 \(envs 2-3\) {why}"):
        batch = venv.step(ACTIONS)
    assert_worker_1_restarted(batch)
    assert venv.get_attr("max_episode_steps") == [3] * NUM_ENVS


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("backend", WORKER_BACKENDS)
def test_a_worker_dying_in_a_call_raises_and_is_replaced_at_the_next_step(
    backend: str, source: str, tmp_path: Path, ray_session
) -> None:
    fault = Fault("die", "attr", tmp_path / "flag")
    with make_venv(backend, source, fault, ray_session) as venv:
        venv.reset()
        venv.step(ACTIONS)
        with pytest.raises(WorkerDiedError) as info:
            venv.get_attr("probe")
        assert_died_then_replaced(venv, info.value, r"died before answering get_attr\('probe'\)")


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("backend", WORKER_BACKENDS)
def test_a_worker_killed_before_a_call_raises_and_is_replaced_at_the_next_step(
    backend: str, source: str, ray_session
) -> None:
    venv = corral.make_vec(
        ENV,
        NUM_ENVS,
        backend,
        native=source == "native",
        seed=0,
        num_workers=2,
        **({"num_cpus_per_worker": 0.25} if backend == "ray" else {}),
    )
    with venv:
        venv.reset()
        venv.step(ACTIONS)
        kill_worker(venv, 1)
        with pytest.raises(WorkerDiedError) as info:
            venv.call("max_episode_steps")
        why = r"died before answering call\('max_episode_steps'\)"
        assert_died_then_replaced(venv, info.value, why)


# -- a worker that misses the timeout ---------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("backend", WORKER_BACKENDS)
def test_a_worker_late_in_a_step_is_replaced_in_it(
    backend: str, source: str, tmp_path: Path, ray_session
) -> None:
    fault = Fault("hang", "step", tmp_path / "flag", at=2)
    with make_venv(backend, source, fault, ray_session, timeout=TIMEOUT) as venv:
        venv.reset()
        venv.step(ACTIONS)
        start = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("error", WorkerRestartWarning)  # the error tells it
            with pytest.raises(WorkerTimeoutError) as info:
                venv.step(ACTIONS)
        assert time.monotonic() - start < HANG_S / 2
        err = info.value
        assert err.env_indices == [2, 3] and err.restarted
        assert str(err).startswith(f"worker 1 (envs 2-3) did not answer step() within {TIMEOUT} s")
        # dict envs tell which one the worker hung in; a natively batched env cannot
        stuck = "(stuck: worker 1 in env 2's step()); stopped" in str(err)
        assert stuck == (source == "dict")
        assert_worker_1_restarted(err.batch)
        assert_steps_on(venv)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("backend", WORKER_BACKENDS)
def test_a_worker_late_in_an_autoreset_keeps_the_step_it_finished(
    backend: str, source: str, tmp_path: Path, ray_session
) -> None:
    fault = Fault("hang", "reset", tmp_path / "flag", at=AUTORESET)
    with make_venv(backend, source, fault, ray_session, timeout=TIMEOUT) as venv:
        venv.reset()
        venv.step(ACTIONS)
        with pytest.raises(WorkerTimeoutError) as info:
            venv.step(ACTIONS)
        err = info.value
        assert err.env_indices == [2, 3] and err.restarted
        assert str(err).startswith(f"worker 1 (envs 2-3) did not answer step() within {TIMEOUT} s")
        stuck = "(stuck: worker 1 in env 2's reset())" in str(err)
        assert stuck == (source == "dict")
        assert_autoreset_cut(err.batch, range(2, 4))
        assert_steps_on(venv)


# Whether the step survives a worker that dies in its autoreset: a subproc worker has
# written it to shared memory; a Ray actor hands it over only in its reply, lost with it
# (handing it over first costs a Ray call more per step: see docs/ray.md).
STEP_SURVIVES_A_DEATH_IN_AN_AUTORESET = {"subproc": True, "ray": False}


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("backend", WORKER_BACKENDS)
def test_a_worker_dying_in_an_autoreset_is_replaced_in_the_step(
    backend: str, source: str, tmp_path: Path, ray_session
) -> None:
    fault = Fault("die", "reset", tmp_path / "flag", at=AUTORESET)
    with make_venv(backend, source, fault, ray_session) as venv:
        venv.reset()
        venv.step(ACTIONS)
        with pytest.warns(WorkerRestartWarning, match=r"worker 1 \(envs 2-3\) died during step"):
            batch = venv.step(ACTIONS)
        if STEP_SURVIVES_A_DEATH_IN_AN_AUTORESET[backend]:
            assert_autoreset_cut(batch, range(2, 4))
        else:  # as if it died in the step itself
            assert_worker_1_restarted(batch)
        assert_steps_on(venv)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("backend", WORKER_BACKENDS)
def test_a_worker_late_in_a_call_raises_and_is_replaced_at_the_next_step(
    backend: str, source: str, tmp_path: Path, ray_session
) -> None:
    fault = Fault("hang", "attr", tmp_path / "flag")
    with make_venv(backend, source, fault, ray_session, timeout=TIMEOUT) as venv:
        venv.reset()
        venv.step(ACTIONS)
        with pytest.raises(WorkerTimeoutError) as info:
            venv.get_attr("probe")
        err = info.value
        assert err.env_indices == [2, 3] and not err.restarted
        why = rf"did not answer get_attr\('probe'\) within {TIMEOUT} s"
        with pytest.warns(WorkerRestartWarning, match=rf"worker 1 \(envs 2-3\) {why}"):
            batch = venv.step(ACTIONS)
        assert_worker_1_restarted(batch)


# -- how the copies are split into shards -------------------------------------------------------


def test_split_envs_makes_contiguous_shards() -> None:
    assert split_envs(5, 2) == [range(0, 3), range(3, 5)]
    assert split_envs(10, 4) == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    assert split_envs(2, 8) == [range(0, 1), range(1, 2)]  # at most one worker per env
    assert split_envs(10, envs_per_worker=4) == [range(0, 4), range(4, 8), range(8, 10)]
    assert split_envs(10, 3, envs_per_worker=4) == [range(0, 4), range(4, 8), range(8, 10)]
    with pytest.raises(ValueError, match="make 3 workers, not num_workers=2; give one of the two"):
        split_envs(5, 2, envs_per_worker=2)
    with pytest.raises(ValueError, match="num_workers must be at least 1, got 0"):
        split_envs(5, 0)
    with pytest.raises(ValueError, match="envs_per_worker must be at least 1, got 0"):
        split_envs(5, envs_per_worker=0)
    with pytest.raises(ValueError, match="num_envs must be at least 1, got 0"):
        split_envs(0, 2)
