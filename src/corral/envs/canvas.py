"""RGB frames drawn with numpy alone, for the ``rgb_array`` render mode of corral's envs.

A frame is a ``uint8`` array ``[height, width, 3]``; the functions below paint
filled rectangles and discs into it in place.
"""

from __future__ import annotations

import numpy as np

Colour = tuple[int, int, int]


def blank(height: int, width: int, colour: Colour) -> np.ndarray:
    """A ``height`` x ``width`` frame filled with ``colour``."""
    frame = np.empty((height, width, 3), dtype=np.uint8)
    frame[...] = colour
    return frame


def fill_rect(
    frame: np.ndarray, top: int, left: int, height: int, width: int, colour: Colour
) -> None:
    """Paint the rectangle with top-left pixel ``(top, left)``, clipped to the frame."""
    frame[max(top, 0) : max(top + height, 0), max(left, 0) : max(left + width, 0)] = colour


def fill_disc(frame: np.ndarray, row: float, col: float, radius: float, colour: Colour) -> None:
    """Paint the disc of ``radius`` pixels centred on ``(row, col)``."""
    rows, cols = np.ogrid[: frame.shape[0], : frame.shape[1]]
    inside = (rows + 0.5 - row) ** 2 + (cols + 0.5 - col) ** 2 <= radius**2
    frame[inside] = colour
