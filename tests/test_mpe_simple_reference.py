"""corral's natively batched ``mpe2/simple_reference_v3`` against mpe2 itself."""

from __future__ import annotations

import numpy as np
import pytest
from mpe_differential import (
    batched,
    check_exact,
    check_float32_returns,
    check_float32_step,
    check_render,
    check_render_at_reset,
    check_torch,
)
from test_native_vector import PLACES

pytest.importorskip("mpe2")

ID = "mpe2/simple_reference_v3"
CASES = [
    {},
    {"local_ratio": 0.3, "max_cycles": 13},
    {"continuous_actions": True, "local_ratio": 1.0},
    {"continuous_actions": True, "max_cycles": 9, "dynamic_rescaling": False},
]
IDS = [str(kw) for kw in CASES]
TORCH = [p for p in PLACES if p != ("numpy", "cpu")]


@pytest.mark.parametrize("env_kwargs", CASES, ids=IDS)
def test_numpy_float64_is_bit_identical_to_mpe2(env_kwargs) -> None:
    check_exact(ID, env_kwargs)


@pytest.mark.parametrize(("array", "device"), TORCH)
@pytest.mark.parametrize("env_kwargs", CASES, ids=IDS)
def test_torch_float64_is_within_1e9_of_numpy(env_kwargs, array, device) -> None:
    check_torch(ID, env_kwargs, device)


@pytest.mark.parametrize("env_kwargs", CASES[::2], ids=IDS[::2])
def test_float32_steps_within_1e4_of_mpe2(env_kwargs) -> None:
    check_float32_step(ID, env_kwargs)


def test_float32_mean_return_within_1_percent() -> None:
    check_float32_returns(ID, CASES[1])


@pytest.mark.parametrize("env_kwargs", CASES[::3], ids=IDS[::3])
def test_render_draws_a_copy_as_mpe2_does(env_kwargs) -> None:
    check_render(ID, env_kwargs)


def test_render_draws_each_copys_goal_colours() -> None:
    """Each agent wears the colour of the landmark it must reach (the other's goal)."""
    env = check_render_at_reset(ID, {})
    assert set(np.asarray(env.goals).ravel().tolist()) == {0, 1, 2}  # every colour drawn


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"benchmark_data": True}, "benchmark_data=True"), ({"local_ratio": 1.5}, "local_ratio")],
)
def test_a_bad_or_unsupported_argument_is_named(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        batched(ID, 2, **kwargs)
