"""Place: where a batch's arrays live, and how torch tensors on the CPU are computed on
(``host_views``, defaulting to ``False`` for a Place built inside ``device_path()``)."""

from __future__ import annotations

import pickle

import pytest

import corral
from corral.arrays import Place, device_path

torch = pytest.importorskip("torch")


def test_a_torch_cpu_place_computes_through_numpy_views_by_default() -> None:
    place = Place("torch", "cpu")
    assert place.host_views is True and place.computes_on_host


def test_inside_device_path_a_torch_cpu_place_computes_in_torch() -> None:
    with device_path():
        place = Place("torch", "cpu")
        numpy = Place()
    assert place.host_views is False and not place.computes_on_host
    assert numpy.computes_on_host  # meaningless for numpy: always on the host


def test_an_explicit_host_views_wins_inside_and_outside_the_block() -> None:
    with device_path():
        inside = Place("torch", "cpu", host_views=True)
    outside = Place("torch", "cpu", host_views=False)
    assert inside.computes_on_host and not outside.computes_on_host


def test_a_place_built_inside_the_block_keeps_the_device_path_after_it() -> None:
    with device_path():
        place = Place("torch", "cpu")
    after = Place("torch", "cpu")
    assert place.host_views is False and not place.computes_on_host
    assert after.host_views is True  # the block is over: the default is back


def test_the_default_comes_back_after_an_error_and_nested_blocks() -> None:
    with pytest.raises(RuntimeError), device_path():
        with device_path():
            pass
        assert Place("torch").host_views is False  # still inside the outer block
        raise RuntimeError
    assert Place("torch").host_views is True


def test_host_views_means_nothing_off_the_cpu() -> None:
    assert not Place("torch", "meta", host_views=True).computes_on_host


def test_places_differing_in_host_views_are_different_places() -> None:
    views, device = Place("torch", "cpu"), Place("torch", "cpu", host_views=False)
    assert views != device and len({views, device, Place("torch", "cpu")}) == 2
    assert pickle.loads(pickle.dumps(device)) == device  # a worker gets the same place


def test_host_views_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="host_views must be a bool, got 0"):
        Place("torch", "cpu", host_views=0)  # type: ignore[arg-type]


def test_device_path_is_at_the_root() -> None:
    assert corral.device_path is device_path


def test_numpy_arrays_of_any_strides_or_writability_come_in_as_their_values() -> None:
    np = pytest.importorskip("numpy")
    base = np.arange(12, dtype=np.int64).reshape(4, 3)
    readonly = base.copy()
    readonly.flags.writeable = False
    place = Place("torch")
    for value in (base[::-1], base[:, ::-1], np.broadcast_to(base[0], (4, 3)), readonly):
        tensor = place.asarray(value)
        assert tensor.tolist() == value.tolist()
    shared = place.asarray(base)  # a plain array is not copied
    base[0, 0] = 99
    assert shared[0, 0].item() == 99
