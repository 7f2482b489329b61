"""The Ray backend: envs in Ray actors, so sampling can span a cluster.

Each actor holds a contiguous shard of the copies and runs its
:class:`~corral.vector.episodes.Episodes` into the actor's own arrays.
The parent keeps the full arrays: a step sends each actor its slice of the
actions and copies the slice of the batch that comes back into place.

Ray is optional and imported only when this backend is built.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from corral.batched_env import BatchedEnv
from corral.errors import (
    EnvError,
    MissingDependencyError,
    WorkerRestartWarning,
    WorkerStartError,
    WorkerTimeoutError,
)
from corral.vector import ray_reaper
from corral.vector.backend import (
    DEFAULT_TIMEOUT,
    Arrays,
    Backend,
    EnvInfo,
    call_shard,
    first_fault,
    set_shard_attrs,
)
from corral.vector.episodes import Episodes
from corral.vector.layout import Layout, Role
from corral.vector.sources import Source

# The arrays a replacement actor takes over from the parent: what
# Episodes.restart_all reads to end the episodes its dead predecessor was running.
_RESTORED_PREFIXES = ("obs/", "state", "alive/", "worker_restarts", "running_")

Refs = list[Any]  # the ObjectRefs of one actor's calls, in submission order
Reply = tuple[Arrays, EnvError | None]  # an actor's slice of the batch, and its envs' fault

LOOPBACK = "127.0.0.1"
"""The node address of a Ray that the backend starts itself: it listens on loopback only."""

CLOSE_TIMEOUT = 10.0
"""Most seconds ``close()`` waits for the actors to close their envs (less if ``timeout`` is)."""


def import_ray() -> Any:
    """The ``ray`` module, or a :class:`MissingDependencyError` saying how to install it."""
    try:
        import ray
    except ModuleNotFoundError as err:
        raise MissingDependencyError(
            "the 'ray' vector backend needs Ray: pip install 'corral[ray]'"
        ) from err
    return ray


class RayWorker:
    """One shard of the copies (global indices from ``offset``), run inside a Ray actor."""

    def __init__(self, source: Source, offset: int) -> None:
        self.source = source
        self.offset = offset
        self.shard: BatchedEnv | None = None

    def make_envs(self) -> EnvInfo:
        """Build the shard; say what it is."""
        self.shard = self.source.build(self.offset)
        return EnvInfo.of(self.shard)

    def start(self, layout: Layout, restored: Arrays) -> None:
        """Allocate this shard's arrays, taking the values in ``restored`` over."""
        self.arrays = layout.allocate(self.shard.num_envs)
        for path, value in restored.items():
            self.arrays[path][...] = value
        self.outputs = layout.paths(Role.STEP, Role.EPISODE, Role.BOOKKEEPING)
        self.episodes = Episodes(self.shard, layout, self.arrays, self.offset)

    # These return the envs' fault instead of raising it: raised, it would lose the batch.

    def reset(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> Reply:
        return self._run(lambda: self.episodes.reset(seeds, options))

    def step(self, actions: Arrays) -> Reply:
        for path, value in actions.items():
            self.arrays[path][...] = value
        return self._run(self.episodes.step)

    def restart(self) -> Reply:
        """End the episodes a dead predecessor was running (truncated) and reset the envs."""
        return self._run(lambda: self.episodes.restart_all([None] * self.shard.num_envs))

    def call(self, name: str, args: tuple | None, kwargs: dict[str, Any]) -> list[Any]:
        return call_shard(self.shard, self.offset, name, args, kwargs)

    def set_attr(self, name: str, values: Sequence[Any]) -> None:
        set_shard_attrs(self.shard, self.offset, name, values)

    def close(self) -> None:
        shard, self.shard = self.shard, None
        if shard is not None:
            shard.close()

    def _run(self, command: Callable[[], None]) -> Reply:
        try:
            command()
        except EnvError as fault:
            return self._batch(), fault
        return self._batch(), None

    def _batch(self) -> Arrays:
        return {path: self.arrays[path] for path in self.outputs}


class _RaySession:
    """Starts Ray when no one has; shuts it down when the last backend using it closes.

    A Ray of its own listens on loopback only, and a reaper process
    (:mod:`corral.vector.ray_reaper`) ends it at once if the driver dies.
    """

    users = 0  # open backends on a Ray that this module started
    reaper: subprocess.Popen | None = None  # that of a local Ray of our own

    @classmethod
    def acquire(cls, ray: Any, address: str | None, num_cpus: int) -> bool:
        """Make sure Ray runs; ``True`` if the caller must :meth:`release` it."""
        if ray.is_initialized():
            if cls.users == 0:
                return False  # the user's Ray: never shut it down
        elif address is not None:
            ray.init(address=address)
        else:
            cls._start_local(ray, num_cpus)
        cls.users += 1
        return True

    @classmethod
    def release(cls, ray: Any) -> None:
        cls.users -= 1
        if cls.users > 0:
            return
        if ray.is_initialized():
            ray.shutdown()
        if cls.reaper is not None:  # Ray's processes are gone: nothing left to reap
            ray_reaper.dismiss(cls.reaper)
            cls.reaper = None

    @classmethod
    def _start_local(cls, ray: Any, num_cpus: int) -> None:
        """A new Ray of our own on loopback, even where `ray start` runs on this machine."""
        with _node_address_on_loopback(ray):
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                _node_ip_address=LOOPBACK,
            )
        try:
            node = ray._private.worker._global_node
            raylet, *_ = node.all_processes[ray._private.ray_constants.PROCESS_TYPE_RAYLET]
            head = [info.process.pid for infos in node.all_processes.values() for info in infos]
            cls.reaper = ray_reaper.start(raylet.process.pid, head)
        except BaseException:
            ray.shutdown()
            raise


@contextlib.contextmanager
def _node_address_on_loopback(ray: Any) -> Iterator[None]:
    """Have ``ray.init`` keep a loopback node address while it starts Ray.

    Ray binds every server (GCS, raylet, workers, agents, metrics) to loopback
    only when the node address is 127.0.0.1, but on Linux it replaces a
    loopback ``_node_ip_address`` with the machine's routable address unless
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` was set when Ray was imported; this
    sets the flag that variable sets.
    """
    constants = ray._private.ray_constants
    cluster = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = cluster


class RayBackend(Backend):
    """Runs the envs in Ray actors, each holding a contiguous slice of them.

    Options:
        num_workers: number of actors (default: as many as the Ray cluster's
            free CPUs hold at ``num_cpus_per_worker`` each, at least one and
            at most one per env).
        envs_per_worker: envs per actor, instead of ``num_workers`` (the last
            actor may hold fewer).
        ray_address: the cluster to join when Ray is not initialised yet
            (``"auto"``, ``"ray://head:10001"``, ``"head:6379"``); without it a
            local Ray is started, with as many CPUs as the machine has cores or
            the workers reserve, whichever is more. A Ray this backend starts is
            shut down on close; a Ray the caller started is left running.
        num_cpus_per_worker: CPUs each actor reserves (fractions allowed).
        timeout: seconds to wait for the actors when a wait or call gives no
            timeout (:data:`~corral.vector.backend.DEFAULT_TIMEOUT`; ``None``:
            no limit).
        start_timeout: seconds to wait for the actors to be scheduled and to
            build their envs, at the start and when a worker is replaced
            (``None``: no limit).

    Workers that the cluster cannot hold raise a :class:`WorkerStartError`
    that says how many CPUs they need and the cluster has: at once when the
    Ray is the backend's own (it cannot grow), else after ``start_timeout``
    (a cluster may add nodes). Ctrl-C while waiting for the actors kills them
    at once.

    A worker that dies is replaced, with a
    :class:`~corral.errors.WorkerRestartWarning`: the episodes it was running
    end, marked truncated, in the same step's batch (``done`` set,
    ``worker_restarts`` counted, the cut episode's stats kept); during a reset
    its envs simply reset. A worker that misses the timeout of a reset or step
    is replaced the same way, within that call (given ``start_timeout`` more
    to start), before the :class:`WorkerTimeoutError` is raised. An env that
    fails is restarted by its actor, which returns its slice of the batch with
    the fault; the fault is raised once every slice is copied in.
    """

    def __init__(
        self,
        source: Source,
        *,
        num_workers: int | None = None,
        envs_per_worker: int | None = None,
        ray_address: str | None = None,
        num_cpus_per_worker: float = 1,
        timeout: float | None = DEFAULT_TIMEOUT,
        start_timeout: float | None = 60.0,
    ) -> None:
        super().__init__(source)
        self._ray = ray = import_ray()
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.num_cpus_per_worker = num_cpus_per_worker
        self._starting: set[int] = set()  # actors replaced and not yet answering
        self._actors: list[Any] = []
        self._layout: Layout | None = None
        self._arrays: Arrays = {}
        self._pending: tuple[dict[int, Refs], Callable[[int], Refs]] | None = None
        self._restart_due: dict[int, Refs] = {}
        self._closed = False
        self.slices = (
            env_slices(self.num_envs, num_workers, envs_per_worker)
            if num_workers is not None or envs_per_worker is not None
            else []
        )
        needed = math.ceil(len(self.slices) * num_cpus_per_worker)
        self._owns_ray = _RaySession.acquire(ray, ray_address, max(os.cpu_count() or 1, needed))
        try:
            self._free_cpus = ray.available_resources().get("CPU", 0.0)
            if not self.slices:
                workers = max(1, int(self._free_cpus // num_cpus_per_worker))
                self.slices = env_slices(self.num_envs, workers, None)
            if self._owns_ray and self._cpus_needed() > ray.cluster_resources().get("CPU", 0):
                raise WorkerStartError(self._shortage("cannot start"))
            self._remote = ray.remote(num_cpus=num_cpus_per_worker)(RayWorker)
            self._actors = [self._spawn(s) for s in self.slices]
            refs = {k: [actor.make_envs.remote()] for k, actor in enumerate(self._actors)}
            try:
                self._info = self._gather(refs, start_timeout, "make_envs")[0]
            except WorkerTimeoutError:
                raise WorkerStartError(
                    self._shortage(f"did not start within {start_timeout} s")
                ) from None
        except BaseException:
            self._shut(graceful=False)
            raise

    def env_info(self) -> EnvInfo:
        return self._info

    def start(self, layout: Layout) -> Arrays:
        self._layout = layout
        self._arrays = layout.allocate()
        refs = {k: [actor.start.remote(layout, {})] for k, actor in enumerate(self._actors)}
        self._gather(refs, self.timeout, "start")
        return self._arrays

    # -- reset and step -----------------------------------------------------------

    def reset_async(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> None:
        def submit(k: int) -> Refs:
            actor, s = self._actors[k], self.slices[k]
            restart = self._take_restart(k)
            return [*restart, actor.reset.remote(seeds[s.start : s.stop], options)]

        self._pending = self._submit(submit), submit

    def step_async(self) -> None:
        actions = {p: self._arrays[p] for p in self._layout.paths(Role.ACTION)}

        def submit(k: int) -> Refs:
            actor, s = self._actors[k], self.slices[k]
            restart = self._take_restart(k)
            if restart:
                return restart
            return [actor.step.remote({p: a[s.start : s.stop] for p, a in actions.items()})]

        self._pending = self._submit(submit), submit

    def reset_wait(self, timeout: float | None) -> None:
        self._wait_pending(timeout, "reset")

    def step_wait(self, timeout: float | None) -> None:
        self._wait_pending(timeout, "step")

    # -- other calls ------------------------------------------------------------------

    def call(
        self, name: str, args: tuple | None, kwargs: dict[str, Any], timeout: float | None
    ) -> list[Any]:
        refs = self._submit(lambda k: [self._actors[k].call.remote(name, args, kwargs)])
        results = self._gather(refs, timeout, f"call({name!r})")
        return [value for k in range(len(self._actors)) for value in results[k]]

    def set_attr(self, name: str, values: Sequence[Any], timeout: float | None) -> None:
        values = list(values)

        def submit(k: int) -> Refs:
            s = self.slices[k]
            return [self._actors[k].set_attr.remote(name, values[s.start : s.stop])]

        self._gather(self._submit(submit), timeout, f"set_attr({name!r})")

    def close(self) -> None:
        self._shut(graceful=True)

    def _shut(self, *, graceful: bool) -> None:
        """Kill the actors, ``graceful``: after they closed their envs (waiting
        ``timeout``, or :data:`CLOSE_TIMEOUT`), and let go of Ray."""
        if self._closed:
            return
        self._closed = True
        ray, actors, self._actors = self._ray, self._actors, []
        errors = []
        try:
            if graceful and actors and ray.is_initialized():
                refs = [actor.close.remote() for actor in actors]
                limit = CLOSE_TIMEOUT if self.timeout is None else min(self.timeout, CLOSE_TIMEOUT)
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=limit)
                for ref in ready:
                    try:
                        ray.get(ref)
                    except ray.exceptions.RayActorError:
                        continue  # a dead worker has no envs left to close
                    except ray.exceptions.RayTaskError as err:
                        errors.append(err)
        finally:
            try:
                if ray.is_initialized():
                    for actor in actors:
                        ray.kill(actor)
            finally:
                if self._owns_ray:
                    _RaySession.release(ray)
        if errors:
            raise _unwrap(errors[0])

    # -- internals ----------------------------------------------------------------------

    def _spawn(self, s: range) -> Any:
        return self._remote.remote(self.source.part(s), s.start)

    def _submit(self, submit: Callable[[int], Refs]) -> dict[int, Refs]:
        return {k: submit(k) for k in range(len(self._actors))}

    def _take_restart(self, k: int) -> Refs:
        """The calls that restart actor ``k``'s envs if it was replaced, else none."""
        setup = self._restart_due.pop(k, None)
        if setup is None:
            return []
        self._starting.add(k)
        return [*setup, self._actors[k].restart.remote()]

    def _wait_pending(self, timeout: float | None, what: str) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        refs, submit = pending
        timeout = self.timeout if timeout is None else timeout
        if self._starting and self.start_timeout is not None:
            # a replacement waits for its CPUs: as long as a start may take, and no longer
            timeout = self.start_timeout if timeout is None else max(timeout, self.start_timeout)
        try:
            self._gather(refs, timeout, what, resubmit=submit, on_result=self._copy_in)
        finally:
            self._starting.clear()

    def _copy_in(self, k: int, reply: Reply) -> EnvError | None:
        """Put actor ``k``'s slice of the batch in place; its envs' fault."""
        outputs, fault = reply
        s = self.slices[k]
        for path, value in outputs.items():
            self._arrays[path][s.start : s.stop] = value
        return fault

    def _replace(self, k: int, why: str, warn: bool = True) -> None:
        """Swap actor ``k`` for a new one, whose envs restart at its next step or reset."""
        s = self.slices[k]
        if warn:
            warnings.warn(
                f"the Ray worker of {_envs(s)} {why}; a new worker took over, whose envs "
                "start new episodes (the cut ones end truncated; batch.worker_restarts "
                "counts it)",
                WorkerRestartWarning,
                stacklevel=2,
            )
        self._ray.kill(self._actors[k])
        actor = self._actors[k] = self._spawn(s)
        restored = {
            path: array[s.start : s.stop]
            for path, array in self._arrays.items()
            if path.startswith(_RESTORED_PREFIXES)
        }
        setup = [actor.make_envs.remote(), actor.start.remote(self._layout, restored)]
        self._restart_due[k] = setup

    def _gather(
        self,
        pending: dict[int, Refs],
        timeout: float | None,
        what: str,
        resubmit: Callable[[int], Refs] | None = None,
        on_result: Callable[[int, Any], BaseException | None] | None = None,
    ) -> dict[int, Any]:
        """Wait for each actor's calls; the result of its last call, by actor.

        ``on_result`` sees each result as it arrives and may return a fault. A dead
        actor is replaced; with ``resubmit`` its calls go again to the replacement
        (once), else an :class:`EnvError` says it died. Actors that miss the timeout
        are replaced; with ``resubmit`` their calls go to the replacements (once,
        given ``start_timeout``) and a :class:`WorkerTimeoutError` is raised once they
        answered. Faults are raised once every actor answered, the one of the lowest
        env index first. Ctrl-C kills the actors.
        """
        try:
            return self._gather_results(pending, timeout, what, resubmit, on_result)
        except KeyboardInterrupt:
            self._shut(graceful=False)
            raise

    def _gather_results(
        self,
        pending: dict[int, Refs],
        timeout: float | None,
        what: str,
        resubmit: Callable[[int], Refs] | None,
        on_result: Callable[[int, Any], BaseException | None] | None,
    ) -> dict[int, Any]:
        ray = self._ray
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        pending = dict(pending)
        results: dict[int, Any] = {}
        errors: list[BaseException] = []
        replaced: set[int] = set()
        while pending:
            last = {refs[-1]: k for k, refs in pending.items()}
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _ = ray.wait(list(last), num_returns=len(last), timeout=left)
            if not ready:
                late = sorted(pending)
                retry = resubmit is not None and self._layout is not None
                retry = retry and not replaced.intersection(late)
                error = self._time_out(late, timeout, what, restarting=retry)
                if not retry:
                    raise error
                errors.append(error)
                replaced.update(late)
                pending = {k: resubmit(k) for k in late}
                # the replacements must start too: as long as a start may take, or the timeout
                start = self.start_timeout
                limit = None if start is None or timeout is None else max(start, timeout)
                deadline = None if limit is None else time.monotonic() + limit
                continue
            for ref in ready:
                k = last[ref]
                try:
                    results[k] = ray.get(pending.pop(k))[-1]
                except ray.exceptions.RayActorError as err:
                    if self._layout is None or k in replaced:
                        raise self._died(k, what, err) from err
                    replaced.add(k)
                    self._replace(k, f"died during {what}")
                    if resubmit is None:
                        errors.append(self._died(k, what, err))
                    else:
                        pending[k] = resubmit(k)
                    continue
                except ray.exceptions.RayTaskError as err:
                    errors.append(err)
                    continue
                fault = None if on_result is None else on_result(k, results[k])
                if fault is not None:
                    errors.append(fault)
        if errors:
            raise first_fault([_unwrap(err) for err in errors])
        return results

    def _cpus_needed(self) -> float:
        return len(self.slices) * self.num_cpus_per_worker

    def _shortage(self, what: str) -> str:
        """What the workers need against what the cluster has, and what to change."""
        workers, each, free = len(self.slices), self.num_cpus_per_worker, self._free_cpus
        total = self._ray.cluster_resources().get("CPU", 0.0)
        said = (
            f"{workers} Ray workers for {self.num_envs} envs {what}: at {each:g} CPU each "
            f"they need {self._cpus_needed():g} CPUs; the Ray cluster has {total:g} CPUs, "
            f"{free:g} free when they were started"
        )
        fits = int(free // each)
        fewer = f"num_workers={fits}" if fits >= 1 else "num_workers"
        fixes = (
            f"start fewer workers ({fewer}, or more envs each with envs_per_worker), "
            "reserve less per worker (num_cpus_per_worker=0.5), or join a larger "
            "cluster (ray_address)"
        )
        if self._cpus_needed() <= free:
            fixes = "raise start_timeout if the envs are slow to build, or " + fixes
        return f"{said}. To fix: {fixes}."

    def _died(self, k: int, what: str, err: BaseException) -> EnvError:
        s = self.slices[k]
        return EnvError(s.start, f"the Ray worker of {_envs(s)} died during {what}: {err}")

    def _time_out(
        self, late: list[int], timeout: float | None, what: str, restarting: bool
    ) -> WorkerTimeoutError:
        """Replace the ``late`` actors; the error that reports them (``restarting``: their
        envs restart within this call)."""
        if self._layout is not None:
            for k in late:
                self._replace(k, f"did not answer {what} within {timeout} s", warn=not restarting)
        envs = [i for k in late for i in self.slices[k]]
        when = (
            "restarted in this call: their episodes end truncated in this batch"
            if restarting
            else "restart at the next step or reset"
        )
        return WorkerTimeoutError(
            f"{what}: the Ray workers of envs {envs} did not answer within {timeout} s; "
            f"they were replaced, and their envs {when}",
            envs,
            restarted=restarting,
        )


def env_slices(num_envs: int, num_workers: int | None, envs_per_worker: int | None) -> list[range]:
    """Contiguous env index ranges, one per worker."""
    if envs_per_worker is not None:
        if envs_per_worker < 1:
            raise ValueError(f"envs_per_worker must be at least 1, got {envs_per_worker}")
        count = math.ceil(num_envs / envs_per_worker)
        if num_workers is not None and num_workers != count:
            raise ValueError(
                f"{num_envs} envs at envs_per_worker={envs_per_worker} make {count} workers, "
                f"not num_workers={num_workers}; give one of the two"
            )
        starts = range(0, num_envs, envs_per_worker)
        return [range(lo, min(lo + envs_per_worker, num_envs)) for lo in starts]
    if num_workers is None or num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    count = min(num_envs, num_workers)
    bounds = [math.ceil(num_envs * w / count) for w in range(count + 1)]
    return [range(lo, hi) for lo, hi in itertools.pairwise(bounds)]


def _envs(s: range) -> str:
    return f"env {s.start}" if len(s) == 1 else f"envs {s.start}-{s.stop - 1}"


def _unwrap(err: BaseException) -> BaseException:
    """The :class:`EnvError` inside Ray's ``RayTaskError`` (it carries the env's traceback)."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, EnvError) else err
