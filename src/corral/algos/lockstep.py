"""The check of algorithms that need every agent to act at every step (``needs_lockstep``):
an env that does not declare ``metadata["lockstep"]`` is held to it as it plays."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.data.rollouts import Rollout
from corral.errors import UnsupportedEnvError


def acted_in_lockstep(rollout: Rollout) -> Any:
    """``[T, E, n]``: the agent acted at the step and, after it, acts again or its episode
    ended (a decision carried into the next rollout counts as acting there: it is not)."""
    ended = rollout.terminated | rollout.truncated
    return rollout.acting & (rollout.next["acting"] | ended)


def check_all_acting(algo: str, group: str, agents: tuple[str, ...], acting: Any) -> None:
    """Raise :class:`~corral.errors.UnsupportedEnvError` naming the first env and agent of
    ``group`` not acting in ``acting`` (``[E, n]`` bools, one row per env)."""
    acting = np.asarray(acting)
    if acting.all():
        return
    env, j = (int(x) for x in np.argwhere(~acting)[0])
    raise UnsupportedEnvError(
        f"{algo} needs every agent to act at every step (simultaneous moves), but in env {env} "
        f"agent {agents[j]!r} of group {group!r} is not acting: turn-based and asynchronous "
        "envs, and envs whose agents leave early, are not supported (use DQN or MAPPO)"
    )
