"""PettingZoo ``AECEnv`` as a turn-based corral env (the ids: :mod:`corral.adapters.catalog`).

``obs`` holds only the agent whose turn it is. The adapter performs
PettingZoo's dead steps (``step(None)`` for a terminated or truncated
``agent_selection``) itself, inside the corral step that ended the agent.

Rewards: PettingZoo reports, at each turn of an agent, its cumulative reward
since it last acted. The adapter hands out the change of every agent's
cumulative reward during each corral step, so an agent's corral rewards
between two of its turns add up to what ``last()`` reports at the second one,
and episode returns equal PettingZoo's. An env made by PettingZoo's
``parallel_to_aec`` (MAgent2's ``env()``) keeps the cumulative rewards through
a round and replaces them with the round's rewards at its last move: there,
each agent earns the round's reward in the step that ends the round, and
nothing in the others, as the parallel env pays it.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np

from corral.adapters import register_adapter
from corral.adapters.pettingzoo_parallel import (
    MASK_KEY,
    PettingZooAdapter,
    build,
    final_observation,
    unpack,
)
from corral.env import AgentID, InfoDict, ObsDict, StepResult, validate_actions


class _Exit(NamedTuple):
    """How an agent left in a dead step, and what it saw then."""

    terminated: bool
    truncated: bool
    info: dict[str, Any]
    observation: Any


class AECEnvAdapter(PettingZooAdapter):
    """A PettingZoo ``AECEnv`` that follows the corral contract (turn-based).

    ``state()`` and ``state_space`` exist exactly when the wrapped env has a
    ``state_space``. The wrapped env is ``adapter.env``. ``metadata`` is a copy
    of the wrapped env's, with ``lockstep`` false when it has several agents
    (they take turns).
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.metadata = dict(getattr(env, "metadata", {"render_modes": []}))
        if len(env.possible_agents) > 1:
            self.metadata["lockstep"] = False
        self.render_mode = getattr(env, "render_mode", None)
        self.agents: list[AgentID] = []
        self._acting: list[AgentID] = []
        self._masks: dict[AgentID, np.ndarray | None] = {}
        self._step = 0
        # Filled by _raw_step during one corral step.
        self._earned: defaultdict[AgentID, float] = defaultdict(float)
        self._exits: dict[AgentID, _Exit] = {}
        self._by_rounds = _is_parallel_to_aec(env)
        """Rewards come as a round's, replacing the cumulative ones (``parallel_to_aec``)."""

    @property
    def max_episode_steps(self) -> int | None:  # type: ignore[override]
        """The source env's ``max_cycles`` times the number of agents (a cycle is a turn
        of each), or ``None``: a bound, as agents that left take no turns."""
        cycles = super().max_episode_steps
        return None if cycles is None else cycles * len(self.possible_agents)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        self.env.reset(seed=seed, options=options)
        self._step = 0
        self._earned.clear()
        self._exits.clear()
        self._step_out_dead()
        self.agents = self._live_agents()
        return self._observe()

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        if self.check_actions:
            validate_actions(actions, self._acting, self.action_space, self._masks, self._step)
        alive = list(self.agents)
        self._earned.clear()
        self._exits.clear()
        self._raw_step(actions[self._acting[0]], acted=True)
        self._step_out_dead()
        self._step += 1
        self.agents = self._live_agents()
        # An agent that already left still gets what it earned before its dead step.
        late = [a for a in self._earned if a not in alive and self._earned[a] != 0.0]
        rewards = {a: self._earned.get(a, 0.0) for a in [*alive, *late]}
        exits = {a: self._exit(a) for a in alive if a not in self.agents}
        terms = {a: exits[a].terminated if a in exits else False for a in alive}
        truncs = {a: exits[a].truncated if a in exits else False for a in alive}
        obs, infos = self._observe()
        for agent, exit_ in exits.items():
            infos[agent] = {**exit_.info, **final_observation(exit_.observation)}
        return obs, rewards, terms, truncs, infos

    def _raw_step(self, action: Any, acted: bool) -> None:
        """Step the raw env once, adding each agent's change of cumulative reward to _earned."""
        cumulative = _cumulative_rewards(self.env)
        before = dict(cumulative)
        if acted:
            # PettingZoo counts an agent's cumulative reward from its last action on.
            before[self.env.agent_selection] = 0.0
        self.env.step(action)
        after = _cumulative_rewards(self.env)
        if self._by_rounds:  # a new dict at the end of a round holds the round's rewards
            if after is not cumulative:
                for agent, reward in after.items():
                    self._earned[agent] += float(reward)
            return
        for agent in dict.fromkeys([*before, *after]):
            start = before.get(agent, 0.0)
            self._earned[agent] += float(after.get(agent, start) - start)

    def _step_out_dead(self) -> None:
        """Perform the dead steps due now, keeping what each stepped-out agent last saw."""
        env = self.env
        while env.agents and self._is_done(env.agent_selection):
            agent = env.agent_selection
            self._exits[agent] = self._exit(agent)
            self._raw_step(None, acted=False)

    def _is_done(self, agent: AgentID) -> bool:
        return bool(self.env.terminations[agent] or self.env.truncations[agent])

    def _live_agents(self) -> list[AgentID]:
        return [a for a in self.env.agents if not self._is_done(a)]

    def _exit(self, agent: AgentID) -> _Exit:
        """How ``agent`` ended: recorded at its dead step, or read now if that step is due later."""
        if agent in self._exits:
            return self._exits[agent]
        env = self.env
        return _Exit(
            bool(env.terminations[agent]),
            bool(env.truncations[agent]),
            dict(env.infos.get(agent, {})),
            env.observe(agent),
        )

    def _observe(self) -> tuple[ObsDict, InfoDict]:
        self._acting = []
        self._masks = {}
        if not self.agents:
            return {}, {}
        agent = self.env.agent_selection
        info = dict(self.env.infos.get(agent, {}))
        observation, mask = unpack(self.env.observe(agent), info)
        if mask is not None:
            info[MASK_KEY] = mask
            self._masks[agent] = mask
        self._acting = [agent]
        return {agent: observation}, {agent: info}


def _cumulative_rewards(env: Any) -> Mapping[AgentID, float]:
    """The raw env's reward of each agent since it last acted (what ``last()`` reports)."""
    try:  # PettingZoo's wrappers forward this one private attribute
        return env._cumulative_rewards
    except AttributeError:
        return env.unwrapped._cumulative_rewards


def _is_parallel_to_aec(env: Any) -> bool:
    """Whether ``env`` is PettingZoo's AEC view of a parallel env (``parallel_to_aec``)."""
    conversions = sys.modules.get("pettingzoo.utils.conversions")
    wrapper = getattr(conversions, "parallel_to_aec_wrapper", None)
    while wrapper is not None and env is not None:  # through PettingZoo's wrappers
        if isinstance(env, wrapper):
            return True
        env = getattr(env, "env", None)
    return False


def _is_aec_env(env: Any) -> bool:
    pettingzoo = sys.modules.get("pettingzoo")
    return pettingzoo is not None and isinstance(env, pettingzoo.AECEnv)


register_adapter(_is_aec_env, AECEnvAdapter)


def build_classic(module: str, zero_sum: bool, **kwargs: Any) -> AECEnvAdapter:
    """The classic game of ``module``, adapted, declaring in ``metadata["zero_sum"]``
    whether its players' returns always sum to zero."""
    env = AECEnvAdapter(build(module, "env", **kwargs))
    env.metadata["zero_sum"] = zero_sum
    return env
