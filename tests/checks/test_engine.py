"""corral.checks.engine: what both conformance checkers share (here: judging a value against
its space, part by part)."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from corral.checks.engine import unfinite_parts

BOX = spaces.Box(-np.inf, np.inf, (2,), np.float32)
SPACE = spaces.Dict(
    pos=BOX,
    parts=spaces.Tuple((spaces.Discrete(3), BOX, spaces.Dict(deep=BOX))),
)


def test_unfinite_parts_names_each_box_part_with_nan_inf_or_overflow() -> None:
    value = {
        "pos": np.array([0.0, np.nan]),
        "parts": (1, np.array([1e300, 0.0]), {"deep": np.array([np.inf, 0.0], np.float32)}),
    }
    assert list(unfinite_parts(SPACE, value, "obs")) == [
        ("obs['pos']", "finite values, got nan at index (1,)"),
        (
            "obs['parts'][1]",
            "values that float32 holds (in [-3.40282e+38, 3.40282e+38]), got 1e+300 at "
            "index (0,), which overflows float32",
        ),
        ("obs['parts'][2]['deep']", "finite values, got inf at index (0,)"),
    ]
    assert list(unfinite_parts(BOX, np.array([np.inf, 0.0]), "")) == [
        ("", "finite values, got inf at index (0,)")
    ]


def test_unfinite_parts_judges_what_a_value_has_and_leaves_the_rest_to_the_space_check() -> None:
    nan = np.array([np.nan, 0.0])
    assert list(unfinite_parts(SPACE, {"parts": [0, nan]}, "")) == [
        ("['parts'][1]", "finite values, got nan at index (0,)")  # a list for the tuple, short
    ]
    for broken in (None, "text", {"pos": "x", "parts": 3}, ("not", "a", "dict")):
        assert list(unfinite_parts(SPACE, broken, "")) == []
    assert list(unfinite_parts(spaces.Discrete(3), np.nan, "")) == []  # no Box: not judged
