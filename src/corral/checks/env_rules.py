"""The rules of the env contract (:mod:`corral.env`), each a function that yields one message
per violation.

A reset or step is read into a :class:`Frame` (what it returned, with what the rules need:
the agents alive when the step began, those whose episode ended earlier); the frame rules
judge it, and the env-wide rules judge the env once, before it is played. A message names
the step and the agent, e.g. ``"step 4: agent 'prey_0' was revived after its episode ended
at step 2"``. :mod:`corral.checks.env_checker` plays an env and applies them; the batched
checker applies the env-wide ones too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.checks.engine import in_space, is_step_count, mask_of, spaces_of, unfinite_parts
from corral.env import spaces_by_agent_hint
from corral.returned_values import describe, is_end_flag, is_finite, is_reward, nonflag_flags

# --------------------------------------------------------------------------- frames


@dataclass
class Frame:
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

    @property
    def alive_at_step(self) -> list:
        """:attr:`alive_before` of a step's frame (the step rules run on steps only)."""
        if self.alive_before is None:
            raise TypeError("a reset's frame has no agents alive before a step")
        return self.alive_before

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
        """``(name, dict)`` of the rewards, terminations and truncations of a step."""
        yield "rewards", self.rewards
        yield "terminations", self.terminations
        yield "truncations", self.truncations


def _truthy(value: Any) -> bool:
    try:
        return bool(value)
    except (TypeError, ValueError):  # e.g. an array: reported by _end_flags_are_bools
        return False


# --------------------------------------------------------------------------- rules

Rule = Callable[[Any, Frame], Iterator[str]]


def _possible(env: Any) -> list:
    return list(env.possible_agents)


def _agents_are_possible_agents(env: Any, frame: Frame) -> Iterator[str]:
    possible = _possible(env)
    for agent in frame.agents:
        if agent not in possible:
            yield (
                f"{frame.where}: env.agents holds {agent!r}, which is not one of "
                f"possible_agents {possible}"
            )


def _agents_are_listed_once(env: Any, frame: Frame) -> Iterator[str]:
    for agent, count in Counter(frame.agents).items():
        if count > 1:
            yield (
                f"{frame.where}: env.agents lists agent {agent!r} {count} times; each live "
                "agent is listed once (an agent that joins mid-episode is added once)"
            )


def _obs_keys_are_live_agents(env: Any, frame: Frame) -> Iterator[str]:
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


def _simultaneous_envs_ask_every_live_agent(env: Any, frame: Frame) -> Iterator[str]:
    if getattr(env, "simultaneous", False) and set(frame.obs) != set(frame.agents):
        yield (
            f"{frame.where}: the env declares simultaneous = True, but obs holds "
            f"{list(frame.obs)} while env.agents is {frame.agents}; every live agent must "
            "act at every step of a simultaneous env"
        )


def _obs_in_observation_spaces(env: Any, frame: Frame) -> Iterator[str]:
    possible = _possible(env)
    for agent, value in frame.obs.items():
        space = env.observation_space(agent) if agent in possible else None
        if space is not None and not in_space(space, value):
            yield (
                f"{frame.where}: observation of agent {agent!r} is not in its observation "
                f"space {space}: got {describe(value)}"
            )


def _observations_are_finite(env: Any, frame: Frame) -> Iterator[str]:
    possible = _possible(env)
    observed = [(agent, "observation", value) for agent, value in frame.obs.items()]
    for agent in frame.ended:
        info = frame.infos.get(agent)
        if isinstance(info, Mapping) and "final_obs" in info:
            observed.append((agent, "final_obs", info["final_obs"]))
    for agent, what, value in observed:
        if agent not in possible:
            continue
        for path, problem in unfinite_parts(env.observation_space(agent), value, ""):
            yield f"{frame.where}: {what}{path} of agent {agent!r}: expected {problem}"


def _episode_end_has_no_obs(env: Any, frame: Frame) -> Iterator[str]:
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


def _infos_cover_acting_agents(env: Any, frame: Frame) -> Iterator[str]:
    for agent in frame.obs:
        if agent not in frame.infos:
            yield f"{frame.where}: infos has no entry for agent {agent!r}, which is in obs"
        elif not isinstance(frame.infos[agent], Mapping):
            yield (
                f"{frame.where}: infos[{agent!r}] must be a dict, "
                f"got {type(frame.infos[agent]).__name__}"
            )


def _masks(frame: Frame) -> Iterator[tuple[Any, Any]]:
    for agent in frame.obs:
        mask = mask_of(frame.infos, agent)
        if mask is not None:
            yield agent, mask


def _action_mask_is_a_0_1_array(env: Any, frame: Frame) -> Iterator[str]:
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
        elif nonflag_flags(mask).any():
            yield f"{name} must hold only 0 and 1, got {np.unique(mask).tolist()}"


def _action_mask_fits_action_space(env: Any, frame: Frame) -> Iterator[str]:
    for agent, mask in _masks(frame):
        space = env.action_space(agent) if agent in _possible(env) else None
        if isinstance(space, spaces.Discrete) and np.shape(mask) != (space.n,):
            yield (
                f"{frame.where}: infos[{agent!r}]['action_mask'] has shape {np.shape(mask)}, "
                f"but the action space {space} has {space.n} actions"
            )


def _action_mask_allows_an_action(env: Any, frame: Frame) -> Iterator[str]:
    for agent, mask in _masks(frame):
        if isinstance(mask, np.ndarray) and mask.size and not np.any(mask):
            yield (
                f"{frame.where}: infos[{agent!r}]['action_mask'] is all zeros; an agent in obs "
                "must have at least one legal action"
            )


def _no_revived_agents(env: Any, frame: Frame) -> Iterator[str]:
    for agent, ended_at in frame.gone.items():
        if agent in frame.agents or agent in frame.obs:
            yield (
                f"{frame.where}: agent {agent!r} was revived after its episode ended at {ended_at}"
            )


def _state_in_state_space(env: Any, frame: Frame) -> Iterator[str]:
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
    if not in_space(space, state):
        yield (
            f"{frame.where}: env.state() is not in env.state_space {space}: got {describe(state)}"
        )


def _state_is_finite(env: Any, frame: Frame) -> Iterator[str]:
    space = getattr(env, "state_space", None)
    if not isinstance(space, spaces.Space) or not frame.agents:
        return
    try:
        state = env.state()
    except Exception:  # reported by _state_in_state_space
        return
    for path, problem in unfinite_parts(space, state, ""):
        yield f"{frame.where}: env.state(){path}: expected {problem}"


def _step_dicts_name_alive_agents(env: Any, frame: Frame) -> Iterator[str]:
    possible = _possible(env)
    for name, values in frame.step_dicts():
        for agent in values:
            if agent not in possible:
                why = f"which is not one of possible_agents {possible}"
            elif agent in frame.gone:
                why = f"whose episode already ended at {frame.gone[agent]}"
            elif agent not in frame.alive_at_step:
                why = "which was not alive when the step began"
            else:
                continue
            yield f"{frame.where}: {name} names agent {agent!r}, {why}"


def _step_dicts_cover_alive_agents(env: Any, frame: Frame) -> Iterator[str]:
    for name, values in frame.step_dicts():
        for agent in frame.alive_at_step:
            if agent not in values:
                yield (
                    f"{frame.where}: {name} has no entry for agent {agent!r}, which was alive "
                    "when the step began"
                )


def _rewards_are_finite_numbers(env: Any, frame: Frame) -> Iterator[str]:
    for agent, reward in frame.rewards.items():
        if not is_reward(reward):
            yield (
                f"{frame.where}: reward of agent {agent!r} must be a number, got {describe(reward)}"
            )
        elif not is_finite(reward):
            yield f"{frame.where}: reward of agent {agent!r} is {reward}; rewards must be finite"


def _end_flags_are_bools(env: Any, frame: Frame) -> Iterator[str]:
    for name, values in frame.step_dicts():
        if name == "rewards":
            continue
        for agent, flag in values.items():
            if not is_end_flag(flag):
                yield f"{frame.where}: {name}[{agent!r}] must be a bool, got {describe(flag)}"


def _ended_agents_leave(env: Any, frame: Frame) -> Iterator[str]:
    for agent in frame.ended:
        if agent in frame.agents:
            yield f"{frame.where}: agent {agent!r} ended but is still in env.agents"
        if agent in frame.obs:
            yield (
                f"{frame.where}: agent {agent!r} ended but is still in obs; its last "
                "observation belongs in infos[agent]['final_obs']"
            )


def _ended_agents_have_final_obs(env: Any, frame: Frame) -> Iterator[str]:
    for agent in frame.ended:
        info = frame.infos.get(agent)
        if not isinstance(info, Mapping) or "final_obs" not in info:
            yield (
                f"{frame.where}: agent {agent!r} ended but infos[{agent!r}]['final_obs'] "
                "(its last observation) is missing"
            )
        elif agent in _possible(env):
            space = env.observation_space(agent)
            if not in_space(space, info["final_obs"]):
                yield (
                    f"{frame.where}: infos[{agent!r}]['final_obs'] is not in the observation "
                    f"space {space}: got {describe(info['final_obs'])}"
                )


def _agents_leave_only_by_ending(env: Any, frame: Frame) -> Iterator[str]:
    ended = frame.ended
    for agent in frame.alive_at_step:
        if agent not in frame.agents and agent not in ended:
            yield (
                f"{frame.where}: agent {agent!r} left env.agents without terminations or "
                "truncations set to True"
            )


def _episode_ends_within_max_episode_steps(env: Any, frame: Frame) -> Iterator[str]:
    limit = getattr(env, "max_episode_steps", None)
    if is_step_count(limit) and frame.agents and frame.episode_steps == limit:
        yield (
            f"{frame.where}: the episode goes on after {limit} steps, but env.max_episode_steps "
            f"is {limit}; an episode must end within max_episode_steps"
        )


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


def possible_agents_are_unique_ids(env: Any) -> Iterator[str]:
    """``env.possible_agents`` is a non-empty list of unique string ids."""
    possible = getattr(env, "possible_agents", None)
    if not isinstance(possible, (list, tuple)) or not possible:
        yield f"env.possible_agents must be a non-empty list of agent ids, got {possible!r}"
    elif len(set(possible)) != len(possible) or not all(isinstance(a, str) for a in possible):
        yield f"env.possible_agents must hold unique string ids, got {possible!r}"


def max_episode_steps_is_a_step_count(env: Any) -> Iterator[str]:
    """``env.max_episode_steps``, if set, is a positive int."""
    limit = getattr(env, "max_episode_steps", None)
    if limit is not None and not is_step_count(limit):
        yield f"env.max_episode_steps must be a positive int or None, got {describe(limit)}"


def spaces_are_methods(env: Any) -> Iterator[str]:
    """``env.observation_space`` and ``env.action_space`` are methods of the agent."""
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


def spaces_are_fixed_gymnasium_spaces(env: Any) -> Iterator[str]:
    """Each agent's spaces are gymnasium spaces, the same on every call."""
    first, second = spaces_of(env), spaces_of(env)
    for (kind, agent), space in first.items():
        if not isinstance(space, spaces.Space):
            yield f"env.{kind}({agent!r}) must be a gymnasium space, got {describe(space)}"
        elif space is not second[(kind, agent)] and space != second[(kind, agent)]:
            yield (
                f"env.{kind}({agent!r}) returned a different space on a second call "
                f"({space} then {second[(kind, agent)]}); spaces are fixed for the env's lifetime"
            )
