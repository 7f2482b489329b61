"""Adapters from other env APIs to the corral contract.

Each adapter module registers a detector with :func:`register_adapter`;
:func:`adapt` asks them in turn, so ``corral.make`` and the vector layer
accept a PettingZoo, Gymnasium or OpenSpiel env as readily as a corral one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from corral.env import MultiAgentEnv

_adapters: list[tuple[Callable[[Any], bool], Callable[[Any], Any]]] = []

_CONTRACT = ("possible_agents", "observation_space", "action_space", "reset", "step")


def register_adapter(detect: Callable[[Any], bool], wrap: Callable[[Any], Any]) -> None:
    """Adapt every env for which ``detect(env)`` is true with ``wrap(env)``."""
    _adapters.append((detect, wrap))


def adapt(env: Any) -> Any:
    """``env`` under the corral contract: wrapped if it speaks another API, else as is."""
    from corral.registry import _load_builtins

    _load_builtins()
    if isinstance(env, MultiAgentEnv):
        return env
    for detect, wrap in _adapters:
        if detect(env):
            return wrap(env)
    if all(hasattr(env, name) for name in _CONTRACT):
        return env
    missing = [name for name in _CONTRACT if not hasattr(env, name)]
    raise TypeError(
        f"{type(env).__name__} is not a multi-agent env: it lacks {missing} and no adapter "
        "(PettingZoo, Gymnasium, OpenSpiel) recognises it"
    )
