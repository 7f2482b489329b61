"""The array pieces simple_formation and simple_line rest on: the assignment of agents
to targets (against scipy's) and numpy's norm and mean (same bits)."""

from __future__ import annotations

import numpy as np
import pytest
from support.batches import PLACES

from corral.arrays import Place, to_numpy
from corral.envs.mpe.assignment import MAX_PERMUTED, Assignment
from corral.envs.mpe.numerics import mean, norm

optimize = pytest.importorskip("scipy.optimize")


@pytest.mark.parametrize(("array", "device"), PLACES)
@pytest.mark.parametrize("n", [1, 2, 4, MAX_PERMUTED, MAX_PERMUTED + 1, 9])
def test_assignment_is_scipys(n, array, device) -> None:
    """Each copy's matching is the one scipy's linear_sum_assignment finds (both ways:
    by permutations up to MAX_PERMUTED rows, by shortest paths above)."""
    place = Place(array, device)
    cost = np.random.default_rng(n).uniform(0, 2, (200, n, n))
    want = np.array([c[optimize.linear_sum_assignment(c)] for c in cost])
    got = to_numpy(Assignment(n, place).matched(place.from_host(cost)))
    np.testing.assert_array_equal(got, want)


def test_shortest_paths_find_scipys_columns() -> None:
    cost = np.random.default_rng(0).uniform(0, 2, (200, 4, 4))
    want = np.array([optimize.linear_sum_assignment(c)[1] for c in cost])
    np.testing.assert_array_equal(Assignment(4, Place()).columns(cost), want)


def test_norm_is_numpys_bit_for_bit() -> None:
    """np.linalg.norm adds the squares with the platform's BLAS dot (a fused multiply-add
    on most CPUs): the same bits, where the plain formula differs in some."""
    delta = np.random.default_rng(1).normal(size=(500, 3, 2))
    want = np.array([[np.linalg.norm(d) for d in row] for row in delta])
    np.testing.assert_array_equal(norm(delta), want)
    np.testing.assert_array_equal(norm(delta[:, ::2]), want[:, ::2])  # any strides


@pytest.mark.parametrize("n", [1, 3, 7, 8, 9, 16, 21])
def test_mean_is_numpys_bit_for_bit(n) -> None:
    """np.mean adds pairwise from 8 values on; the same order gives the same bits."""
    values = np.random.default_rng(n).uniform(0, 2, (2000, n))
    np.testing.assert_array_equal(mean(values), np.array([np.mean(v) for v in values]))


def test_mean_refuses_what_it_cannot_add_in_numpys_order() -> None:
    with pytest.raises(ValueError, match="at most 128"):
        mean(np.zeros((1, 129)))


def test_an_assignment_needs_rows() -> None:
    with pytest.raises(ValueError, match="at least one row"):
        Assignment(0, Place())


def test_shortest_paths_compile_to_one_torch_graph() -> None:
    """On torch the search runs every round rather than ask the device whether copies
    are done: a compiled step has no graph break and no read-back."""
    torch = pytest.importorskip("torch")
    place = Place("torch", "cpu")
    assignment = Assignment(MAX_PERMUTED + 1, place)
    cost = torch.rand(4, MAX_PERMUTED + 1, MAX_PERMUTED + 1, dtype=torch.float64)
    explained = torch._dynamo.explain(assignment.matched)(cost)
    assert explained.graph_break_count == 0, [b.reason for b in explained.break_reasons]
