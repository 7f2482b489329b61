"""The conformance checker: plays an env and lists every way it breaks the env contract.

:func:`check_env` plays a few seeded episodes with a random legal policy (the
first one to its end, within a cap) and checks every reset and step against
the rules of the contract (:mod:`corral.env`). It then replays the same seed
to check that the env is deterministic, and replays it once more after
sending bad actions to check that they are rejected with a ``ValueError`` and
change nothing.

Each rule is a small function that yields one message per violation; a message
names the step and the agent, e.g. ``"step 4: agent 'prey_0' was revived after
its episode ended at step 2"``. A batched env (:class:`corral.BatchedEnv`) is
checked by :mod:`corral.checks.batched_checker`, against the rules of
:mod:`corral.checks.batched_rules`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import math
import numbers
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import singledispatch
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.checks.values import describe, finite_problem
from corral.env import spaces_by_agent_hint
from corral.errors import CheckIncompleteWarning, EnvContractError

MAX_REPEATS = 3
"""Messages kept per rule; further violations of the same rule are only counted."""

STEP_CAP = 10_000
"""Default of the most steps :func:`check_env` plays for its first episode to end."""

_NOT_AN_AGENT = "__not_an_agent__"


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


def check_env(
    env: Any,
    *,
    seed: int = 0,
    max_steps: int = 300,
    episodes: int = 2,
    step_cap: int = STEP_CAP,
    env_kwargs: Mapping[str, Any] | None = None,
    raise_on_error: bool = True,
    dict_env: Callable[[], Any] | None = None,
) -> CheckReport:
    """Check ``env`` (an env, or an id for :func:`corral.make`) against the env contract.

    A :class:`corral.BatchedEnv`, or an id registered only natively batched, is checked by
    :func:`corral.checks.batched_checker.check_batched_env` (with ``dict_env``, the dict env it
    implements, if given).

    Plays up to ``episodes`` episodes and ``max_steps`` steps in all, starting
    with ``reset(seed=seed)``, and reports every violation found (at most
    :data:`MAX_REPEATS` messages per rule). The first episode, though, plays
    on past ``max_steps`` until it ends, up to ``step_cap`` steps, so that the
    rules about how episodes end are checked; if it does not end, the report
    is not :attr:`~CheckReport.complete` and a :class:`CheckIncompleteWarning`
    says so. ``env_kwargs`` go to :func:`corral.make` when ``env`` is an id;
    an env built from an id is closed at the end. Raises
    :class:`~corral.errors.EnvContractError` listing the violations if there
    are any and ``raise_on_error`` is true.
    """
    from corral.adapters import adapt
    from corral.batched_env import BatchedEnv
    from corral.checks.batched_checker import check_batched_env
    from corral.registry import make, spec

    if isinstance(env, BatchedEnv) or (isinstance(env, str) and spec(env).entry_point is None):
        return check_batched_env(
            env,
            seed=seed,
            max_steps=max_steps,
            episodes=episodes,
            step_cap=step_cap,
            dict_env=dict_env,
            env_kwargs=env_kwargs,
            raise_on_error=raise_on_error,
        )
    built = isinstance(env, str)
    name = env if built else type(env).__name__
    env = make(env, **(env_kwargs or {})) if built else adapt(env)
    try:
        report = _Checker(env, seed).run(name, max_steps, episodes, step_cap)
    finally:
        if built:
            env.close()
    return _concluded(report, name, raise_on_error)


def _concluded(report: Any, name: str, raise_on_error: bool) -> Any:
    """``report``, raised as an :class:`EnvContractError` if it found violations (and
    ``raise_on_error``), with a :class:`CheckIncompleteWarning` if it could not finish."""
    if raise_on_error and not report.ok:
        raise EnvContractError(report.violations)
    if report.ok and not report.complete:
        warnings.warn(f"{name}: {report.unchecked}", CheckIncompleteWarning, stacklevel=3)
    return report


class RandomPolicy:
    """Seeded, uniformly random actions for the agents in ``obs``, legal under their masks.

    Samples from copies of the env's action spaces, so the env's own spaces
    and their random generators are left untouched.
    """

    def __init__(self, env: Any, seed: int | None = None) -> None:
        self._env = env
        self._seed = seed
        self._spaces: dict[Any, spaces.Space] = {}

    def sample(self, agent: Any, mask: Any = None) -> Any:
        """A random action of ``agent``; a valid Discrete ``mask`` restricts it."""
        space = self._spaces.get(agent)
        if space is None:
            space = copy.deepcopy(self._env.action_space(agent))
            space.seed(None if self._seed is None else self._seed + len(self._spaces))
            self._spaces[agent] = space
        if isinstance(space, spaces.Discrete) and _usable_mask(mask, int(space.n)):
            return space.sample(mask=np.asarray(mask, dtype=np.int8))
        return space.sample()

    def __call__(self, obs: Mapping[Any, Any], infos: Mapping[Any, Any]) -> dict[Any, Any]:
        """Actions for exactly the agents in ``obs``."""
        return {agent: self.sample(agent, _mask_of(infos, agent)) for agent in obs}


def _mask_of(infos: Any, agent: Any) -> Any:
    info = infos.get(agent) if isinstance(infos, Mapping) else None
    return info.get("action_mask") if isinstance(info, Mapping) else None


def _usable_mask(mask: Any, n: int) -> bool:
    return isinstance(mask, np.ndarray) and mask.shape == (n,) and bool(np.any(mask))


# --------------------------------------------------------------------------- frames


@dataclass
class _Frame:
    """What one ``reset`` or ``step`` returned, with what the rules need to judge it."""

    where: str
    obs: dict
    infos: dict
    agents: list
    """``env.agents`` right after the call."""
    gone: dict[Any, str] = field(default_factory=dict)
    """Agents whose episode ended earlier in this episode -> where it ended."""
    alive_before: list | None = None
    """``env.agents`` when the step began; ``None`` for a reset."""
    rewards: dict = field(default_factory=dict)
    terminations: dict = field(default_factory=dict)
    truncations: dict = field(default_factory=dict)
    episode_steps: int = 0
    """Steps taken in this episode, this one included."""

    @property
    def ended(self) -> list:
        """Agents whose termination or truncation is set in this step."""
        flagged = {**self.terminations, **self.truncations}
        return [
            a
            for a in flagged
            if _truthy(self.terminations.get(a)) or _truthy(self.truncations.get(a))
        ]

    def step_dicts(self) -> Iterator[tuple[str, dict]]:
        yield "rewards", self.rewards
        yield "terminations", self.terminations
        yield "truncations", self.truncations


def _truthy(value: Any) -> bool:
    try:
        return bool(value)
    except (TypeError, ValueError):  # e.g. an array: reported by _end_flags_are_bools
        return False


def _where(episode: int, step: int | None) -> str:
    call = "reset" if step is None else f"step {step}"
    return call if episode == 0 else f"episode {episode}, {call}"


# --------------------------------------------------------------------------- rules

Rule = Callable[[Any, _Frame], Iterator[str]]


def _in_space(space: spaces.Space, value: Any) -> bool:
    # contains() warns about what it casts (a scalar, a list, an overflow): the verdict is
    # what the checker reports, and a warning turned into an error must not end the check
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return bool(space.contains(value))
        except (TypeError, ValueError, AttributeError, IndexError):
            return False


def _possible(env: Any) -> list:
    return list(env.possible_agents)


def _agents_are_possible_agents(env: Any, frame: _Frame) -> Iterator[str]:
    possible = _possible(env)
    for agent in frame.agents:
        if agent not in possible:
            yield (
                f"{frame.where}: env.agents holds {agent!r}, which is not one of "
                f"possible_agents {possible}"
            )


def _agents_are_listed_once(env: Any, frame: _Frame) -> Iterator[str]:
    for agent, count in Counter(frame.agents).items():
        if count > 1:
            yield (
                f"{frame.where}: env.agents lists agent {agent!r} {count} times; each live "
                "agent is listed once (an agent that joins mid-episode is added once)"
            )


def _obs_keys_are_live_agents(env: Any, frame: _Frame) -> Iterator[str]:
    possible = _possible(env)
    for agent in frame.obs:
        if agent not in possible:
            yield (
                f"{frame.where}: obs holds agent {agent!r}, which is not one of "
                f"possible_agents {possible}"
            )
        elif frame.agents and agent not in frame.agents:
            yield (
                f"{frame.where}: obs holds agent {agent!r}, which is not in env.agents "
                f"{frame.agents}; only live agents may be asked to act (an agent that joins "
                "mid-episode enters env.agents no later than obs)"
            )


def _simultaneous_envs_ask_every_live_agent(env: Any, frame: _Frame) -> Iterator[str]:
    if getattr(env, "simultaneous", False) and set(frame.obs) != set(frame.agents):
        yield (
            f"{frame.where}: the env declares simultaneous = True, but obs holds "
            f"{list(frame.obs)} while env.agents is {frame.agents}; every live agent must "
            "act at every step of a simultaneous env"
        )


def _obs_in_observation_spaces(env: Any, frame: _Frame) -> Iterator[str]:
    possible = _possible(env)
    for agent, value in frame.obs.items():
        space = env.observation_space(agent) if agent in possible else None
        if space is not None and not _in_space(space, value):
            yield (
                f"{frame.where}: observation of agent {agent!r} is not in its observation "
                f"space {space}: got {describe(value)}"
            )


@singledispatch
def _unfinite_parts(space: spaces.Space, value: Any, path: str) -> Iterator[tuple[str, str]]:
    """``(path, problem)`` of each Box part of ``value`` holding NaN, inf, or a number that
    overflows the Box's dtype (:func:`corral.checks.values.finite_problem`)."""
    return iter(())


@_unfinite_parts.register
def _(space: spaces.Box, value: Any, path: str) -> Iterator[tuple[str, str]]:
    problem = finite_problem(value, space.dtype)
    if problem:
        yield path, problem


@_unfinite_parts.register
def _(space: spaces.Dict, value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, Mapping):
        for key, sub in space.spaces.items():
            if key in value:
                yield from _unfinite_parts(sub, value[key], f"{path}[{key!r}]")


@_unfinite_parts.register
def _(space: spaces.Tuple, value: Any, path: str) -> Iterator[tuple[str, str]]:
    if isinstance(value, (tuple, list)):
        for k, (sub, part) in enumerate(zip(space.spaces, value, strict=False)):
            yield from _unfinite_parts(sub, part, f"{path}[{k}]")


def _observations_are_finite(env: Any, frame: _Frame) -> Iterator[str]:
    possible = _possible(env)
    observed = [(agent, "observation", value) for agent, value in frame.obs.items()]
    for agent in frame.ended:
        info = frame.infos.get(agent)
        if isinstance(info, Mapping) and "final_obs" in info:
            observed.append((agent, "final_obs", info["final_obs"]))
    for agent, what, value in observed:
        if agent not in possible:
            continue
        for path, problem in _unfinite_parts(env.observation_space(agent), value, ""):
            yield f"{frame.where}: {what}{path} of agent {agent!r}: expected {problem}"


def _episode_end_has_no_obs(env: Any, frame: _Frame) -> Iterator[str]:
    if frame.agents and not frame.obs:
        yield (
            f"{frame.where}: env.agents is {frame.agents} but obs is empty; obs must hold the "
            "agents that act next, so the episode cannot go on"
        )
    if not frame.agents and frame.obs:
        yield (
            f"{frame.where}: the episode is over (env.agents is empty) but obs holds "
            f"{list(frame.obs)}; it must be empty"
        )


def _infos_cover_acting_agents(env: Any, frame: _Frame) -> Iterator[str]:
    for agent in frame.obs:
        if agent not in frame.infos:
            yield f"{frame.where}: infos has no entry for agent {agent!r}, which is in obs"
        elif not isinstance(frame.infos[agent], Mapping):
            yield (
                f"{frame.where}: infos[{agent!r}] must be a dict, "
                f"got {type(frame.infos[agent]).__name__}"
            )


def _masks(frame: _Frame) -> Iterator[tuple[Any, Any]]:
    for agent in frame.obs:
        mask = _mask_of(frame.infos, agent)
        if mask is not None:
            yield agent, mask


def _action_mask_is_a_0_1_array(env: Any, frame: _Frame) -> Iterator[str]:
    for agent, mask in _masks(frame):
        name = f"{frame.where}: infos[{agent!r}]['action_mask']"
        if not isinstance(mask, np.ndarray):
            yield f"{name} must be a numpy array of 0/1, got {describe(mask)}"
        elif mask.ndim != 1:
            yield f"{name} must be 1-D, got shape {mask.shape}"
        elif mask.dtype != np.int8:
            yield (
                f"{name} must have dtype int8, the dtype Gymnasium's Discrete.sample(mask=...) "
                f"takes, got dtype {mask.dtype}: return mask.astype(np.int8)"
            )
        elif not np.all((mask == 0) | (mask == 1)):
            yield f"{name} must hold only 0 and 1, got {np.unique(mask).tolist()}"


def _action_mask_fits_action_space(env: Any, frame: _Frame) -> Iterator[str]:
    for agent, mask in _masks(frame):
        space = env.action_space(agent) if agent in _possible(env) else None
        if isinstance(space, spaces.Discrete) and np.shape(mask) != (space.n,):
            yield (
                f"{frame.where}: infos[{agent!r}]['action_mask'] has shape {np.shape(mask)}, "
                f"but the action space {space} has {space.n} actions"
            )


def _action_mask_allows_an_action(env: Any, frame: _Frame) -> Iterator[str]:
    for agent, mask in _masks(frame):
        if isinstance(mask, np.ndarray) and mask.size and not np.any(mask):
            yield (
                f"{frame.where}: infos[{agent!r}]['action_mask'] is all zeros; an agent in obs "
                "must have at least one legal action"
            )


def _no_revived_agents(env: Any, frame: _Frame) -> Iterator[str]:
    for agent, ended_at in frame.gone.items():
        if agent in frame.agents or agent in frame.obs:
            yield (
                f"{frame.where}: agent {agent!r} was revived after its episode ended at {ended_at}"
            )


def _state_in_state_space(env: Any, frame: _Frame) -> Iterator[str]:
    space = getattr(env, "state_space", None)
    if space is None or not frame.agents:  # no state is owed once the episode is over
        return
    if not isinstance(space, spaces.Space):
        yield f"{frame.where}: env.state_space must be a gymnasium space, got {describe(space)}"
        return
    try:
        state = env.state()
    except Exception as err:  # the env's own failure is the finding
        yield f"{frame.where}: env.state() raised {type(err).__name__}: {err}"
        return
    if not _in_space(space, state):
        yield (
            f"{frame.where}: env.state() is not in env.state_space {space}: got {describe(state)}"
        )


def _state_is_finite(env: Any, frame: _Frame) -> Iterator[str]:
    space = getattr(env, "state_space", None)
    if not isinstance(space, spaces.Space) or not frame.agents:
        return
    try:
        state = env.state()
    except Exception:  # reported by _state_in_state_space
        return
    for path, problem in _unfinite_parts(space, state, ""):
        yield f"{frame.where}: env.state(){path}: expected {problem}"


def _step_dicts_name_alive_agents(env: Any, frame: _Frame) -> Iterator[str]:
    possible = _possible(env)
    for name, values in frame.step_dicts():
        for agent in values:
            if agent not in possible:
                why = f"which is not one of possible_agents {possible}"
            elif agent in frame.gone:
                why = f"whose episode already ended at {frame.gone[agent]}"
            elif agent not in frame.alive_before:
                why = "which was not alive when the step began"
            else:
                continue
            yield f"{frame.where}: {name} names agent {agent!r}, {why}"


def _step_dicts_cover_alive_agents(env: Any, frame: _Frame) -> Iterator[str]:
    for name, values in frame.step_dicts():
        for agent in frame.alive_before:
            if agent not in values:
                yield (
                    f"{frame.where}: {name} has no entry for agent {agent!r}, which was alive "
                    "when the step began"
                )


def _rewards_are_finite_numbers(env: Any, frame: _Frame) -> Iterator[str]:
    for agent, reward in frame.rewards.items():
        if not isinstance(reward, numbers.Real) or isinstance(reward, bool):
            yield (
                f"{frame.where}: reward of agent {agent!r} must be a number, got {describe(reward)}"
            )
        elif not math.isfinite(reward):
            yield f"{frame.where}: reward of agent {agent!r} is {reward}; rewards must be finite"


def _end_flags_are_bools(env: Any, frame: _Frame) -> Iterator[str]:
    for name, values in frame.step_dicts():
        if name == "rewards":
            continue
        for agent, flag in values.items():
            if not isinstance(flag, (bool, np.bool_)):
                yield f"{frame.where}: {name}[{agent!r}] must be a bool, got {describe(flag)}"


def _ended_agents_leave(env: Any, frame: _Frame) -> Iterator[str]:
    for agent in frame.ended:
        if agent in frame.agents:
            yield f"{frame.where}: agent {agent!r} ended but is still in env.agents"
        if agent in frame.obs:
            yield (
                f"{frame.where}: agent {agent!r} ended but is still in obs; its last "
                "observation belongs in infos[agent]['final_obs']"
            )


def _ended_agents_have_final_obs(env: Any, frame: _Frame) -> Iterator[str]:
    for agent in frame.ended:
        info = frame.infos.get(agent)
        if not isinstance(info, Mapping) or "final_obs" not in info:
            yield (
                f"{frame.where}: agent {agent!r} ended but infos[{agent!r}]['final_obs'] "
                "(its last observation) is missing"
            )
        elif agent in _possible(env):
            space = env.observation_space(agent)
            if not _in_space(space, info["final_obs"]):
                yield (
                    f"{frame.where}: infos[{agent!r}]['final_obs'] is not in the observation "
                    f"space {space}: got {describe(info['final_obs'])}"
                )


def _agents_leave_only_by_ending(env: Any, frame: _Frame) -> Iterator[str]:
    ended = frame.ended
    for agent in frame.alive_before:
        if agent not in frame.agents and agent not in ended:
            yield (
                f"{frame.where}: agent {agent!r} left env.agents without terminations or "
                "truncations set to True"
            )


def _episode_ends_within_max_episode_steps(env: Any, frame: _Frame) -> Iterator[str]:
    limit = getattr(env, "max_episode_steps", None)
    if _is_step_count(limit) and frame.agents and frame.episode_steps == limit:
        yield (
            f"{frame.where}: the episode goes on after {limit} steps, but env.max_episode_steps "
            f"is {limit}; an episode must end within max_episode_steps"
        )


def _is_step_count(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value > 0


FRAME_RULES: tuple[Rule, ...] = (
    _agents_are_possible_agents,
    _agents_are_listed_once,
    _obs_keys_are_live_agents,
    _simultaneous_envs_ask_every_live_agent,
    _obs_in_observation_spaces,
    _observations_are_finite,
    _episode_end_has_no_obs,
    _infos_cover_acting_agents,
    _action_mask_is_a_0_1_array,
    _action_mask_fits_action_space,
    _action_mask_allows_an_action,
    _no_revived_agents,
    _state_in_state_space,
    _state_is_finite,
)
"""Rules checked on what every ``reset`` and ``step`` returns."""

STEP_RULES: tuple[Rule, ...] = (
    _step_dicts_name_alive_agents,
    _step_dicts_cover_alive_agents,
    _rewards_are_finite_numbers,
    _end_flags_are_bools,
    _ended_agents_leave,
    _ended_agents_have_final_obs,
    _agents_leave_only_by_ending,
    _episode_ends_within_max_episode_steps,
)
"""Rules checked on what every ``step`` returns."""


# --------------------------------------------------------------------------- env-wide rules


def _possible_agents_are_unique_ids(env: Any) -> Iterator[str]:
    possible = getattr(env, "possible_agents", None)
    if not isinstance(possible, (list, tuple)) or not possible:
        yield f"env.possible_agents must be a non-empty list of agent ids, got {possible!r}"
    elif len(set(possible)) != len(possible) or not all(isinstance(a, str) for a in possible):
        yield f"env.possible_agents must hold unique string ids, got {possible!r}"


def _max_episode_steps_is_a_step_count(env: Any) -> Iterator[str]:
    limit = getattr(env, "max_episode_steps", None)
    if limit is not None and not _is_step_count(limit):
        yield f"env.max_episode_steps must be a positive int or None, got {describe(limit)}"


def _spaces_are_methods(env: Any) -> Iterator[str]:
    for kind in ("observation_space", "action_space"):
        value = getattr(env, kind, None)
        if callable(value):
            continue
        if isinstance(value, spaces.Space):
            found = f"a gymnasium space, {value}"
        elif isinstance(value, Mapping):
            found = f"a dict keyed by {list(value)!r}"
        else:
            found = describe(value)
        yield (
            f"env.{kind} is {found}, not a method: the contract asks each agent's space as "
            f"env.{kind}(agent), which returns a gymnasium space. {spaces_by_agent_hint(kind)}"
        )


def _spaces_of(env: Any) -> dict[tuple[str, Any], Any]:
    return {
        (kind, agent): getattr(env, kind)(agent)
        for agent in _possible(env)
        for kind in ("observation_space", "action_space")
    }


def _spaces_are_fixed_gymnasium_spaces(env: Any) -> Iterator[str]:
    first, second = _spaces_of(env), _spaces_of(env)
    for (kind, agent), space in first.items():
        if not isinstance(space, spaces.Space):
            yield f"env.{kind}({agent!r}) must be a gymnasium space, got {describe(space)}"
        elif space is not second[(kind, agent)] and space != second[(kind, agent)]:
            yield (
                f"env.{kind}({agent!r}) returned a different space on a second call "
                f"({space} then {second[(kind, agent)]}); spaces are fixed for the env's lifetime"
            )


# --------------------------------------------------------------------------- fingerprints


@dataclass(frozen=True)
class _Digest:
    """An array, by shape, dtype and a hash of its bytes."""

    shape: tuple[int, ...]
    dtype: str
    digest: str


def _fingerprint(value: Any) -> Any:
    """``value`` with arrays replaced by digests: equal for equal values, small to keep."""
    if isinstance(value, Mapping):
        return {k: _fingerprint(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_fingerprint(v) for v in value)
    if isinstance(value, np.ndarray):
        data = value.tobytes() if value.dtype != object else repr(value.tolist()).encode()
        return _Digest(value.shape, value.dtype.str, hashlib.blake2b(data).hexdigest())
    if isinstance(value, (numbers.Number, str, bytes, type(None), np.generic)):
        return value
    return repr(value)


def _difference(a: Any, b: Any, path: str) -> str | None:
    """The path of the first place where two fingerprints differ, or ``None``."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if list(a) != list(b):
            return f"{path} keys ({list(a)} vs {list(b)})"
        for key in a:
            found = _difference(a[key], b[key], f"{path}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return None
    try:
        same = bool(a == b)
    except (TypeError, ValueError):
        same = False
    return None if same else path


@dataclass
class _Record:
    where: str
    data: dict[str, Any]


# --------------------------------------------------------------------------- rollouts


class _EnvFailed(Exception):
    """The env raised or returned garbage while being played; the rollout cannot go on."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


@dataclass
class _Rollout:
    records: list[_Record] = field(default_factory=list)
    steps: int = 0
    episodes: int = 0


class _Findings:
    """The violations found so far, at most :data:`MAX_REPEATS` messages per rule."""

    def __init__(self) -> None:
        self._messages: list[str] = []
        self._counts: Counter[str] = Counter()

    def add(self, rule: str, message: str) -> None:
        self._counts[rule] += 1
        if self._counts[rule] <= MAX_REPEATS:
            self._messages.append(message)

    def violations(self) -> list[str]:
        hidden = [
            f"... and {n - MAX_REPEATS} more violation(s) of the rule {rule.strip('_')!r}"
            for rule, n in self._counts.items()
            if n > MAX_REPEATS
        ]
        return self._messages + hidden

    def apply(self, rules: tuple[Callable[..., Iterator[str]], ...], *args: Any) -> None:
        for rule in rules:
            for message in rule(*args):
                self.add(rule.__name__, message)

    def check_spaces_unchanged(self, env: Any, before: dict[tuple[str, Any], Any]) -> None:
        after = _attempt("after playing", "getting the spaces", _spaces_of, env)
        for (kind, agent), space in after.items():
            if space != before[(kind, agent)]:
                self.add(
                    "spaces_are_fixed",
                    f"env.{kind}({agent!r}) changed while playing: {before[(kind, agent)]} "
                    f"became {space}",
                )


class _Checker(_Findings):
    def __init__(self, env: Any, seed: int) -> None:
        super().__init__()
        self.env = env
        self.seed = seed

    def run(self, name: str, max_steps: int, episodes: int, step_cap: int) -> CheckReport:
        self.apply((_possible_agents_are_unique_ids, _spaces_are_methods), self.env)
        if self._messages:
            return CheckReport(name, self.seed, violations=self.violations())
        try:
            spaces_before = _attempt("before reset", "getting the spaces", _spaces_of, self.env)
            self.apply((_spaces_are_fixed_gymnasium_spaces,), self.env)
            self.apply((_max_episode_steps_is_a_step_count,), self.env)
        except _EnvFailed as err:
            self.add("env_does_not_raise", str(err))
            return CheckReport(name, self.seed, violations=self.violations())
        if not all(isinstance(space, spaces.Space) for space in spaces_before.values()):
            return CheckReport(name, self.seed, violations=self.violations())

        main = self._play(max_steps, episodes, step_cap, check=True)
        try:
            self.check_spaces_unchanged(self.env, spaces_before)
        except _EnvFailed as err:
            self.add("env_does_not_raise", str(err))
        replay = self._play(max_steps, episodes, step_cap)
        differs = self._compare(
            main,
            replay,
            "{where}: {what} differs between two runs that both call reset(seed={seed}) and take "
            "the same actions; the env must be deterministic given the seed",
        )
        if not differs and main.records:
            probed = self._play(min(main.steps, 20), 1, 0, probe=True)
            self._compare(
                main,
                probed,
                "{where}: {what} differs from a run without the bad actions that env.step "
                "rejected at step 0; env.step must check actions before changing any state",
                prefix_only=True,
            )
        return CheckReport(name, self.seed, main.steps, main.episodes, self.violations())

    def _compare(self, a: _Rollout, b: _Rollout, message: str, prefix_only: bool = False) -> bool:
        """Report the first record where ``b`` differs from ``a``; whether there was one.

        ``message`` is formatted with ``where``, ``what`` (what differs) and ``seed``.
        """
        for ra, rb in zip(a.records, b.records, strict=False):
            what = _record_difference(ra, rb)
            if what:
                self.add(
                    "same_seed_same_trajectory",
                    message.format(where=ra.where, what=what, seed=self.seed),
                )
                return True
        if not prefix_only and len(a.records) != len(b.records):
            self.add(
                "same_seed_same_trajectory",
                message.format(
                    where=f"after {len(a.records)} resets and steps",
                    what=f"the length of the run ({len(b.records)} resets and steps)",
                    seed=self.seed,
                ),
            )
            return True
        return False

    def _play(
        self,
        max_steps: int,
        episodes: int,
        step_cap: int,
        *,
        check: bool = False,
        probe: bool = False,
    ) -> _Rollout:
        """Play from ``reset(seed)``, checking the rules if ``check``, probing if ``probe``.

        The first episode plays on past ``max_steps``, up to ``step_cap`` steps, until it ends.
        """
        rollout = _Rollout()
        policy = RandomPolicy(self.env, self.seed)
        try:
            for episode in range(episodes):
                if episode and rollout.steps >= max_steps:
                    break
                limit = max(max_steps, step_cap) if episode == 0 else max_steps
                self._play_episode(rollout, policy, episode, limit, check, probe)
        except _EnvFailed as err:
            rollout.records.append(_Record(err.where, {"error": err.message}))
            if check:
                self.add("env_does_not_raise", str(err))
        return rollout

    def _play_episode(
        self,
        rollout: _Rollout,
        policy: RandomPolicy,
        episode: int,
        max_steps: int,
        check: bool,
        probe: bool,
    ) -> None:
        seed = self.seed + episode
        where = _where(episode, None)
        obs, infos = _reset(self.env, seed, where)
        frame = _Frame(where, obs, infos, list(self.env.agents))
        rollout.records.append(_Record(where, {"obs": _fingerprint(obs)}))
        if check:
            self.apply(FRAME_RULES, self.env, frame)
        if probe:
            obs, infos = self._probe_bad_actions(obs, infos, seed)
        gone: dict[Any, str] = {}
        step = 0
        while self.env.agents and obs and rollout.steps < max_steps:
            where = _where(episode, step)
            alive = list(self.env.agents)
            actions = _attempt(where, "sampling actions from env.action_space", policy, obs, infos)
            obs, rewards, terms, truncs, infos = _step(self.env, actions, where)
            rollout.steps += 1
            frame = _Frame(
                where,
                obs,
                infos,
                list(self.env.agents),
                dict(gone),
                alive,
                rewards,
                terms,
                truncs,
                step + 1,
            )
            data = {"obs": obs, "rewards": rewards, "terminations": terms, "truncations": truncs}
            rollout.records.append(_Record(where, _fingerprint(data)))
            if check:
                self.apply(FRAME_RULES + STEP_RULES, self.env, frame)
            for agent in list(gone):
                if agent in frame.agents or agent in obs:
                    del gone[agent]  # revived: reported once, then treated as alive
            gone.update((agent, where) for agent in frame.ended)
            step += 1
        if not self.env.agents:
            rollout.episodes += 1

    def _probe_bad_actions(self, obs: dict, infos: dict, seed: int) -> tuple[dict, dict]:
        """Send bad actions at step 0; each must raise a ValueError and change nothing."""
        sampler = RandomPolicy(self.env, self.seed + 1)
        good = _attempt("step 0", "sampling actions from env.action_space", sampler, obs, infos)
        if not good:
            return obs, infos
        idle = next((a for a in _possible(self.env) if a not in obs), None)
        extra = idle if idle is not None else _NOT_AN_AGENT
        dropped = next(iter(good))
        extra_action = _attempt(
            "step 0", "sampling actions", sampler.sample, extra if idle is not None else dropped
        )
        probes = {
            f"an action for {extra!r} (not an acting agent)": {**good, extra: extra_action},
            f"no action for {dropped!r} (an acting agent)": {
                a: v for a, v in good.items() if a != dropped
            },
        }
        for what, actions in probes.items():
            try:
                self.env.step(actions)
            except ValueError:
                continue
            except Exception as err:  # the wrong exception type is the finding
                self.add(
                    "rejects_bad_actions",
                    f"step 0: given {what}, env.step raised {type(err).__name__} instead of a "
                    "ValueError (use corral.env.validate_actions)",
                )
            else:
                self.add(
                    "rejects_bad_actions",
                    f"step 0: env.step accepted {what} instead of raising a ValueError; call "
                    "corral.env.validate_actions before changing any state",
                )
            obs, infos = _reset(self.env, seed, "reset")
        return obs, infos


def _record_difference(a: _Record, b: _Record) -> str | None:
    """What differs between two records of the same point of two runs, or ``None``."""
    if a.where != b.where:
        return f"where the run is ({b.where} in the other run)"
    if "error" in a.data or "error" in b.data:
        if a.data == b.data:
            return None
        first = a.data.get("error", "nothing")
        second = b.data.get("error", "nothing")
        return f"what the env raised ({first!r} vs {second!r})"
    for key in a.data:
        path = _difference(a.data[key], b.data.get(key), key)
        if path:
            return path
    return None


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


def _attempt(where: str, what: str, fn: Callable[..., Any], *args: Any) -> Any:
    on_call = _ON_CALL.get()
    if on_call is not None:
        on_call(f"{where}: {what}")
    try:
        return fn(*args)
    except Exception as err:  # any failure of the env is reported, not propagated
        raise _EnvFailed(where, f"{what} raised {type(err).__name__}: {err}") from err


def _reset(env: Any, seed: int, where: str) -> tuple[dict, dict]:
    result = _attempt(where, f"env.reset(seed={seed})", lambda: env.reset(seed=seed))
    if not (
        isinstance(result, tuple)
        and len(result) == 2
        and all(isinstance(part, dict) for part in result)
    ):
        raise _EnvFailed(
            where, f"env.reset must return (obs, infos), two dicts; got {describe(result)}"
        )
    return result


def _step(env: Any, actions: dict, where: str) -> tuple[dict, dict, dict, dict, dict]:
    result = _attempt(where, "env.step", env.step, actions)
    if not (
        isinstance(result, tuple)
        and len(result) == 5
        and all(isinstance(part, dict) for part in result)
    ):
        raise _EnvFailed(
            where,
            f"env.step must return (obs, rewards, terminations, truncations, infos), "
            f"five dicts; got {describe(result)}",
        )
    return result
