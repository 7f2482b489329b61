"""Turn-based rock-paper-scissors: ``corral/rps``.

The smallest env whose rewards arrive in a step where the rewarded agent did
not act, so learners must credit them to that agent's earlier action.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.env import AgentID, InfoDict, MultiAgentEnv, ObsDict, StepResult, validate_actions
from corral.envs.canvas import Colour, blank, fill_rect
from corral.registry import register

MOVES = ("rock", "paper", "scissors")

# rgb_array frames: one panel per player
PANEL, GAP, BORDER, BAR = 64, 8, 5, 6  # pixels
MOVE_COLOURS: tuple[Colour, ...] = ((128, 128, 140), (240, 238, 226), (150, 92, 206))
NO_MOVE, BACKGROUND = (56, 56, 64), (24, 24, 30)
RESULT_COLOURS = {1.0: (64, 176, 84), -1.0: (196, 68, 60), 0.0: (150, 150, 150)}
TO_MOVE, PROGRESS = (236, 200, 64), (96, 140, 220)


def round_reward(move: int, other: int) -> float:
    """+1 if ``move`` beats ``other``, -1 if it loses, 0 on a draw."""
    return (0.0, 1.0, -1.0)[(move - other) % 3]


def players_frame(
    moves: Sequence[int],
    results: Sequence[float | None],
    to_move: Sequence[bool],
    progress: float,
) -> np.ndarray:
    """An ``rgb_array`` frame of rock-paper-scissors players, one panel each, left to right.

    A panel shows the player's last move (grey rock, white paper, purple scissors,
    dark before the first) framed by the result of its last round (green win,
    red loss, grey draw); a yellow bar marks the players to move next, and a
    blue bar along the bottom the fraction of the episode played.
    """
    width = len(moves) * (PANEL + GAP) + GAP
    height = GAP + PANEL + GAP + BAR + GAP + BAR + GAP
    frame = blank(height, width, BACKGROUND)
    for k, (move, result, moving) in enumerate(zip(moves, results, to_move, strict=True)):
        left = GAP + k * (PANEL + GAP)
        if result is not None:
            fill_rect(frame, GAP, left, PANEL, PANEL, RESULT_COLOURS[result])
        colour = MOVE_COLOURS[move] if move >= 0 else NO_MOVE
        inner = PANEL - 2 * BORDER
        fill_rect(frame, GAP + BORDER, left + BORDER, inner, inner, colour)
        if moving:
            fill_rect(frame, 2 * GAP + PANEL, left, BAR, PANEL, TO_MOVE)
    done = round((width - 2 * GAP) * min(max(progress, 0.0), 1.0))
    fill_rect(frame, height - GAP - BAR, GAP, BAR, done, PROGRESS)
    return frame


class RockPaperScissors(MultiAgentEnv):
    """Rock-paper-scissors played turn by turn for ``num_rounds`` rounds.

    Each round ``player_0`` moves first (the observation dict holds only
    ``player_0``), then ``player_1`` (only ``player_1``), without seeing
    ``player_0``'s move of this round. The round's zero-sum reward (+1 win,
    -1 loss, 0 draw) is paid to *both* players in the step of ``player_1``'s
    move; ``player_0`` earns 0 in its own step. After the last round both
    players terminate.

    Actions are ``Discrete(3)``: 0 rock, 1 paper, 2 scissors. An observation
    is ``float32[7]``: a one-hot of the player's own move in the previous
    round, a one-hot of the opponent's (both zero in the first round), and the
    fraction of rounds played. The global state is ``float32[10]``:
    ``player_0``'s and ``player_1``'s previous moves, ``player_0``'s pending
    move of this round (one-hots) and the fraction of rounds played.

    Examples:
        >>> env = RockPaperScissors(num_rounds=1)
        >>> obs, infos = env.reset(seed=0)
        >>> list(obs)
        ['player_0']
        >>> obs, rewards, *_ = env.step({"player_0": 0})
        >>> list(obs), rewards
        (['player_1'], {'player_0': 0.0, 'player_1': 0.0})
        >>> obs, rewards, terms, truncs, infos = env.step({"player_1": 2})
        >>> rewards, env.agents
        ({'player_0': 1.0, 'player_1': -1.0}, [])
    """

    metadata = {
        "render_modes": ["ansi", "rgb_array"],
        "name": "rps",
        "zero_sum": True,
        "lockstep": False,
    }

    def __init__(self, num_rounds: int = 3, render_mode: str | None = None) -> None:
        if num_rounds < 1:
            raise ValueError(f"num_rounds must be at least 1, got {num_rounds}")
        self.check_render_mode(render_mode)
        self.num_rounds = num_rounds
        self.render_mode = render_mode
        self.possible_agents = ["player_0", "player_1"]
        self.agents = []
        self._obs_space = spaces.Box(0.0, 1.0, shape=(7,), dtype=np.float32)
        self._action_space = spaces.Discrete(3)
        self.state_space = spaces.Box(0.0, 1.0, shape=(10,), dtype=np.float32)
        self._round = 0
        self._turn = 0
        self._step = 0
        self._last = [-1, -1]
        self._pending = -1

    @property
    def max_episode_steps(self) -> int:  # type: ignore[override]
        """Every episode lasts exactly two steps a round."""
        return 2 * self.num_rounds

    def observation_space(self, agent: AgentID) -> spaces.Box:
        """``float32[7]``: own and opponent's previous moves, fraction of rounds played."""
        return self._obs_space

    def action_space(self, agent: AgentID) -> spaces.Discrete:
        """``Discrete(3)``: rock, paper, scissors."""
        return self._action_space

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        """Start the first round; ``player_0`` moves first. The game has no chance events."""
        self.agents = list(self.possible_agents)
        self._round = 0
        self._turn = 0
        self._step = 0
        self._last = [-1, -1]
        self._pending = -1
        return {"player_0": self._observe(0)}, {"player_0": {}}

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        """Record the move of the player to act; score the round after ``player_1``'s move."""
        acting = [self.possible_agents[self._turn]] if self.agents else []
        if self.check_actions:
            validate_actions(actions, acting, self.action_space, {}, self._step)
        self._step += 1
        move = int(actions[acting[0]])
        if self._turn == 0:
            self._pending = move
            self._turn = 1
            rewards = {"player_0": 0.0, "player_1": 0.0}
            no = {"player_0": False, "player_1": False}
            return {"player_1": self._observe(1)}, rewards, no, dict(no), {"player_1": {}}
        reward = round_reward(self._pending, move)
        rewards = {"player_0": reward, "player_1": -reward}
        self._last = [self._pending, move]
        self._pending = -1
        self._round += 1
        self._turn = 0
        done = self._round == self.num_rounds
        terms = {"player_0": done, "player_1": done}
        truncs = {"player_0": False, "player_1": False}
        if done:
            infos = {a: {"final_obs": self._observe(i)} for i, a in enumerate(self.agents)}
            self.agents = []
            return {}, rewards, terms, truncs, infos
        return {"player_0": self._observe(0)}, rewards, terms, truncs, {"player_0": {}}

    def state(self) -> np.ndarray:
        """Both previous moves, ``player_0``'s pending move and the fraction of rounds played."""
        state = np.zeros(10, dtype=np.float32)
        for offset, move in zip((0, 3, 6), (*self._last, self._pending), strict=True):
            if move >= 0:
                state[offset + move] = 1.0
        state[9] = self._round / self.num_rounds
        return state

    def render(self) -> str | np.ndarray | None:
        """The round, the previous round's moves and who moves next: as text in ``ansi``
        mode, as a ``uint8`` frame in ``rgb_array`` mode (see :func:`players_frame`)."""
        if self.render_mode == "rgb_array":
            played = self._last[0] >= 0
            reward = round_reward(*self._last) if played else None
            return players_frame(
                self._last,
                [reward, None if reward is None else -reward],
                [bool(self.agents) and self._turn == k for k in range(2)],
                self._round / self.num_rounds,
            )
        if self.render_mode != "ansi":
            return None
        if self._last[0] < 0:
            previous = "no round played yet"
        else:
            p0, p1 = (MOVES[m] for m in self._last)
            outcome = {1.0: "player_0 wins", -1.0: "player_1 wins", 0.0: "draw"}
            previous = f"last round: {p0} vs {p1} ({outcome[round_reward(*self._last)]})"
        to_move = f"player_{self._turn} to move" if self.agents else "game over"
        return f"round {self._round}/{self.num_rounds}; {previous}; {to_move}\n"

    def _observe(self, player: int) -> np.ndarray:
        obs = np.zeros(7, dtype=np.float32)
        own, other = self._last[player], self._last[1 - player]
        if own >= 0:
            obs[own] = 1.0
            obs[3 + other] = 1.0
        obs[6] = self._round / self.num_rounds
        return obs


register("corral/rps", RockPaperScissors)
