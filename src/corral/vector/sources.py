"""Where a vector env's copies come from: packed dict envs, or a natively batched env.

A source builds the :class:`~corral.BatchedEnv` of any contiguous range of the
copies (a backend's shard: all of them in process, a slice per worker), and
travels to worker processes and Ray actors by pickling.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.arrays import default_host_views, host_views_by_default
from corral.batched_env import BatchedEnv
from corral.groups import GroupMap
from corral.vector.dict_envs import DictEnvs

EnvFn = Callable[[], Any]


@dataclass(frozen=True)
class DictSource:
    """One dict env per copy, built by ``env_fns[i]`` and packed by :class:`DictEnvs`."""

    env_fns: tuple[EnvFn, ...]
    group_map: GroupMap = None
    state: bool = False
    check_finite: bool = False

    @property
    def num_envs(self) -> int:
        return len(self.env_fns)

    def part(self, envs: range) -> DictSource:
        """The source of the copies ``envs`` only."""
        return DictSource(
            self.env_fns[envs.start : envs.stop], self.group_map, self.state, self.check_finite
        )

    def build(self, offset: int = 0) -> BatchedEnv:
        """The batched env of every copy of this source (global indices from ``offset``)."""
        return DictEnvs(
            self.env_fns,
            offset=offset,
            group_map=self.group_map,
            state=self.state,
            check_finite=self.check_finite,
        )


@dataclass(frozen=True)
class NativeSource:
    """A natively batched env: ``make(num_envs)`` builds one of ``num_envs`` copies."""

    make: Callable[[int], BatchedEnv]
    num_envs: int
    state: bool = True
    host_views: bool = field(default_factory=default_host_views, kw_only=True)
    """The default ``host_views`` of the Places its env builds: that of where the source was
    made (``False`` inside :func:`corral.device_path`), in every build (in a worker process,
    or after a fault) too."""

    def part(self, envs: range) -> NativeSource:
        return NativeSource(self.make, len(envs), self.state, host_views=self.host_views)

    def build(self, offset: int = 0) -> BatchedEnv:
        with host_views_by_default(self.host_views):
            env = self.make(self.num_envs)
        if env.num_envs != self.num_envs:
            raise ValueError(
                f"the batched env built for {self.num_envs} copies has num_envs={env.num_envs}"
            )
        return env


Source = DictSource | NativeSource


def as_source(envs: Sequence[EnvFn] | Source, **dict_options: Any) -> Source:
    """``envs`` as a source: a list of env constructors becomes a :class:`DictSource`."""
    if isinstance(envs, (DictSource, NativeSource)):
        return envs
    return DictSource(tuple(envs), **dict_options)
