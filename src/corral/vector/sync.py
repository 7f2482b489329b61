"""The in-process backend: the whole batched env in the caller's process, no copies."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from corral.vector.backend import Arrays, Backend, EnvInfo, call_shard, set_shard_attrs
from corral.vector.env_calls import guarded
from corral.vector.episodes import Episodes
from corral.vector.layout import Layout
from corral.vector.sources import Source


class SyncBackend(Backend):
    """Steps every copy in the caller's process. It takes no options."""

    refused_options = {
        "timeout": (
            "its envs run in the caller's process, where an env that hangs cannot be "
            "stopped; use backend='subproc' (or 'ray') for a timeout"
        )
    }

    def __init__(self, source: Source) -> None:
        super().__init__(source)
        self.shard = source.build(0)
        self._pending: tuple[Callable[[], None], str] | None = None  # a call and its name
        self._call: Callable[[], list[Any]] | None = None  # of call_async

    def env_info(self) -> EnvInfo:
        return EnvInfo.of(self.shard)

    def start(self, layout: Layout) -> Arrays:
        arrays = layout.allocate()
        self.episodes = Episodes(self.shard, layout, arrays, share=True)
        return arrays

    # A natively batched env's exception is its copies' EnvError, as on the other backends.

    def reset_async(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> None:
        self._pending = (partial(self.episodes.reset, seeds, options), "reset()")

    def step_async(self) -> None:
        self._pending = (self.episodes.step, "step()")

    def _run_pending(self, timeout: float | None = None) -> None:
        if self._pending is None:
            return
        (call, what), self._pending = self._pending, None
        guarded(0, what, call)

    reset_wait = step_wait = _run_pending

    def call_async(self, name: str, args: tuple | None, kwargs: dict[str, Any]) -> None:
        self._call = partial(call_shard, self.shard, 0, name, args, kwargs)

    def call_wait(self, timeout: float | None) -> list[Any]:
        call, self._call = self._call, None
        assert call is not None, "call_wait() without its call_async()"
        return call()

    def set_attr(self, name: str, values: Sequence[Any], timeout: float | None) -> int | None:
        return set_shard_attrs(self.shard, 0, name, values)

    def close(self, terminate: bool = False) -> None:
        self.shard.close()  # nothing to terminate: the envs run in this process
