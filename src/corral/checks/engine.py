"""The engine both conformance checkers share: the report, the findings, how the env is called.

A check calls the env only through :func:`attempt` (and :func:`reset_env`,
:func:`step_env`), which turns any failure of the env into an :class:`EnvFailed` naming the
call; the rules yield messages, and :class:`Findings` keeps at most :data:`MAX_REPEATS` of
each rule. :func:`in_space` and :func:`unfinite_parts` judge a value against its space the
same way for a dict env (:mod:`corral.checks.env_rules`) and a batched one
(:mod:`corral.checks.batched_rules`).
"""

from __future__ import annotations

import contextlib
import numbers
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from gymnasium import spaces

from corral.arrays.tree import index, leaves_found, map_space
from corral.errors import CheckIncompleteWarning, EnvContractError
from corral.returned_values import describe, finite_problem

MAX_REPEATS = 3
"""Messages kept per rule; further violations of the same rule are only counted."""

STEP_CAP = 10_000
"""Default of the most steps :func:`check_env` plays for its first episode to end."""


@dataclass
class CheckReport:
    """What :func:`check_env` found: ``ok`` when ``violations`` is empty."""

    env: str
    seed: int
    steps: int = 0
    """Steps taken in the checked rollout."""
    episodes: int = 0
    """Episodes of the checked rollout that reached their end."""
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No violation was found (see :attr:`complete` for whether every rule was checked)."""
        return not self.violations

    @property
    def complete(self) -> bool:
        """An episode ended, so the rules about how episodes end were checked too."""
        return self.episodes > 0

    @property
    def unchecked(self) -> str:
        """What was not checked, and why; empty when the check is complete."""
        if self.complete:
            return ""
        return (
            f"no episode ended within {self.steps} steps, so the rules about how an episode "
            "ends (ended agents leave with a final_obs, obs is empty at the end, the next "
            "reset starts afresh) were not checked; raise step_cap (corral check --step-cap) "
            "or make the env's episodes shorter"
        )

    @property
    def head(self) -> str:
        """What was checked, as the report's first line begins."""
        return f"{self.env} (seed {self.seed}, {self.steps} steps, {self.episodes} episodes)"

    def __str__(self) -> str:
        head = self.head
        if self.ok and self.complete:
            return f"{head}: ok, no contract violation found"
        if self.ok:
            return f"{head}: incomplete, no contract violation found, but {self.unchecked}"
        lines = "\n".join(f"  - {v}" for v in self.violations)
        note = "" if self.complete or not self.steps else f"\n  ({self.unchecked})"
        return f"{head}: contract violations:\n{lines}{note}"


def concluded(report: Any, name: str, raise_on_error: bool) -> Any:
    """``report``, raised as an :class:`EnvContractError` if it found violations (and
    ``raise_on_error``), with a :class:`CheckIncompleteWarning` if it could not finish."""
    if raise_on_error and not report.ok:
        raise EnvContractError(report.violations)
    if report.ok and not report.complete:
        warnings.warn(f"{name}: {report.unchecked}", CheckIncompleteWarning, stacklevel=3)
    return report


class Findings:
    """The violations found so far, at most :data:`MAX_REPEATS` messages per rule."""

    def __init__(self) -> None:
        self._messages: list[str] = []
        self._counts: Counter[str] = Counter()

    def add(self, rule: str, message: str) -> None:
        """Record a violation of ``rule``; its message is kept if few of the rule's are."""
        self._counts[rule] += 1
        if self._counts[rule] <= MAX_REPEATS:
            self._messages.append(message)

    def violations(self) -> list[str]:
        """The messages kept, then how many more each rule had."""
        hidden = [
            f"... and {n - MAX_REPEATS} more violation(s) of the rule {rule.strip('_')!r}"
            for rule, n in self._counts.items()
            if n > MAX_REPEATS
        ]
        return self._messages + hidden

    def apply(self, rules: tuple[Callable[..., Iterator[str]], ...], *args: Any) -> None:
        """Record what each rule, called with ``args``, yields (under the rule's name)."""
        for rule in rules:
            for message in rule(*args):
                self.add(rule.__name__, message)

    def check_spaces_unchanged(self, env: Any, before: dict[tuple[str, Any], Any]) -> None:
        """Record each space of ``env`` that differs from ``before`` (:func:`spaces_of`)."""
        after = attempt("after playing", "getting the spaces", spaces_of, env)
        for (kind, agent), space in after.items():
            if space != before[(kind, agent)]:
                self.add(
                    "spaces_are_fixed",
                    f"env.{kind}({agent!r}) changed while playing: {before[(kind, agent)]} "
                    f"became {space}",
                )


# --------------------------------------------------------------------------- judging values


def in_space(space: spaces.Space, value: Any) -> bool:
    """Whether ``value`` is in ``space``: ``False`` where ``space.contains`` raises."""
    # contains() warns about what it casts (a scalar, a list, an overflow): the verdict is
    # what the checker reports, and a warning turned into an error must not end the check
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return bool(space.contains(value))
        except (TypeError, ValueError, AttributeError, IndexError):
            return False


def unfinite_parts(space: spaces.Space, value: Any, path: str) -> Iterator[tuple[str, str]]:
    """``(path, problem)`` of each Box part of ``value`` holding NaN, inf, or a number that
    overflows the Box's dtype (:func:`corral.returned_values.finite_problem`); a part that
    ``value`` lacks is left to the space check."""
    leaf_spaces = map_space(_itself, space)
    for where, leaf, part in leaves_found(leaf_spaces, value, path, index):
        if isinstance(leaf, spaces.Box) and part is not None:
            problem = finite_problem(part, leaf.dtype)
            if problem:
                yield where, problem


def _itself(space: spaces.Space) -> spaces.Space:
    return space


def is_step_count(value: Any) -> bool:
    """Whether ``value`` is a positive int (not a bool): a count of steps or copies."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) > 0


# --------------------------------------------------------------------------- calling the env


def spaces_of(env: Any) -> dict[tuple[str, Any], Any]:
    """``(kind, agent) -> space`` of every possible agent's observation and action space."""
    return {
        (kind, agent): getattr(env, kind)(agent)
        for agent in env.possible_agents
        for kind in ("observation_space", "action_space")
    }


def mask_of(infos: Any, agent: Any) -> Any:
    """``infos[agent]["action_mask"]``, or ``None`` where there is none."""
    info = infos.get(agent) if isinstance(infos, Mapping) else None
    return info.get("action_mask") if isinstance(info, Mapping) else None


class EnvFailed(Exception):
    """The env raised or returned garbage while being played; the rollout cannot go on."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


_ON_CALL: ContextVar[Callable[[str], None] | None] = ContextVar("on_env_call", default=None)


@contextlib.contextmanager
def reporting_calls(callback: Callable[[str], None]) -> Iterator[None]:
    """Within the block, a check calls ``callback(text)`` as it starts each call of the env
    (``"step 4: env.step"``): how ``corral check`` says where an env hung."""
    token = _ON_CALL.set(callback)
    try:
        yield
    finally:
        _ON_CALL.reset(token)


def attempt(where: str, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, a call of the env at ``where``; any exception it raises becomes an
    :class:`EnvFailed` that says ``what`` raised it."""
    on_call = _ON_CALL.get()
    if on_call is not None:
        on_call(f"{where}: {what}")
    try:
        return fn(*args)
    except Exception as err:  # any failure of the env is reported, not propagated
        raise EnvFailed(where, f"{what} raised {type(err).__name__}: {err}") from err


def reset_env(env: Any, seed: int | None, where: str) -> tuple[dict, dict]:
    """``env.reset(seed=seed)``, which must return ``(obs, infos)``; else :class:`EnvFailed`."""
    result = attempt(where, f"env.reset(seed={seed})", lambda: env.reset(seed=seed))
    if not (
        isinstance(result, tuple)
        and len(result) == 2
        and all(isinstance(part, dict) for part in result)
    ):
        raise EnvFailed(
            where, f"env.reset must return (obs, infos), two dicts; got {describe(result)}"
        )
    return result


def step_env(env: Any, actions: dict, where: str) -> tuple[dict, dict, dict, dict, dict]:
    """``env.step(actions)``, which must return five dicts; else :class:`EnvFailed`."""
    result = attempt(where, "env.step", env.step, actions)
    if not (
        isinstance(result, tuple)
        and len(result) == 5
        and all(isinstance(part, dict) for part in result)
    ):
        raise EnvFailed(
            where,
            f"env.step must return (obs, rewards, terminations, truncations, infos), "
            f"five dicts; got {describe(result)}",
        )
    return result
