"""A function run in a child process under a time limit per step of its work: how
``corral check`` survives an env that hangs or ends its process.

:func:`run_watched` runs ``work(send, note)`` in a child process and yields what it
sends. The work calls ``note(text)`` as it starts each step that may hang (an env's
reset or step, building or closing it); a step that goes on for more than ``timeout``
seconds raises :class:`WorkHung` in the parent (what the work does before its first note,
such as imports, has no limit), and a child that ends before its work
does (``os._exit``, a signal, ``sys.exit``) raises :class:`WorkExited`. Each names the
step as last noted. The child is forked where the platform can (it sees everything
the parent imported and registered), else spawned.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import time
from collections.abc import Callable, Iterator
from typing import Any

PHASE_BYTES = 512
"""The longest note kept (in UTF-8 bytes)."""

_DONE = "__done__"
POLL = 0.05
"""Seconds between two looks at the child."""

Send = Callable[[Any], None]
Note = Callable[[str], None]


class WorkHung(Exception):
    """The child spent more than ``seconds`` in the step noted as ``phase``."""

    def __init__(self, phase: str, seconds: float) -> None:
        super().__init__(f"hung for more than {seconds:g} s at {phase}")
        self.phase = phase
        self.seconds = seconds


class WorkExited(Exception):
    """The child's process ended with ``exitcode`` (negative: ``-signal``) during the
    step noted as ``phase``."""

    def __init__(self, phase: str, exitcode: int | None) -> None:
        if exitcode is not None and exitcode < 0:
            how = f"was killed by signal {-exitcode}"
        else:
            how = f"exited with code {exitcode}"
        super().__init__(f"{how} at {phase}")
        self.phase = phase
        self.exitcode = exitcode
        self.how = how


def run_watched(work: Callable[[Send, Note], None], timeout: float) -> Iterator[Any]:
    """Run ``work(send, note)`` in a child process; yield each value it sends. Raises
    :class:`WorkHung` where a step noted by ``note`` lasts more than ``timeout`` seconds
    (the child is killed), :class:`WorkExited` where the child ends before ``work``
    returns. ``work`` must be picklable where the child is spawned."""
    context = _context()
    phase = context.RawArray(ctypes.c_char, PHASE_BYTES)
    count = context.RawValue(ctypes.c_uint64, 0)
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(work, send, phase, count), daemon=True)
    child.start()
    send.close()  # the child holds the only writer: its end shows as end of file
    try:
        last, since = count.value, time.monotonic()
        while True:
            if receive.poll(POLL):
                try:
                    message = receive.recv()
                except EOFError:  # the child ended without finishing
                    break
                if isinstance(message, str) and message == _DONE:
                    child.join()
                    return
                yield message
                last, since = count.value, time.monotonic()
                continue
            if not child.is_alive() and not receive.poll(0):
                break
            now = count.value
            if now != last:
                last, since = now, time.monotonic()
            elif now and time.monotonic() - since > timeout:  # the setup before a note: free
                raise WorkHung(_text(phase), timeout)
        child.join()
        raise WorkExited(_text(phase), child.exitcode)
    finally:
        if child.is_alive():
            child.kill()
            child.join()
        receive.close()


def _context() -> Any:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else "spawn")


def _child(work: Callable[[Send, Note], None], send: Any, phase: Any, count: Any) -> None:
    def note(text: str) -> None:
        phase.value = text.encode("utf-8", "replace")[: PHASE_BYTES - 1]
        count.value += 1

    work(send.send, note)
    send.send(_DONE)


def _text(phase: Any) -> str:
    return phase.value.decode("utf-8", "replace") or "its start"
