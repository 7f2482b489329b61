"""Ends processes that corral started as soon as the driver that started them dies.

Some of them cannot be trusted to notice the driver's end on their own: a
``subproc`` worker hung in C code that holds the GIL never runs the thread
that watches its parent (on Linux the kernel kills it anyway, see
``subproc._DeathPact``: the reaper is the fallback where that cannot be
arranged, and the kernel's the fallback where the reaper was killed), and the
dashboard and runtime-env agents of a Ray ignore SIGTERM and poll for their
parent, lingering a minute after a SIGKILL of the driver. A reaper is a
small process started next to them that waits for the driver to exit,
gives them ``grace`` seconds to end by themselves, and then kills those
still there: the processes it was given at its start or
told of since (:func:`hold`), and every child of its ``children_of`` process
(the raylet), looked up every :data:`POLL_S` seconds while the driver lives
(once that process is dead they can no longer be told from others). A driver
that ended them itself dismisses it (:func:`dismiss`).

The reaper runs as a script with the standard library only, so it starts in
milliseconds and never imports corral or Ray.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

POLL_S = 1.0  # how often the reaper drops ended processes and looks for new children


def start(
    held: Iterable[int] = (), *, children_of: int | None = None, grace: float = 0.0
) -> subprocess.Popen:
    """Start a reaper of the processes ``held`` and the children of ``children_of``, which
    kills them ``grace`` seconds after this process exits (at once for ``grace=0``)."""
    script = [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()), str(grace)]
    command = [*script, str(children_of or 0), *map(str, held)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)


def hold(reaper: subprocess.Popen, pid: int) -> None:
    """Have ``reaper`` kill process ``pid`` too, if this process dies before it ends."""
    assert reaper.stdin is not None  # started with stdin=PIPE
    with contextlib.suppress(BrokenPipeError):  # a reaper killed by someone reaps nothing
        reaper.stdin.write(b"%d\n" % pid)
        reaper.stdin.flush()


def dismiss(reaper: subprocess.Popen) -> None:
    """End ``reaper`` (its processes were ended) without it killing anything."""
    reaper.kill()  # at once: it may still be starting up; it ignores the other signals
    reaper.wait()
    assert reaper.stdin is not None  # started with stdin=PIPE
    reaper.stdin.close()


# -- the reaper's side -------------------------------------------------------------------


class _Process:
    """A process held by its pidfd where there are pidfds, so a reused pid is never hit."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd: int | None = None
        self.gone = False
        try:
            self.fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.gone = True
        except (AttributeError, OSError):  # no pidfds here: fall back to the pid
            pass

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, signal.SIGKILL)
            elif not self.gone:
                os.kill(self.pid, signal.SIGKILL)

    def ended(self) -> bool:
        if self.fd is None:
            return self.gone
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)  # readable once the process exited
        return bool(poller.poll(0))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux; none elsewhere)."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:  # gone, or no /proc
        return []
    found: list[int] = []
    for thread in threads:  # each thread's own children
        try:
            with open(f"/proc/{pid}/task/{thread}/children") as f:
                found += map(int, f.read().split())
        except FileNotFoundError:  # a kernel without the file: read every parent pid
            return [child for child, parent in _parents().items() if parent == pid]
        except OSError:  # the thread ended
            continue
    return found


def _parents() -> dict[int, int]:
    """The parent of every process."""
    parents = {}
    for entry in os.listdir("/proc"):
        # not a process, or it ended
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{entry}/stat", "rb") as f:
            parents[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
    return parents


class _Driver:
    """The driver as the reaper sees it: its exit, and what it writes on the reaper's stdin."""

    def __init__(self, pid: int) -> None:
        self.process = _Process(pid)
        self.stdin = sys.stdin.fileno()
        self.pending = b""

    def wait(self, timeout: float) -> tuple[bool, list[int]]:
        """Within ``timeout`` seconds: whether the driver exited, and the pids it asked
        to hold meanwhile (all of them, once it exited)."""
        handles = [self.stdin] if self.process.fd is None else [self.stdin, self.process.fd]
        ready, _, _ = select.select(handles, [], [], 0 if self.process.gone else timeout)
        exited = self.process.gone or self.process.fd in ready
        told: list[int] = []
        while self.stdin in ready:
            data = os.read(self.stdin, 4096)
            if not data:  # the driver's end of the pipe closed: it exited
                return True, told
            *lines, self.pending = (self.pending + data).split(b"\n")
            told += [int(line) for line in lines if line.strip()]
            # once the driver exited, read all it wrote before
            ready, _, _ = select.select([self.stdin], [], [], 0) if exited else ([], [], [])
        return exited, told


def main(argv: list[str]) -> None:
    """``reaper.py DRIVER_PID GRACE_S CHILDREN_OF_PID|0 [PID...]``"""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # it ends with the driver
        signal.signal(sig, signal.SIG_IGN)
    driver = _Driver(int(argv[0]))
    grace, parent = float(argv[1]), int(argv[2])
    held = {pid: _Process(pid) for pid in map(int, argv[3:])}
    while True:
        for pid in [pid for pid, process in held.items() if process.ended()]:
            held.pop(pid).close()
        # the raylet's children die with it but not with the driver: hold each while it lives
        for pid in set(_children(parent) if parent else ()) - held.keys():
            held[pid] = _Process(pid)
        exited, told = driver.wait(POLL_S)
        for pid in told:
            held.setdefault(pid, _Process(pid))
        if exited:
            break
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not all(p.ended() for p in held.values()):
        time.sleep(0.05)  # let them end by themselves first (a worker closes its envs)
    for process in held.values():  # in the order given: the raylet first, it starts no more
        process.kill()


if __name__ == "__main__":
    main(sys.argv[1:])
