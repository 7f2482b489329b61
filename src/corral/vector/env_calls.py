"""Calling a backend's envs: an exception an env raises becomes an :class:`EnvError`
naming the env, and what ``set_attr`` wrote on the envs is remembered.

Every backend, and :class:`~corral.vector.dict_envs.DictEnvs` inside one, reports an
env's failure this way.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from corral.adapters import set_env_attr
from corral.errors import EnvError

T = TypeVar("T")


def guarded(index: int, what: str, call: Callable[[], T]) -> T:
    """``call()``; an exception it raises becomes an :class:`EnvError` of env ``index``.

    The error keeps the traceback as the env's process saw it, so every backend
    reports an env's failure the same way.
    """
    try:
        return call()
    except EnvError:
        raise
    except Exception as err:
        raise env_error(index, what, err) from err


def env_error(index: int, what: str, err: BaseException) -> EnvError:
    """``err`` (being handled) as an :class:`EnvError` of env ``index``, with the
    traceback as the env's process saw it; an :class:`EnvError` stays as it is."""
    if isinstance(err, EnvError):
        return err
    return EnvError(index, f"{what} raised {type(err).__name__}: {err}", traceback.format_exc())


def first_fault(errors: Sequence[BaseException]) -> BaseException:
    """The error to raise for the ``errors`` of one call: the first by env index, with
    every fault of the call (theirs included) in its ``faults``."""
    found = {id(f): f for err in errors for f in getattr(err, "faults", [err])}
    faults = sorted(found.values(), key=_first_env)
    first = faults[0]
    if hasattr(first, "faults"):
        first.faults = faults
    return first


def _first_env(err: BaseException) -> int:
    if isinstance(err, EnvError):
        return err.env_index
    indices = getattr(err, "env_indices", None)  # a worker's fault: its envs
    return min(indices) if indices else -1  # -1: no env's fault, raised first


def call_env(env: Any, name: str, args: tuple | None, kwargs: dict[str, Any]) -> Any:
    """``env.name(*args, **kwargs)`` if it is a method, else the attribute's value.

    With ``args=None`` the attribute itself, even a method (what ``get_attr`` reads).
    """
    attr = getattr(env, name)
    return attr(*args, **kwargs) if args is not None and callable(attr) else attr


def call_envs(
    envs: Sequence[Any], offset: int, name: str, args: tuple | None, kwargs: dict[str, Any]
) -> list[Any]:
    """:func:`call_env` on each env (indices from ``offset``); errors as :class:`EnvError`."""
    what = f"reading attribute {name!r}" if args is None else f"{name}()"
    return [
        guarded(offset + i, what, partial(call_env, env, name, args, kwargs))
        for i, env in enumerate(envs)
    ]


Written = dict[str, list[Any]]
"""What ``set_attr`` wrote on the copies of a shard: attribute name -> value of each copy,
in the order last written (the latest write of a name wins). A shard built anew (a
replaced worker's) takes them before its first reset (:func:`build_shard`)."""


def remember(written: Written, name: str, values: Sequence[Any]) -> None:
    """Record in ``written`` that ``set_attr`` set ``name`` to ``values`` (the latest last)."""
    written.pop(name, None)
    written[name] = list(values)


def set_env_attrs(envs: Sequence[Any], offset: int, name: str, values: Sequence[Any]) -> None:
    """Set attribute ``name`` of env ``i`` to ``values[i]`` where reading it finds it
    (:func:`corral.adapters.set_env_attr`); errors as :class:`EnvError`."""
    for i, (env, value) in enumerate(zip(envs, values, strict=True)):
        guarded(offset + i, f"setting attribute {name!r}", partial(set_env_attr, env, name, value))
