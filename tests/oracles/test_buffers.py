"""Rollout and replay buffers, and GAE over each agent's own decisions."""

from __future__ import annotations

import numpy as np

from oracles.buffers import RolloutBuffer, gae


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
