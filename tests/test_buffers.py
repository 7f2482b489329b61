"""Rollout and replay buffers, and GAE over each agent's own decisions."""

from __future__ import annotations

import numpy as np
import pytest

from corral.data.buffers import ReplayBuffer, RolloutBuffer, gae


def _rows(**fields):
    return {k: np.asarray(v) for k, v in fields.items()}


def test_gae_follows_each_agents_sequence_through_interleaved_rows() -> None:
    # Turn-based: rows of agent 0 and agent 1 interleave in completion order.
    t = _rows(
        env=[0, 0, 0, 0],
        agent=[0, 1, 0, 1],
        reward=[1.0, 0.0, 2.0, -1.0],
        terminated=[False, False, True, True],
        truncated=[False, False, False, False],
    )
    value = np.array([0.5, 0.1, 0.2, 0.3])
    next_value = np.array([0.2, 0.3, 9.0, 9.0])  # terminal rows must ignore theirs
    gamma, lam = 0.9, 0.8
    adv, ret = gae(t, value, next_value, gamma, lam)
    # agent 0: row 2 is terminal; row 0 continues into row 2.
    a2 = 2.0 - 0.2
    a0 = (1.0 + gamma * 0.2 - 0.5) + gamma * lam * a2
    # agent 1: row 3 terminal; row 1 continues into row 3.
    a3 = -1.0 - 0.3
    a1 = (0.0 + gamma * 0.3 - 0.1) + gamma * lam * a3
    np.testing.assert_allclose(adv, [a0, a1, a2, a3])
    np.testing.assert_allclose(ret, adv + value)


def test_gae_bootstraps_truncation_and_the_rollout_end_but_not_termination() -> None:
    t = _rows(
        env=[0, 1, 2],
        agent=[0, 0, 0],
        reward=[1.0, 1.0, 1.0],
        terminated=[False, True, False],
        truncated=[True, False, False],
    )
    value = np.zeros(3)
    next_value = np.array([5.0, 5.0, 5.0])
    adv, _ = gae(t, value, next_value, gamma=0.5, lam=1.0)
    np.testing.assert_allclose(adv, [1 + 0.5 * 5, 1.0, 1 + 0.5 * 5])


def test_gae_does_not_carry_across_a_truncated_episode_boundary() -> None:
    t = _rows(
        env=[0, 0],
        agent=[0, 0],
        reward=[0.0, 10.0],
        terminated=[False, True],
        truncated=[True, False],
    )
    adv, _ = gae(t, np.zeros(2), np.array([1.0, 0.0]), gamma=1.0, lam=1.0)
    assert adv.tolist() == [1.0, 10.0]


def test_rollout_buffer_concatenates_in_completion_order() -> None:
    buf = RolloutBuffer()
    buf.add(_rows(reward=[1.0, 2.0], obs=[[1], [2]]))
    buf.add(_rows(reward=[3.0], obs=[[3]]))
    assert len(buf) == 3
    assert buf.data()["obs"][:, 0].tolist() == [1, 2, 3]
    buf.clear()
    assert len(buf) == 0 and buf.data() == {}


def test_replay_buffer_wraps_around_and_samples_only_stored_rows() -> None:
    buf = ReplayBuffer(capacity=4, seed=0)
    for k in range(3):
        buf.add(_rows(reward=[float(2 * k), float(2 * k + 1)], obs=[[2 * k], [2 * k + 1]]))
    assert len(buf) == 4
    sample = buf.sample(200)
    assert set(sample["reward"].tolist()) == {2.0, 3.0, 4.0, 5.0}  # 0 and 1 were overwritten
    np.testing.assert_array_equal(sample["obs"][:, 0], sample["reward"])


def test_replay_buffer_declared_by_fields_rejects_transitions_missing_one() -> None:
    buf = ReplayBuffer(8, fields={"reward": ((), np.float64), "state": ((3,), np.float32)})
    with pytest.raises(ValueError, match="state"):
        buf.add(_rows(reward=[1.0]))
    buf.add(_rows(reward=[1.0], state=[[1, 2, 3]], extra=[7]))
    assert buf.sample(1)["state"].dtype == np.float32
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(2).sample(1)


def test_replay_buffer_keeps_the_newest_rows_of_an_oversized_add() -> None:
    buf = ReplayBuffer(2, seed=0)
    buf.add(_rows(reward=[1.0, 2.0, 3.0]))
    assert sorted(set(buf.sample(50)["reward"].tolist())) == [2.0, 3.0]


def test_replay_buffer_state_dict_restores_rows_position_and_sampling() -> None:
    buf = ReplayBuffer(capacity=5, seed=0)
    buf.add({"reward": np.arange(7.0), "obs": np.arange(14.0).reshape(7, 2)})
    state = buf.state_dict()
    assert len(state["data"]["reward"]) == 5
    copy = ReplayBuffer(capacity=5, seed=123)  # another seed: the sampler's state is restored
    copy.load_state_dict(state)
    assert len(copy) == 5
    a, b = buf.sample(16), copy.sample(16)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    buf.add({"reward": np.array([70.0]), "obs": np.array([[70.0, 71.0]])})
    copy.add({"reward": np.array([70.0]), "obs": np.array([[70.0, 71.0]])})
    after, copied = buf.state_dict(), copy.state_dict()
    assert after["next"] == copied["next"] == 1
    assert all(np.array_equal(after["data"][k], copied["data"][k]) for k in a)
    with pytest.raises(ValueError, match="capacity 5 cannot be loaded into one of capacity 4"):
        ReplayBuffer(capacity=4).load_state_dict(state)
