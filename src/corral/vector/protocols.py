"""The vector env and its batches as the training layer sees them, for the type checker.

:class:`~corral.vector.VectorEnv` satisfies :class:`VecEnv`; the training layer
(collector, algorithms, rollouts, scoring) takes any object with these members, so
a test double or a wrapper needs no subclassing. Nothing here is checked at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
from gymnasium import spaces

from corral.arrays import Place
from corral.vector.vector_env import Batch


class Groups(Protocol):
    """How many envs, and which agents form each group: all a rollout's layout needs."""

    @property
    def num_envs(self) -> int: ...

    @property
    def groups(self) -> Mapping[str, tuple[str, ...]]: ...


class VecEnv(Groups, Protocol):
    """A corral vector env as the training layer drives it (see
    :class:`~corral.vector.VectorEnv` for what each member means)."""

    @property
    def metadata(self) -> dict[str, Any]: ...

    @property
    def possible_agents(self) -> list[str]: ...

    @property
    def place(self) -> Place: ...

    @property
    def state_space(self) -> spaces.Space | None: ...

    def observation_space(self, key: str) -> spaces.Space: ...

    def action_space(self, key: str) -> spaces.Space: ...

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Batch: ...

    def step(self, actions: Mapping[str, Any]) -> Batch: ...

    def sample_actions(self, batch: Batch, rng: np.random.Generator | None = None) -> dict: ...

    def render(self) -> list: ...

    def close(self, *, terminate: bool = False) -> None: ...


class EndedEpisodes(Protocol):
    """The fields of a batch that say which episodes ended and how (a :class:`Batch`, or
    those fields of several batches read back at once)."""

    @property
    def done(self) -> Any: ...

    @property
    def episode_return(self) -> Mapping[str, Any]: ...

    @property
    def episode_length(self) -> Any: ...

    @property
    def episode_cut(self) -> Any: ...


__all__ = ["Batch", "EndedEpisodes", "Groups", "VecEnv"]
