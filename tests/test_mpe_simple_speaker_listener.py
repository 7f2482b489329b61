"""corral's natively batched ``mpe2/simple_speaker_listener_v4`` against mpe2 itself."""

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

ID = "mpe2/simple_speaker_listener_v4"
CASES = [
    {},
    {"max_cycles": 13},
    {"continuous_actions": True},
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
    check_float32_returns(ID, CASES[2])


@pytest.mark.parametrize("env_kwargs", CASES[::3], ids=IDS[::3])
def test_render_draws_a_copy_as_mpe2_does(env_kwargs) -> None:
    check_render(ID, env_kwargs)


def test_render_draws_each_copys_goal_colours() -> None:
    """The listener wears its goal landmark's colour, lightened."""
    env = check_render_at_reset(ID, {})
    assert set(np.asarray(env.goal).tolist()) == {0, 1, 2}  # every colour drawn


def test_the_speaker_never_moves() -> None:
    """The speaker stays where its reset put it, whatever it says; the listener moves."""
    env = batched(ID, 3)
    env.reset(seed=1)
    start = env.world.pos.copy()
    rng = np.random.default_rng(0)
    for _ in range(5):
        env.step({"speaker": rng.integers(0, 3, (3, 1)), "listener": np.full((3, 1), 2)})
    assert (env.world.pos[:, 0] == start[:, 0]).all()
    assert (env.world.pos[:, 1, 0] > start[:, 1, 0]).all()


def test_an_unsupported_argument_is_named() -> None:
    with pytest.raises(ValueError, match="benchmark_data=True"):
        batched(ID, 2, benchmark_data=True)
