"""Random batched actions (corral.vector.sampling): inside every space, bounded or not."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from corral.vector.sampling import sample_array

INF = np.inf
BOXES = {
    "bounded": spaces.Box(np.array([0, -2], np.float32), np.array([1, 3], np.float32)),
    "from a low": spaces.Box(5.0, INF, shape=(3,), dtype=np.float32),
    "up to a high": spaces.Box(-INF, -5.0, shape=(3,), dtype=np.float64),
    "unbounded": spaces.Box(-INF, INF, shape=(2,), dtype=np.float32),
    "mixed": spaces.Box(np.array([-INF, 0, -INF, 2]), np.array([INF, INF, 1, 4]), dtype=np.float64),
    "integer": spaces.Box(-3, 7, shape=(2,), dtype=np.int16),
}


@pytest.mark.parametrize("name", sorted(BOXES))
def test_every_sampled_box_action_is_in_its_space(name: str) -> None:
    space = BOXES[name]
    drawn = sample_array(space, (64, 3), np.random.default_rng(0))
    assert drawn.shape == (64, 3, *space.shape) and drawn.dtype == space.dtype
    assert all(space.contains(a) for a in drawn.reshape(-1, *space.shape))
    # an open side is sampled within 2 of the finite bound, or within [-1, 1]
    low = np.where(
        np.isfinite(space.low), space.low, np.where(np.isfinite(space.high), space.high - 2, -1)
    )
    high = np.where(
        np.isfinite(space.high), space.high, np.where(np.isfinite(space.low), space.low + 2, 1)
    )
    assert (drawn >= low).all() and (drawn <= high).all()
    assert len(np.unique(drawn)) > 1


def test_a_bounded_box_draws_the_uniform_numbers_of_its_bounds() -> None:
    space = BOXES["bounded"]
    drawn = sample_array(space, (4,), np.random.default_rng(1))
    expected = np.random.default_rng(1).uniform(space.low, space.high, size=(4, 2))
    np.testing.assert_array_equal(drawn, expected.astype(np.float32))
