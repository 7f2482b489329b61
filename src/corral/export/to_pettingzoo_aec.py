"""Any corral env as a PettingZoo ``AECEnv``: turn-based, asynchronous or simultaneous.

Built by ``corral.to_pettingzoo(env, api="aec")``. The agents that must act
in a corral step (the keys of its ``obs``) are selected one after another, in
the order of ``agents``; their actions are collected and the corral step runs
when the last of them has acted. Agents not asked to act are never selected.
After a step in which agents ended, each of them is selected once more for a
dead step (``step(None)``), which removes it, before the next live agent.
Dead steps go in the order of ``agents``, as PettingZoo's ``_deads_step_first``
orders them (the API leaves the order to the env, and its games differ).

Rewards follow PettingZoo: ``rewards`` holds what each agent earned in the
corral step that just ran (zeros after any other call), and ``last()``
reports ``_cumulative_rewards``: what the selected agent earned since it last
acted. ``observe(agent)`` is the last observation ``agent`` received (its
final one once it ended), ``None`` before its first.
"""

from __future__ import annotations

from typing import Any

import pettingzoo

from corral.env import AgentID, validate_actions
from corral.errors import EpisodeOverError, InvalidActionError
from corral.export.observation_form import MASK_KEY, export_info
from corral.export.to_pettingzoo_parallel import PettingZooExport


class AECEnvExport(PettingZooExport, pettingzoo.AECEnv):
    """A corral env as a ``pettingzoo.AECEnv``; see the module docstring for the order of turns.

    ``metadata["is_parallelizable"]`` is true for simultaneous envs (every agent
    acts once per cycle), so PettingZoo's ``aec_to_parallel`` accepts those.
    """

    def __init__(self, env: Any, mask_in_obs: bool = False) -> None:
        super().__init__()
        self._wrap(env, mask_in_obs)
        self.metadata["is_parallelizable"] = bool(getattr(env, "simultaneous", False))
        self.rewards: dict[AgentID, float] = {}
        self._cumulative_rewards: dict[AgentID, float] = {}
        self.terminations: dict[AgentID, bool] = {}
        self.truncations: dict[AgentID, bool] = {}
        self.infos: dict[AgentID, dict[str, Any]] = {}
        self.agent_selection: AgentID | None = None
        self._observations: dict[AgentID, Any] = {}
        self._to_act: list[AgentID] = []  # agents still to act in this corral step, in turn
        self._dead: list[AgentID] = []  # ended agents still due their dead step, in turn
        self._actions: dict[AgentID, Any] = {}
        self._steps = 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        obs, infos = self.env.reset(seed=seed, options=options)
        self._steps = 0
        self.agents = []
        self.rewards, self._cumulative_rewards = {}, {}
        self.terminations, self.truncations, self.infos = {}, {}, {}
        self._observations, self._actions, self._dead = {}, {}, []
        self._join(self.env.agents)
        self._receive(obs, infos)
        self._select()

    def observe(self, agent: AgentID) -> Any:
        return self._observations.get(agent)

    def step(self, action: Any) -> None:
        agent = self.agent_selection
        if agent is None or not self.agents:
            raise EpisodeOverError(
                f"step {self._steps}: no agent is left to act (the episode ended, or reset() "
                "was never called); call reset() first"
            )
        if self.terminations[agent] or self.truncations[agent]:
            self._dead_step(agent, action)
            return
        mask = self.infos[agent].get(MASK_KEY)
        validate_actions({agent: action}, [agent], self.action_space, {agent: mask}, self._steps)
        actions = {**self._actions, agent: action}
        if len(self._to_act) > 1:
            self._actions = actions
            self._cumulative_rewards[agent] = 0.0
            self._to_act.pop(0)
            self._clear_rewards()
            self.agent_selection = self._to_act[0]
            return
        self._corral_step(agent, actions)

    def _corral_step(self, agent: AgentID, actions: dict[AgentID, Any]) -> None:
        obs, rewards, terms, truncs, infos = self.env.step(actions)
        self._steps += 1
        self._actions = {}
        self._cumulative_rewards[agent] = 0.0
        self._join(self.env.agents)
        for a in self.agents:
            self.rewards[a] = float(rewards.get(a, 0.0))
            self._cumulative_rewards[a] += self.rewards[a]
            self.terminations[a] = bool(terms.get(a, False))
            self.truncations[a] = bool(truncs.get(a, False))
            self.infos[a] = {}
            if self.terminations[a] or self.truncations[a]:
                self._observations[a] = self._form.final(a, infos.get(a, {}))
                self.infos[a] = export_info(infos.get(a, {}))
        self._dead = [a for a in self.agents if self.terminations[a] or self.truncations[a]]
        self._receive(obs, infos)
        self._select()

    def _join(self, agents: list[AgentID]) -> None:
        """Start the bookkeeping of agents that are new to ``agents``."""
        for agent in agents:
            if agent not in self.agents:
                self.agents.append(agent)
                self.rewards[agent] = self._cumulative_rewards[agent] = 0.0
                self.terminations[agent] = self.truncations[agent] = False
                self.infos[agent] = {}

    def _receive(self, obs: dict[AgentID, Any], infos: dict[AgentID, Any]) -> None:
        """Take the observations of the agents that must act next; they act in turn."""
        for agent, observation in obs.items():
            info = infos.get(agent, {})
            self._observations[agent] = self._form.live(agent, observation, info)
            self.infos[agent] = export_info(info)
        self._to_act = [a for a in self.agents if a in obs]

    def _select(self) -> None:
        """Select the next agent due a dead step, else the next to act."""
        if self._dead:
            self.agent_selection = self._dead[0]
        elif self._to_act:
            self.agent_selection = self._to_act[0]

    def _dead_step(self, agent: AgentID, action: Any) -> None:
        if action is not None:
            ended = "terminated" if self.terminations[agent] else "truncated"
            raise InvalidActionError(
                f"step {self._steps}: agent {agent!r} has {ended}; its only valid action is "
                f"None (a dead step), got {action!r}"
            )
        for table in (
            self.rewards,
            self._cumulative_rewards,
            self.terminations,
            self.truncations,
            self.infos,
        ):
            del table[agent]
        self._observations.pop(agent, None)
        self.agents.remove(agent)
        self._dead.remove(agent)
        self._clear_rewards()
        self._select()
