"""Variants of corral's small games that the tests register."""

from __future__ import annotations

from corral.envs.rps import RockPaperScissors


class UndeclaredRPS(RockPaperScissors):
    """rock-paper-scissors that does not declare itself zero-sum."""

    metadata = {"render_modes": [], "name": "undeclared_rps"}
