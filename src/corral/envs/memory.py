"""A cue to remember: ``corral/memory``, the smallest env that only a policy with memory solves.

Each agent is shown a cue at its first decision and must name it at its
last, after ``delay`` decisions that show nothing: a policy without memory
can only guess (success ``1 / num_cues``), a recurrent one can be right every
time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.env import AgentID, InfoDict, MultiAgentEnv, ObsDict, StepResult, validate_actions
from corral.registry import register


class Memory(MultiAgentEnv):
    """``num_agents`` agents, each to name the cue it saw ``delay`` decisions earlier.

    Every agent draws its own cue (one of ``num_cues``) at reset. An agent's
    episode is ``delay + 2`` decisions: the first shows its cue, the next
    ``delay`` show nothing, the last shows a query flag, and the agent's
    action there is its answer (reward 1 if it names the cue, else 0; every
    other action is ignored and earns 0). Then the agent terminates.

    ``turns=False`` (default): the agents act together, every step.
    ``turns=True``: they take turns, ``agent_0`` first, one agent a step, so an
    agent's decisions are ``num_agents`` steps apart and the episode lasts
    ``num_agents * (delay + 2)`` steps; everyone terminates after the last
    answer.

    Actions are ``Discrete(num_cues)``. An observation is ``float32[num_cues + 1]``:
    a one-hot of the cue at the first decision, the query flag last at the
    last decision, zeros in between. The global state is ``float32[num_agents
    * num_cues + 1]``: every agent's cue (one-hots) and the fraction of the
    episode's steps taken.

    Examples:
        >>> env = Memory(num_agents=1, num_cues=2, delay=1)
        >>> obs, infos = env.reset(seed=0)
        >>> cue = int(obs["agent_0"][:2].argmax())
        >>> obs, rewards, *_ = env.step({"agent_0": 0})
        >>> obs["agent_0"].tolist()
        [0.0, 0.0, 0.0]
        >>> obs, rewards, *_ = env.step({"agent_0": 0})
        >>> obs["agent_0"].tolist()
        [0.0, 0.0, 1.0]
        >>> obs, rewards, terms, *_ = env.step({"agent_0": cue})
        >>> rewards, terms, env.agents
        ({'agent_0': 1.0}, {'agent_0': True}, [])
    """

    metadata = {"render_modes": ["ansi"], "name": "memory", "lockstep": False}

    def __init__(
        self,
        num_agents: int = 2,
        num_cues: int = 2,
        delay: int = 3,
        turns: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if num_agents < 1:
            raise ValueError(f"num_agents must be at least 1, got {num_agents}")
        if num_cues < 2:
            raise ValueError(f"num_cues must be at least 2, got {num_cues}")
        if delay < 0:
            raise ValueError(f"delay must be at least 0, got {delay}")
        self.check_render_mode(render_mode)
        self.render_mode = render_mode
        self.num_cues, self.delay, self.turns = num_cues, delay, bool(turns)
        # together, every agent acts at every step and all end at once
        self.metadata = {**type(self).metadata, "lockstep": not self.turns}
        self.simultaneous = not self.turns
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        self.agents = []
        self._obs_space = spaces.Box(0.0, 1.0, shape=(num_cues + 1,), dtype=np.float32)
        self._action_space = spaces.Discrete(num_cues)
        self.state_space = spaces.Box(0.0, 1.0, (num_agents * num_cues + 1,), np.float32)
        self._rng = np.random.default_rng()
        self._cues = np.zeros(num_agents, dtype=np.int64)
        self._step = 0

    @property
    def max_episode_steps(self) -> int:  # type: ignore[override]
        """Every episode lasts exactly this many steps."""
        return self._decisions * (len(self.possible_agents) if self.turns else 1)

    @property
    def _decisions(self) -> int:
        return self.delay + 2

    def observation_space(self, agent: AgentID) -> spaces.Box:
        """``float32[num_cues + 1]``: the cue (first decision), the query flag (last)."""
        return self._obs_space

    def action_space(self, agent: AgentID) -> spaces.Discrete:
        """``Discrete(num_cues)``: the answer (at the last decision; ignored before)."""
        return self._action_space

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        """Draw every agent's cue; show it to the agents acting first."""
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._cues = self._rng.integers(self.num_cues, size=len(self.possible_agents))
        self._step = 0
        acting = self._acting()
        return {a: self._observe(a) for a in acting}, {a: {} for a in acting}

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        """Take the acting agents' actions; score the answers of those at their last decision."""
        acting = self._acting() if self.agents else []
        if self.check_actions:
            validate_actions(actions, acting, self.action_space, {}, self._step)
        rewards = dict.fromkeys(self.possible_agents, 0.0)
        for agent in acting:
            if self._decision(agent) == self._decisions - 1:
                right = int(actions[agent]) == self._cues[self.possible_agents.index(agent)]
                rewards[agent] = float(right)
        self._step += 1
        done = self._step == self.max_episode_steps
        terms = dict.fromkeys(self.possible_agents, done)
        truncs = dict.fromkeys(self.possible_agents, False)
        if done:
            infos = {a: {"final_obs": self._observe(a)} for a in self.agents}
            self.agents = []
            return {}, rewards, terms, truncs, infos
        obs = {a: self._observe(a) for a in self._acting()}
        return obs, rewards, terms, truncs, {a: {} for a in obs}

    def state(self) -> np.ndarray:
        """Every agent's cue (one-hots) and the fraction of the episode's steps taken."""
        state = np.zeros(self.state_space.shape, dtype=np.float32)
        for i, cue in enumerate(self._cues):
            state[i * self.num_cues + cue] = 1.0
        state[-1] = self._step / self.max_episode_steps
        return state

    def render(self) -> str | None:
        """The step, the cues and who acts next, as text (``ansi``)."""
        if self.render_mode != "ansi":
            return None
        acting = ", ".join(self._acting()) if self.agents else "nobody (episode over)"
        return f"step {self._step}/{self.max_episode_steps}; cues {self._cues.tolist()}; {acting}\n"

    def _acting(self) -> list[AgentID]:
        if not self.turns:
            return list(self.agents)
        return [self.possible_agents[self._step % len(self.possible_agents)]]

    def _decision(self, agent: AgentID) -> int:
        """The agent's decision index in the episode at the current step (as it acts now)."""
        return self._step // len(self.possible_agents) if self.turns else self._step

    def _observe(self, agent: AgentID) -> np.ndarray:
        obs = np.zeros(self.num_cues + 1, dtype=np.float32)
        decision = min(self._decision(agent), self._decisions - 1)
        if decision == 0:
            obs[self._cues[self.possible_agents.index(agent)]] = 1.0
        elif decision == self._decisions - 1:
            obs[-1] = 1.0
        return obs


register("corral/memory", Memory)
register("corral/memory-turns", Memory, turns=True)
