"""The Ray backend: envs in Ray actors, so sampling can span a cluster.

Each actor holds a contiguous shard of the copies and runs its
:class:`~corral.vector.episodes.Episodes` into the actor's own arrays.
The parent keeps the full arrays: a step sends each actor its rows of the
actions and copies the rows of the batch that come back into place. What the
parent makes of a dead or late actor is :mod:`corral.vector.shards`'s to say.

An actor runs its calls one at a time, in the order they were sent, on one
thread (not the process's main thread, so an env cannot set signal handlers
there); a second thread (the :data:`WHERE` concurrency group) answers only
:meth:`RayWorker.where`, so that an actor stuck in an env can still say which,
and, stuck in the reset that follows a step (its autoreset), hand over the
step it had finished, as a ``subproc`` worker leaves it in shared memory.

Ray is optional and imported only when this backend is built.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from numbers import Real
from typing import Any

from corral.arrays import is_tensor
from corral.batched_env import BatchedEnv, BatchedStep
from corral.errors import ConfigError, EnvError, MissingDependencyError, WorkerStartError
from corral.vector import reaper
from corral.vector.backend import (
    DEFAULT_START_TIMEOUT,
    DEFAULT_TIMEOUT,
    Arrays,
    Backend,
    EnvInfo,
    ResetWatch,
    build_shard,
    call_shard,
    set_shard_attrs,
)
from corral.vector.dict_envs import DictEnvs, call_inside
from corral.vector.env_calls import Written, guarded
from corral.vector.episodes import Episodes
from corral.vector.layout import Layout, Role
from corral.vector.shards import (
    Answer,
    Answers,
    Shard,
    call_faults,
    call_text,
    gather,
    raise_first,
    split_envs,
    step_faults,
    warn_restarted,
)
from corral.vector.sources import Source

# The fields a replacement actor takes over from the parent, besides the bookkeeping: what
# Episodes.restart_all reads to end the episodes its dead predecessor was running.
_TAKEN_OVER = frozenset({"obs", "state", "alive", "decision", "worker_restarts"})

Refs = list[Any]  # the ObjectRefs of one actor's calls, in submission order
Reply = tuple[Arrays, EnvError | None]  # an actor's rows of the batch, and its envs' fault
Whereabouts = tuple[str | None, Arrays | None]  # what RayWorker.where says

LOOPBACK = "127.0.0.1"
"""The node address of a Ray that the backend starts itself: it listens on loopback only."""

CLOSE_TIMEOUT = 10.0
"""Most seconds ``close()`` waits for the actors to close their envs (less if ``timeout`` is)."""

WHERE = "where"
"""The concurrency group of :meth:`RayWorker.where`: a thread of its own in each actor."""

WHERE_TIMEOUT = 1.0
"""Most seconds the parent waits for late actors to say which env call they are stuck in."""


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
        self.stepping = False  # in a step() call
        # Odd while the shard resets inside a step() call: the arrays then hold the step
        # as finished so far; until the reset returns, nothing writes them but the reset
        # itself, in the rows of the copies that ended (a replacement restarts them).
        self.resets_in_step = 0

    def make_envs(self, written: Written | None = None) -> EnvInfo:
        """Build the shard, with what ``set_attr`` had ``written`` on the envs of the actor
        this one replaces; say what it is."""
        self.shard = guarded(
            self.offset, "building the env", lambda: build_shard(self.source, self.offset, written)
        )
        return EnvInfo.of(self.shard)

    def _built(self) -> BatchedEnv:
        """The shard, which :meth:`make_envs` built (the parent calls it first)."""
        assert self.shard is not None, "make_envs() builds the shard"
        return self.shard

    def start(self, layout: Layout, restored: Arrays) -> None:
        """Allocate this shard's arrays, taking the values in ``restored`` over."""
        shard = self._built()
        self.arrays = layout.allocate(shard.num_envs)
        for path, value in restored.items():
            self.arrays[path][...] = value
        self.outputs = layout.paths(Role.STEP, Role.EPISODE, Role.BOOKKEEPING)
        watched = _ResetsInStep(shard, self)
        # The shard may write into the arrays (they die with the actor; a replacement
        # starts from the parent's copy, or from the step handed over by where()).
        self.episodes = Episodes(watched, layout, self.arrays, self.offset, share=True)

    # These return the envs' fault instead of raising it: raised, it would lose the batch.

    def reset(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> Reply:
        return self._run("reset()", lambda: self.episodes.reset(seeds, options))

    def step(self, actions: Arrays) -> Reply:
        for path, value in actions.items():
            self.arrays[path][...] = value
        self.stepping = True
        try:
            return self._run("step()", self.episodes.step)
        finally:
            self.stepping = False

    def restart(self) -> Reply:
        """End the episodes a dead predecessor was running (truncated) and reset the envs."""
        seeds = [None] * self._built().num_envs
        return self._run("restart()", lambda: self.episodes.restart_all(seeds))

    def call(self, name: str, args: tuple | None, kwargs: dict[str, Any]) -> list[Any]:
        return call_shard(self._built(), self.offset, name, args, kwargs)

    def set_attr(self, name: str, values: Sequence[Any]) -> int | None:
        return set_shard_attrs(self._built(), self.offset, name, values)

    def close(self) -> None:
        shard, self.shard = self.shard, None
        if shard is not None:
            shard.close()

    def where(self) -> Whereabouts:
        """The env call the shard is in (``"env 2's step()"``), if its envs tell (dict envs
        do); and, if it is in a reset inside a step (the autoreset of the copies that
        ended), the step's batch as finished before that reset. Runs in the :data:`WHERE`
        group, beside a call that may hang."""
        shard = self.shard
        said = call_inside(shard.inside) if isinstance(shard, DictEnvs) else None
        mark = self.resets_in_step
        if mark % 2 == 0:
            return said, None
        finished = {path: _copy(self.arrays[path]) for path in self.outputs}
        # the reset may have returned meanwhile, and its rows been written: then none
        return said, finished if self.resets_in_step == mark else None

    def _run(self, what: str, command: Callable[[], None]) -> Reply:
        try:
            guarded(self.offset, what, command)  # a native env's exception as its shard's
        except EnvError as fault:
            return self._batch(), fault
        return self._batch(), None

    def _batch(self) -> Arrays:
        return {path: self.arrays[path] for path in self.outputs}


class _ResetsInStep(ResetWatch):
    """``shard`` as its actor's :class:`Episodes` runs it: counts in ``worker.resets_in_step``
    each reset that begins or ends inside a step() call, and is ``shard`` otherwise."""

    def __init__(self, shard: BatchedEnv, worker: RayWorker) -> None:
        super().__init__(shard)
        self._worker = worker

    def reset(self, *args: Any, **kwargs: Any) -> BatchedStep:
        worker = self._worker
        if not worker.stepping:
            return self._shard.reset(*args, **kwargs)
        worker.resets_in_step += 1
        try:
            return self._shard.reset(*args, **kwargs)
        finally:
            worker.resets_in_step += 1


def _copy(array: Any) -> Any:
    """A copy of a numpy array or torch tensor."""
    return array.clone() if is_tensor(array) else array.copy()


class _RaySession:
    """Starts Ray when no one has; shuts it down when the last backend using it closes.

    A Ray of its own listens on loopback only, and a reaper process
    (:mod:`corral.vector.reaper`) ends it at once if the driver dies. One process
    is connected to one Ray: a ``ray_address`` other than the Ray this process
    already runs on is refused (:func:`_check_address`).
    """

    users = 0  # open backends on a Ray that this module started
    address: str | None = None  # the ray_address it was started with (None: a local Ray)
    reaper: subprocess.Popen | None = None  # that of a local Ray of our own

    @classmethod
    def acquire(cls, ray: Any, address: str | None, num_cpus: int) -> bool:
        """Make sure Ray runs; ``True`` if the caller must :meth:`release` it."""
        if ray.is_initialized():
            ours = cls.users > 0
            _check_address(ray, address, cls.address if ours else None, ours)
            if not ours:
                return False  # the user's Ray: never shut it down
        elif address is not None:
            ray.init(address=address)
            cls.address = address
        else:
            cls._start_local(ray, num_cpus)
            cls.address = None
        cls.users += 1
        return True

    @classmethod
    def release(cls, ray: Any) -> None:
        cls.users -= 1
        if cls.users > 0:
            return
        if ray.is_initialized():
            ray.shutdown()
            # ray.init leaves a reference cycle behind (the ImportError of the dashboard's
            # optional dependencies, whose traceback holds its frames and so its Node), and
            # the Node's connection to the GCS stays open until the cycle is collected.
            gc.collect()
        if cls.reaper is not None:  # Ray's processes are gone: nothing left to reap
            reaper.dismiss(cls.reaper)
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
            pid = raylet.process.pid
            cls.reaper = reaper.start([pid, *head], children_of=pid)
        except BaseException:
            ray.shutdown()
            raise


def join_ray(address: str | None, num_cpus: int) -> bool:
    """Make sure this process runs on Ray as the backend starts it: the cluster at
    ``address``, else a local Ray of ``num_cpus`` CPUs of its own on loopback (with its
    reaper), else the Ray already running; ``True`` if the caller must :func:`leave_ray`."""
    return _RaySession.acquire(import_ray(), address, num_cpus)


def leave_ray() -> None:
    """Let go of a Ray that :func:`join_ray` said to leave: shut down when no one else uses it."""
    _RaySession.release(import_ray())


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


def _check_options(num_cpus_per_worker: float, ray_address: str | None, sized: bool) -> None:
    """Raise a :class:`ConfigError` for a Ray option that cannot work (``sized``: the number
    of workers was given), before anything is started."""
    cpus = num_cpus_per_worker
    if isinstance(cpus, bool) or not isinstance(cpus, Real) or not 0 <= cpus < math.inf:
        raise ConfigError(
            f"num_cpus_per_worker must be a number of CPUs, 0 or more (fractions allowed), "
            f"got {cpus!r}"
        )
    if cpus == 0 and not sized:
        raise ConfigError(
            "num_cpus_per_worker=0 reserves no CPU, so the free CPUs cannot size the workers: "
            "give num_workers or envs_per_worker too"
        )
    if ray_address is not None and not isinstance(ray_address, str):
        raise ConfigError(
            f"ray_address must be a Ray address ('auto', 'head:6379', 'ray://head:10001') or "
            f"None, got {ray_address!r}"
        )


def _check_address(ray: Any, address: str | None, given: str | None, ours: bool) -> None:
    """Refuse to join the Ray at ``address`` where this process already runs on another
    one (``ours``: one that corral started, with ``ray_address=given``; else the user's)."""
    if address is None:
        return  # no address: the Ray that runs
    if ours and address == given:
        return
    running = ray.get_runtime_context().gcs_address
    if not ours and address == running:
        return
    whose = (
        "a Ray that corral started for another vector env that is still open"
        if ours
        else "a Ray that this process initialised (ray.init)"
    )
    fix = "close those vector envs first" if ours else "call ray.shutdown() first"
    raise ConfigError(
        f"ray_address={address!r}: this process already runs on {whose}, at {running}; a "
        f"process joins one Ray at a time. Leave ray_address out to use that one, or {fix}."
    )


@dataclass(eq=False)
class _Actor(Shard):
    """The parent's handle on one Ray actor and the envs it runs."""

    handle: Any = None
    setup: Refs = field(default_factory=list)
    """The calls that make a replacement take over from a lost actor; its envs restart
    at the next reset or step (empty: nothing to take over)."""
    finished: Arrays | None = None
    """The step a late actor had finished before the reset it was stuck in (an autoreset):
    its replacement takes the step over, so that it counts (``None``: none)."""


class RayBackend(Backend):
    """Runs the envs in Ray actors, each holding a contiguous shard of them.

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
            shut down on close, or when the backend fails to start; a Ray the
            caller started is left running. An address other than that of the
            Ray this process already runs on raises :class:`ConfigError`.
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

    A worker that dies or misses the timeout is replaced as
    :mod:`corral.vector.shards` says: in a reset or step within the call (given
    ``start_timeout`` more to start), its episodes ending truncated in that
    batch (``done`` set, ``worker_restarts`` counted, the cut episode's stats
    kept); after another call, at the next reset or step. A late actor of dict
    envs is asked which env call it is stuck in, for the
    :class:`~corral.errors.WorkerTimeoutError` to say; one stuck in the reset
    that follows a step (the autoreset of the copies that ended) hands over the
    step it had finished, which counts (those episodes end as they ended), as
    on ``subproc``. An actor that dies there loses that step with it (unlike
    ``subproc``, whose worker leaves it in shared memory): its episodes end
    where they stood before the step. An env that fails is
    restarted by its actor, which returns its shard of the batch with the fault;
    the fault is raised once every shard is copied in.
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
        start_timeout: float | None = DEFAULT_START_TIMEOUT,
    ) -> None:
        super().__init__(source)
        self._ray = ray = import_ray()
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.num_cpus_per_worker = num_cpus_per_worker
        self._starting: set[int] = set()  # shards whose envs restart in the pending call
        self.shards: list[_Actor] = []
        self._layout: Layout | None = None
        self._arrays: Arrays = {}
        self._pending: tuple[str, dict[int, Refs], Callable[[_Actor], Refs]] | None = None
        self._asked: tuple[str, dict[int, Refs]] | None = None  # a call awaiting its replies
        self._closed = False
        sized = num_workers is not None or envs_per_worker is not None
        _check_options(num_cpus_per_worker, ray_address, sized)
        if sized:
            self._split(split_envs(self.num_envs, num_workers, envs_per_worker))
        # Ray starts only once every option has been checked; from here on a failure ends
        # what was started (_shut), a Ray of our own included.
        needed = math.ceil(len(self.shards) * num_cpus_per_worker)
        self._owns_ray = _RaySession.acquire(ray, ray_address, max(os.cpu_count() or 1, needed))
        try:
            self._free_cpus = ray.available_resources().get("CPU", 0.0)
            if not self.shards:
                workers = max(1, int(self._free_cpus // num_cpus_per_worker))
                self._split(split_envs(self.num_envs, workers))
            if self._owns_ray and self._cpus_needed() > ray.cluster_resources().get("CPU", 0):
                raise WorkerStartError(self._shortage("cannot start"))
            remote = ray.remote(num_cpus=num_cpus_per_worker, concurrency_groups={WHERE: 1})
            self._remote = remote(RayWorker)
            self._info = self._make_envs()
        except BaseException:
            self._shut(graceful=False)
            raise

    def env_info(self) -> EnvInfo:
        return self._info

    def start(self, layout: Layout) -> Arrays:
        self._layout = layout
        self._arrays = layout.allocate()
        self._actions = {p: self._arrays[p] for p in layout.paths(Role.ACTION)}
        self._call(lambda s: [s.handle.start.remote(layout, {})], "start()", self.timeout)
        return self._arrays

    # -- reset and step -----------------------------------------------------------

    def reset_async(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> None:
        def submit(s: _Actor) -> Refs:
            restart = self._take_restart(s)  # an actor runs its calls in the order submitted
            return [*restart, s.handle.reset.remote(seeds[s.envs.start : s.envs.stop], options)]

        self._post("reset()", submit)

    def step_async(self) -> None:
        actions = self._actions

        def submit(s: _Actor) -> Refs:
            restart = self._take_restart(s)
            if restart:
                return restart
            rows = slice(s.envs.start, s.envs.stop)
            return [s.handle.step.remote({p: a[rows] for p, a in actions.items()})]

        self._post("step()", submit)

    def reset_wait(self, timeout: float | None) -> None:
        self._finish(timeout)

    def step_wait(self, timeout: float | None) -> None:
        self._finish(timeout)

    # -- other calls ------------------------------------------------------------------

    def call_async(self, name: str, args: tuple | None, kwargs: dict[str, Any]) -> None:
        self._ask(lambda s: [s.handle.call.remote(name, args, kwargs)], call_text(name, args))

    def call_wait(self, timeout: float | None) -> list[Any]:
        results = self._answers(timeout)
        return [value for s in self.shards for value in results[s.index]]

    def set_attr(self, name: str, values: Sequence[Any], timeout: float | None) -> int | None:
        values = list(values)
        results = self._call(
            lambda s: [s.handle.set_attr.remote(name, values[s.envs.start : s.envs.stop])],
            f"set_attr({name!r})",
            timeout,
            took=lambda s: s.remember(name, values),
        )
        return results[0]

    def close(self, terminate: bool = False) -> None:
        self._shut(graceful=not terminate)

    def _shut(self, *, graceful: bool) -> None:
        """Kill the actors, ``graceful``: after they closed their envs (waiting
        ``timeout``, or :data:`CLOSE_TIMEOUT`), and let go of Ray."""
        if self._closed:
            return
        self._closed = True
        fault = None
        try:
            fault = self._end_actors(graceful)
        finally:
            # No actor class, handle or ObjectRef may outlive a Ray that shuts down here: Ray
            # then leaves connections open in this process (sockets that pile up, run after run).
            self._pending = self._asked = self._remote = None
            if self._owns_ray:
                _RaySession.release(self._ray)
        if fault is not None:
            raise fault

    def _end_actors(self, graceful: bool) -> BaseException | None:
        """Kill the actors (``graceful``: once they closed their envs); the first fault of
        their closes, if any."""
        ray = self._ray
        actors = [s.handle for s in self.shards if s.handle is not None]
        for s in self.shards:
            s.handle, s.setup = None, []
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
                        errors.append(_unwrap(err))
        finally:
            if ray.is_initialized():
                for actor in actors:
                    ray.kill(actor)
        return errors[0] if errors else None

    # -- internals ----------------------------------------------------------------------

    def _split(self, ranges: list[range]) -> None:
        self.shards = [_Actor(k, envs) for k, envs in enumerate(ranges)]

    def _spawn(self, s: _Actor) -> None:
        s.handle = self._remote.remote(self.source.part(s.envs), s.envs.start)

    def _make_envs(self) -> EnvInfo:
        """Start the actors and have them build their envs; what the envs are."""
        for s in self.shards:
            self._spawn(s)
        pending = {s.index: [s.handle.make_envs.remote()] for s in self.shards}
        answers = self._gather(pending, self.start_timeout)
        if answers.late:
            raise WorkerStartError(self._shortage(f"did not start within {self.start_timeout} s"))
        raise_first(answers.errors)
        if answers.dead:
            raise WorkerStartError(
                f"{', '.join(map(str, answers.dead))} died while starting, before building "
                "their envs"
            )
        return answers.values[0]

    def _take_restart(self, s: _Actor) -> Refs:
        """The calls that restart ``s``'s envs if its actor was replaced, else none."""
        if not s.setup:
            return []
        self._starting.add(s.index)
        setup, s.setup = s.setup, []
        return [*setup, s.handle.restart.remote()]

    def _post(self, what: str, submit: Callable[[_Actor], Refs]) -> None:
        self._pending = what, {s.index: submit(s) for s in self.shards}, submit

    def _finish(self, timeout: float | None) -> None:
        """Wait for the reset or step; replace the actors that died or were late and
        resubmit their part (once), then raise the first fault (the batch is complete)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        what, refs, submit = pending
        limit = self.timeout if timeout is None else timeout
        if self._starting and self.start_timeout is not None:
            # a replacement waits for its CPUs: as long as a start may take, and no longer
            limit = self.start_timeout if limit is None else max(limit, self.start_timeout)
        try:
            answers = self._gather(refs, limit)
            faults = step_faults(answers, what, limit) + self._copy_in(answers.values)
            retry = answers.dead + answers.late
            if retry:
                faults += self._retry(retry, submit, what, limit)
            restarted = [s for s in self.shards if s.index in self._starting or s in retry]
            warn_restarted([s for s in restarted if not s.setup])
        finally:
            self._starting.clear()
        raise_first(faults)

    def _retry(
        self, shards: list[_Actor], submit: Callable[[_Actor], Refs], what: str, limit: float | None
    ) -> list[BaseException]:
        """Replace the actors of ``shards`` and submit their part again, given as long as a
        start may take; the faults. One that fails again is replaced at the next call."""
        for s in shards:
            self._replace(s)
        start = self.start_timeout
        limit = None if start is None or limit is None else max(start, limit)
        answers = self._gather({s.index: submit(s) for s in shards}, limit)
        for s in answers.dead + answers.late:
            self._replace(s)
        return call_faults(answers, what, limit) + self._copy_in(answers.values)

    def _copy_in(self, replies: dict[int, Reply]) -> list[EnvError]:
        """Put each actor's shard of the batch in place; their envs' faults."""
        faults = []
        for k, (outputs, fault) in replies.items():
            envs = self.shards[k].envs
            for path, value in outputs.items():
                self._arrays[path][envs.start : envs.stop] = value
            if fault is not None:
                faults.append(fault)
        return faults

    def _replace(self, s: _Actor) -> None:
        """Swap ``s``'s actor for a new one, whose envs restart at its next step or reset:
        after the step its predecessor finished, if it handed one over, else after the
        last batch."""
        self._ray.kill(s.handle)
        self._spawn(s)
        restored, s.finished = s.finished, None
        if restored is None:
            assert self._layout is not None  # start() lays out the arrays before any replacement
            restored = {
                path: self._arrays[path][s.envs.start : s.envs.stop]
                for path, f in self._layout.fields.items()
                if f.role is Role.BOOKKEEPING or path.split("/")[0] in _TAKEN_OVER
            }
        s.setup = [
            s.handle.make_envs.remote(s.written),
            s.handle.start.remote(self._layout, restored),
        ]

    def _call(
        self,
        submit: Callable[[_Actor], Refs],
        what: str,
        timeout: float | None,
        took: Callable[[_Actor], None] | None = None,
    ) -> dict[int, Any]:
        """Each actor's reply to ``submit(s)`` (not a reset or step), by shard index;
        ``took(s)`` for each actor that answered, before a fault of the others is raised.
        An actor that dies or misses the timeout is replaced, its envs restarting at the
        next reset or step; until then a call raises :class:`WorkerDiedError` for it."""
        self._ask(submit, what)
        return self._answers(timeout, took)

    def _ask(self, submit: Callable[[_Actor], Refs], what: str) -> None:
        """Start :meth:`_call`; :meth:`_answers` gathers the replies."""
        self._asked = (what, {s.index: submit(s) for s in self.shards if not s.setup})

    def _answers(
        self, timeout: float | None, took: Callable[[_Actor], None] | None = None
    ) -> dict[int, Any]:
        """The replies to the last :meth:`_ask`, by shard index (see :meth:`_call`)."""
        asked, self._asked = self._asked, None
        assert asked is not None, "_answers() without its _ask()"
        what, pending = asked
        limit = self.timeout if timeout is None else timeout
        answers = self._gather(pending, limit)
        for s in self.shards:
            if took is not None and s.index in answers.values:
                took(s)
        for s in answers.dead + answers.late:
            self._replace(s)
        answers.dead = [s for s in self.shards if s.setup and s not in answers.late]
        raise_first(call_faults(answers, what, limit))
        return answers.values

    def _gather(self, pending: dict[int, Refs], timeout: float | None) -> Answers[_Actor]:
        """The answer of each shard's last call in ``pending``; Ctrl-C kills the actors."""
        ray = self._ray

        def ready(waiting: list[_Actor], left: float | None) -> list[_Actor]:
            last = {pending[s.index][-1]: s for s in waiting}
            done, _ = ray.wait(list(last), num_returns=len(last), timeout=left)
            return [last[ref] for ref in done]

        def receive(s: _Actor) -> Answer:
            try:
                return "ok", ray.get(pending[s.index])[-1]
            except ray.exceptions.RayActorError:
                return "dead", None
            except ray.exceptions.RayTaskError as err:
                return "error", _unwrap(err)

        try:
            answers = gather([self.shards[k] for k in pending], ready, receive, timeout)
            self._ask_where(answers.late)
        except KeyboardInterrupt:
            self._shut(graceful=False)
            raise
        return answers

    def _ask_where(self, late: list[_Actor]) -> None:
        """Set the ``stuck_in`` of each late actor's shard (the env call it says it is in)
        and its ``finished`` step (if it is stuck in the autoreset that follows one), asked
        for at most :data:`WHERE_TIMEOUT` seconds (an actor that does not say: none)."""
        ray = self._ray
        asked = {s.handle.where.options(concurrency_group=WHERE).remote(): s for s in late}
        for s in late:
            s.stuck_in, s.finished = None, None
        if not asked:
            return
        said, _ = ray.wait(list(asked), num_returns=len(asked), timeout=WHERE_TIMEOUT)
        for ref in said:
            with contextlib.suppress(ray.exceptions.RayActorError):  # it died meanwhile
                asked[ref].stuck_in, asked[ref].finished = ray.get(ref)

    def _cpus_needed(self) -> float:
        return len(self.shards) * self.num_cpus_per_worker

    def _shortage(self, what: str) -> str:
        """What the workers need against what the cluster has, and what to change."""
        return cpu_shortage(
            f"{len(self.shards)} Ray workers for {self.num_envs} envs {what}",
            len(self.shards),
            self.num_cpus_per_worker,
            self._free_cpus,
            self._ray.cluster_resources().get("CPU", 0.0),
            workers_setting="num_workers",
            envs_setting="envs_per_worker",
            less_each="num_cpus_per_worker=0.5",
        )


def cpu_shortage(
    what: str,
    workers: int,
    each: float,
    free: float,
    total: float,
    *,
    workers_setting: str,
    envs_setting: str,
    less_each: str | None = None,
) -> str:
    """``what`` went wrong to ``workers`` actors of ``each`` CPUs on a Ray cluster of ``total``
    CPUs, ``free`` of them free: what they need against what it has, and what to change
    (fewer of them, by ``workers_setting`` or ``envs_setting``; ``less_each``: reserving
    less per actor, where a setting does that)."""
    needed = workers * each
    said = (
        f"{what}: at {each:g} CPU each they need {needed:g} CPUs; the Ray cluster has "
        f"{total:g} CPUs, {free:g} free when they were started"
    )
    fits = int(free // each)
    fewer = f"{workers_setting}={fits}" if fits >= 1 else workers_setting
    fixes = [f"start fewer workers ({fewer}, or more envs each with {envs_setting})"]
    if less_each is not None:
        fixes.append(f"reserve less per worker ({less_each})")
    fixes.append("or join a larger cluster (ray_address)")
    text = ", ".join(fixes)
    if needed <= free:
        text = "raise start_timeout if the envs are slow to build, or " + text
    return f"{said}. To fix: {text}."


def _unwrap(err: BaseException) -> BaseException:
    """The :class:`EnvError` inside Ray's ``RayTaskError`` (it carries the env's traceback)."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, EnvError) else err
