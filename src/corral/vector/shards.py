"""Shards of the copies in workers: how the copies are split, and what a call over the
shards raises or warns.

The ``subproc`` and ``ray`` backends each run contiguous shards of a source's
copies in workers (processes, actors) and know only how to talk to them. What
the parent makes of a call over the shards is decided here, once, so that the
same event gets the same type on both:

* an env that raises: the worker replies an :class:`~corral.errors.EnvError`
  (its traceback as the worker saw it);
* a worker that misses the timeout: a :class:`~corral.errors.WorkerTimeoutError`
  naming its envs; in a reset or step it is replaced within the call;
* a worker that dies during a reset or step: it is replaced within the call,
  with a :class:`~corral.errors.WorkerRestartWarning`; during (or before) any
  other call: a :class:`~corral.errors.WorkerDiedError` naming its envs, and
  it is replaced at the next reset or step.

Every shard answers (or is found dead or late) before the first fault of the
call, by env index, is raised.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Generic, Literal, TypeVar

from corral.errors import WorkerDiedError, WorkerRestartWarning, WorkerTimeoutError, envs_text
from corral.vector.env_calls import Written, first_fault, remember

S = TypeVar("S", bound="Shard")
Answer = tuple[Literal["ok", "error", "dead"], Any]
"""A shard's answer: ``("ok", value)``, ``("error", exception)`` or ``("dead", None)``."""


def split_envs(
    num_envs: int, num_workers: int | None = None, envs_per_worker: int | None = None
) -> list[range]:
    """The copies split into contiguous shards, one per worker.

    With ``envs_per_worker``, every shard holds that many copies, the last the rest;
    with ``num_workers`` (at most one per copy), the shards differ by at most one
    copy, the larger first.

    Examples:
        >>> split_envs(10, num_workers=4)
        [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
        >>> split_envs(10, envs_per_worker=4)
        [range(0, 4), range(4, 8), range(8, 10)]
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
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
    if num_workers is None:
        raise ValueError("give num_workers or envs_per_worker")
    if num_workers < 1:
        raise ValueError(f"num_workers must be at least 1, got {num_workers}")
    count = min(num_workers, num_envs)
    base, extra = divmod(num_envs, count)
    bounds = [k * base + min(k, extra) for k in range(count + 1)]
    return [range(lo, hi) for lo, hi in itertools.pairwise(bounds)]


@dataclass(eq=False)
class Shard:
    """The parent's record of one worker and the contiguous copies ``envs`` it runs."""

    index: int
    envs: range
    lost: str | None = None
    """Why the worker was lost (it died, or missed a timeout), to tell in the
    :class:`WorkerRestartWarning` when its envs restart; ``None``: nothing to tell."""
    stuck_in: str | None = None
    """Where a worker that missed the timeout was stuck (``"env 2's step()"``), where its
    backend can tell; ``None`` elsewhere."""
    written: Written = field(default_factory=dict)
    """What ``set_attr`` wrote on its envs (those it answered for): a replacement worker
    builds its envs with them (:func:`~corral.vector.backend.build_shard`)."""

    def remember(self, name: str, values: Sequence[Any]) -> None:
        """Record that ``set_attr`` set ``name`` of every env to ``values`` (one per env of
        the vector env, this shard's among them)."""
        remember(self.written, name, values[self.envs.start : self.envs.stop])

    def __str__(self) -> str:
        return f"worker {self.index} ({envs_text(self.envs)})"


def call_text(name: str, args: tuple | None) -> str:
    """How a ``call`` (``args`` given) or ``get_attr`` (``args=None``) of ``name`` is named
    in errors."""
    return f"get_attr({name!r})" if args is None else f"call({name!r})"


@dataclass
class Answers(Generic[S]):
    """What the shards (of type ``S``) of one call answered."""

    values: dict[int, Any] = field(default_factory=dict)
    """Each shard's reply, by shard index."""
    errors: list[BaseException] = field(default_factory=list)
    """The errors the shards replied (their envs' faults)."""
    dead: list[S] = field(default_factory=list)
    """The shards whose worker died before it answered."""
    late: list[S] = field(default_factory=list)
    """The shards whose worker did not answer within the timeout."""


def gather(
    shards: Sequence[S],
    ready: Callable[[list[S], float | None], list[S]],
    receive: Callable[[S], Answer],
    timeout: float | None,
) -> Answers[S]:
    """Wait for every shard's answer to one call, ``timeout`` seconds in all.

    ``ready(waiting, seconds)`` returns the shards of ``waiting`` that answered or
    died within ``seconds`` (``None``: without limit), none once the time is up;
    ``receive(shard)`` reads the answer of one of them.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    waiting = list(shards)
    answers: Answers[S] = Answers()
    while waiting:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        done = ready(waiting, left)
        if not done:
            answers.late = waiting
            break
        for shard in done:
            waiting.remove(shard)
            status, value = receive(shard)
            if status == "ok":
                answers.values[shard.index] = value
            elif status == "error":
                answers.errors.append(value)
            else:
                answers.dead.append(shard)
    return answers


def call_faults(answers: Answers[S], what: str, timeout: float | None) -> list[BaseException]:
    """The faults of a call outside a reset or step (``what``), whose dead and late
    workers are replaced at the next reset or step: the envs' errors, a
    :class:`WorkerDiedError` and a :class:`WorkerTimeoutError`. Marks those shards lost."""
    faults = list(answers.errors)
    for shard in answers.dead:
        shard.lost = shard.lost or f"died before answering {what}"
    for shard in answers.late:
        shard.lost = f"did not answer {what} within {timeout} s"
    if answers.dead:
        faults.append(died_error(answers.dead, what))
    if answers.late:
        faults.append(timeout_error(answers.late, what, timeout, restarted=False))
    return faults


def step_faults(answers: Answers[S], what: str, timeout: float | None) -> list[BaseException]:
    """The faults of a reset or step (``what``), whose dead and late workers are replaced
    within the call: the envs' errors and a :class:`WorkerTimeoutError`. Marks the dead
    shards lost (the late ones are told by the error)."""
    for shard in answers.dead:
        shard.lost = f"died during {what}"
    faults = list(answers.errors)
    if answers.late:
        faults.append(timeout_error(answers.late, what, timeout, restarted=True))
    return faults


def died_error(shards: Sequence[Shard], what: str) -> WorkerDiedError:
    """The error of workers that died before answering ``what`` (not a reset or step)."""
    return WorkerDiedError(
        f"{_workers(shards)} died before answering {what}; "
        f"{_their(shards)} envs restart at the next reset or step",
        [i for shard in shards for i in shard.envs],
    )


def timeout_error(
    shards: Sequence[Shard], what: str, timeout: float | None, restarted: bool
) -> WorkerTimeoutError:
    """The error of workers that missed the ``timeout`` of ``what``, stopped and
    ``restarted`` within the call (else at the next reset or step)."""
    when = (
        "were restarted: their episodes end truncated in this batch"
        if restarted
        else "restart at the next reset or step"
    )
    stuck = ", ".join(f"worker {s.index} in {s.stuck_in}" for s in shards if s.stuck_in)
    return WorkerTimeoutError(
        f"{_workers(shards)} did not answer {what} within {timeout} s"
        f"{f' (stuck: {stuck})' if stuck else ''}; stopped, {_their(shards)} envs {when}",
        [i for shard in shards for i in shard.envs],
        restarted=restarted,
    )


def warn_restarted(shards: Sequence[Shard]) -> None:
    """Warn that the lost workers of ``shards`` were replaced in this reset or step (and
    forget why they were lost)."""
    told = [shard for shard in shards if shard.lost is not None]
    if not told:
        return
    why = "; ".join(f"{shard} {shard.lost}" for shard in told)
    for shard in told:
        shard.lost = None
    warnings.warn(
        f"{why}: replaced by a new worker, whose envs start new episodes (the cut ones "
        "end truncated; batch.worker_restarts counts it)",
        WorkerRestartWarning,
        stacklevel=_caller_level(),
    )


def raise_first(faults: Sequence[BaseException]) -> None:
    """Raise the first of ``faults`` by env index, with all of them in its ``faults``."""
    if faults:
        raise first_fault(faults)


def _workers(shards: Sequence[Shard]) -> str:
    return ", ".join(map(str, shards))


def _their(shards: Sequence[Shard]) -> str:
    return "its" if len(shards) == 1 else "their"


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside corral: the caller of ``step()``,
    ``reset()`` or their ``*_wait()``, however deep the backend called from."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level
