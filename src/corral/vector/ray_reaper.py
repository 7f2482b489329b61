"""Ends the processes of a Ray that corral started as soon as the driver that started it dies.

Ray's head processes (GCS, raylet, monitors) die with the driver: Ray gives
them a parent-death signal. The processes the raylet starts do not: its
dashboard agent and runtime-env agent ignore SIGTERM and poll for their
parent, and linger a minute after a SIGKILL of the driver. The reaper is a
small process started next to Ray that waits for the driver to exit and then
kills every process of the session at once: the head processes it was given
and every child of the raylet, which it looks up every :data:`POLL_S` seconds
while the driver lives (once the raylet is dead they can no longer be told
from others). A driver that shuts Ray down dismisses it first.

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
from collections.abc import Iterable

DISMISS = b"done\n"  # what the driver writes when it shut Ray down itself

POLL_S = 1.0  # how often the reaper looks for new children of the raylet


def start(raylet: int, head: Iterable[int]) -> subprocess.Popen:
    """Start a reaper of the ``raylet``'s children and the ``head`` processes of this driver."""
    command = [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()), str(raylet)]
    return subprocess.Popen([*command, *map(str, head)], stdin=subprocess.PIPE)


def dismiss(reaper: subprocess.Popen) -> None:
    """Tell ``reaper`` that Ray was shut down, and wait for it to exit."""
    reaper.communicate(DISMISS)  # a reaper that already ended is fine too


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


def _wait(driver: _Process, timeout: float) -> str | None:
    """``"exited"`` when the driver exits, ``"dismissed"`` when it dismisses the reaper."""
    if driver.gone:
        return "exited"
    stdin = sys.stdin.fileno()
    handles = [stdin] if driver.fd is None else [stdin, driver.fd]
    ready, _, _ = select.select(handles, [], [], timeout)
    if not ready:
        return None
    if stdin in ready and os.read(stdin, len(DISMISS)) == DISMISS:
        return "dismissed"
    return "exited"


def main(argv: list[str]) -> None:
    """``ray_reaper.py DRIVER_PID RAYLET_PID [HEAD_PID...]``"""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # it ends with the driver
        signal.signal(sig, signal.SIG_IGN)
    driver_pid, raylet, *head = map(int, argv)
    driver = _Process(driver_pid)
    held = {pid: _Process(pid) for pid in [raylet, *head]}
    while True:
        for pid in [pid for pid, process in held.items() if process.ended()]:
            held.pop(pid).close()
        # the raylet's children die with it but not with the driver: hold each while it lives
        for pid in set(_children(raylet)) - held.keys():
            held[pid] = _Process(pid)
        state = _wait(driver, POLL_S)
        if state == "dismissed":
            return
        if state == "exited":
            break
    for process in held.values():  # the raylet first: it starts no more
        process.kill()


if __name__ == "__main__":
    main(sys.argv[1:])
