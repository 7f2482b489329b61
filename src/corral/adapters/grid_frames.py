"""``rgb_array`` frames of the grid worlds of EPyMARL's envs, drawn from their state.

Level-Based Foraging and the multi-robot warehouse draw themselves with pyglet,
which needs a display (and LBF offers no ``rgb_array`` mode at all), so recording
an episode on a headless machine failed. These functions draw a frame with numpy
alone from the unwrapped env's state, ``CELL`` pixels per grid cell; the
:class:`~corral.adapters.gymnasium_multi.MultiAgentGymnasiumAdapter` returns them
in ``rgb_array`` mode (``gymnasium_multi.KNOWN`` says which package draws how).

* LBF: food as green squares, agents as discs of their own colour; a row of
  pips along the bottom of a cell shows the level of the food or agent there.
* RWARE: goal cells dark, shelves as squares (teal where requested), agents as
  orange discs (red while carrying a shelf) with a black dot on the side they face.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.envs.canvas import Colour, blank, fill_disc, fill_rect

CELL = 24
"""Pixels per grid cell."""
FLOOR, GRID = (236, 234, 224), (214, 211, 200)
FOOD, PIP = (70, 160, 70), (30, 30, 30)
AGENTS: tuple[Colour, ...] = (
    (206, 60, 50), (48, 108, 206), (230, 160, 30), (140, 70, 170),
    (40, 160, 160), (200, 90, 150), (110, 110, 110), (150, 110, 60),
)  # fmt: skip
"""LBF's agents' colours, agent ``i`` the ``i % 8``-th."""
GOAL, SHELF, REQUESTED = (60, 60, 60), (72, 61, 139), (0, 128, 128)
ROBOT, LOADED, FACING = (255, 140, 0), (220, 30, 30), (0, 0, 0)
PIP_RADIUS = 1.5
FACING_OFFSET = {"UP": (-1, 0), "DOWN": (1, 0), "LEFT": (0, -1), "RIGHT": (0, 1)}
"""The direction an RWARE agent faces, as (row, column) steps."""


def grid(rows: int, cols: int) -> np.ndarray:
    """An empty floor of ``rows`` x ``cols`` cells with grid lines."""
    frame = blank(rows * CELL, cols * CELL, FLOOR)
    frame[::CELL], frame[-1] = GRID, GRID
    frame[:, ::CELL], frame[:, -1] = GRID, GRID
    return frame


def pip_centre(row: int, col: int, k: int) -> tuple[float, float]:
    """The centre (pixels) of the ``k``-th level pip of cell ``(row, col)``, left to right
    along its bottom (a cell holds 5; level ``k > 5`` wraps onto the row above)."""
    line, place = divmod(k, 5)
    return (row + 1) * CELL - 4 - 5 * line, col * CELL + 4 + 4 * place


def lbf_frame(env: Any) -> np.ndarray:
    """The frame of an LBF env (``lbforaging``'s ``ForagingEnv``): ``field[r, c]`` is the
    level of the food in cell ``(r, c)`` (0: none), each player a ``position`` (row,
    column) and a ``level``."""
    field = np.asarray(env.field)
    frame = grid(*field.shape)
    for row, col in zip(*np.nonzero(field), strict=True):
        fill_rect(frame, row * CELL + 4, col * CELL + 4, CELL - 7, CELL - 7, FOOD)
        _pips(frame, row, col, int(field[row, col]))
    for i, player in enumerate(env.players):
        if player.position is None:
            continue
        row, col = (int(x) for x in player.position)
        centre = (row + 0.5) * CELL, (col + 0.5) * CELL
        fill_disc(frame, centre[0] - 2, centre[1], CELL * 0.36, AGENTS[i % len(AGENTS)])
        _pips(frame, row, col, int(player.level))
    return frame


def rware_frame(env: Any) -> np.ndarray:
    """The frame of an RWARE env (``rware``'s ``Warehouse``): ``grid_size`` (rows,
    columns); goals, shelves and agents at ``x`` (column) and ``y`` (row); the shelves in
    ``request_queue`` requested; each agent's ``dir`` and ``carrying_shelf``."""
    rows, cols = (int(n) for n in env.grid_size)
    frame = grid(rows, cols)
    for x, y in env.goals:
        fill_rect(frame, int(y) * CELL + 1, int(x) * CELL + 1, CELL - 1, CELL - 1, GOAL)
    requested = {id(shelf) for shelf in env.request_queue}
    for shelf in env.shelfs:
        colour = REQUESTED if id(shelf) in requested else SHELF
        top, left = int(shelf.y) * CELL + 3, int(shelf.x) * CELL + 3
        fill_rect(frame, top, left, CELL - 5, CELL - 5, colour)
    for agent in env.agents:
        row, col = int(agent.y), int(agent.x)
        centre = (row + 0.5) * CELL, (col + 0.5) * CELL
        colour = LOADED if agent.carrying_shelf is not None else ROBOT
        fill_disc(frame, *centre, CELL * 0.32, colour)
        d_row, d_col = FACING_OFFSET[agent.dir.name]
        facing = centre[0] + d_row * CELL * 0.22, centre[1] + d_col * CELL * 0.22
        fill_disc(frame, *facing, 2.5, FACING)
    return frame


def _pips(frame: np.ndarray, row: int, col: int, level: int) -> None:
    for k in range(level):
        fill_disc(frame, *pip_centre(row, col, k), PIP_RADIUS, PIP)
