"""Adapters from other env APIs to the corral contract.

Each adapter module registers a detector with :func:`register_adapter`;
:func:`adapt` asks them in turn, so ``corral.make`` and the vector layer
accept a PettingZoo, Gymnasium or OpenSpiel env as readily as a corral one.
Adapters know nothing of the registry: the registry builds an env, then adapts it.
:mod:`corral.adapters.catalog` lists the other libraries' ids, as data the registry
reads.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

from corral.env import MultiAgentEnv, spaces_by_agent_hint

_adapters: list[tuple[Callable[[Any], bool], Callable[[Any], Any]]] = []
_builtins_loaded = False

# The modules whose import registers corral's own adapters, in the order they are asked.
_BUILTIN_MODULES = (
    "corral.adapters.pettingzoo_parallel",
    "corral.adapters.pettingzoo_aec",
    "corral.adapters.gymnasium",
    "corral.adapters.gymnasium_multi",
    "corral.adapters.openspiel",
)

_CONTRACT = ("possible_agents", "observation_space", "action_space", "reset", "step")

# Where PettingZoo's and Gymnasium's wrappers keep the env they wrap.
_WRAPPED_ENV_ATTRIBUTES = ("env", "aec_env")


def register_adapter(detect: Callable[[Any], bool], wrap: Callable[[Any], Any]) -> None:
    """Adapt every env for which ``detect(env)`` is true with ``wrap(env)``."""
    _adapters.append((detect, wrap))


def adapt(env: Any) -> Any:
    """``env`` under the corral contract: wrapped if it speaks another API, else as is."""
    _load_builtins()
    if isinstance(env, MultiAgentEnv):
        return env
    for detect, wrap in _adapters:
        if detect(env):
            return wrap(env)
    if all(hasattr(env, name) for name in _CONTRACT):
        return env
    missing = [name for name in _CONTRACT if not hasattr(env, name)]
    hints = [spaces_by_agent_hint(name) for name in missing if hasattr(env, f"{name}s")]
    raise TypeError(
        f"{type(env).__name__} is not a multi-agent env: it lacks {missing} and no adapter "
        "(PettingZoo, Gymnasium, OpenSpiel) recognises it" + "".join(f". {h}" for h in hints)
    )


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)


def source_attr(source: Any, name: str) -> Any:
    """Attribute ``name`` of the source env ``source``, or of the env inside it that holds it.

    Walks down the wrappers (``wrapper.env``, ``aec_to_parallel(...).aec_env``) to
    the raw env, so an adapter reaches ``max_cycles`` of an mpe2 env or
    ``spec`` of a Gymnasium one; reads from :func:`attr_holder`, where
    :func:`set_env_attr` writes. Raises ``AttributeError`` if none has it.
    """
    return getattr(attr_holder(source, name), name)


def attr_holder(source: Any, name: str) -> Any:
    """The env, of ``source`` and the envs inside its wrappers, whose attribute ``name`` is
    read and written through ``source``.

    That is the outermost one that holds ``name`` itself (in its instance or its class),
    not through a ``__getattr__`` that hands it down, as PettingZoo's wrappers do: the
    raw mpe2 env for ``max_cycles``. Failing that, the outermost one whose own
    ``__getattr__`` answers for it. Raises ``AttributeError`` if none has it.
    """
    chain = list(_wrapped_envs(source))
    for env in chain:
        if _holds(env, name):
            return env
    for env in chain:
        if hasattr(env, name):
            return env
    raise AttributeError(name)


def set_env_attr(env: Any, name: str, value: Any) -> None:
    """Set attribute ``name`` of ``env`` on the object that reading ``env.name`` reads.

    An adapter's own attributes are the adapter's; a public one it lacks goes to the env
    inside it that holds it (:func:`attr_holder`), so that ``max_cycles`` of an mpe2 env
    or the knob a PettingZoo env's rewards read reach the env that uses them. A name that
    nothing holds yet is set on ``env`` itself, as Gymnasium's ``set_wrapper_attr`` does.
    """
    target = env
    source = getattr(env, "__dict__", {}).get("env")
    forwarded = not name.startswith("_") and not _holds(env, name)  # private: the adapter's
    if isinstance(env, SourceAdapter) and source is not None and forwarded:
        with contextlib.suppress(AttributeError):  # held by nobody: set on the adapter
            target = attr_holder(source, name)
    setattr(target, name, value)


def _wrapped_envs(source: Any) -> Iterator[Any]:
    """``source``, then the env each wrapper wraps (``wrapper.env``, ``wrapper.aec_env``)."""
    env, seen = source, set()
    while env is not None and id(env) not in seen:
        seen.add(id(env))
        yield env
        inner = getattr(env, "__dict__", {})
        env = next((inner[key] for key in _WRAPPED_ENV_ATTRIBUTES if key in inner), None)


def _holds(obj: Any, name: str) -> bool:
    """Whether ``name`` is ``obj``'s own: in its instance dict or its class (an attribute,
    method or property), not handed down by a ``__getattr__``."""
    return name in getattr(obj, "__dict__", ()) or any(
        name in vars(cls) for cls in type(obj).__mro__
    )


class SourceAdapter(MultiAgentEnv):
    """Base of the adapters around another library's env, ``adapter.env``.

    A public attribute the adapter lacks is read from the source env, or from
    an env inside its wrappers (``adapter.max_cycles`` of an mpe2 env);
    private names (``_x``) are not forwarded. :func:`set_env_attr` (what
    ``VectorEnv.set_attr`` calls) writes such an attribute where it is read from;
    a plain ``adapter.x = value`` sets the adapter's own. ``unwrapped`` is the raw
    source env.
    """

    env: Any

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not found normally.
        source = self.__dict__.get("env")
        where = ""
        if name.startswith("_"):
            where = " (private attributes of the wrapped env are not forwarded)"
        elif source is not None:
            try:
                return source_attr(source, name)
            except AttributeError:
                where = f", nor has the {type(source).__name__} it wraps or any env inside it"
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}{where}")

    @property
    def unwrapped(self) -> Any:
        """The raw source env under every wrapper."""
        return self.env.unwrapped
