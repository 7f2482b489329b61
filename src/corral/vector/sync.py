"""The in-process backend: one loop over all envs, no copies, no workers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from corral.adapters import adapt
from corral.vector.backend import Arrays, Backend, EnvFn, EnvInfo, call_envs, set_env_attrs
from corral.vector.layout import Layout
from corral.vector.runner import EnvRunner


class SyncBackend(Backend):
    """Steps every env in the caller's process, in order. It takes no options."""

    refused_options = {
        "timeout": (
            "its envs run in the caller's process, where an env that hangs cannot be "
            "stopped; use backend='subproc' (or 'ray') for a timeout"
        )
    }

    def __init__(self, env_fns: Sequence[EnvFn]) -> None:
        super().__init__(env_fns)
        self.envs = [adapt(fn()) for fn in self.env_fns]
        self._pending: Callable[[], None] | None = None

    def env_info(self) -> EnvInfo:
        return EnvInfo.of(self.envs[0])

    def start(self, layout: Layout) -> Arrays:
        arrays = {
            path: np.zeros(shape, dtype) for path, (shape, dtype) in layout.array_specs().items()
        }
        # the runner replaces an env it rebuilds after a fault in self.envs itself
        self.runner = EnvRunner(self.envs, layout, arrays, env_fns=self.env_fns)
        return arrays

    def reset_async(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> None:
        self._pending = lambda: self.runner.reset(seeds, options)

    def step_async(self) -> None:
        self._pending = self.runner.step

    def _run_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending()

    def reset_wait(self, timeout: float | None) -> None:
        self._run_pending()

    def step_wait(self, timeout: float | None) -> None:
        self._run_pending()

    def call(
        self, name: str, args: tuple | None, kwargs: dict[str, Any], timeout: float | None
    ) -> list[Any]:
        return call_envs(self.envs, 0, name, args, kwargs)

    def set_attr(self, name: str, values: Sequence[Any], timeout: float | None) -> None:
        set_env_attrs(self.envs, 0, name, values)

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []
