"""The env contract's helpers (corral/env.py): ``validate_actions``."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

import corral
from corral.errors import InvalidActionError

SPACE = spaces.Discrete(3)


def action_space(agent: str) -> spaces.Space:
    return SPACE


def test_validate_actions_without_masks_allows_every_action_and_still_checks_the_space():
    for masks in (None, {}):
        corral.validate_actions({"a": 2, "b": 0}, ["a", "b"], action_space, masks, 4)
        with pytest.raises(
            InvalidActionError, match=r"step 4: agent 'b': expected an integer in \[0, 2\], got 3"
        ):
            corral.validate_actions({"a": 2, "b": 3}, ["a", "b"], action_space, masks, 4)


def test_validate_actions_reads_the_masks_it_is_given():
    masks = {"a": np.array([1, 0, 1], np.int8)}  # "b" has no mask: every action allowed
    corral.validate_actions({"a": 2, "b": 1}, ["a", "b"], action_space, masks, 0)
    with pytest.raises(InvalidActionError, match=r"agent 'a': expected a legal action \[0, 2\]"):
        corral.validate_actions({"a": 1, "b": 1}, ["a", "b"], action_space, masks, 0)
