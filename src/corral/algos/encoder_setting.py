"""The ``encoder`` setting of an algorithm's config: what it may name and how a run's
``config.yaml`` records it (without importing torch; the encoders are in
:mod:`corral.algos.encoders`)."""

from __future__ import annotations

from typing import Any

from corral.errors import ConfigError
from corral.registry import resolve

BUILT_IN = ("mlp", "cnn")
"""The encoders named by a word; any other ``encoder`` is ``module:attr`` or a factory."""

OBJECT = "object:"
"""How a run's ``config.yaml`` records a factory given as an object it cannot import back."""


def check_setting(value: Any) -> None:
    """Raise :class:`~corral.errors.ConfigError` unless ``value`` can name an encoder."""
    if callable(value) or (isinstance(value, str) and (value in BUILT_IN or ":" in value)):
        return
    raise ConfigError(
        f"encoder must be one of {list(BUILT_IN)}, 'module:attr' of a factory "
        f"(space) -> nn.Module, or such a factory, got {value!r}"
    )


def written(setting: Any) -> str:
    """An ``encoder`` setting as a run's ``config.yaml`` records it: a factory by its
    ``module:attr`` where that imports it back, else as ``object:Name`` (not readable)."""
    if isinstance(setting, str):
        return setting
    qualname = getattr(setting, "__qualname__", type(setting).__qualname__)
    name = f"{getattr(setting, '__module__', '')}:{qualname}"
    return name if _imports_back(name, setting) else f"{OBJECT}{qualname}"


def _imports_back(name: str, setting: Any) -> bool:
    try:
        return resolve(name) is setting
    except (ImportError, AttributeError, ValueError):  # a local function, a lambda
        return False
