"""Envs for fault tests of rollout workers, named by entry point (``support.faulty_envs:...``)
so that a Ray actor with ``tests/`` on its path builds them: they note the pid of each process
that builds one, and hang or end their process at a step."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import corral
from corral.errors import ConfigError

ENTRY = "support.faulty_envs:FaultyEnv"
"""The env id (an entry point) of :class:`FaultyEnv`."""


class FaultyEnv:
    """The env ``env`` that writes its process's pid as a file into ``pids`` (when given;
    the file holds the id of the Ray node the process runs on, if it joined Ray) and at its
    ``at``-th step does ``fault``: ``hang`` sleeps ``seconds``, ``die`` ends the process at
    once, ``raise`` raises a ``RuntimeError``. ``marker``: a path that the first env to fault
    creates, so that only that one faults (every env faults each time where ``marker`` is
    ``None``). ``refuse_after``: a path whose existence makes building the env raise a
    :class:`~corral.errors.ConfigError` (a replacement worker built after the fault)."""

    def __init__(
        self,
        env: str = "mdp/multi_round_nmdp",
        fault: str | None = None,
        at: int = 2,
        seconds: float = 600.0,
        marker: str | None = None,
        pids: str | None = None,
        refuse_after: str | None = None,
    ) -> None:
        if refuse_after is not None and Path(refuse_after).exists():
            raise ConfigError(f"this env is not built after {refuse_after} exists")
        self.env = corral.make(env)
        self.fault, self.at, self.seconds, self.marker = fault, at, seconds, marker
        self.steps = 0
        if pids is not None:
            (Path(pids) / str(os.getpid())).write_text(_node_id())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: Any) -> Any:
        self.steps += 1
        if self.fault is not None and self.steps == self.at and self._first():
            if self.fault == "die":
                os._exit(1)
            if self.fault == "raise":
                raise RuntimeError("the faulty env raised")
            time.sleep(self.seconds)
        return self.env.step(actions)

    def _first(self) -> bool:
        """Whether this env is the one to fault (the first to create ``marker``)."""
        if self.marker is None:
            return True
        try:
            Path(self.marker).touch(exist_ok=False)
        except FileExistsError:
            return False
        return True

    def close(self) -> None:
        self.env.close()


def _node_id() -> str:
    """The id of the Ray node this process runs on, or ``""`` outside Ray."""
    try:
        import ray
    except ImportError:
        return ""
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def noted_pids(pids: Path) -> dict[int, str]:
    """The pids that :class:`FaultyEnv` noted in ``pids``, each with its Ray node's id."""
    return {int(path.name): path.read_text() for path in pids.iterdir()}
