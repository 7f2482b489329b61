"""How an export shows observations: as the corral env gives them, or packed with their masks.

PettingZoo's classic games give each agent a Dict observation
``{"observation": ..., "action_mask": ...}``; corral unpacks it (the mask goes
to ``infos[a]["action_mask"]``). An export packs it again where the env asks
for that form, so PettingZoo's tools, which read masks only from observations,
see them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.env import AgentID

OBS_KEY = "observation"
MASK_KEY = "action_mask"


class ObservationForm:
    """Each agent's observation space and observations as an export shows them.

    With ``mask_in_obs``, agents with a ``Discrete`` action space see
    ``{"observation": obs, "action_mask": int8 mask}`` in the space
    ``Dict(observation=<corral space>, action_mask=Box(0, 1, (n,), int8))``;
    other agents, and every agent without ``mask_in_obs``, see corral's
    observation in corral's space. Spaces are built once, so an agent's space
    is the same object on every call (PettingZoo's seeding relies on it).
    """

    def __init__(self, env: Any, mask_in_obs: bool) -> None:
        self._spaces: dict[AgentID, spaces.Space] = {}
        self._masks: dict[AgentID, spaces.Box] = {}  # the mask space of each packed agent
        self._source: dict[AgentID, spaces.Space] = {}
        for agent in env.possible_agents:
            space = self._source[agent] = env.observation_space(agent)
            action_space = env.action_space(agent)
            if mask_in_obs and isinstance(action_space, spaces.Discrete):
                mask_space = spaces.Box(0, 1, shape=(int(action_space.n),), dtype=np.int8)
                space = spaces.Dict({OBS_KEY: space, MASK_KEY: mask_space})
                self._masks[agent] = mask_space
            self._spaces[agent] = space

    def space(self, agent: AgentID) -> spaces.Space:
        """The observation space of ``agent`` as the export shows it."""
        return self._spaces[agent]

    def live(self, agent: AgentID, observation: Any, info: Mapping[str, Any]) -> Any:
        """The observation of an agent that must act; without a mask every action is legal."""
        return self._pack(agent, observation, info.get(MASK_KEY), legal=1)

    def final(self, agent: AgentID, info: Mapping[str, Any]) -> Any:
        """The last observation of an agent whose episode ended, from corral's ``infos[agent]``.

        Its mask is the one the source gave with it (``final_action_mask``), else
        all zeros: an ended agent has no legal action.
        """
        return self._pack(agent, info.get("final_obs"), info.get("final_action_mask"), legal=0)

    def _pack(self, agent: AgentID, observation: Any, mask: Any, legal: int) -> Any:
        observation = _as_array(self._source[agent], observation)
        if agent not in self._masks:
            return observation
        if mask is None:
            mask = np.full(self._masks[agent].shape, legal, dtype=np.int8)
        return {OBS_KEY: observation, MASK_KEY: np.asarray(mask, dtype=np.int8)}


_ARRAY_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def _as_array(space: spaces.Space, observation: Any) -> Any:
    """A Python number or list of an array space as a NumPy value of the space's dtype.

    Gymnasium's spaces accept ``3`` for ``Discrete``; PettingZoo's tools read
    ``observation.dtype``.
    """
    if isinstance(space, _ARRAY_SPACES) and not isinstance(observation, (np.ndarray, np.generic)):
        return np.asarray(observation, dtype=space.dtype)
    return observation


def export_info(info: Mapping[str, Any]) -> dict[str, Any]:
    """corral's info of one agent without the entries an export moves into the observation."""
    return {k: v for k, v in info.items() if k not in ("final_obs", "final_action_mask")}
