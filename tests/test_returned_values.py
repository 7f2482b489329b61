"""corral.returned_values: the one home of the rules that judge what an env returns.

The rules of the vector layer and of the conformance checkers are tested where they are
used too (tests/vector/test_validation.py, tests/checks/); here each rule is held to its
contract, and the rules that judge the same number are held to agree.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from corral import returned_values as rv

# -- rewards and end flags: the contract, and what the dict envs' packer takes -----------------

REWARDS = [
    # (value, is a reward by the contract, what the packer stores)
    (0.5, True, 0.5),
    (-3, True, -3.0),
    (np.float32(0.25), True, 0.25),
    (np.int64(7), True, 7.0),
    (math.nan, True, math.nan),
    (True, False, 1.0),
    (np.bool_(False), False, 0.0),
    (np.array([2]), False, 2.0),
    (np.array([[1.5]], np.float32), False, 1.5),
    (np.array(True), False, 1.0),
    (np.ones(2), False, None),
    (np.array(["x"]), False, None),
    (1 + 2j, False, None),
    ("1", False, None),
    (None, False, None),
]


@pytest.mark.parametrize(("value", "contract", "packed"), REWARDS)
def test_a_reward_is_a_real_number_and_the_packer_also_takes_bools_and_one_element_arrays(
    value, contract, packed
) -> None:
    assert rv.is_reward(value) is contract
    got = rv.packed_reward(value)
    if packed is None:
        assert got is None
    else:
        assert type(got) is float
        assert got == packed or (math.isnan(got) and math.isnan(packed))


FLAGS = [
    # (value, a flag by the contract, what the packer stores)
    (True, True, True),
    (np.False_, True, False),
    (0, False, False),
    (1, False, True),
    (np.int8(1), False, True),
    (np.array([1]), False, True),
    (np.array(True), False, True),
    (np.array([[0]], np.uint8), False, False),
    (2, False, None),
    (0.0, False, None),
    (np.array([1.0]), False, None),
    (np.array([0, 1]), False, None),
    ("True", False, None),
    (None, False, None),
]


@pytest.mark.parametrize(("value", "contract", "packed"), FLAGS)
def test_an_end_flag_is_a_bool_and_the_packer_also_takes_0_and_1(value, contract, packed) -> None:
    assert rv.is_end_flag(value) is contract
    assert rv.packed_flag(value) is packed


def test_the_packer_takes_every_reward_and_flag_the_contract_takes_as_it_is() -> None:
    for value, contract, _ in REWARDS:
        if contract:
            got = rv.packed_reward(value)
            assert got == float(value) or (math.isnan(got) and math.isnan(value))
    for value, contract, _ in FLAGS:
        if contract:
            assert rv.packed_flag(value) is bool(value)


# -- numbers -------------------------------------------------------------------------------


def test_arrays_of_numbers_are_bool_integer_or_float() -> None:
    for dtype in (bool, np.uint8, np.int64, np.float16, np.float64):
        assert rv.holds_numbers(np.zeros(2, dtype))
    for array in (np.zeros(2, complex), np.array(["a"]), np.array([None])):
        assert not rv.holds_numbers(array)


def test_finite_means_neither_nan_nor_inf() -> None:
    assert rv.is_finite(1.0) and rv.is_finite(3) and rv.is_finite(np.float32(2))
    assert not rv.is_finite(math.inf) and not rv.is_finite(np.float32("nan"))
    assert rv.is_finite(np.zeros((2, 3))) and rv.is_finite(np.ones(2, np.int64))
    assert not rv.is_finite(np.array([0.0, -np.inf]))
    np.testing.assert_array_equal(
        rv.not_finite(np.array([[0.0, np.nan], [np.inf, 1e300]])), [[False, True], [True, False]]
    )
    np.testing.assert_array_equal(rv.not_finite(np.array([3, 4])), [False, False])


def test_a_bool_array_takes_0_and_1_only() -> None:
    """A Box(bool) observation stored 0.5 and 2.0 as True."""
    target = np.zeros(4, bool)
    rv.store_exactly(target, slice(None), np.array([0.0, 1.0, 1, 0]))
    np.testing.assert_array_equal(target, [False, True, True, False])
    for bad in (0.5, 2.0, -1, np.nan):
        with pytest.raises(OverflowError, match="stored as bool"):
            rv.store_exactly(target, slice(None), np.array([0.0, bad, 1.0, 1.0]))
    np.testing.assert_array_equal(target, [False, True, True, False])  # nothing written


def test_a_python_int_past_float64_is_not_finite_rather_than_an_overflow_error() -> None:
    assert rv.is_finite(2**1000) and rv.is_finite(-(2**1000))  # within float64
    assert not rv.is_finite(10**400) and not rv.is_finite(-(10**400))
    # the packer stores it as inf (corral's OverflowError was blamed on the env's step)
    assert rv.packed_reward(10**400) == np.inf and rv.packed_reward(-(10**400)) == -np.inf


def test_describe_gives_the_range_of_the_finite_numbers_and_counts_the_others() -> None:
    said = rv.describe(np.array([0.2, np.nan, 5.0]))  # was "values in [nan, nan]"
    assert (
        said
        == "array of shape (3,) and dtype float64 with values in [0.2, 5.0], 1 of them NaN or inf"
    )
    assert rv.describe(np.array([np.inf])).endswith("float64, 1 of them NaN or inf")
    assert rv.describe(np.array([1, 3])).endswith("int64 with values in [1, 3]")


def test_has_dtype_compares_numpy_dtypes_and_their_torch_equivalents() -> None:
    assert rv.has_dtype(np.zeros(2, np.float32), np.dtype(np.float32))
    assert not rv.has_dtype(np.zeros(2), np.dtype(np.float32))
    torch = pytest.importorskip("torch")
    assert rv.has_dtype(torch.zeros(2), np.dtype(np.float32))
    assert rv.has_dtype(torch.zeros(2, dtype=torch.bool), np.dtype(bool))
    assert not rv.has_dtype(torch.zeros(2, dtype=torch.float64), np.dtype(np.float32))


# -- storing: overflow and not finite are two faults -----------------------------------------


@pytest.mark.parametrize("value", [300.0, -1.0, 256.0, 1e20, -0.5])
def test_a_finite_float_that_an_integer_dtype_cannot_hold_overflows_as_an_integer_does(
    value,
) -> None:
    target = np.zeros(2, np.uint8)
    with pytest.raises(OverflowError, match="beyond the range of uint8"):
        rv.store_exactly(target, slice(None), np.array([1.0, value]))
    assert target.tolist() == [0, 0]  # nothing stored
    assert rv.finite_problem(value, np.uint8).endswith("which overflows uint8")
    rv.store_exactly(target, slice(None), np.array([1.0, 254.9]))  # rounding stays
    assert target.tolist() == [1, 254]


def test_two_to_the_63_overflows_int64_though_int64s_max_rounds_to_it_as_a_float() -> None:
    target = np.zeros(2, np.int64)
    with pytest.raises(OverflowError, match="beyond the range of int64"):
        rv.store_exactly(target, slice(None), np.array([1.0, 2.0**63]))
    assert target.tolist() == [0, 0]
    assert rv.finite_problem(2.0**63, np.int64).endswith("which overflows int64")
    assert rv.overflow_flags(np.array([2.0**63, 2.0**63 - 1024]), target).tolist() == [True, False]
    rv.store_exactly(target, slice(None), np.array([-(2.0**63), 2.0**63 - 1024]))  # the edges
    assert target.tolist() == [-(2**63), 2**63 - 1024]


def test_a_float32_tensor_at_two_to_the_31_overflows_int32() -> None:
    torch = pytest.importorskip("torch")
    rows = torch.zeros(2, dtype=torch.int32)
    over = rv.overflow_flags(torch.tensor([2.0**31, 2.0**30]), rows)
    assert over.tolist() == [True, False]


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_stored_as_an_integer_are_refused_by_name(value) -> None:
    target = np.zeros(2, np.int32)
    with pytest.raises(OverflowError, match=rf"^{value} stored as int32, which has no NaN or inf"):
        rv.store_exactly(target, slice(None), np.array([1.0, value]))
    assert target.tolist() == [0, 0]
    assert rv.finite_problem(np.array([1.0, value]), np.int32) == (
        f"finite values, got {value} at index (1,)"
    )


def test_inf_stored_as_a_narrower_float_stays_inf_and_is_not_an_overflow() -> None:
    target = np.zeros(3, np.float32)
    rv.store_exactly(target, slice(None), np.array([np.inf, -np.inf, 1.0]))
    assert target.tolist() == [np.inf, -np.inf, 1.0]
    assert not rv.overflow_flags(np.array([np.inf, -np.inf, np.nan]), target).any()
    np.testing.assert_array_equal(
        rv.overflow_flags(np.array([np.inf, 1e300, -1e300]), target), [False, True, True]
    )
    # not finite, its own fault: the message the checks give for it
    assert rv.finite_problem(np.array([1.0, np.inf]), np.float32) == (
        "finite values, got inf at index (1,)"
    )


NUMBERS = np.array([0.0, 1.5, -1.0, 255.0, 255.5, 300.0, 1e20, 1e300, -1e300, np.nan, np.inf])


@pytest.mark.parametrize(
    "dtype", [np.bool_, np.uint8, np.int8, np.int32, np.int64, np.float16, np.float32, np.float64]
)
def test_overflow_flags_mark_exactly_what_store_exactly_refuses(dtype) -> None:
    # the check of a natively batched env's arrays (overflow_flags, numpy and torch) and the
    # dict envs' store (store_exactly) judge each number alike
    rows = np.zeros(len(NUMBERS), dtype)
    refused = []
    for number in NUMBERS:
        try:
            rv.store_exactly(np.zeros(1, dtype), slice(None), np.array([number]))
            refused.append(False)
        except OverflowError:
            refused.append(True)
    flags = rv.overflow_flags(NUMBERS, rows)
    np.testing.assert_array_equal(np.zeros(len(rows), bool) if flags is None else flags, refused)
    torch = pytest.importorskip("torch")
    on_torch = rv.overflow_flags(torch.as_tensor(NUMBERS), torch.as_tensor(rows))
    got = np.zeros(len(rows), bool) if on_torch is None else on_torch.numpy()
    np.testing.assert_array_equal(got, refused)
