"""Predator-prey tag on a grid: ``corral/tag``.

Two kinds of agents with different spaces, agents that die mid-episode and
per-step action masks in a simultaneous env.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.env import AgentID, InfoDict, MultiAgentEnv, ObsDict, StepResult, validate_actions
from corral.envs.canvas import blank, fill_disc, fill_rect
from corral.envs.step_count import StepCount
from corral.registry import register

Cell = tuple[int, int]

# Row/column offsets of each action: stay, up, down, left, right, then the diagonals.
KING_MOVES: tuple[Cell, ...] = (
    (0, 0), (-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1),
)  # fmt: skip
PREDATOR_MOVES = KING_MOVES[:5]
PREY_MOVES = KING_MOVES
CATCH_REWARD = 1.0

CELL = 24  # pixels per grid cell of an rgb_array frame
FLOOR, GRID, WALL = (236, 234, 224), (214, 211, 200), (72, 72, 84)
PREDATOR, PREY = (206, 60, 50), (48, 108, 206)


class Tag(MultiAgentEnv):
    """Predators chase prey on a ``size`` x ``size`` grid with walls.

    All live agents act simultaneously. ``predator_0..`` move one cell per
    step (``Discrete(5)``: stay, up, down, left, right); ``prey_0..`` move
    like a chess king (``Discrete(9)``: those five and the four diagonals).
    Moves into a wall or off the grid are illegal and masked out in
    ``infos[agent]["action_mask"]`` (a read-only ``int8`` array); agents
    never block each other. By default four pillars stand two cells in from
    the corners.

    A prey is caught when, after the move, a predator stands on its cell or
    the two swapped cells. A caught prey earns -1, terminates, leaves
    ``agents`` and the observation dict (its last observation is
    ``infos[prey]["final_obs"]``) and never returns; every predator earns +1
    per prey caught in the step. The episode ends when all prey are caught
    (every agent terminates) or after ``max_cycles`` steps (every live agent
    is truncated). Initial cells are distinct, drawn from the generator seeded
    by ``reset(seed)``; nothing else is random.

    Observations, positions scaled by ``1 / (size - 1)``:

    * predator, ``float32[2 + 2 * (P - 1) + 3 * Y]``: its own (row, col), each
      other predator's position relative to it, and each prey's relative
      position and alive flag (zeros once caught);
    * prey, ``float32[2 + 2 * P + 3 * (Y - 1)]``: its own (row, col), each
      predator's relative position, each other prey's relative position and
      alive flag;

    where P = ``num_predators`` and Y = ``num_prey``. The global state is
    ``float32[3 * (P + Y)]``: every agent's scaled (row, col) then every
    agent's alive flag, zeros for caught prey.

    Examples:
        >>> env = Tag(num_predators=2, num_prey=1)
        >>> obs, infos = env.reset(seed=0)
        >>> sorted(obs)
        ['predator_0', 'predator_1', 'prey_0']
        >>> env.action_space("predator_0"), env.action_space("prey_0")
        (Discrete(5), Discrete(9))
    """

    metadata = {"render_modes": ["ansi", "rgb_array"], "name": "tag", "lockstep": False}
    simultaneous = True
    max_cycles = StepCount()

    def __init__(
        self,
        num_predators: int = 2,
        num_prey: int = 2,
        size: int = 7,
        max_cycles: int = 50,
        walls: Sequence[tuple[int, int]] | None = None,
        render_mode: str | None = None,
    ) -> None:
        if num_predators < 1 or num_prey < 1:
            raise ValueError(
                f"need at least one predator and one prey, got {num_predators} and {num_prey}"
            )
        if size < 2:
            raise ValueError(f"need size >= 2, got {size}")
        self.check_render_mode(render_mode)
        self.num_predators, self.num_prey = num_predators, num_prey
        self.size, self.max_cycles, self.render_mode = size, max_cycles, render_mode
        predators = [f"predator_{i}" for i in range(num_predators)]
        prey = [f"prey_{i}" for i in range(num_prey)]
        self.possible_agents = predators + prey
        self.agents = []
        self._index = {agent: i for i, agent in enumerate(self.possible_agents)}

        self._free = np.ones((size, size), dtype=bool)
        for row, col in _default_walls(size) if walls is None else walls:
            if not (0 <= row < size and 0 <= col < size):
                raise ValueError(f"wall {(row, col)} is outside the {size}x{size} grid")
            self._free[row, col] = False
        self._free_cells = [(int(r), int(c)) for r, c in np.argwhere(self._free)]
        n = num_predators + num_prey
        if len(self._free_cells) < n:
            raise ValueError(f"{len(self._free_cells)} free cells cannot hold {n} agents")
        predator_masks = mask_table(self._free, PREDATOR_MOVES)
        prey_masks = mask_table(self._free, PREY_MOVES)

        self._obs_spaces: dict[AgentID, spaces.Box] = {}
        self._action_spaces: dict[AgentID, spaces.Discrete] = {}
        self._moves: list[tuple[Cell, ...]] = []
        self._masks: list[list[list[np.ndarray]]] = []
        self._gather: list[np.ndarray] = []
        for i, agent in enumerate(self.possible_agents):
            is_predator = i < num_predators
            moves = PREDATOR_MOVES if is_predator else PREY_MOVES
            self._moves.append(moves)
            self._masks.append(predator_masks if is_predator else prey_masks)
            self._action_spaces[agent] = spaces.Discrete(len(moves))
            self._gather.append(_observation_index(i, n, num_predators))
            shape = self._gather[i].shape
            self._obs_spaces[agent] = spaces.Box(-1.0, 1.0, shape=shape, dtype=np.float32)
        self.state_space = spaces.Box(-1.0, 1.0, shape=(3 * n,), dtype=np.float32)

        self._scale = 1.0 / (size - 1)
        self._rng: np.random.Generator | None = None
        self._pos: list[Cell] = [(0, 0)] * n
        self._alive = np.zeros(n, dtype=np.float32)
        self._step = 0
        self._current_masks: dict[AgentID, np.ndarray] = {}

    @property
    def max_episode_steps(self) -> int:  # type: ignore[override]
        """``max_cycles``: every live agent is truncated then."""
        return self.max_cycles

    def observation_space(self, agent: AgentID) -> spaces.Box:
        """A predator's and a prey's observations differ in size; see the class docstring."""
        return self._obs_spaces[agent]

    def action_space(self, agent: AgentID) -> spaces.Discrete:
        """``Discrete(5)`` for predators, ``Discrete(9)`` for prey."""
        return self._action_spaces[agent]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        """Place every agent on a distinct free cell drawn from the seeded generator."""
        if seed is not None or self._rng is None:
            self._rng = np.random.default_rng(seed)
        n = len(self.possible_agents)
        cells = self._rng.choice(len(self._free_cells), size=n, replace=False)
        self._pos = [self._free_cells[c] for c in cells]
        self._alive[:] = 1.0
        self._step = 0
        self.agents = list(self.possible_agents)
        return self._observe_agents(self._features())

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        """Move every live agent, then remove the prey that were caught."""
        if self.check_actions:
            validate_actions(
                actions, self.agents, self.action_space, self._current_masks, self._step
            )
        self._step += 1
        old = self._pos
        new = list(old)
        for agent in self.agents:
            i = self._index[agent]
            (row, col), (drow, dcol) = old[i], self._moves[i][int(actions[agent])]
            new[i] = (row + drow, col + dcol)
        self._pos = new

        rewards = dict.fromkeys(self.agents, 0.0)
        caught = [self.possible_agents[i] for i in self._caught(old, new)]
        for prey in caught:
            self._alive[self._index[prey]] = 0.0
            rewards[prey] = -CATCH_REWARD
        for agent in self.possible_agents[: self.num_predators]:  # predators never leave
            rewards[agent] = CATCH_REWARD * len(caught)

        all_caught = not self._alive[self.num_predators :].any()
        out_of_time = self._step >= self.max_cycles and not all_caught
        terms = {a: all_caught or a in caught for a in self.agents}
        truncs = {a: out_of_time and a not in caught for a in self.agents}
        ended = [a for a in self.agents if terms[a] or truncs[a]]
        features = self._features()
        infos = {a: {"final_obs": features[self._gather[self._index[a]]]} for a in ended}
        self.agents = [a for a in self.agents if a not in ended]
        obs, live_infos = self._observe_agents(features)
        infos.update(live_infos)
        return obs, rewards, terms, truncs, infos

    def state(self) -> np.ndarray:
        """Every agent's scaled (row, col), then alive flags; zeros for caught prey."""
        pos = np.array(self._pos, dtype=np.float32) * self._scale * self._alive[:, None]
        return np.concatenate([pos.ravel(), self._alive])

    def render(self) -> str | np.ndarray | None:
        """The grid: as text in ``ansi`` mode (``#`` wall, ``P`` predator, ``o`` prey,
        ``.`` free), as a ``uint8`` frame ``[size * 24, size * 24, 3]`` in ``rgb_array``
        mode (dark walls, red predators, smaller blue prey)."""
        if self.render_mode == "rgb_array":
            return self._frame()
        if self.render_mode != "ansi":
            return None
        grid = np.where(self._free, ".", "#")
        for agent in self.agents:
            i = self._index[agent]
            grid[self._pos[i]] = "P" if i < self.num_predators else "o"
        return "\n".join("".join(row) for row in grid) + "\n"

    def _frame(self) -> np.ndarray:
        side = self.size * CELL
        frame = blank(side, side, FLOOR)
        frame[::CELL], frame[-1] = GRID, GRID
        frame[:, ::CELL], frame[:, -1] = GRID, GRID
        for row, col in np.argwhere(~self._free):
            fill_rect(frame, row * CELL, col * CELL, CELL, CELL, WALL)
        for agent in self.agents:
            i = self._index[agent]
            row, col = self._pos[i]
            predator = i < self.num_predators
            radius = CELL * (0.42 if predator else 0.3)
            colour = PREDATOR if predator else PREY
            fill_disc(frame, (row + 0.5) * CELL, (col + 0.5) * CELL, radius, colour)
        return frame

    def _caught(self, old: list[Cell], new: list[Cell]) -> list[int]:
        """Indices of the live prey that a predator reached or swapped cells with."""
        hunters = list(zip(old[: self.num_predators], new[: self.num_predators], strict=True))
        return [
            j
            for j in range(self.num_predators, len(new))
            if self._alive[j]
            and any(to == new[j] or (to == old[j] and was == new[j]) for was, to in hunters)
        ]

    def _features(self) -> np.ndarray:
        """Scaled positions, then for each pair (i, j): j's position relative to i, j alive.

        Every observation is a gather from this vector; caught prey read as zeros.
        """
        n = len(self.possible_agents)
        pos = np.array(self._pos, dtype=np.float32) * self._scale
        pairs = np.empty((n, n, 3), dtype=np.float32)
        np.multiply(pos[None] - pos[:, None], self._alive[None, :, None], out=pairs[..., :2])
        pairs[..., 2] = self._alive
        return np.concatenate([pos.ravel(), pairs.ravel()])

    def _observe_agents(self, features: np.ndarray) -> tuple[ObsDict, InfoDict]:
        obs, infos = {}, {}
        for agent in self.agents:
            i = self._index[agent]
            obs[agent] = features[self._gather[i]]
            row, col = self._pos[i]
            infos[agent] = {"action_mask": self._masks[i][row][col]}
        self._current_masks = {a: info["action_mask"] for a, info in infos.items()}
        return obs, infos


def _observation_index(i: int, n: int, num_predators: int) -> np.ndarray:
    """Where agent ``i``'s observation lies in the feature vector of :meth:`Tag._features`."""
    pairs = [2 * n + 3 * (i * n + j) for j in range(n) if j != i]
    seen_predators = num_predators - (i < num_predators)
    index = [2 * i, 2 * i + 1]
    index += [k + d for k in pairs[:seen_predators] for d in (0, 1)]
    index += [k + d for k in pairs[seen_predators:] for d in (0, 1, 2)]
    return np.array(index, dtype=np.intp)


def _default_walls(size: int) -> list[Cell]:
    """Four pillars two cells in from the corners (none on grids smaller than 5x5)."""
    if size < 5:
        return []
    far = size - 3
    return [(2, 2), (2, far), (far, 2), (far, far)]


def mask_table(free: np.ndarray, moves: tuple[Cell, ...]) -> list[list[np.ndarray]]:
    """``table[row][col]``: a read-only ``int8`` mask, 1 where the move from the cell is legal."""
    size = free.shape[0]
    padded = np.zeros((size + 2, size + 2), dtype=bool)
    padded[1:-1, 1:-1] = free
    rows, cols = np.indices(free.shape)
    table = np.stack([padded[rows + 1 + dr, cols + 1 + dc] for dr, dc in moves], axis=-1)
    table = table.astype(np.int8)
    table.setflags(write=False)
    return [list(row) for row in table]


register("corral/tag", Tag, batched="corral.envs.tag_batched:BatchedTag")
