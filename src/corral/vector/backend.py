"""The interface every vector backend implements: it only moves data.

A backend builds the envs, allocates the batch arrays where its envs can
write them, and runs :class:`~corral.vector.episodes.Episodes` over each
shard of the copies. Everything else (layout, validation, the call order, the
batch) belongs to :class:`~corral.vector.vector_env.VectorEnv`.
"""

from __future__ import annotations

import importlib
import inspect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeGuard, TypeVar

from gymnasium import spaces

from corral.arrays import Place
from corral.batched_env import BatchedEnv, BatchedStep
from corral.vector.dict_envs import DictEnvs
from corral.vector.env_calls import Written, call_envs, guarded
from corral.vector.layout import Layout
from corral.vector.sources import Source

if TYPE_CHECKING:
    _Proxied = BatchedEnv  # a ResetWatch passes for its shard (through __getattr__)
else:
    _Proxied = object

T = TypeVar("T")
EnvFn = Callable[[], Any]
Arrays = dict[str, Any]  # path -> numpy array or torch tensor

DEFAULT_TIMEOUT = 300.0
"""Seconds a worker backend (``subproc``, ``ray``) waits for a reset, step or call when
no ``timeout`` option is given: long enough for any sane env step, short enough that a
hung env does not block a run forever. ``timeout=None`` waits without limit."""

DEFAULT_START_TIMEOUT = 60.0
"""Seconds a worker backend waits for its workers to start and build their envs when no
``start_timeout`` option is given (``start_timeout=None`` waits without limit)."""

# Backend name -> "module:class"; the module is imported only when used.
BACKENDS = {
    "sync": "corral.vector.sync:SyncBackend",
    "subproc": "corral.vector.subproc:SubprocBackend",
    "ray": "corral.vector.ray_backend:RayBackend",
}


@dataclass(frozen=True)
class EnvInfo:
    """What the parent needs to know of the envs to lay out their arrays."""

    possible_agents: list[str]
    groups: dict[str, tuple[str, ...]]
    observation_spaces: dict[str, spaces.Space]
    action_spaces: dict[str, spaces.Space]
    state_space: spaces.Space | None
    metadata: dict[str, Any]
    max_episode_steps: int | None = None
    place: Place = field(default_factory=Place)

    @classmethod
    def of(cls, env: BatchedEnv) -> EnvInfo:
        """What ``env`` (a batched env, or a shard of the vector env's copies) is."""
        agents = list(env.possible_agents)
        return cls(
            agents,
            dict(env.groups),
            {a: env.observation_space(a) for a in agents},
            {a: env.action_space(a) for a in agents},
            env.state_space,
            dict(env.metadata),
            env.max_episode_steps,
            env.place,
        )


class Backend:
    """Runs the copies of ``source``; subclasses decide where (in shards of it).

    A subclass takes its options as keyword-only arguments of ``__init__``;
    ``refused_options`` says why it lacks an option the other backends take.
    """

    refused_options: ClassVar[dict[str, str]] = {}

    def __init__(self, source: Source, **options: Any) -> None:
        self.source = source

    @property
    def num_envs(self) -> int:
        return self.source.num_envs

    def env_info(self) -> EnvInfo:
        """Agents and spaces of the envs (all envs must share them)."""
        raise NotImplementedError

    def start(self, layout: Layout) -> Arrays:
        """Allocate the arrays of ``layout`` and make the envs write into them."""
        raise NotImplementedError

    def reset_async(self, seeds: Sequence[int | None], options: dict[str, Any] | None) -> None:
        raise NotImplementedError

    def reset_wait(self, timeout: float | None) -> None:
        """Finish the reset; like :meth:`step_wait` for faults."""
        raise NotImplementedError

    def step_async(self) -> None:
        """Start a step with the actions already written in the ``action/...`` arrays."""
        raise NotImplementedError

    def step_wait(self, timeout: float | None) -> None:
        """Finish the step. Faults (an :class:`EnvError`, a :class:`WorkerTimeoutError`)
        are raised only once the batch is complete, the faulty envs restarted, with
        every fault of the step in the raised error's ``faults``."""
        raise NotImplementedError

    def call(
        self, name: str, args: tuple | None, kwargs: dict[str, Any], timeout: float | None
    ) -> list[Any]:
        """:func:`call_env` on every env, in order; an env's exception as :class:`EnvError`."""
        self.call_async(name, args, kwargs)
        return self.call_wait(timeout)

    def call_async(self, name: str, args: tuple | None, kwargs: dict[str, Any]) -> None:
        """Start :meth:`call`; :meth:`call_wait` returns its values."""
        raise NotImplementedError

    def call_wait(self, timeout: float | None) -> list[Any]:
        """Finish the call started by :meth:`call_async`: every env's value, in order."""
        raise NotImplementedError

    def set_attr(self, name: str, values: Sequence[Any], timeout: float | None) -> int | None:
        """Set attribute ``name`` of env ``i`` to ``values[i]`` (:func:`set_shard_attrs`);
        return the first env's ``max_episode_steps`` after the write."""
        raise NotImplementedError

    def close(self, terminate: bool = False) -> None:
        """Release everything; safe to call twice. ``terminate``: end the workers at once,
        without letting them close their envs."""


def backend_class(name: str) -> type[Backend]:
    """The backend class registered as ``name``."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {sorted(BACKENDS)}")
    module, _, attr = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def backend_options(name: str) -> frozenset[str]:
    """The names of the options that the backend ``name`` takes."""
    parameters = inspect.signature(backend_class(name).__init__).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is p.KEYWORD_ONLY)


SECONDS_OPTIONS = ("timeout", "start_timeout")
"""The options that are time limits: a positive, finite number of seconds, or ``None``."""


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """Raise a ``ValueError`` for an option the backend ``name`` does not take, or a time
    limit that is not a positive, finite number of seconds or ``None``."""
    taken = backend_options(name)
    for option in options:
        if option in taken:
            if option in SECONDS_OPTIONS:
                check_seconds(option, options[option])
            continue
        why = backend_class(name).refused_options.get(option)
        if why is not None:
            raise ValueError(f"backend {name!r} takes no {option!r} option: {why}")
        raise ValueError(
            f"backend {name!r} takes no option {option!r}; its options: "
            f"{', '.join(sorted(taken)) or 'none'}"
        )


def check_timeout(name: str, timeout: float | None) -> None:
    """Raise a ``ValueError`` for a ``timeout`` given to a backend that cannot honour it, or
    one that is not a positive, finite number of seconds."""
    if timeout is not None:
        check_options(name, {"timeout": timeout})


def check_seconds(option: str, value: Any) -> None:
    """Raise a ``ValueError`` unless ``value`` is a positive, finite number of seconds or
    ``None`` (no limit)."""
    if value is None:
        return
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{option} must be a positive, finite number of seconds, or None to wait "
            f"without limit; got {value!r}"
        )


def call_shard(
    shard: BatchedEnv, offset: int, name: str, args: tuple | None, kwargs: dict[str, Any]
) -> list[Any]:
    """:func:`call_envs` on a shard's dict envs; of a natively batched shard, its attribute
    ``name`` once per copy (it has no per-copy methods), or, for ``render()`` where the shard
    has render modes, its ``render(copy)`` of each copy."""
    if _is_dict_envs(shard):
        return call_envs(shard.envs, offset, name, args, kwargs)
    if name == "render" and args == () and not kwargs and _renders_copies(shard):
        return [
            guarded(offset + i, "render()", partial(shard.render, i)) for i in range(shard.num_envs)
        ]
    if args is not None and callable(getattr(shard, name, None)):
        raise TypeError(
            f"{type(shard).__name__} is natively batched: it has no method {name!r} per copy "
            "to call (call it on the batched env itself, or use native=False)"
        )
    value = guarded(offset, f"reading attribute {name!r}", lambda: getattr(shard, name))
    return [value] * shard.num_envs


def set_shard_attrs(shard: BatchedEnv, offset: int, name: str, values: Sequence[Any]) -> int | None:
    """Set attribute ``name`` of copy ``i`` to ``values[i]``: on a shard of dict envs, of
    each env where reading it finds it, remembered for the envs it rebuilds
    (:meth:`~corral.vector.dict_envs.DictEnvs.set_attr`); on a natively batched shard, one
    of the attributes it declares settable (``settable_attributes``) to ``values[0]``, the
    one value of all its copies. Returns the shard's ``max_episode_steps`` after the write
    (a write may change it: mpe2's ``max_cycles``)."""
    if _is_dict_envs(shard):
        shard.set_attr(name, values)
    else:
        guarded(offset, f"setting attribute {name!r}", lambda: set_native_attr(shard, name, values))
    return shard.max_episode_steps


class _CopyRenderer(Protocol):
    """A natively batched env with render modes: it renders one copy at a time."""

    num_envs: int

    def render(self, copy: int) -> Any: ...


def _renders_copies(shard: BatchedEnv) -> TypeGuard[_CopyRenderer]:
    """Whether a natively batched ``shard`` renders each copy (it has render modes)."""
    return bool(shard.metadata.get("render_modes"))


def _is_dict_envs(shard: BatchedEnv) -> TypeGuard[DictEnvs]:
    """Whether ``shard`` (or the shard a :class:`ResetWatch` watches) is a shard of dict envs;
    a natively batched env is not, whatever attributes it has."""
    return isinstance(shard._shard if isinstance(shard, ResetWatch) else shard, DictEnvs)


class ResetWatch(_Proxied):
    """``shard`` as a worker's :class:`~corral.vector.episodes.Episodes` runs it, with
    :meth:`reset` to say what a worker's backend notes of each reset (subclasses)."""

    def __init__(self, shard: BatchedEnv) -> None:
        self._shard = shard

    def __getattr__(self, name: str) -> Any:
        return getattr(self._shard, name)

    def step(self, actions: Any) -> BatchedStep:
        return self._shard.step(actions)

    def reset(self, *args: Any, **kwargs: Any) -> BatchedStep:
        return self._shard.reset(*args, **kwargs)


def build_shard(source: Source, offset: int, written: Written | None = None) -> BatchedEnv:
    """The shard of ``source``'s copies (global indices from ``offset``), with what
    ``set_attr`` had ``written`` on the copies of the shard it replaces."""
    shard = source.build(offset)
    for name, values in (written or {}).items():
        set_shard_attrs(shard, offset, name, values)
    return shard


def set_native_attr(shard: BatchedEnv, name: str, values: Sequence[Any]) -> None:
    """Set attribute ``name`` of a natively batched env to ``values[0]``, where the env
    declares it settable (a write to any other would not reach its copies' arrays)."""
    settable = tuple(shard.settable_attributes)
    if name not in settable:
        raise AttributeError(
            f"{type(shard).__name__} is natively batched: set_attr sets only the attributes "
            f"it declares settable ({', '.join(map(repr, settable)) or 'none'}), one value for "
            f"all its copies; set {name!r} when it is built (make_vec(..., env_kwargs=...)), "
            "or per copy with native=False"
        )
    setattr(shard, name, values[0])
