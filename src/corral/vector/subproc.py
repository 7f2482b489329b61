"""The ``subproc`` backend: worker processes stepping their envs into shared memory.

Each worker runs a contiguous shard of the envs in series with an
:class:`~corral.vector.episodes.Episodes` over its rows of the batch arrays,
which live in one block of shared memory (:mod:`corral.vector.shared_memory`):
workers write observations, rewards, masks and state there and the parent
reads them without copies. Pipes carry only commands and small replies; a
worker that has answered watches its pipe for a moment before it blocks on it
(:class:`_Inbox`), so a step loop wakes no sleeping worker.

Every command sent to a worker gets exactly one reply, ``("ok", value)`` or
``("error", exc)``; the parent collects all replies before raising the first
error, so the pipes stay in step. A worker whose env fails still writes the
step of its other envs (its runner restarts the failed one) before it replies
the error. A worker that dies is noticed through its process sentinel, one
that outlives the timeout (starting: ``start_timeout``) is killed; what the
parent makes of that (and when the worker is replaced) is
:mod:`corral.vector.shards`'s to say.

Workers end soon after the process that started them, whatever ends it: an
idle one sees its pipe close and closes its envs; on Linux the kernel kills a
busy one at once (:class:`_DeathPact`), even one hung in C code that holds the
GIL, where no thread of it runs; elsewhere a thread in each ends a busy one a
moment later, and a reaper process (:mod:`corral.vector.reaper`) kills those
still there.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler, recv_handle, send_handle
from typing import Any, cast

import cloudpickle

from corral.arrays import on_host
from corral.batched_env import BatchedEnv, BatchedStep
from corral.errors import EnvError, VectorStateError, WorkerStartError
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
from corral.vector.env_calls import Written, env_error, first_fault
from corral.vector.episodes import Episodes, clear_step_fields
from corral.vector.layout import Layout
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
    timeout_error,
    warn_restarted,
)
from corral.vector.shared_memory import BlockLayout, create_block, map_arrays
from corral.vector.sources import Source

CLOSE_GRACE_S = 1.0  # how long close() lets a worker finish before killing it
REAP_AFTER_S = 2 * CLOSE_GRACE_S
"""Seconds after the parent's death when its reaper kills the workers still there (those
that cannot end by themselves meanwhile: see :func:`_exit_with_parent`)."""


def default_start_method() -> str:
    """``"forkserver"`` where available (safe with torch and threads), else ``"spawn"``."""
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _preload_in_forkserver(ctx: Any) -> None:
    """Have the fork server import this module once, so workers fork with corral loaded.

    Only takes effect before the fork server starts; keeps the modules already asked for.
    """
    from multiprocessing import forkserver

    # no public getter for the preload list: read it so a user's own list is kept
    preload = list(getattr(forkserver._forkserver, "_preload_modules", None) or ["__main__"])
    if __name__ not in preload:
        ctx.set_forkserver_preload([*preload, __name__])


# -- the worker's side ------------------------------------------------------------------


IDLE, STEPPING, STEPPED = 0, 1, 2
"""Where a worker is in a step (its ``stage``, shared with the parent): a worker lost while
``STEPPING`` loses the step (what its env wrote of it is not reported); once ``STEPPED``
(the step's fields complete, in the autoreset that follows or after it) the step counts."""


class _Server:
    """A worker's shard of the copies and, once attached to the shared block, its episodes."""

    def __init__(self, conn: Connection, shard: BatchedEnv, offset: int, stage: Any) -> None:
        self.conn = conn
        self.shard = shard
        self.offset = offset
        self.stage = stage

    def attach(self, layout: Layout, block: BlockLayout, seeds: list | None) -> None:
        """Map this worker's rows; with ``seeds``, take over from a dead worker."""
        fd = recv_handle(self.conn)
        rows = slice(self.offset, self.offset + self.shard.num_envs)
        try:
            arrays = on_host(layout.place, map_arrays(fd, block, rows))
        finally:
            os.close(fd)
        marked = _MarksStepped(self.shard, self.stage)
        self.episodes = Episodes(marked, layout, arrays, self.offset, share=True)
        if seeds is not None:
            self.episodes.restart_all(seeds)

    def reset(self, seeds: list, options: dict[str, Any] | None) -> None:
        self.episodes.reset(seeds, options)

    def step(self) -> None:
        self.stage.value = STEPPING
        try:
            self.episodes.step()
        finally:
            self.stage.value = STEPPED

    def call(self, name: str, args: tuple | None, kwargs: dict[str, Any]) -> list[Any]:
        return call_shard(self.shard, self.offset, name, args, kwargs)

    def set_attr(self, name: str, values: list[Any]) -> int | None:
        return set_shard_attrs(self.shard, self.offset, name, values)


class _MarksStepped(ResetWatch):
    """``shard`` as a worker's :class:`Episodes` runs it: a reset inside a step (the
    autoreset, which begins once the step's fields are complete) marks the step
    ``STEPPED`` in ``stage``; ``shard`` otherwise."""

    def __init__(self, shard: BatchedEnv, stage: Any) -> None:
        super().__init__(shard)
        self._stage = stage

    def reset(self, *args: Any, **kwargs: Any) -> BatchedStep:
        self._stage.value = STEPPED
        return self._shard.reset(*args, **kwargs)


def _exit_with_parent() -> None:
    """End this worker soon after the process that started it ends, even inside a hung env.

    An idle worker sees the parent's end of its pipe close, closes its envs and
    exits. A daemon thread waits for the parent too (a pidfd on Linux, else the
    pipe multiprocessing keeps open from the parent) and ends the worker
    :data:`CLOSE_GRACE_S` later if it is still there (busy in an env, or its
    pipe held open by another child of the parent). An env hung in C code that
    holds the GIL keeps the thread from running: there the worker's
    :class:`_DeathPact` ends it, else the parent's reaper kills it
    :data:`REAP_AFTER_S` after the parent's death.
    """
    parent = mp.parent_process()  # the driver, also where a fork server forked this worker
    if parent is None:
        return
    assert parent.pid is not None  # a process that started this one has a pid
    try:
        handle = os.pidfd_open(parent.pid)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):  # no pidfd here
        handle = parent.sentinel
    if wait([parent.sentinel], 0):  # the parent ended before the watch began
        os._exit(1)
    threading.Thread(
        target=_exit_after_parent, args=(handle,), name="corral-parent-watch", daemon=True
    ).start()


def _exit_after_parent(handle: int) -> None:
    wait([handle])
    time.sleep(CLOSE_GRACE_S)  # an idle worker closes its envs meanwhile, and exits
    os._exit(1)


def _let_the_fork_server_end() -> None:
    """Close this worker's copy of the pipe whose open ends keep the fork server running.

    multiprocessing hands one to every process the fork server forks, so the server would
    outlive the driver as long as a worker does, and a busy worker's
    :class:`_DeathPact` with it would never come due. The worker does not need it: a
    process it starts with ``"forkserver"`` gets a fork server of its own.
    """
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver  # no public handle on what the fork server passed
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None and getattr(server, "_forkserver_pid", None) is None:  # forked by it
        os.close(fd)
        server._forkserver_alive_fd = None


_PR_SET_PDEATHSIG = 1  # prctl's option, from <linux/prctl.h>


class _DeathPact:
    """Has the kernel kill this worker (SIGKILL) the moment the process that forked it
    ends, while the worker is busy: in an env, where it may hang in C code that holds the
    GIL and no thread of it runs. A worker waiting for a command is spared, so that it
    closes its envs when its pipe closes. Linux only (``prctl(PR_SET_PDEATHSIG)``), and only
    where ``armed``: the kernel sends the signal when the *thread* that forked the worker
    ends, so the pact is made only where that thread lives as long as its process (the
    fork server's, or the main thread of the driver)."""

    def __init__(self, armed: bool) -> None:
        self._prctl = None
        self._parent = os.getppid()
        if armed and sys.platform.startswith("linux"):
            import ctypes

            self._prctl = ctypes.CDLL(None, use_errno=True).prctl
        self.busy()

    def busy(self) -> None:
        """From now on, die with the parent."""
        if self._prctl is None:
            return
        self._prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self._parent:  # it ended before the pact was made
            os._exit(1)

    def idle(self) -> None:
        """From now on, outlive the parent long enough to close the envs."""
        if self._prctl is not None:
            self._prctl(_PR_SET_PDEATHSIG, 0, 0, 0, 0)


_OK = ForkingPickler.dumps(("ok", None))  # the usual reply, pickled once
_CLOSED = "closed"
"""A worker's last message: its envs closed, with the fault of any that failed (or None)."""
_STEP = ("step",)
_STEP_PICKLED = ForkingPickler.dumps(_STEP)

SPIN_S = 0.001
"""How long an idle worker watches its pipe before it blocks on it (see :class:`_Inbox`)."""
LONG_WAITS = 3
"""After this many waits in a row that outlasted :data:`SPIN_S`, a worker blocks at once."""

_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


class _Inbox:
    """A worker's end of the pipe from the parent, watched for a moment before it blocks.

    Waking a process blocked on a pipe costs tens of microseconds on a busy machine, and
    more where the woken worker takes the parent's core before the parent has sent the
    other workers their command. A worker that has just answered therefore watches its
    pipe for up to :data:`SPIN_S` (yielding its core to any process that wants it) before
    it blocks: a parent that steps again within that moment (a step loop) finds it awake.
    After :data:`LONG_WAITS` waits in a row that outlasted the watch (a parent busy between
    steps) it blocks at once, until a wait is short again, so idle workers do not spin
    while the parent computes.
    """

    def __init__(self, conn: Connection, pact: _DeathPact | None = None) -> None:
        self.conn = conn
        self.pact = pact or _DeathPact(armed=False)
        self._poll = None
        if hasattr(select, "poll"):
            self._poll = select.poll()
            self._poll.register(conn.fileno(), select.POLLIN)
        self._long_waits = 0  # in a row

    def receive(self) -> Any:
        """The next message from the parent (``EOFError`` once the parent is gone)."""
        start = time.perf_counter()
        ready = False
        if self._poll is not None and self._long_waits < LONG_WAITS:
            deadline = start + SPIN_S
            while not (ready := bool(self._poll.poll(0))) and time.perf_counter() < deadline:
                _yield()
        if ready:
            message = self.conn.recv()
        else:  # it blocks: idle until the command comes (see _DeathPact)
            self.pact.idle()
            message = self.conn.recv()
            self.pact.busy()
        if time.perf_counter() - start <= SPIN_S:
            self._long_waits = 0
        else:
            self._long_waits += 1
        return message


def _serve(
    conn: Connection,
    payload: bytes,
    offset: int,
    written: Written,
    inherited: list[Any],
    inside: Any,
    stage: Any,
    armed: bool,
) -> None:
    """A worker's main function: build the envs, then answer commands until told to close.

    ``written``: what ``set_attr`` wrote on the envs of the worker this one replaces;
    ``inside``: shared memory where dict envs tell which env they are in
    (:attr:`~corral.vector.dict_envs.DictEnvs.inside`), read by the parent when the
    worker misses a timeout; ``stage``: where the worker is in a step (:data:`STEPPING`),
    read by the parent when it loses the worker; ``armed``: whether to make a
    :class:`_DeathPact`."""
    _exit_with_parent()
    _let_the_fork_server_end()
    pact = _DeathPact(armed)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    for parent_end in inherited:  # forked copies would hide the parent's exit (from workers,
        parent_end.close()  # and from the reaper where it has no pidfd to watch the parent)
    try:
        shard = build_shard(cloudpickle.loads(payload), offset, written)
    except Exception as err:
        conn.send(("error", env_error(offset, "building the env", err)))
        return
    if isinstance(shard, DictEnvs):
        shard.inside = inside
    conn.send(("ok", EnvInfo.of(shard)))  # the parent lays out the batch from worker 0's
    server = _Server(conn, shard, offset, stage)
    inbox = _Inbox(conn, pact)
    while True:
        try:
            command, *args = inbox.receive()
        except (EOFError, ConnectionResetError):  # the parent is gone
            break
        if command == "close":
            break
        try:
            reply = ("ok", getattr(server, command)(*args))
        except Exception as err:
            # call() and set_attr() guard the envs' own code (an EnvError): anything else
            # they raise is the caller's mistake, raised as it is, as sync and ray raise it
            mine = command in ("call", "set_attr") and not isinstance(err, EnvError)
            reply = ("error", err if mine else env_error(offset, f"{command}()", err))
        try:
            if reply[1] is None and reply[0] == "ok":
                conn.send_bytes(_OK)
            else:
                conn.send(reply)
        except (BrokenPipeError, ConnectionResetError):  # the parent is gone
            break
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            conn.send(("error", env_error(offset, f"sending the reply to {command}()", err)))
    closed: BaseException | None = None
    try:
        shard.close()
    except Exception as err:  # an env's close() failed: the parent raises it, as sync does
        closed = env_error(offset, "close()", err)
    with contextlib.suppress(OSError, pickle.PicklingError, TypeError, AttributeError):
        conn.send((_CLOSED, closed))


# -- the parent's side ------------------------------------------------------------------


@dataclass(eq=False)
class _Worker(Shard):
    """The parent's handle on one worker process and the envs it runs."""

    process: Any = None
    conn: Connection | None = None
    dead: bool = True
    exitcode: int | None = None
    """The exit code of the last process stopped (negative: the signal that ended it)."""
    inside: Any = None
    """The process's :attr:`DictEnvs.inside <corral.vector.dict_envs.DictEnvs.inside>`."""
    stage: Any = None
    """Where the process is in a step (:data:`STEPPING`...), in shared memory."""
    replied: bool = False
    """Its pipe was found readable (a reply, or its end) and not read yet."""

    def where_stuck(self) -> str | None:
        """The env call the process is in (``"env 2's step()"``), if its envs tell."""
        return None if self.inside is None else call_inside(self.inside)

    def stop(self, grace: float = 0.0) -> None:
        """End the process (killing it after ``grace`` seconds) and release the pipe."""
        if self.process is not None:
            self.process.join(grace)
            if self.process.exitcode is None:
                self.process.kill()
                self.process.join()
            self.exitcode = self.process.exitcode
            self.process.close()
        if self.conn is not None:
            self.conn.close()
        self.process, self.conn, self.dead, self.replied = None, None, True, False


def _shutdown(
    workers: list[_Worker],
    fds: list[int],
    reaper_process: subprocess.Popen,
    grace: float = CLOSE_GRACE_S,
) -> list[BaseException]:
    """Close every worker, the shared block and the reaper (also run by the finalizer);
    returns the faults of envs whose ``close()`` failed.

    Each worker has ``grace`` seconds to close its envs and exit before it is killed; with
    none, it is killed at once and its envs are not closed."""
    closing = []
    for worker in workers:
        if worker.conn is not None and grace > 0:  # a live worker (stop() drops the pipe)
            with contextlib.suppress(OSError):  # one already gone is reaped by stop()
                worker.conn.send(("close",))
                closing.append(worker)
    deadline = time.monotonic() + grace
    faults = [f for w in closing if (f := _close_fault(w, deadline)) is not None]
    for worker in workers:
        worker.stop(max(0.0, deadline - time.monotonic()))
    for fd in fds:
        os.close(fd)
    fds.clear()
    reaper.dismiss(reaper_process)
    return faults


def _close_fault(worker: _Worker, deadline: float) -> BaseException | None:
    """The fault a closing worker reports for its envs' ``close()`` (``None``: they closed, or
    it said nothing before ``deadline``); a reply to a call still in flight is passed over."""
    conn = worker.conn
    assert conn is not None
    with contextlib.suppress(OSError, EOFError, pickle.UnpicklingError):
        while conn.poll(max(0.0, deadline - time.monotonic())):
            message = conn.recv()
            if isinstance(message, tuple) and message and message[0] == _CLOSED:
                return message[1]
    return None


class SubprocBackend(Backend):
    """Runs the envs in worker processes, ``envs_per_worker`` each, over shared memory.

    Args:
        num_workers: number of worker processes (default: one per CPU, at most
            one per env); the envs are split evenly and contiguously
            (:func:`~corral.vector.shards.split_envs`).
        envs_per_worker: envs stepped in series by each worker (the last may
            have fewer), instead of ``num_workers``.
        start_method: ``"fork"``, ``"spawn"`` or ``"forkserver"`` (default:
            :func:`default_start_method`).
        timeout: default limit, in seconds, of every reset, step and call wait
            (:data:`~corral.vector.backend.DEFAULT_TIMEOUT`); ``None`` waits as
            long as the workers live. A worker that misses it is killed and, in a
            reset or step, restarted at once.
        start_timeout: seconds to wait for the workers to start and build their
            envs, at the start (then :class:`~corral.errors.WorkerStartError`) and
            when a worker is replaced in a reset or step (then a
            :class:`~corral.errors.WorkerTimeoutError`, ``restarted`` false: it is
            tried again at the next reset or step); ``None``: no limit. A worker
            late to start is killed.
        daemon: make the workers daemonic (they cannot start processes of their own).
    """

    def __init__(
        self,
        source: Source,
        *,
        num_workers: int | None = None,
        envs_per_worker: int | None = None,
        start_method: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        start_timeout: float | None = DEFAULT_START_TIMEOUT,
        daemon: bool = True,
    ) -> None:
        super().__init__(source)
        self.timeout = timeout
        self.start_timeout = start_timeout
        self.daemon = daemon
        self._ctx = mp.get_context(start_method or default_start_method())
        if self._ctx.get_start_method() == "forkserver":
            _preload_in_forkserver(self._ctx)
        if num_workers is None and envs_per_worker is None:
            num_workers = os.cpu_count() or 1
        ranges = split_envs(self.num_envs, num_workers, envs_per_worker)
        self.shards = [_Worker(k, envs) for k, envs in enumerate(ranges)]
        self._payloads = [cloudpickle.dumps(source.part(r)) for r in ranges]
        self._fds: list[int] = []
        self._reaper = reaper.start(grace=REAP_AFTER_S)  # told of each worker as it starts
        self._finalizer = weakref.finalize(self, _shutdown, self.shards, self._fds, self._reaper)
        self._awaiting: tuple[str, list[_Worker], list | None] | None = None
        self._asked = ""  # what the call awaiting its replies is (see _ask)
        try:
            answers = self._start(self.shards)
            if answers.late:
                raise _late_start_error(answers.late, self.start_timeout)
            self._info = answers.values[0]
        except BaseException:
            self.close()
            raise

    @property
    def worker_pids(self) -> list[int | None]:
        """The process id of each worker (``None`` for one that is dead)."""
        return [None if w.dead else w.process.pid for w in self.shards]

    def env_info(self) -> EnvInfo:
        return self._info

    def start(self, layout: Layout) -> Arrays:
        self._layout = layout
        self._block = BlockLayout.of(layout.array_specs())
        self._fds.append(create_block(self._block.size))
        self._host = map_arrays(self._fds[0], self._block)
        self._arrays = arrays = on_host(layout.place, self._host)
        self._alive = {f"alive/{g}": self._host[f"alive/{g}"] for g in layout.groups}
        self._alive_before = {path: alive.copy() for path, alive in self._alive.items()}
        raise_first(self._attach(self.shards, None, self.timeout))
        return arrays

    # -- reset and step ---------------------------------------------------------------

    def reset_async(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> None:
        seeds = list(seeds)
        self._clear_step_fields()
        self._post("reset", lambda w: ("reset", seeds[w.envs.start : w.envs.stop], options), seeds)

    def reset_wait(self, timeout: float | None) -> None:
        self._finish(timeout)

    def step_async(self) -> None:
        self._clear_step_fields()
        for path, alive in self._alive.items():  # for the episodes of a worker lost in it
            self._alive_before[path][...] = alive
        self._post("step", lambda w: _STEP, None)

    def _clear_step_fields(self) -> None:
        """Clear the step fields here too: a worker that dies in the call leaves what it
        wrote (taken back where it had not finished the step: :meth:`_forget_step`)."""
        self._check_open()
        clear_step_fields(self._arrays, self._layout.groups)

    def step_wait(self, timeout: float | None) -> None:
        self._finish(timeout)

    def _post(self, what: str, message: Callable[[_Worker], tuple], seeds: list | None) -> None:
        self._check_open()
        workers = [w for w in self.shards if not w.dead]
        self._send(workers, message)
        self._awaiting = (what, workers, seeds)

    def _finish(self, timeout: float | None) -> None:
        """Wait for the reset or step; replace the workers that died or were late, then
        raise the first fault (the batch is complete by then)."""
        awaiting, self._awaiting = self._awaiting, None
        assert awaiting is not None, "step_wait() or reset_wait() without its *_async()"
        what, workers, seeds = awaiting
        limit = self._limit(timeout)
        answers = self._gather(workers, limit)
        faults = step_faults(answers, f"{what}()", limit)
        lost = [w for w in self.shards if w.dead]
        for worker in lost:  # found dead when the call was sent: told like one that died in it
            if worker.lost is None and worker not in answers.late:
                worker.lost = f"died before {what}()"
            if seeds is None and worker.stage.value == STEPPING:
                self._forget_step(worker)
        if lost:
            faults += self._revive(lost, seeds or [None] * self.num_envs, limit)
            if seeds is not None:  # a reset's batch reports no ended episode
                clear_step_fields(self._arrays, self._layout.groups)
        raise_first(faults)

    def _forget_step(self, worker: _Worker) -> None:
        """Take back what ``worker``'s env wrote of the step it did not finish (an env that
        writes into the batch): its step fields are cleared and its agents alive as before
        the step, so that its replacement ends those episodes where they stood."""
        rows = slice(worker.envs.start, worker.envs.stop)
        clear_step_fields({path: a[rows] for path, a in self._host.items()}, self._layout.groups)
        for path, alive in self._alive.items():
            alive[rows] = self._alive_before[path][rows]
        worker.stage.value = IDLE

    def _revive(self, workers: list[_Worker], seeds: list, limit: float | None) -> list:
        """Start new processes for ``workers``; their envs restart (with ``seeds``, within
        ``limit`` seconds), the episodes cut ending truncated. The faults: an env that could
        not reset, workers that did not start within ``start_timeout`` or restart within
        ``limit`` (their agents stop acting; tried again at the next reset or step)."""
        try:
            late = self._start(workers).late
        except EnvError as err:  # a rebuilt env raised: none of them started
            self._stop_acting(workers)
            return [err]
        faults: list[BaseException] = []
        if late:
            for worker in late:
                worker.lost = f"did not start within {self.start_timeout} s"
            what = "its start (building its envs)"
            faults.append(timeout_error(late, what, self.start_timeout, restarted=False))
        started = [w for w in workers if not w.dead]
        faults += self._attach(started, seeds, limit)
        self._stop_acting([w for w in workers if w.dead])
        warn_restarted([w for w in started if not w.dead])
        return faults

    def _stop_acting(self, workers: list[_Worker]) -> None:
        """None of the agents of ``workers``' envs acts (their workers are not running)."""
        for worker in workers:
            for g in self._layout.groups:
                self._host[f"acting/{g}"][worker.envs.start : worker.envs.stop] = False

    # -- other calls ------------------------------------------------------------------

    def call_async(self, name: str, args: tuple | None, kwargs: dict[str, Any]) -> None:
        self._ask(lambda w: ("call", name, args, kwargs), call_text(name, args))

    def call_wait(self, timeout: float | None) -> list[Any]:
        return [value for reply in self._answers(timeout) for value in reply]

    def set_attr(self, name: str, values: Sequence[Any], timeout: float | None) -> int | None:
        values = list(values)
        self._ask(
            lambda w: ("set_attr", name, values[w.envs.start : w.envs.stop]), f"set_attr({name!r})"
        )
        return self._answers(timeout, took=lambda w: w.remember(name, values))[0]

    def close(self, terminate: bool = False) -> None:
        if terminate and self._finalizer.alive:
            self._finalizer.detach()
            _shutdown(self.shards, self._fds, self._reaper, grace=0.0)
        faults = self._finalizer()  # None once closed
        if faults:
            raise first_fault(faults)

    # -- talking to workers ---------------------------------------------------------------

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise VectorStateError("the subproc backend is closed")

    def _limit(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def _ask(self, message: Callable[[_Worker], tuple], what: str) -> None:
        """Send ``message(w)`` to every worker; :meth:`_answers` gathers the replies."""
        self._check_open()
        self._send(self.shards, message)
        self._asked = what

    def _answers(
        self, timeout: float | None, took: Callable[[_Worker], None] | None = None
    ) -> list[Any]:
        """The workers' replies to the last :meth:`_ask`, in order; ``took(w)`` for each
        worker that answered it, before a fault of the others is raised."""
        what, self._asked = self._asked, ""
        limit = self._limit(timeout)
        answers = self._gather([w for w in self.shards if not w.dead], limit)
        for worker in self.shards:
            if took is not None and worker.index in answers.values:
                took(worker)
        answers.dead = [w for w in self.shards if w.dead and w not in answers.late]
        raise_first(call_faults(answers, what, limit))
        return [answers.values[w.index] for w in self.shards]

    def _start(self, workers: list[_Worker]) -> Answers[_Worker]:
        """Start the processes of ``workers``; what their envs are, by worker index (in
        ``values``), and the workers that did not say so within ``start_timeout`` (``late``:
        stopped). An env that cannot be built, or a worker that died, raises."""
        # the thread that forks a worker must outlive it (see _DeathPact)
        forker = self._ctx.get_start_method() == "forkserver"
        armed = forker or threading.current_thread() is threading.main_thread()
        for worker in workers:
            conn, child = self._ctx.Pipe()
            inherited: list[Any] = []
            if self._ctx.get_start_method() == "fork":
                inherited = [conn, *(w.conn for w in self.shards if w.conn is not None)]
                inherited.append(self._reaper.stdin)
            worker.inside = self._ctx.RawArray("q", [-1, -1])
            worker.stage = self._ctx.RawValue("b", IDLE)
            # typeshed's BaseContext (what get_context gives for a str) lacks the Process every
            # start method's context has
            process = self._ctx.Process(  # type: ignore[attr-defined]
                target=_serve,
                args=(
                    child,
                    self._payloads[worker.index],
                    worker.envs.start,
                    worker.written,
                    inherited,
                    worker.inside,
                    worker.stage,
                    armed,
                ),
                name=f"corral-subproc-{worker.index}",
                daemon=self.daemon,
            )
            try:
                process.start()
            finally:
                child.close()
            reaper.hold(self._reaper, process.pid)
            worker.process, worker.conn, worker.dead = process, conn, False
        try:
            answers = self._gather(workers, self.start_timeout)
            raise_first(answers.errors)
            if answers.dead:
                raise _start_error(answers.dead, self._ctx.get_start_method())
        except (EnvError, WorkerStartError):  # a worker that cannot build its envs has exited
            for worker in workers:
                worker.stop()
            raise
        return answers

    def _attach(self, workers: list[_Worker], seeds: list | None, limit: float | None) -> list:
        """Have ``workers`` map the shared block; with ``seeds``, restart their envs. The
        faults: their envs' errors, and workers that missed ``limit`` seconds.

        One that dies or is late meanwhile is started again at the next reset or step."""

        def message(w: _Worker) -> tuple:
            rows = None if seeds is None else seeds[w.envs.start : w.envs.stop]
            return ("attach", self._layout, self._block, rows)

        self._send(workers, message, fd=self._fds[0])
        answers = self._gather(workers, limit)
        for worker in answers.dead:
            worker.lost = worker.lost or "died while starting"
        faults = list(answers.errors)
        if answers.late:
            what = "restart()" if seeds is not None else "attach()"
            for worker in answers.late:
                worker.lost = f"did not answer {what} within {limit} s"
            faults.append(timeout_error(answers.late, what, limit, restarted=False))
        return faults

    def _send(
        self, workers: list[_Worker], message: Callable[[_Worker], tuple], fd: int | None = None
    ) -> None:
        """Send ``message(w)`` (then the file descriptor ``fd``) to each live worker."""
        for worker in workers:
            conn = worker.conn
            if conn is None:  # dead (stop() drops the pipe)
                continue
            command = message(worker)
            try:
                if command is _STEP:
                    conn.send_bytes(_STEP_PICKLED)
                else:
                    conn.send(command)
                if fd is not None:
                    send_handle(conn, fd, worker.process.pid)
            except (BrokenPipeError, ConnectionResetError):  # it died before this call
                worker.stop()

    def _gather(self, workers: list[_Worker], timeout: float | None) -> Answers[_Worker]:
        """The answers of the live ``workers``; those that die or miss the timeout are
        stopped. Ctrl-C while waiting closes every worker."""
        try:
            answers = gather([w for w in workers if not w.dead], _ready, _receive, timeout)
        except KeyboardInterrupt:
            self.close()
            raise
        for worker in answers.late:
            worker.stuck_in = worker.where_stuck()
            worker.stop()
        return answers


def _ready(workers: list[_Worker], timeout: float | None) -> list[_Worker]:
    """The workers that replied or died within ``timeout`` seconds."""
    conns = {w.conn.fileno(): w for w in workers if w.conn is not None}  # all: they are live
    sentinels = {w.process.sentinel: w for w in workers}
    ready = _readable([*conns, *sentinels], timeout)
    for fd in ready:
        if fd in conns:
            conns[fd].replied = True
    return list(dict.fromkeys(conns.get(fd) or sentinels[fd] for fd in ready))


def _readable(fds: list[int], timeout: float | None) -> list[int]:
    """The file descriptors of ``fds`` readable (or closed) within ``timeout`` seconds."""
    if not hasattr(select, "poll"):
        return cast("list[int]", wait(fds, timeout))  # the ones of ``fds`` that are ready
    poll = select.poll()
    for fd in fds:
        poll.register(fd, select.POLLIN)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        ms = None if deadline is None else max(0, math.ceil((deadline - time.monotonic()) * 1000))
        ready = poll.poll(ms)
        if ready or ms == 0:
            return [fd for fd, _ in ready]


def _receive(worker: _Worker) -> Answer:
    """The worker's reply, or ``("dead", None)`` (and the worker stopped) if it died."""
    replied, worker.replied = worker.replied, False
    conn = worker.conn
    assert conn is not None  # a worker that replied or died, not stopped yet
    try:
        readable = replied or _readable([conn.fileno()], 0)
        reply = conn.recv() if readable else None
    except (EOFError, OSError):  # the pipe broke with the process
        reply = None
    if reply is None:
        worker.stop()
        return "dead", None
    return reply


def _start_error(workers: Sequence[_Worker], start_method: str) -> WorkerStartError:
    """What to tell when ``workers`` exited before saying what their envs are."""
    codes = {w.index: w.exitcode for w in workers}
    how = "; ".join(f"{w}: {_exit_status(w.exitcode)}" for w in workers)
    message = f"{len(workers)} worker(s) died while starting, before building their envs ({how})."
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    if start_method == "fork" or script is None:  # no script of the user's runs in the worker
        message += " Was the worker killed (out of memory?)"
    else:
        message += (
            f" The usual cause: a worker started with {start_method!r} first imports the "
            f"main script ({script}) again, and a script that builds a vector env at module "
            "level then starts workers from inside the worker, which Python forbids. Fix: put "
            'that code under `if __name__ == "__main__":`, or use backend="sync". The '
            "worker's own traceback is on stderr above."
        )
    return WorkerStartError(message, codes)


def _late_start_error(workers: Sequence[_Worker], limit: float | None) -> WorkerStartError:
    """What to tell when ``workers`` did not build their envs within ``limit`` seconds."""
    return WorkerStartError(
        f"{', '.join(map(str, workers))} did not start within {limit} s (start_timeout): "
        "stopped while building their envs. Raise start_timeout if the envs are slow to "
        "build (None: no limit).",
        env_indices=[i for worker in workers for i in worker.envs],
    )


def _exit_status(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by signal {-code}"
    return f"exit code {code}"
