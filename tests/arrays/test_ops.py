"""The array layer's op set: each numpy op against its torch op on the same inputs, and the
row writes and bit tricks against plain numpy written here."""

from __future__ import annotations

import numpy as np
import pytest

from corral.arrays import Ops, Place, TorchOps, ops_for, ops_in, ops_of, to_numpy, xp, zeros

torch = pytest.importorskip("torch")

NP = Ops()
TO = TorchOps("cpu")


def t(array: np.ndarray):
    """The same values as a CPU tensor (its own memory)."""
    return torch.from_numpy(np.array(array))


def same(numpy_result, torch_result) -> None:
    """The torch result equals the numpy one: values bit for bit, dtype and shape."""
    got = to_numpy(torch_result)
    assert got.dtype == np.asarray(numpy_result).dtype
    np.testing.assert_array_equal(got, numpy_result)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_torch_spells_every_op_anew():
    """No torch op falls through to a numpy one."""
    public = {name for name in vars(Ops) if not name.startswith("_")} - {"xp", "torch"}
    spelled = set(vars(TorchOps)) | set(vars(TO))
    assert public - spelled == set()


@pytest.mark.parametrize("name", ["sqrt", "exp", "cos", "sin"])
def test_elementwise(name, rng):
    x = rng.uniform(0.1, 3.0, (5, 4))
    np.testing.assert_allclose(to_numpy(getattr(TO, name)(t(x))), getattr(NP, name)(x), rtol=1e-14)


def test_arctan2_where_subtract_multiply(rng):
    y, x = rng.normal(size=(2, 6, 3))
    np.testing.assert_allclose(to_numpy(TO.arctan2(t(y), t(x))), NP.arctan2(y, x), rtol=1e-14)
    same(NP.where(y > 0, y, x), TO.where(t(y) > 0, t(y), t(x)))
    out_np, out_to = np.empty_like(y), t(np.empty_like(y))
    NP.subtract(y, x, out=out_np)
    TO.subtract(t(y), t(x), out=out_to)
    same(out_np, out_to)
    NP.multiply(y, x, out=out_np)
    TO.multiply(t(y), t(x), out=out_to)
    same(out_np, out_to)


def test_softplus(rng):
    x = rng.normal(0, 30, (50,))
    np.testing.assert_allclose(to_numpy(TO.softplus(t(x))), NP.softplus(x), rtol=1e-14)


def test_making_arrays(rng):
    like = rng.normal(size=(3,)).astype(np.float32)
    same(NP.zeros((2, 3), like), TO.zeros((2, 3), t(like)))
    same(NP.zeros((2,), like, np.bool_), TO.zeros((2,), t(like), np.bool_))
    same(NP.zeros_like(like), TO.zeros_like(t(like)))
    same(NP.arange(5, like), TO.arange(5, t(like)))
    for ops in (NP, TO):
        empty = ops.empty((4, 2), np.int32)
        assert tuple(empty.shape) == (4, 2) and to_numpy(empty).dtype == np.int32
    copied = TO.copy(t(like))
    copied[0] = 7
    assert NP.copy(like) is not like and float(copied[0]) == 7


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int16, np.bool_])
def test_astype(dtype, rng):
    x = rng.integers(-3, 3, (4, 5))
    same(NP.astype(x, dtype), TO.astype(t(x), dtype))


def test_shapes(rng):
    a, b = rng.normal(size=(2, 3, 4, 2))
    same(NP.concat([a, b], 1), TO.concat([t(a), t(b)], 1))
    same(NP.concat([a, b], 2, np.float32), TO.concat([t(a), t(b)], 2, np.float32))
    same(NP.stack([a, b], 1), TO.stack([t(a), t(b)], 1))
    same(NP.broadcast_to(a[:, :1], (3, 4, 2)), TO.broadcast_to(t(a)[:, :1], (3, 4, 2)))
    same(NP.flat(a), TO.flat(t(a)))


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("index_shape", [(4,), (2, 3)])
def test_take(axis, index_shape, rng):
    array = rng.normal(size=(5, 6, 7))
    index = rng.integers(0, 5, index_shape)
    same(NP.take(array, index, axis), TO.take(t(array), t(index), axis))


def test_gather_and_argsort(rng):
    x = rng.integers(0, 3, (4, 9)).astype(np.float64)  # ties: the sort must be stable
    order = NP.argsort(x, 1)
    same(order, TO.argsort(t(x), 1))
    same(NP.gather(x, order, 1), TO.gather(t(x), t(order), 1))
    same(NP.amax(x, 1), TO.amax(t(x), 1))
    same(NP.amin(x, 0), TO.amin(t(x), 0))


@pytest.mark.parametrize("value", [True, 0, "array"])
@pytest.mark.parametrize("axis", [0, -1])
def test_put(value, axis, rng):
    a = rng.integers(0, 9, (4, 6))
    index = np.array([3, 0])
    if value == "array":
        shape = list(a.shape)
        shape[axis] = 2
        value = rng.integers(0, 9, shape)
    a_np, a_to = a.copy(), t(a)
    NP.put(a_np, index, value, axis)
    TO.put(a_to, t(index), t(value) if isinstance(value, np.ndarray) else value, axis)
    oracle = a.copy()
    if axis == 0:
        oracle[index] = value
    else:
        oracle[:, index] = value
    np.testing.assert_array_equal(a_np, oracle)
    same(a_np, a_to)


def test_replaced(rng):
    a, value = rng.normal(size=(3, 5, 2)), rng.normal(size=(3, 2, 2))
    index = np.array([4, 1])
    got = NP.replaced(a, index, value, 1)
    oracle = a.copy()
    oracle[:, index] = value
    np.testing.assert_array_equal(got, oracle)
    assert not np.shares_memory(got, a)
    same(got, TO.replaced(t(a), t(index), t(value), 1))


def test_nonzero_is_mask_fits(rng):
    x = rng.random((3, 4, 5)) < 0.3
    for n, o in zip(NP.nonzero(x), TO.nonzero(t(x)), strict=True):
        same(n, o)
    assert NP.is_mask(x) and TO.is_mask(t(x))
    assert not NP.is_mask(np.array([1])) and not TO.is_mask(t(np.array([1])))
    assert NP.fits(x.copy(), x) and TO.fits(t(x), t(x))
    assert not NP.fits(x.astype(np.int8), x) and not TO.fits(t(x).to(torch.int8), t(x))
    assert not NP.fits(x.T.copy().T, x) and not TO.fits(t(x).transpose(0, 1), t(x))
    assert not NP.fits(t(x), x) and not TO.fits(x, t(x))


def test_count_and_copy_major_sum(rng):
    flags = rng.random((3, 7)) < 0.5
    same(flags.sum(0).astype(np.float64), NP.count(flags))
    same(NP.count(flags), TO.count(t(flags)))
    a, b = rng.integers(0, 50, (2, 3, 8))
    assert NP.copy_major_sum(a, b).flags.c_contiguous
    same((a + b).T, NP.copy_major_sum(a, b))
    same(NP.copy_major_sum(a, b), TO.copy_major_sum(t(a), t(b)))


@pytest.mark.parametrize("rows", [1, 5, 40])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 9])
def test_rows_any(rows, n, rng):
    """Each way of ``any`` along a short axis (bytes as words, a reduction, a column loop)
    is ``any(1)``, and reads the flags as they are when called."""
    flags = rng.random((rows, n)) < 0.2
    flags_t = t(flags)
    by_np, by_to = NP.rows_any(flags), TO.rows_any(flags_t)
    same(flags.any(1), by_np())
    same(flags.any(1), by_to())
    flags[...] = False
    flags_t[...] = False
    assert not by_np().any() and not by_to().any()
    flags[-1, -1] = True
    flags_t[-1, -1] = True
    same(flags.any(1), by_np())
    same(flags.any(1), by_to())


def test_assign(rng):
    out_np, out_to = np.zeros((2, 3)), t(np.zeros((2, 3)))
    value = rng.normal(size=(2, 3))
    NP.assign(out_np, value)
    TO.assign(out_to, t(value))
    np.testing.assert_array_equal(out_np, value)
    same(out_np, out_to)


@pytest.mark.parametrize("shape", [(6,), (6, 3), (6, 2, 4)])
def test_row_writes_with_a_mask(shape, rng):
    """``copy_rows``, ``write_rows`` and ``fill_rows`` with a bool mask (the torch one
    blends) and with ``None``, against numpy's indexing."""
    dst, src = rng.normal(size=(2, *shape))
    mask = np.array([True, False, False, True, True, False])
    for rows in (mask, None):
        oracle = dst.copy()
        oracle[slice(None) if rows is None else rows] = src[slice(None) if rows is None else rows]
        for method in ("copy_rows", "write_rows"):
            d_np, d_to = dst.copy(), t(dst)
            getattr(NP, method)(d_np, src, rows)
            getattr(TO, method)(d_to, t(src), None if rows is None else t(rows))
            np.testing.assert_array_equal(d_np, oracle)
            same(d_np, d_to)
        filled = dst.copy()
        filled[slice(None) if rows is None else rows] = 2.5
        d_np, d_to = dst.copy(), t(dst)
        NP.fill_rows(d_np, 2.5, rows)
        TO.fill_rows(d_to, 2.5, None if rows is None else t(rows))
        np.testing.assert_array_equal(d_np, filled)
        same(d_np, d_to)


def test_numpy_row_writes_with_indices(rng):
    dst, src = rng.normal(size=(2, 6, 3))
    index = np.array([4, 1])
    got = dst.copy()
    NP.copy_rows(got, src, index)
    oracle = dst.copy()
    oracle[[4, 1]] = src[[4, 1]]
    np.testing.assert_array_equal(got, oracle)
    NP.fill_rows(got, 0.0, index)
    assert not got[[4, 1]].any() and (got[[0, 2, 3, 5]] == dst[[0, 2, 3, 5]]).all()


def test_write_rows_skips_its_own_memory(rng):
    """Nothing is written where ``src`` is ``dst`` or a view of all of it (``copy_rows`` with
    such a ``src`` would be a copy of every row to itself)."""

    class Loud(np.ndarray):
        def __setitem__(self, key, value):
            raise AssertionError("written")

    dst = rng.normal(size=(4, 2)).view(Loud)
    NP.write_rows(dst, dst, None)
    NP.write_rows(dst, dst.view(np.ndarray), np.array([True, False, True, False]))
    with pytest.raises(AssertionError, match="written"):
        NP.write_rows(dst, dst[::-1].view(np.ndarray), None)
    d_to = t(np.zeros(3))
    TO.write_rows(d_to, d_to, None)


@pytest.mark.parametrize("shape", [(5,), (5, 3), (5, 2, 3)])
def test_as_rows(shape, rng):
    """Rows as byte items: selecting them copies the same bytes as selecting the rows."""
    a = rng.normal(size=shape).astype(np.float32)
    b = np.zeros_like(a)
    rows_a, rows_b = NP.as_rows(a), NP.as_rows(b)
    assert rows_a.shape == (5,)
    pick = np.array([True, False, True, True, False])
    rows_b[pick] = rows_a[pick]
    oracle = np.zeros_like(a)
    oracle[pick] = a[pick]
    np.testing.assert_array_equal(b, oracle)
    if a.ndim > 1:
        transposed = a.T  # not C-contiguous: as it is
        assert NP.as_rows(transposed) is transposed
    tensor = t(a)
    assert TO.as_rows(tensor) is tensor


@pytest.mark.parametrize("width", [3, 7])  # a few rows (written one by one), more
def test_write_transposed(width, rng):
    e = 6
    out0 = rng.integers(0, 9, (e, width))
    rows_all = rng.integers(0, 9, (width, e))
    # all copies
    o_np, o_to = out0.copy(), t(out0)
    NP.write_transposed(o_np, rows_all, None)
    TO.write_transposed(o_to, t(rows_all), None)
    np.testing.assert_array_equal(o_np, rows_all.T)
    same(o_np, o_to)
    # some copies by indices: rows holds their values only
    index = np.array([5, 2])
    o_np, o_to = out0.copy(), t(out0)
    NP.write_transposed(o_np, rows_all[:, index], index)
    TO.write_transposed(o_to, t(rows_all[:, index]), t(index))
    oracle = out0.copy()
    oracle[index] = rows_all[:, index].T
    np.testing.assert_array_equal(o_np, oracle)
    same(o_np, o_to)
    # torch: some copies by a mask, rows holding every copy's values, blended in
    mask = np.isin(np.arange(e), index)
    o_to = t(out0)
    TO.write_transposed(o_to, t(rows_all), t(mask))
    same(oracle, o_to)


@pytest.mark.parametrize("size", [1, 3])
def test_keep_blends_bits_like_a_where(size, rng):
    """``keep``: ``values`` where kept, else ``last``, for each agent's ``size`` rows; checked
    against ``np.where`` (NaNs and negative zeros included: bits, not values)."""
    n, e = 3, 8
    values = rng.normal(size=(n * size, e)).astype(np.float32)
    last = rng.normal(size=(n * size, e)).astype(np.float32)
    values[0, 0], last[1, 1], values[-1, 2] = np.nan, -0.0, -0.0
    keep = rng.random((n, e)) < 0.5
    oracle = np.where(np.repeat(keep, size, 0), values, last)
    v_np, bits = values.copy(), np.empty((n * size, e), np.int32)
    NP.keep(v_np, keep, last, bits)
    np.testing.assert_array_equal(v_np.view(np.int32), oracle.view(np.int32))
    v_to = t(values)
    TO.keep(v_to, t(keep), t(last), t(np.empty((n * size, e), np.int32)))
    np.testing.assert_array_equal(to_numpy(v_to).view(np.int32), oracle.view(np.int32))


@pytest.mark.parametrize("n_actions", [5, 9, 16, 3])
def test_write_masks_like_a_table_lookup(n_actions, rng):
    """``write_masks`` (numpy: each mask's bytes as a few integers) is ``table[key]``, for
    every copy, some copies by indices, and (torch) by a mask."""
    e, n = 7, 2
    table = rng.random((20, n_actions)) < 0.5
    key = np.ascontiguousarray(rng.integers(0, 20, (e, n)))
    out0 = rng.random((e, n, n_actions)) < 0.5
    o_np, o_to = out0.copy(), t(out0)
    NP.write_masks(o_np, table, key, None)
    TO.write_masks(o_to, t(table), t(key), None)
    np.testing.assert_array_equal(o_np, table[key])
    same(o_np, o_to)
    NP.write_masks(o_np, table[::-1].copy(), key, None)  # another table: its own columns
    np.testing.assert_array_equal(o_np, table[::-1][key])
    index = np.array([6, 0, 3])
    o_np, o_to = out0.copy(), t(out0)
    NP.write_masks(o_np, table, key[index], index)
    TO.write_masks(o_to, t(table), t(key[index]), t(index))
    oracle = out0.copy()
    oracle[index] = table[key[index]]
    np.testing.assert_array_equal(o_np, oracle)
    same(o_np, o_to)
    o_to = t(out0)
    TO.write_masks(o_to, t(table), t(key), t(np.isin(np.arange(e), index)))
    same(oracle, o_to)


def test_choosing_the_op_set():
    """``ops_for``: where the vector layer computes (numpy views of CPU tensors where the
    place computes on the host); ``ops_in``: the place's own namespace; ``ops_of``: an
    array's."""
    assert type(ops_for(Place())) is Ops and type(ops_in(Place())) is Ops
    cpu = Place("torch", "cpu")
    assert type(ops_in(cpu)) is TorchOps
    assert type(ops_for(cpu)) is (Ops if cpu.computes_on_host else TorchOps)
    assert ops_of(np.zeros(2)) is ops_of([1, 2]) and type(ops_of(np.zeros(2))) is Ops
    tensor_ops = ops_of(torch.zeros(2))
    assert type(tensor_ops) is TorchOps and ops_of(torch.ones(3)) is tensor_ops
    assert xp(np.zeros(2)) is np and xp(torch.zeros(2)) is torch
    assert ops_of(torch.zeros(2)).xp is torch and ops_of(np.zeros(2)).xp is np


def test_zeros_in_an_arrays_namespace():
    z = zeros(np.ones(2, np.float32), (3,))
    assert isinstance(z, np.ndarray) and z.dtype == np.float32 and not z.any()
    z = zeros(torch.ones(2, dtype=torch.float16), (3, 1), np.bool_)
    assert z.dtype == torch.bool and tuple(z.shape) == (3, 1) and not z.any()
    z = zeros(torch.ones(2, dtype=torch.float16), (2,))
    assert z.dtype == torch.float16
