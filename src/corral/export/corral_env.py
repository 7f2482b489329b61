"""The corral env an export wraps (built from an id, or adapted), and how messages name it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.adapters import adapt
from corral.registry import make


def env_name(env: Any) -> str:
    """How a message names ``env``: the id it is made from, else its class and
    ``metadata["name"]`` (``OpenSpielEnv 'kuhn_poker'``)."""
    if isinstance(env, str):
        return repr(env)
    metadata = getattr(env, "metadata", None)
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    return type(env).__name__ + (f" {name!r}" if name else "")


def corral_env(env: Any, kwargs: dict[str, Any]) -> Any:
    """``env`` as a corral env: made from a registered id (with ``kwargs``), else adapted."""
    if isinstance(env, str):
        return make(env, **kwargs)
    if kwargs:
        raise TypeError(
            f"keyword arguments {sorted(kwargs)} build an env from a registered id; "
            f"got an env object ({type(env).__name__}), which is already built"
        )
    return adapt(env)
