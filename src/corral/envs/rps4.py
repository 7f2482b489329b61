"""Asynchronous four-player rock-paper-scissors: ``corral/rps4``.

Two pairs play on different clocks, so the set of acting agents changes from
step to step: the smallest test of an asynchronous env.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.env import AgentID, InfoDict, MultiAgentEnv, ObsDict, StepResult, validate_actions
from corral.envs.rps import MOVES, players_frame, round_reward
from corral.registry import register

PLAYERS = ("player_0", "player_1", "player_2", "player_3")
# The pair (player indices) that plays in each step of a cycle.
SCHEDULE = ((0, 1), (2, 3), (2, 3))


class RockPaperScissors4(MultiAgentEnv):
    """Two rock-paper-scissors pairs on different clocks, for ``num_cycles`` cycles.

    Schedule of one cycle (three steps)::

        step 0: player_0 and player_1 play a round (both in obs, simultaneously)
        step 1: player_2 and player_3 play a round
        step 2: player_2 and player_3 play another round

    Players that do not play in a step are not in the observation dict, are
    not asked to act and earn 0. The two players of a round earn +1/-1 (or 0
    for a draw), zero-sum within the pair, in the step of the round. After
    ``num_cycles`` cycles all four players terminate.

    Actions are ``Discrete(3)``: 0 rock, 1 paper, 2 scissors. An observation
    is ``float32[7]``: one-hots of the player's own and its opponent's moves
    in their pair's previous round (zero before the first) and the fraction
    of the episode's steps taken. The global state is ``float32[13]``: the
    previous moves of all four players (one-hots) and that fraction.

    Examples:
        >>> env = RockPaperScissors4(num_cycles=1)
        >>> obs, infos = env.reset(seed=0)
        >>> sorted(obs)
        ['player_0', 'player_1']
        >>> obs, rewards, *_ = env.step({"player_0": 1, "player_1": 0})
        >>> sorted(obs), rewards["player_0"], rewards["player_2"]
        (['player_2', 'player_3'], 1.0, 0.0)
    """

    metadata = {
        "render_modes": ["ansi", "rgb_array"],
        "name": "rps4",
        "zero_sum": True,
        "lockstep": False,
    }

    def __init__(self, num_cycles: int = 2, render_mode: str | None = None) -> None:
        if num_cycles < 1:
            raise ValueError(f"num_cycles must be at least 1, got {num_cycles}")
        self.check_render_mode(render_mode)
        self.num_cycles = num_cycles
        self.render_mode = render_mode
        self.possible_agents = list(PLAYERS)
        self.agents = []
        self._obs_space = spaces.Box(0.0, 1.0, shape=(7,), dtype=np.float32)
        self._action_space = spaces.Discrete(3)
        self.state_space = spaces.Box(0.0, 1.0, shape=(13,), dtype=np.float32)
        self._num_steps = len(SCHEDULE) * num_cycles
        self._step = 0
        self._last = [-1] * len(PLAYERS)

    @property
    def max_episode_steps(self) -> int:  # type: ignore[override]
        """Every episode lasts exactly three steps a cycle."""
        return self._num_steps

    def observation_space(self, agent: AgentID) -> spaces.Box:
        """``float32[7]``: own and opponent's previous moves, fraction of steps taken."""
        return self._obs_space

    def action_space(self, agent: AgentID) -> spaces.Discrete:
        """``Discrete(3)``: rock, paper, scissors."""
        return self._action_space

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        """Start the first cycle; ``player_0`` and ``player_1`` play first. No chance events."""
        self.agents = list(self.possible_agents)
        self._step = 0
        self._last = [-1] * len(PLAYERS)
        return self._pair_obs()

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        """Play the round of the scheduled pair."""
        i, j = SCHEDULE[self._step % len(SCHEDULE)]
        acting = [PLAYERS[i], PLAYERS[j]] if self.agents else []
        if self.check_actions:
            validate_actions(actions, acting, self.action_space, {}, self._step)
        move_i, move_j = int(actions[PLAYERS[i]]), int(actions[PLAYERS[j]])
        reward = round_reward(move_i, move_j)
        rewards = dict.fromkeys(PLAYERS, 0.0)
        rewards[PLAYERS[i]], rewards[PLAYERS[j]] = reward, -reward
        self._last[i], self._last[j] = move_i, move_j
        self._step += 1
        done = self._step == self._num_steps
        terms = dict.fromkeys(PLAYERS, done)
        truncs = dict.fromkeys(PLAYERS, False)
        if done:
            infos = {a: {"final_obs": self._observe(k)} for k, a in enumerate(PLAYERS)}
            self.agents = []
            return {}, rewards, terms, truncs, infos
        obs, infos = self._pair_obs()
        return obs, rewards, terms, truncs, infos

    def state(self) -> np.ndarray:
        """The previous moves of all four players and the fraction of steps taken."""
        state = np.zeros(13, dtype=np.float32)
        for k, move in enumerate(self._last):
            if move >= 0:
                state[3 * k + move] = 1.0
        state[12] = self._step / self._num_steps
        return state

    def render(self) -> str | np.ndarray | None:
        """Each player's previous move and the pair to play next: as text in ``ansi`` mode,
        as a ``uint8`` frame in ``rgb_array`` mode (see :func:`corral.envs.rps.players_frame`)."""
        if self.render_mode == "rgb_array":
            results: list[float | None] = [None] * len(PLAYERS)
            for i in (0, 2):  # the pairs (0, 1) and (2, 3)
                if self._last[i] >= 0:
                    reward = round_reward(self._last[i], self._last[i + 1])
                    results[i], results[i + 1] = reward, -reward
            pair = SCHEDULE[self._step % len(SCHEDULE)] if self.agents else ()
            to_move = [k in pair for k in range(len(PLAYERS))]
            return players_frame(self._last, results, to_move, self._step / self._num_steps)
        if self.render_mode != "ansi":
            return None
        moves = ", ".join(
            f"{a}: {MOVES[m] if m >= 0 else '-'}" for a, m in zip(PLAYERS, self._last, strict=True)
        )
        if self.agents:
            i, j = SCHEDULE[self._step % len(SCHEDULE)]
            nxt = f"{PLAYERS[i]} and {PLAYERS[j]} to play"
        else:
            nxt = "game over"
        return f"step {self._step}/{self._num_steps}; {moves}; {nxt}\n"

    def _pair_obs(self) -> tuple[ObsDict, InfoDict]:
        i, j = SCHEDULE[self._step % len(SCHEDULE)]
        return (
            {PLAYERS[i]: self._observe(i), PLAYERS[j]: self._observe(j)},
            {PLAYERS[i]: {}, PLAYERS[j]: {}},
        )

    def _observe(self, player: int) -> np.ndarray:
        obs = np.zeros(7, dtype=np.float32)
        own, other = self._last[player], self._last[player ^ 1]  # pairs are (0, 1), (2, 3)
        if own >= 0:
            obs[own] = 1.0
            obs[3 + other] = 1.0
        obs[6] = self._step / self._num_steps
        return obs


register("corral/rps4", RockPaperScissors4)
