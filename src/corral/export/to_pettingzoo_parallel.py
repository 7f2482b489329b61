"""A simultaneous corral env as a PettingZoo ``ParallelEnv``.

Built by ``corral.to_pettingzoo(env, api="parallel")``. What changes from
corral's loop is only where things are: an agent whose episode ends in a step
keeps its key in that step's ``obs``, holding its last observation
(PettingZoo's convention; corral puts it in ``infos[a]["final_obs"]``), and
with ``mask_in_obs`` observations are Dicts carrying their action masks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pettingzoo
from gymnasium import spaces

from corral.env import AgentID, InfoDict, ObsDict, StepResult
from corral.errors import EnvContractError
from corral.export.observation_form import ObservationForm, export_info


class PettingZooExport:
    """What the Parallel and AEC exports share: spaces, render, close and the global state.

    The corral env is ``export.env``; ``state()`` and ``state_space`` exist when it has them.
    """

    env: Any
    metadata: dict[str, Any]
    render_mode: str | None
    possible_agents: list[AgentID]
    agents: list[AgentID]

    def _wrap(self, env: Any, mask_in_obs: bool) -> None:
        self.env = env
        self.metadata = dict(getattr(env, "metadata", {"render_modes": []}))
        self.render_mode = getattr(env, "render_mode", None)
        self.possible_agents = list(env.possible_agents)
        self.agents = []
        self._form = ObservationForm(env, mask_in_obs)
        if hasattr(env, "state_space"):
            self.state_space = env.state_space

    def observation_space(self, agent: AgentID) -> spaces.Space:
        return self._form.space(agent)

    def action_space(self, agent: AgentID) -> spaces.Space:
        return self.env.action_space(agent)

    def state(self) -> np.ndarray:
        if not hasattr(self.env, "state"):
            raise NotImplementedError(f"{self.env!r} has no global state (no state() method)")
        return self.env.state()

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()


class ParallelEnvExport(PettingZooExport, pettingzoo.ParallelEnv):
    """A simultaneous corral env as a ``pettingzoo.ParallelEnv``.

    ``step`` returns, for every agent alive when the step began, its
    observation in ``obs``: the last one for an agent that ended. Masks stay in
    ``infos[a]["action_mask"]``, and with ``mask_in_obs`` also come in the
    observation. A step with no actions once every agent is gone returns five
    empty dicts, as PettingZoo's own parallel envs do. The env must keep every
    live agent acting: an ``EnvContractError`` says when it does not.
    """

    def __init__(self, env: Any, mask_in_obs: bool = False) -> None:
        self._wrap(env, mask_in_obs)
        self._steps = 0

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        obs, infos = self.env.reset(seed=seed, options=options)
        self._steps = 0
        self.agents = list(self.env.agents)
        self._check_every_agent_acts(obs)
        observations = {a: self._form.live(a, o, infos.get(a, {})) for a, o in obs.items()}
        return observations, {a: export_info(info) for a, info in infos.items()}

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        if not actions and not self.env.agents:
            return {}, {}, {}, {}, {}
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        self._steps += 1
        self.agents = list(self.env.agents)
        self._check_every_agent_acts(obs)
        observations = {}
        for agent in dict.fromkeys([*terms, *obs]):
            if agent in obs:
                observations[agent] = self._form.live(agent, obs[agent], infos.get(agent, {}))
            elif terms[agent] or truncs.get(agent, False):
                observations[agent] = self._form.final(agent, infos.get(agent, {}))
        out_infos = {a: export_info(info) for a, info in infos.items()}
        return observations, dict(rewards), dict(terms), dict(truncs), out_infos

    def _check_every_agent_acts(self, obs: Mapping[AgentID, Any]) -> None:
        if set(obs) != set(self.env.agents):
            where = "reset" if self._steps == 0 else f"step {self._steps}"
            raise EnvContractError(
                [
                    f"{where}: the env declares simultaneous = True, so every live agent must "
                    f"act, but obs holds {list(obs)} while agents are {list(self.env.agents)}; "
                    "export it with corral.to_pettingzoo(env, api='aec')"
                ]
            )
