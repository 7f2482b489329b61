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


def _bad_render_mode_message(build) -> str:
    with pytest.raises(ValueError) as caught:
        build("no_such_mode")
    return str(caught.value)


@pytest.mark.parametrize(
    ("build", "modes"),
    [
        (lambda mode: corral.make("corral/rps", render_mode=mode), "one of ['ansi', 'rgb_array']"),
        (lambda mode: corral.make("corral/rps4", render_mode=mode), "one of ['ansi', 'rgb_array']"),
        (lambda mode: corral.make("corral/tag", render_mode=mode), "one of ['ansi', 'rgb_array']"),
        (lambda mode: corral.make("mdp/two_round_dmdp", render_mode=mode), "'ansi'"),
        (lambda mode: corral.make("mdp/climbing", render_mode=mode), "'ansi'"),
        (lambda mode: corral.make("openspiel/tic_tac_toe", render_mode=mode), "'ansi'"),
        (
            lambda mode: corral.spec("mpe2/simple_spread_v3").make_batched(2, render_mode=mode),
            "'rgb_array'",
        ),
    ],
)
def test_every_env_rejects_an_unknown_render_mode_with_one_message(build, modes) -> None:
    message = _bad_render_mode_message(build)
    assert message.startswith(f"render_mode must be None or {modes}, got 'no_such_mode'")


def test_an_env_that_cannot_render_says_so_and_what_to_render_instead() -> None:
    message = _bad_render_mode_message(
        lambda mode: corral.spec("corral/tag").make_batched(2, render_mode=mode)
    )
    assert message.startswith(
        "render_mode must be None (the env cannot render), got 'no_such_mode'"
    )
    assert "native=False" in message


def test_a_listed_render_mode_and_none_pass_the_base_class_check() -> None:
    env = corral.make("corral/rps")
    env.check_render_mode(None)
    env.check_render_mode("ansi")
    with pytest.raises(ValueError, match="got 'human'; draw it yourself"):
        env.check_render_mode("human", "draw it yourself")
