"""``CopyStreams`` draws, copy by copy, exactly what numpy's ``Generator(PCG64)`` draws.

The reference is one ``np.random.default_rng(seed)`` per copy (a dict env's
``np_random``): the same calls must give bit-identical values and leave
identical generator states, in numpy and in torch.
"""

from __future__ import annotations

import copy
import doctest

import numpy as np
import pytest
from support.marks import needs_cuda, needs_torch

from corral.arrays import CopyStreams, Place, to_numpy
from corral.arrays import streams as streams_module

PLACES = [
    ("numpy", "cpu"),
    pytest.param("torch", "cpu", marks=needs_torch),
    pytest.param("torch", "cuda", marks=needs_cuda),
]

SEEDS = [0, 1, 7, 2**32 - 1, 2**32, 2**63, 2**64 + 3, 2**128 + 5, 3**150, np.int64(42)]
SEEDS += [int(s) for s in np.random.default_rng(2024).integers(0, 2**62, 22)]

# Calls of Generator's methods, interleaved so that 32-bit draws leave a half buffered
# before 64-bit draws and the other way round.
CALLS = [
    ("uniform", (-1.0, 1.0, 2)),
    ("integers", (3,)),
    ("uniform", (0.0, 1.0, 1)),
    *[("integers", (n,)) for n in range(1, 11)],
    ("integers", (3,)),
    ("uniform", (-3.0, 2.5, 5)),
    ("integers", (-5, 7)),
    ("integers", (2**31 + 1,)),  # about half of the 32-bit draws rejected
    ("integers", (10**9,)),
    ("integers", (2**32,)),  # one bare 32-bit draw
    ("integers", (2**32 + 1,)),  # 64-bit draws from here
    ("integers", (2**40 + 3,)),
    ("integers", (-(2**63), 1)),  # about half of the 64-bit draws rejected
    ("integers", (-(2**63), 2**63)),  # one bare 64-bit draw
    ("integers", (2**63 - 7, 2**63)),
    ("integers", (5,)),
    ("uniform", (5.0, 5.0, 3)),
    ("uniform", (-1e300, 1e300, 2)),
]


def _draw(streams: CopyStreams, name: str, args: tuple, where=None) -> np.ndarray:
    return to_numpy(getattr(streams, name)(*args, where=where))


def _expected(generators: list[np.random.Generator], name: str, args: tuple) -> np.ndarray:
    return np.array([getattr(g, name)(*args) for g in generators])


def _assert_same_states(streams: CopyStreams, generators: list[np.random.Generator]) -> None:
    for i, g in enumerate(generators):
        got = streams.generator(i).bit_generator.state
        assert got == g.bit_generator.state, f"copy {i}"


@pytest.mark.parametrize(("array", "device"), PLACES)
def test_draws_and_states_match_numpy_generators(array: str, device: str) -> None:
    streams = CopyStreams(len(SEEDS), Place(array, device))
    streams.seed(SEEDS)
    generators = [np.random.default_rng(s) for s in SEEDS]
    for name, args in CALLS:
        got, want = _draw(streams, name, args), _expected(generators, name, args)
        assert got.dtype == want.dtype and got.shape == want.shape, (name, args)
        np.testing.assert_array_equal(got, want, err_msg=f"{name}{args}")
    scalars = [g.uniform(-2.0, 3.0) for g in generators]  # one draw, as size 1
    np.testing.assert_array_equal(_draw(streams, "uniform", (-2.0, 3.0, 1))[:, 0], scalars)
    _assert_same_states(streams, generators)


@pytest.mark.parametrize(("array", "device"), PLACES)
def test_only_the_selected_copies_advance(array: str, device: str) -> None:
    place = Place(array, device)
    seeds = SEEDS[:16]
    streams = CopyStreams(len(seeds), place)
    streams.seed(seeds)
    generators = [np.random.default_rng(s) for s in seeds]
    chooser = np.random.default_rng(5)
    for step in range(40):
        name, args = CALLS[chooser.integers(len(CALLS))]
        where = chooser.random(len(seeds)) < 0.5
        got = _draw(streams, name, args, where=place.asarray(where))
        chosen = [g for g, w in zip(generators, where, strict=True) if w]
        want = _expected(chosen, name, args)
        np.testing.assert_array_equal(got[where], want, err_msg=f"step {step}: {name}{args}")
    _assert_same_states(streams, generators)


def test_a_device_draws_a_fixed_number_of_rounds_with_numpy_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Off the host, how many times a copy redraws a rejected value is fixed in advance
    # rather than read from the arrays; numpy arrays stand in for a GPU's here.
    streams = CopyStreams(len(SEEDS), Place())
    monkeypatch.setattr(streams, "_on_host", False)
    streams.seed(SEEDS)
    generators = [np.random.default_rng(s) for s in SEEDS]
    for args in [(2**31 + 1,), (7,), (-(2**63), 1), (6,), (2**31 + 1,)]:
        got, want = _draw(streams, "integers", args), _expected(generators, "integers", args)
        np.testing.assert_array_equal(got, want, err_msg=f"integers{args}")
    _assert_same_states(streams, generators)


@pytest.mark.parametrize(("array", "device"), PLACES)
def test_words_read_ahead_are_next_uint32s_and_skipping_draws_them(array: str, device: str):
    place = Place(array, device)
    seeds = SEEDS[:12]
    streams = CopyStreams(len(seeds), place)
    streams.seed(seeds)
    generators = [np.random.default_rng(s) for s in seeds]
    chooser = np.random.default_rng(3)
    for step in range(40):
        # copies left with a word kept (odd numbers of 32-bit draws) and without
        name, args = CALLS[chooser.integers(len(CALLS))]
        where = chooser.random(len(seeds)) < 0.5
        _draw(streams, name, args, where=place.asarray(where))
        _expected([g for g, w in zip(generators, where, strict=True) if w], name, args)
        count = int(chooser.integers(1, 10))
        ahead = [copy.deepcopy(g) for g in generators]
        want = np.array([[g.integers(2**32) for _ in range(count)] for g in ahead])
        np.testing.assert_array_equal(to_numpy(streams.peek_words(count)), want, f"step {step}")
        used = chooser.integers(0, count + 1, len(seeds))
        where = None if step % 3 else chooser.random(len(seeds)) < 0.5
        streams.skip_words(place.asarray(used), None if where is None else place.asarray(where))
        for i, g in enumerate(generators):
            if where is None or where[i]:
                g.integers(2**32, size=used[i])
        _assert_same_states(streams, generators)


@pytest.mark.parametrize(
    "device", [pytest.param("meta", marks=needs_torch), pytest.param("cuda", marks=needs_cuda)]
)
def test_device_draws_never_wait_for_the_device(device: str) -> None:
    # A meta tensor has no values, so any read of one raises; on CUDA, torch raises on
    # any synchronising call in "error" sync-debug mode.
    import torch

    place = Place("torch", device)
    streams = CopyStreams(6, place)
    streams.seed(list(range(6)))
    where = place.asarray(np.array([True, False] * 3))
    if device == "cuda":
        torch.cuda.set_sync_debug_mode("error")
    try:
        for name, args in CALLS:
            value = getattr(streams, name)(*args, where=where)
            assert value.device.type == device
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("default")


@needs_torch
def test_ranges_that_divide_the_word_never_look_at_the_copies() -> None:
    """integers over 2**k values rejects no draw: even the host's way (which reads the
    copies to find rejected ones) reads nothing (meta tensors raise on any read), so a
    compiled step drawing them needs no read-back."""
    streams = CopyStreams(6, Place("torch", "meta"))
    streams.seed(list(range(6)))
    streams._on_host = True
    for n in (1, 2, 4, 2**20, 2**32, 2**40):
        assert streams.integers(n).shape == (6,)


@pytest.mark.parametrize(("array", "device"), PLACES)
def test_seeding_follows_default_rng_and_keeps_unseeded_streams(array: str, device: str) -> None:
    streams = CopyStreams(4, Place(array, device))
    streams.seed([1, 2, 3, 4])
    streams.integers(5)  # every copy keeps half a 64-bit draw
    streams.seed([None, 20, 30, None], where=np.array([True, True, False, False]))
    generators = [np.random.default_rng(s) for s in [1, 2, 3, 4]]
    for i in (0, 2, 3):
        generators[i].integers(5)
    generators[1] = np.random.default_rng(20)
    _assert_same_states(streams, generators)  # copy 1 keeps no half of its old stream
    for name, args in [("integers", (4,)), *CALLS[:6]]:
        np.testing.assert_array_equal(
            _draw(streams, name, args), _expected(generators, name, args), err_msg=name
        )
    _assert_same_states(streams, generators)


@pytest.mark.parametrize(("array", "device"), PLACES)
def test_a_copy_first_seeded_with_none_draws_from_fresh_entropy(array: str, device: str) -> None:
    streams = CopyStreams(3, Place(array, device))
    streams.seed([None, None, 5])
    first = [streams.generator(i).bit_generator.state for i in range(3)]
    assert first[0]["state"] != first[1]["state"]
    assert first[2] == np.random.default_rng(5).bit_generator.state
    streams.seed([None, None, None])  # seeded before: nothing changes
    assert [streams.generator(i).bit_generator.state for i in range(3)] == first


@pytest.mark.parametrize(("array", "device"), PLACES)
def test_generator_and_set_generator_round_trip(array: str, device: str) -> None:
    streams = CopyStreams(3, Place(array, device))
    streams.seed([0, 1, 2])
    generator = np.random.default_rng(77)
    generator.uniform(size=3)
    generator.integers(9)  # half a draw kept
    streams.set_generator(1, generator)
    taken = streams.generator(1)
    assert taken.bit_generator.state == generator.bit_generator.state
    taken.integers(9)  # the copy keeps its own state
    np.testing.assert_array_equal(_draw(streams, "integers", (9,))[1], generator.integers(9))
    np.testing.assert_array_equal(
        _draw(streams, "uniform", (0.0, 1.0, 4))[1], generator.uniform(0.0, 1.0, 4)
    )
    assert streams.generator(1).bit_generator.state == generator.bit_generator.state


@pytest.mark.parametrize(("array", "device"), PLACES)
def test_copied_streams_draw_on_their_own(array: str, device: str) -> None:
    """copy_from: the selected copies take the other streams as they are (a half draw
    kept included), as deep copies of their generators would; then each side draws on
    its own, and the copies not selected keep theirs."""
    place = Place(array, device)
    source, copies = CopyStreams(4, place), CopyStreams(4, place)
    source.seed([10, 11, 12, 13])
    copies.seed([20, 21, 22, 23])
    originals = [np.random.default_rng(s) for s in (10, 11, 12, 13)]
    for g in originals:
        g.integers(9)
    source.integers(9)
    copies.copy_from(source, place.from_host(np.array([True, False, True, False])))
    copied = [originals[0], np.random.default_rng(21), originals[2], np.random.default_rng(23)]
    copied = [copy.deepcopy(g) for g in copied]
    for name, args in CALLS[:4]:
        np.testing.assert_array_equal(_draw(copies, name, args), _expected(copied, name, args))
    np.testing.assert_array_equal(
        _draw(source, "uniform", (0.0, 1.0, 2)), _expected(originals, "uniform", (0.0, 1.0, 2))
    )
    _assert_same_states(copies, copied)
    unseeded = CopyStreams(4, place)
    unseeded.copy_from(source)
    _assert_same_states(unseeded, originals)


@pytest.mark.parametrize(("array", "device"), PLACES)
def test_draws_are_arrays_of_the_place(array: str, device: str) -> None:
    place = Place(array, device)
    streams = CopyStreams(5, place)
    streams.seed(range(5))
    for value, dtype, shape in [
        (streams.uniform(-1.0, 1.0, 3), np.float64, (5, 3)),
        (streams.integers(4), np.int64, (5,)),
    ]:
        assert type(value) is type(place.zeros((1,), dtype))
        assert to_numpy(value).dtype == dtype and tuple(value.shape) == shape


def test_bad_input_is_refused_as_numpy_refuses_it() -> None:
    streams = CopyStreams(2, Place())
    with pytest.raises(ValueError, match="no random stream yet"):
        streams.generator(0)
    with pytest.raises(ValueError, match="copy 1: seed -1"):
        streams.seed([0, -1])
    with pytest.raises(ValueError):
        np.random.default_rng(-1)
    with pytest.raises(ValueError, match="got 3 seeds for 2 copies"):
        streams.seed([0, 1, 2])
    with pytest.raises(ValueError, match=r"where has shape \(3,\), expected \(2,\)"):
        streams.seed([0, 1], where=np.ones(3, bool))
    with pytest.raises(TypeError, match="copy 1: expected a numpy Generator of PCG64"):
        streams.set_generator(1, np.random.Generator(np.random.Philox(0)))
    streams.seed([0, 1])
    generator = np.random.default_rng(0)
    for args in [(0,), (5, 3), (-(2**63) - 1, 0), (0, 2**63 + 1)]:
        with pytest.raises(ValueError, match=r"integers\("):
            streams.integers(*args)
        with pytest.raises(ValueError):
            generator.integers(*args)
    for args, error in [((1.0, -1.0, 2), ValueError), ((-1e308, 1e308, 2), OverflowError)]:
        with pytest.raises(error, match=r"uniform\("):
            streams.uniform(*args)
        with pytest.raises(error):
            generator.uniform(*args)


def test_the_examples_run() -> None:
    result = doctest.testmod(streams_module)
    assert result.attempted > 0 and result.failed == 0
