"""The env registry: ids grouped by source, ``register`` and ``make``.

Each module that provides envs registers its own ids when imported; the
registry imports those modules the first time it is asked for an id, so
``import corral`` stays cheap and never imports an optional dependency.

Ids read ``source/name`` (``mpe2/simple_spread_v3``, ``openspiel/kuhn_poker``).
A *namespace* registers a whole source at once: ``gym/<any Gymnasium id>``.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corral.adapters import adapt
from corral.errors import MissingDependencyError, RegistrationError, UnknownEnvError

EntryPoint = Callable[..., Any] | str

# Modules whose import registers corral's built-in ids (one line per source).
_BUILTIN_MODULES = (
    "corral.envs.rps",
    "corral.envs.rps4",
    "corral.envs.tag",
    "corral.envs.mdp",
    "corral.sources",
)


@dataclass(frozen=True)
class EnvSpec:
    """How to build one registered env."""

    id: str
    entry_point: EntryPoint | None
    kwargs: dict[str, Any] = field(default_factory=dict)
    extra: str | None = None
    """The ``pip install corral[extra]`` that provides its dependencies, if any."""
    batched: EntryPoint | None = None
    """A natively batched implementation: ``batched(num_envs=, array=, device=, **kwargs)``
    returns a :class:`corral.BatchedEnv` of ``num_envs`` copies."""

    def make(self, **kwargs: Any) -> Any:
        """Build the env with the registered defaults updated by ``kwargs``."""
        if self.entry_point is None:
            raise RegistrationError(
                f"env {self.id!r} is registered only natively batched: use "
                f"corral.make_vec({self.id!r}, num_envs) or corral.make_batched"
            )
        return _call(self.id, self.extra, self.entry_point, {**self.kwargs, **kwargs})

    def make_batched(
        self, num_envs: int, array: str = "numpy", device: str = "cpu", **kwargs: Any
    ) -> Any:
        """Build the natively batched env of ``num_envs`` copies."""
        if self.batched is None:
            raise RegistrationError(
                f"env {self.id!r} has no natively batched implementation; the ids that have "
                f"one: {', '.join(batched_ids()) or 'none'}"
            )
        kwargs = {**self.kwargs, **kwargs, "num_envs": num_envs, "array": array, "device": device}
        return _call(self.id, self.extra, self.batched, kwargs)


@dataclass(frozen=True)
class Namespace:
    """A source whose ids are open-ended: ``prefix/name`` builds ``factory(name, **kwargs)``."""

    prefix: str
    factory: EntryPoint
    extra: str | None = None


_specs: dict[str, EnvSpec] = {}
_namespaces: dict[str, Namespace] = {}
_builtins_loaded = False


def resolve(entry_point: EntryPoint) -> Callable[..., Any]:
    """The callable behind an entry point (a callable or ``"module:attr"``)."""
    if callable(entry_point):
        return entry_point
    module_name, sep, attr = entry_point.partition(":")
    if not sep or not attr:
        raise RegistrationError(f"entry point {entry_point!r} is not of the form 'module:attr'")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target


def register(
    id: str,
    entry_point: EntryPoint | None = None,
    *,
    batched: EntryPoint | None = None,
    extra: str | None = None,
    **kwargs: Any,
) -> None:
    """Register ``id`` so that ``corral.make(id)`` calls ``entry_point(**kwargs)``.

    ``entry_point`` may return a corral env, a PettingZoo ``ParallelEnv`` or
    ``AECEnv`` or a Gymnasium env; ``make`` adapts the last three. ``batched``
    builds a natively batched implementation (a :class:`corral.BatchedEnv`),
    called as ``batched(num_envs=E, array=..., device=..., **kwargs)``;
    :func:`corral.make_vec` picks it unless ``native=False``. An id needs at
    least one of the two.

    Examples:
        >>> import corral
        >>> corral.register("docs/rps-3", "corral.envs.rps:RockPaperScissors", num_rounds=3)
        >>> corral.make("docs/rps-3").num_rounds
        3
    """
    source, _, name = id.partition("/")
    if not source or not name:
        raise RegistrationError(f"env id {id!r} must read 'source/name', e.g. 'mine/{id}'")
    if id in _specs:
        raise RegistrationError(f"env id {id!r} is already registered")
    if entry_point is None and batched is None:
        raise RegistrationError(f"env id {id!r} needs an entry_point, a batched one, or both")
    for point in (entry_point, batched):
        if point is not None and not (callable(point) or isinstance(point, str)):
            raise RegistrationError(f"entry point of {id!r} must be a callable or 'module:attr'")
    _specs[id] = EnvSpec(id, entry_point, dict(kwargs), extra, batched)


def register_namespace(prefix: str, factory: EntryPoint, *, extra: str | None = None) -> None:
    """Make every id ``prefix/name`` build ``factory(name, **kwargs)``."""
    if prefix in _namespaces:
        raise RegistrationError(f"namespace {prefix!r} is already registered")
    _namespaces[prefix] = Namespace(prefix, factory, extra)


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)


def registered_ids(source: str | None = None) -> list[str]:
    """Every registered id, sorted; only those of ``source`` (e.g. ``"mpe2"``) if given."""
    _load_builtins()
    ids = sorted(_specs)
    return [i for i in ids if i.split("/", 1)[0] == source] if source else ids


def batched_ids() -> list[str]:
    """Every registered id that has a natively batched implementation, sorted."""
    _load_builtins()
    return sorted(i for i, s in _specs.items() if s.batched is not None)


def namespaces() -> list[str]:
    """The prefixes of open-ended sources (``gym``: any Gymnasium id)."""
    _load_builtins()
    return sorted(_namespaces)


def spec(id: str) -> EnvSpec:
    """The spec of ``id``; an :class:`UnknownEnvError` naming the closest ids otherwise."""
    _load_builtins()
    if id in _specs:
        return _specs[id]
    prefix, _, name = id.partition("/")
    if prefix in _namespaces and name:
        ns = _namespaces[prefix]
        return EnvSpec(id, _NamespaceEntry(ns.factory, name), {}, ns.extra)
    close = difflib.get_close_matches(id, list(_specs), n=5, cutoff=0.6)
    close += [i for i in _specs if id and id.lower() in i.lower() and i not in close][:5]
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    sources = {i.split("/")[0] for i in _specs} | set(_namespaces)
    known = ", ".join(f"{p}/..." for p in sorted(sources))
    raise UnknownEnvError(
        f"unknown env id {id!r}.{hint} Sources: {known}. Run `corral list` to see every id."
    )


@dataclass(frozen=True)
class _NamespaceEntry:
    factory: EntryPoint
    name: str

    def __call__(self, **kwargs: Any) -> Any:
        return resolve(self.factory)(self.name, **kwargs)


def make(id: str, **kwargs: Any) -> Any:
    """Build the env registered as ``id``, adapted to the corral contract.

    Examples:
        >>> import corral
        >>> env = corral.make("corral/rps", num_rounds=2)
        >>> obs, infos = env.reset(seed=0)
        >>> list(obs)
        ['player_0']
    """
    return adapt(spec(id).make(**kwargs))


def _call(id: str, extra: str | None, entry_point: EntryPoint, kwargs: dict[str, Any]) -> Any:
    try:
        return resolve(entry_point)(**kwargs)
    except ModuleNotFoundError as err:
        missing = (err.name or "").split(".")[0]
        if extra is None or missing in ("", "corral"):
            raise
        raise MissingDependencyError(
            f"env {id!r} needs the optional dependency {missing!r}, which is not installed: "
            f"pip install 'corral[{extra}]'"
        ) from err
