"""The env registry: ids grouped by source, ``register`` and ``make``.

Each module of corral's envs registers its own ids when imported, and
:mod:`corral.adapters.catalog` lists the other libraries' ids; the registry
imports those modules (and registers the catalog's ids) the first time it is
asked for an id, so ``import corral`` stays cheap and never imports an optional
dependency.

Ids read ``source/name`` (``mpe2/simple_spread_v3``, ``openspiel/kuhn_poker``).
A *namespace* registers a whole source at once: ``gym/<any Gymnasium id>``.
An id may also be an entry point ``module:attr`` naming an env class or
function (or a :class:`corral.BatchedEnv` subclass) directly.

Installed packages make their ids known through the entry-point group
``corral.envs``: when an id is not registered, the registry loads the group's
entry points it has not loaded yet (each a module whose import registers ids,
or a function of no arguments that does), then looks again.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.metadata
import types
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from corral.adapters import adapt
from corral.batched_env import BatchedEnv
from corral.errors import MissingDependencyError, RegistrationError, UnknownEnvError

EntryPoint = Callable[..., Any] | str

# Modules whose import registers corral's built-in ids (one line per source).
_BUILTIN_MODULES = (
    "corral.envs.rps",
    "corral.envs.rps4",
    "corral.envs.memory",
    "corral.envs.tag",
    "corral.envs.mdp_ids",
)
# The module that lists the other libraries' ids (IDS, NAMESPACES), registered after them.
_CATALOG = "corral.adapters.catalog"
ENTRY_POINT_GROUP = "corral.envs"
"""The entry-point group through which installed packages register their ids."""


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
                f"env {self.id!r} is registered only natively batched (no env of one "
                f"copy to build): use corral.make_vec({self.id!r}, num_envs)"
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
    names: EntryPoint | None = None
    """Which names the source knows: ``names(name)`` returns ``None`` where it knows
    ``name``, else the names it knows (the error suggests the closest); ``None``: any."""


_specs: dict[str, EnvSpec] = {}
_namespaces: dict[str, Namespace] = {}
_builtins_loaded = False
_plugins: set[str] = set()
"""The entry points of :data:`ENTRY_POINT_GROUP` loaded so far (``name = value``)."""


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
    if not source or not name or is_entry_point(id):
        raise RegistrationError(
            f"env id {id!r} must read 'source/name' (no ':' before the '/', which names "
            f"code to import), e.g. 'mine/{id.replace(':', '-')}'"
        )
    _load_builtins()  # an id of corral's own is taken even before the first lookup
    if id in _specs:
        raise RegistrationError(f"env id {id!r} is already registered")
    if entry_point is None and batched is None:
        raise RegistrationError(f"env id {id!r} needs an entry_point, a batched one, or both")
    for point in (entry_point, batched):
        if point is not None and not (callable(point) or isinstance(point, str)):
            raise RegistrationError(f"entry point of {id!r} must be a callable or 'module:attr'")
    _specs[id] = EnvSpec(id, entry_point, dict(kwargs), extra, batched)


def register_namespace(
    prefix: str,
    factory: EntryPoint,
    *,
    extra: str | None = None,
    names: EntryPoint | None = None,
) -> None:
    """Make every id ``prefix/name`` build ``factory(name, **kwargs)``.

    ``names``, where given, says which names the source knows, so that a misspelt
    one is an :class:`UnknownEnvError` before anything is built: ``names(name)``
    returns ``None`` for a name the source knows, else the names it knows.
    """
    if not isinstance(prefix, str) or not prefix or any(c in prefix for c in "/:"):
        raise RegistrationError(
            f"a namespace's prefix is the 'source' of its ids 'source/name': a name without "
            f"'/' or ':', got {prefix!r}"
        )
    if not (callable(factory) or isinstance(factory, str)):
        raise RegistrationError(
            f"the factory of namespace {prefix!r} must be a callable or 'module:attr'"
        )
    _load_builtins()
    if prefix in _namespaces:
        raise RegistrationError(f"namespace {prefix!r} is already registered")
    _namespaces[prefix] = Namespace(prefix, factory, extra, names)


def import_modules(modules: Iterable[str]) -> None:
    """Import each of ``modules`` (modules of yours that register ids, say); a
    :class:`RegistrationError` names a module that cannot be imported."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise RegistrationError(f"cannot import the module {module!r}: {err}") from err


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)
        catalog = importlib.import_module(_CATALOG)
        for env_id, entry_point, options in catalog.IDS:
            register(env_id, entry_point, **options)
        for prefix, factory, options in catalog.NAMESPACES:
            register_namespace(prefix, factory, **options)


def _load_plugins() -> None:
    """Load the entry points of :data:`ENTRY_POINT_GROUP` not loaded yet."""
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = f"{entry.name} = {entry.value}"
        if key in _plugins:
            continue
        _plugins.add(key)  # loaded once, also where it fails
        try:
            target = entry.load()
            if not isinstance(target, types.ModuleType):
                target()
        except Exception as err:  # the package's code, in its own words, named
            dist = f"package {entry.dist.name!r}" if entry.dist else "an installed package"
            raise RegistrationError(
                f"the entry point '{key}' of {dist} (group {ENTRY_POINT_GROUP}) cannot be "
                f"loaded: {type(err).__name__}: {err}"
            ) from err


def registered_ids(source: str | None = None) -> list[str]:
    """Every registered id, sorted; only those of ``source`` (e.g. ``"mpe2"``) if given.

    Installed packages' ids (:data:`ENTRY_POINT_GROUP`) included."""
    _load_builtins()
    _load_plugins()
    ids = sorted(_specs)
    return [i for i in ids if i.split("/", 1)[0] == source] if source else ids


def batched_ids() -> list[str]:
    """Every registered id that has a natively batched implementation, sorted."""
    _load_builtins()
    _load_plugins()
    return sorted(i for i, s in _specs.items() if s.batched is not None)


def namespaces() -> list[str]:
    """The prefixes of open-ended sources (``gym``: any Gymnasium id)."""
    _load_builtins()
    _load_plugins()
    return sorted(_namespaces)


def namespace(prefix: str) -> Namespace:
    """The namespace ``prefix`` (see :func:`namespaces`); a ``KeyError`` if there is none."""
    _load_builtins()
    _load_plugins()
    return _namespaces[prefix]


def spec(id: str) -> EnvSpec:
    """The spec of ``id``: a registered id, ``prefix/name`` of a namespace, or an entry
    point ``module:attr``; an :class:`UnknownEnvError` naming the closest ids otherwise.

    An id not registered yet is looked up again after loading the entry points of
    :data:`ENTRY_POINT_GROUP`.
    """
    _load_builtins()
    if is_entry_point(id):
        return _entry_point_spec(id)
    if id not in _specs:
        _load_plugins()
    if id in _specs:
        return _specs[id]
    prefix, _, name = id.partition("/")
    if prefix in _namespaces and name:
        return _namespace_spec(id, _namespaces[prefix], name)
    raise _unknown(id, _specs)


def is_entry_point(id: str) -> bool:
    """Whether ``id`` reads ``module:attr`` rather than ``source/name``."""
    module, colon, attr = id.partition(":")
    return bool(colon and module and attr) and "/" not in module


def _entry_point_spec(id: str) -> EnvSpec:
    """The spec of the entry point ``module:attr``: natively batched where it names a
    :class:`corral.BatchedEnv` subclass."""
    module = id.partition(":")[0]
    try:
        target = resolve(id)
    except ModuleNotFoundError as err:
        if not err.name or not (module == err.name or module.startswith(err.name + ".")):
            raise  # the module imports one that is missing: its own error says which
        raise UnknownEnvError(
            f"cannot import {module!r} of the entry point {id!r}: {err} (run from the "
            "directory that holds it, or put that directory on PYTHONPATH)"
        ) from err
    except AttributeError as err:
        raise UnknownEnvError(f"cannot load the entry point {id!r}: {err}") from err
    if isinstance(target, type) and issubclass(target, BatchedEnv):
        return EnvSpec(id, None, batched=id)
    return EnvSpec(id, id)


def _namespace_spec(id: str, ns: Namespace, name: str) -> EnvSpec:
    if ns.names is not None:
        with _dependency(id, ns.extra):
            known = resolve(ns.names)(name)
        if known is not None:
            raise _unknown(id, [f"{ns.prefix}/{n}" for n in known], _specs)
    return EnvSpec(id, _NamespaceEntry(ns.factory, name), {}, ns.extra)


def _unknown(id: str, *candidates: Collection[str]) -> UnknownEnvError:
    """The error for ``id``, suggesting the closest of ``candidates`` (ids)."""
    pool = list(dict.fromkeys(i for ids in candidates for i in ids))
    close = difflib.get_close_matches(id, pool, n=5, cutoff=0.6)
    close += [i for i in pool if id and id.lower() in i.lower() and i not in close][:5]
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    prefix, _, name = id.partition("/")
    if prefix in _namespaces and name:
        return UnknownEnvError(f"unknown env id {id!r}: {prefix} knows no env {name!r}.{hint}")
    sources = {i.split("/")[0] for i in _specs} | set(_namespaces)
    known = ", ".join(f"{p}/..." for p in sorted(sources))
    mine = ""
    if prefix not in sources:
        mine = (
            f" No env of source {prefix!r} is registered: if a module of yours registers it, "
            "import that module first (on the command line: --import MODULE; an installed "
            f"package: its entry points in the group {ENTRY_POINT_GROUP!r})."
        )
    return UnknownEnvError(
        f"unknown env id {id!r}.{hint}{mine} Sources: {known}. Run `corral list` to see every id."
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
    with _dependency(id, extra):
        return resolve(entry_point)(**kwargs)


@contextlib.contextmanager
def _dependency(id: str, extra: str | None) -> Iterator[None]:
    """A module missing in the block is a :class:`MissingDependencyError` naming ``extra``."""
    try:
        yield
    except ModuleNotFoundError as err:
        missing = (err.name or "").split(".")[0]
        if extra is None or missing in ("", "corral"):
            raise
        raise MissingDependencyError(
            f"env {id!r} needs the optional dependency {missing!r}, which is not installed: "
            f"pip install 'corral[{extra}]'"
        ) from err
