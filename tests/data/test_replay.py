"""The replay memory: rows stored and sampled where they are (NumPy, torch on its device)."""

from __future__ import annotations

import numpy as np
import pytest
from support.marks import needs_cuda

from corral.arrays import to_numpy
from corral.data.replay import Replay

torch = pytest.importorskip("torch")

WHERE = [
    "numpy",
    "cpu",
    pytest.param("cuda", marks=needs_cuda),
]


def arrays(where, **fields):
    """``fields`` as arrays of ``where`` (``numpy`` or a torch device)."""
    if where == "numpy":
        return {k: np.asarray(v) for k, v in fields.items()}
    return {k: torch.as_tensor(np.asarray(v), device=where) for k, v in fields.items()}


def rows(where, rewards):
    r = np.asarray(rewards, dtype=np.float64)
    return arrays(where, reward=r, obs=np.stack([r, -r], axis=1).astype(np.float32))


def stored(replay: Replay) -> list[float]:
    return sorted(to_numpy(replay.state_dict()["data"]["reward"]).tolist())


@pytest.mark.parametrize("where", WHERE)
def test_rows_stay_where_they_are_and_wrap_around(where):
    replay = Replay(4, seed=0)
    for k in range(3):
        replay.add(rows(where, [2 * k, 2 * k + 1]))
    assert len(replay) == 4 and stored(replay) == [2.0, 3.0, 4.0, 5.0]  # 0 and 1 overwritten
    sample = replay.sample(300)
    if where == "numpy":
        assert isinstance(sample["reward"], np.ndarray)
    else:
        assert sample["reward"].device.type == where and torch.is_tensor(replay.size)
    reward, obs = to_numpy(sample["reward"]), to_numpy(sample["obs"])
    assert set(reward.tolist()) == {2.0, 3.0, 4.0, 5.0}
    np.testing.assert_array_equal(obs[:, 0], reward)  # a row's fields stay together
    np.testing.assert_array_equal(obs[:, 1], -reward)


@pytest.mark.parametrize("where", WHERE)
def test_only_kept_rows_are_written_in_order(where):
    replay = Replay(5, seed=0)
    keep = arrays(where, k=[True, False, True, False, True, True])["k"]
    replay.add(rows(where, [0, 1, 2, 3, 4, 5]), keep=keep)
    assert len(replay) == 4
    data = replay.state_dict()["data"]
    assert to_numpy(data["reward"]).tolist() == [0.0, 2.0, 4.0, 5.0]
    replay.add(rows(where, [6, 7, 8]), keep=arrays(where, k=[False, True, True])["k"])
    # the 5th row lands in the last place, the 6th overwrites the oldest
    assert to_numpy(replay.state_dict()["data"]["reward"]).tolist() == [8.0, 2.0, 4.0, 5.0, 7.0]
    assert replay.state_dict()["next"] == 1


@pytest.mark.parametrize("where", WHERE)
def test_more_kept_rows_than_capacity_keep_the_newest(where):
    replay = Replay(2, seed=0)
    replay.add(rows(where, [1, 2, 3, 4]), keep=arrays(where, k=[True, True, True, False])["k"])
    assert stored(replay) == [2.0, 3.0]


@pytest.mark.parametrize("where", WHERE)
def test_sampling_is_uniform_over_the_stored_rows(where):
    replay = Replay(10, seed=3)
    replay.add(rows(where, range(8)))
    draws = np.concatenate([to_numpy(replay.sample(1000)["reward"]) for _ in range(8)])
    counts = np.bincount(draws.astype(int), minlength=10)
    assert counts[8:].sum() == 0  # never an empty place
    expected = len(draws) / 8
    chi2 = ((counts[:8] - expected) ** 2 / expected).sum()
    assert chi2 < 24.3  # the 0.999 quantile of chi-square with 7 degrees of freedom


@pytest.mark.parametrize("where", WHERE)
def test_state_dict_round_trip_restores_rows_position_and_sampling(where):
    replay = Replay(5, seed=0)
    replay.add(rows(where, range(7)))
    replay.sample(3)  # the torch generator exists and has moved
    state = replay.state_dict()
    assert len(state["data"]["reward"]) == 5 and state["next"] == 2
    copy = Replay(5, seed=123)  # another seed: the samplers' states are restored
    copy.load_state_dict(state)
    copy.to(rows(where, [0])["reward"])
    assert len(copy) == 5
    a, b = replay.sample(16), copy.sample(16)
    assert all(np.array_equal(to_numpy(a[k]), to_numpy(b[k])) for k in a)
    replay.add(rows(where, [70]))
    copy.add(rows(where, [70]))
    after, copied = replay.state_dict(), copy.state_dict()
    assert after["next"] == copied["next"] == 3
    assert all(np.array_equal(to_numpy(after["data"][k]), to_numpy(copied["data"][k])) for k in a)
    with pytest.raises(ValueError, match="capacity 5 cannot be loaded into one of capacity 4"):
        Replay(4).load_state_dict(state)


@pytest.mark.parametrize("where", WHERE)
def test_a_memory_saved_again_before_it_samples_keeps_the_restored_sampler(where):
    """A checkpoint written after a resume and before the next sample (a resumed run saved
    at once) lost the torch sampler's restored state: the next resume drew other rows."""
    replay = Replay(5, seed=0)
    replay.add(rows(where, range(7)))
    replay.sample(3)
    once = Replay(5, seed=123)
    once.load_state_dict(replay.state_dict())
    twice = Replay(5, seed=456)
    twice.load_state_dict(once.state_dict())  # saved again before any sample
    twice.to(rows(where, [0])["reward"])
    a, b = replay.sample(16), twice.sample(16)
    assert all(np.array_equal(to_numpy(a[k]), to_numpy(b[k])) for k in a)


def test_a_numpy_memory_resumes_on_torch_rows():
    replay = Replay(4, seed=0)
    replay.add(rows("numpy", [1, 2]))
    resumed = Replay(4, seed=0)
    resumed.load_state_dict(replay.state_dict())
    resumed.add(rows("cpu", [3]))
    assert torch.is_tensor(resumed.sample(2)["reward"]) and stored(resumed) == [1.0, 2.0, 3.0]


def test_an_earlier_replay_buffer_state_loads():
    # corral's earlier numpy ReplayBuffer saved this layout (no torch generator)
    old = {
        "capacity": 3,
        "data": {"reward": np.array([5.0, 6.0]), "obs": np.zeros((2, 2), np.float32)},
        "next": 2,
        "size": 2,
        "rng": np.random.default_rng(9).bit_generator.state,
    }
    replay = Replay(3, seed=0)
    replay.load_state_dict(old)
    assert len(replay) == 2 and set(replay.sample(20)["reward"].tolist()) == {5.0, 6.0}
    replay.add(rows("numpy", [7, 8]))
    assert replay.state_dict()["data"]["reward"].tolist() == [8.0, 6.0, 7.0]


def test_bad_rows_are_refused_by_name():
    replay = Replay(4)
    with pytest.raises(ValueError, match="empty"):
        replay.sample(1)
    replay.add(rows("numpy", [1]))
    with pytest.raises(ValueError, match=r"lack the fields \['obs'\]"):
        replay.add({"reward": np.ones(1)})
    with pytest.raises(ValueError, match="field 'obs'"):
        replay.add({"reward": np.ones(1), "obs": np.ones((1, 3), np.float32)})
    with pytest.raises(ValueError, match="capacity of at least 1"):
        Replay(0)


@pytest.mark.parametrize("where", WHERE)
def test_a_nested_field_is_stored_sampled_and_restored_leaf_by_leaf(where):
    def nested(rewards):
        flat = rows(where, rewards)
        return {"reward": flat["reward"], "obs": {"image": flat["obs"], "pair": (flat["reward"],)}}

    replay = Replay(4, seed=0)
    replay.add(nested([1, 2, 3]))
    replay.add(nested([4, 5]))  # wraps around: 1 is overwritten
    sample = replay.sample(64)
    reward = to_numpy(sample["reward"])
    assert set(reward.tolist()) == {2.0, 3.0, 4.0, 5.0}
    np.testing.assert_array_equal(to_numpy(sample["obs"]["image"])[:, 1], -reward)
    np.testing.assert_array_equal(to_numpy(sample["obs"]["pair"][0]), reward)
    copy = Replay(4, seed=1)
    copy.load_state_dict(replay.state_dict())
    copy.to(nested([0])["reward"])
    a, b = replay.sample(8), copy.sample(8)
    np.testing.assert_array_equal(to_numpy(a["obs"]["image"]), to_numpy(b["obs"]["image"]))
    with pytest.raises(ValueError, match="field 'obs': the rows are laid out unlike"):
        replay.add(rows(where, [6]))
    with pytest.raises(ValueError, match=r"field 'obs/image': rows of shape \(3,\)"):
        bad = nested([6])
        bad["obs"]["image"] = bad["obs"]["image"][:, [0, 1, 1]]
        replay.add(bad)
