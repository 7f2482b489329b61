"""PettingZoo ``ParallelEnv`` under the corral contract (the ids: :mod:`corral.adapters.catalog`).

A parallel env already has the contract's shape; the adapter adds what
PettingZoo leaves to each env: action checks with clear errors, the final
observation of an ended agent in ``infos[a]["final_obs"]`` (it leaves ``obs``),
an ``infos`` entry for every agent, and Dict observations with an
``action_mask`` key unpacked into the ``"observation"`` part and
``infos[a]["action_mask"]`` (the mask that came with an ended agent's last
observation is ``infos[a]["final_action_mask"]``, so that
:func:`corral.to_pettingzoo` can give that observation back whole).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Mapping
from typing import Any, TypeGuard

import numpy as np
from gymnasium import spaces

from corral.adapters import SourceAdapter, register_adapter, source_attr
from corral.env import (
    AgentID,
    BoolDict,
    InfoDict,
    ObsDict,
    StepResult,
    validate_actions,
)

MASK_KEY = "action_mask"
OBS_KEY = "observation"


def is_masked(space: spaces.Space) -> TypeGuard[spaces.Dict]:
    """Whether ``space`` is a Dict of an ``"observation"`` and its ``"action_mask"``."""
    return isinstance(space, spaces.Dict) and MASK_KEY in space.spaces and OBS_KEY in space.spaces


def observation_part(space: spaces.Space) -> spaces.Space:
    """The space of what the agent sees: the ``"observation"`` part of a masked Dict space."""
    return space[OBS_KEY] if is_masked(space) else space


def unpack(observation: Any, info: Mapping[str, Any] | None) -> tuple[Any, np.ndarray | None]:
    """Split a raw observation into what the agent sees and its int8 action mask (or ``None``).

    The mask comes from a Dict observation's ``action_mask`` key, else from ``info``.
    """
    if type(observation) is not np.ndarray and (  # the common case, checked cheaply
        isinstance(observation, Mapping) and MASK_KEY in observation and OBS_KEY in observation
    ):
        return observation[OBS_KEY], np.asarray(observation[MASK_KEY], dtype=np.int8)
    if info is not None and info.get(MASK_KEY) is not None:
        return observation, np.asarray(info[MASK_KEY], dtype=np.int8)
    return observation, None


def final_observation(observation: Any) -> dict[str, Any]:
    """The ``infos`` entries of an ended agent's last raw observation.

    ``final_obs``, and ``final_action_mask`` when the observation carried a mask.
    """
    final, mask = unpack(observation, None)
    return {"final_obs": final} if mask is None else {"final_obs": final, "final_action_mask": mask}


def build(module: str, factory: str, **kwargs: Any) -> Any:
    """``module.factory(**kwargs)``, importing ``module`` only now (it is optional)."""
    return getattr(importlib.import_module(module), factory)(**kwargs)


def build_unchecked(module: str, **kwargs: Any) -> Any:
    """``module``'s parallel env without PettingZoo's checking wrappers.

    PettingZoo wraps an AEC env in wrappers that enforce the call order and
    assert (or clip) actions, and every attribute read goes through them: a
    third of an MPE step. The adapter checks actions itself, with clearer
    errors, so it builds ``aec_to_parallel(raw_env(...))``; what the env
    computes is unchanged (the differential tests compare it step by step with
    the wrapped env).
    """
    from pettingzoo.utils.conversions import aec_to_parallel

    return aec_to_parallel(build(module, "raw_env", **kwargs))


class PettingZooAdapter(SourceAdapter):
    """What both PettingZoo adapters pass through from the wrapped ``env``.

    ``state()`` and ``state_space`` exist exactly when the wrapped env has a
    ``state_space``; Dict observations with an action mask are seen as their
    ``"observation"`` part. Other attributes the adapter lacks are read from the
    wrapped env, or from the envs inside it (``adapter.max_cycles``).
    """

    def __getattr__(self, name: str) -> Any:
        # The global state only where the source declares a state_space (PettingZoo's base
        # class has a state() that raises).
        if name in ("state", "state_space"):
            env = self.__dict__.get("env")
            if hasattr(env, "state_space"):
                return getattr(env, name)
            raise AttributeError(f"{type(self).__name__} has no {name!r}: its env has no state")
        return super().__getattr__(name)

    @property
    def max_episode_steps(self) -> int | None:  # type: ignore[override]
        """The source env's ``max_cycles`` (a cycle is one step of every agent), or ``None``."""
        try:
            cycles = source_attr(self.env, "max_cycles")
        except AttributeError:
            return None
        return None if cycles is None else int(cycles)

    @property
    def possible_agents(self) -> list[AgentID]:  # type: ignore[override]
        return list(self.env.possible_agents)

    @property
    def mask_in_obs(self) -> bool:
        """Whether the wrapped env packs action masks into Dict observations (classic does)."""
        return any(is_masked(self.env.observation_space(a)) for a in self.env.possible_agents)

    def observation_space(self, agent: AgentID) -> spaces.Space:
        return observation_part(self.env.observation_space(agent))

    def action_space(self, agent: AgentID) -> spaces.Space:
        return self.env.action_space(agent)

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


class ParallelEnvAdapter(PettingZooAdapter):
    """A PettingZoo ``ParallelEnv`` that follows the corral contract.

    ``state()`` and ``state_space`` exist exactly when the wrapped env has a
    ``state_space``. The wrapped env is ``adapter.env``.
    """

    simultaneous = True

    def __init__(self, env: Any) -> None:
        self.env = env
        self.metadata = getattr(env, "metadata", {"render_modes": []})
        self.render_mode = getattr(env, "render_mode", None)
        self.agents: list[AgentID] = []
        self._masks: dict[AgentID, np.ndarray | None] = {}
        self._acting: list[AgentID] = []
        self._step = 0

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        raw_obs, raw_infos = self.env.reset(seed=seed, options=options)
        self._step = 0
        self.agents = list(self.env.agents)
        return self._observe(raw_obs, raw_infos or {}, ended=[])

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        if self.check_actions:
            validate_actions(actions, self._acting, self.action_space, self._masks, self._step)
        alive = self.agents  # replaced below, never changed in place
        raw_obs, raw_rewards, raw_terms, raw_truncs, raw_infos = self.env.step(
            actions if type(actions) is dict else dict(actions)
        )
        self._step += 1
        # Every agent alive before the step, then any other that the env reports.
        keys: Any = dict.fromkeys(alive)
        keys.update(raw_rewards)
        keys.update(raw_terms)
        keys.update(raw_truncs)
        rewards: dict[AgentID, Any] = {}
        terms: BoolDict = {}
        truncs: BoolDict = {}
        ended = []
        reward_of, term_of, trunc_of = raw_rewards.get, raw_terms.get, raw_truncs.get
        for k, agent in enumerate(keys):
            rewards[agent] = reward_of(agent, 0.0)
            # only an agent alive before the step can end in it (some envs go on reporting
            # the dead as terminated, which PettingZoo's API test only warns about)
            was_alive = k < len(alive)
            term = terms[agent] = was_alive and bool(term_of(agent, False))
            trunc = truncs[agent] = was_alive and bool(trunc_of(agent, False))
            if term or trunc:
                ended.append(agent)
        if ended:
            self.agents = [a for a in self.env.agents if a not in ended]
        else:
            self.agents = list(self.env.agents)
        obs, infos = self._observe(raw_obs, raw_infos or {}, ended)
        return obs, rewards, terms, truncs, infos

    def _observe(
        self, raw_obs: Mapping[AgentID, Any], raw_infos: Mapping[AgentID, Any], ended: list[AgentID]
    ) -> tuple[ObsDict, InfoDict]:
        obs: ObsDict = {}
        infos: InfoDict = {}
        self._masks = masks = {}
        info_of = raw_infos.get
        for agent in self.agents:
            if agent not in raw_obs:
                continue
            info = info_of(agent)
            infos[agent] = info = {} if info is None else dict(info)  # the mask may be added
            value = raw_obs[agent]
            if type(value) is np.ndarray and MASK_KEY not in info:  # no mask: cheaply
                obs[agent] = value
                continue
            obs[agent], mask = unpack(value, info)
            if mask is not None:
                info[MASK_KEY] = mask
                masks[agent] = mask
        for agent in ended:
            info = dict(raw_infos.get(agent, {}))
            if agent in raw_obs:
                info.update(final_observation(raw_obs[agent]))
            infos[agent] = info
        self._acting = list(obs)
        return obs, infos


def _is_parallel_env(env: Any) -> bool:
    pettingzoo = sys.modules.get("pettingzoo")
    return pettingzoo is not None and isinstance(env, pettingzoo.ParallelEnv)


register_adapter(_is_parallel_env, ParallelEnvAdapter)
