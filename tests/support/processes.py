"""The process table (from ``/proc``): whether processes live, which a process started, and
waiting for them to end, for tests that check that nothing outlives a run."""

from __future__ import annotations

import os
import signal
import time


def _stat(pid: int) -> tuple[str, int] | None:
    """The state and parent pid of process ``pid``, or ``None`` if there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
    except (OSError, ValueError):  # no such process, or it ended while being read
        return None
    return state, int(ppid)


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def descendants(root: int) -> set[int]:
    """The live processes below ``root`` in the process tree."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None and stat[0] != "Z":
            children.setdefault(stat[1], []).append(int(entry))
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return " ".join(f.read().decode(errors="replace").replace("\0", " ").split())
    except OSError:
        return "(gone)"


def wait_until_gone(pids: set[int], seconds: float) -> set[int]:
    """``pids`` still alive after waiting up to ``seconds`` for them to exit."""
    deadline = time.monotonic() + seconds
    while (left := {p for p in pids if alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def kill_all(pids: set[int]) -> None:
    """Clean up after a failed test: SIGKILL whatever of ``pids`` is left."""
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
