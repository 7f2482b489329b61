"""corral.vector.layout: a space's values laid out in arrays, stored and read back."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from corral.vector.layout import WriteError, array_tree, leaves, reader, store, writer

SPACE = spaces.Dict(
    move=spaces.Box(-1, 1, (2,), np.float32),
    pick=spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(4))),
)


def _arrays(tree, path: str, lead: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {p: np.zeros((*lead, *spec.shape), spec.dtype) for p, spec in leaves(tree, path)}


def test_store_puts_each_leaf_of_a_batched_value_in_its_array() -> None:
    tree = array_tree(SPACE)
    arrays = _arrays(tree, "action/g", (3, 2))
    value = {
        "move": np.full((3, 2, 2), 0.5, np.float32),
        "pick": (np.arange(6).reshape(3, 2) % 3, np.ones((3, 2, 4), np.int8)),
        "extra": "not stored",
    }
    store(tree, "action/g", arrays, value)
    assert sorted(arrays) == ["action/g/move", "action/g/pick/0", "action/g/pick/1"]
    np.testing.assert_array_equal(arrays["action/g/move"], value["move"])
    np.testing.assert_array_equal(arrays["action/g/pick/0"], value["pick"][0])
    np.testing.assert_array_equal(arrays["action/g/pick/1"], value["pick"][1])
    one = _arrays(array_tree(spaces.Discrete(3)), "action/h", (3,))
    store(array_tree(spaces.Discrete(3)), "action/h", one, np.array([2, 1, 0]))
    assert one["action/h"].tolist() == [2, 1, 0]


def test_reader_reads_one_value_as_the_space_holds_it() -> None:
    tree = array_tree(SPACE)
    arrays = _arrays(tree, "a", (3,))
    arrays["a/move"][1] = [0.25, -0.5]
    arrays["a/pick/0"][1] = 2
    arrays["a/pick/1"][1] = [1, 0, 1, 0]
    got = reader(tree, "a", arrays)(1)
    assert set(got) == {"move", "pick"} and isinstance(got["pick"], tuple)
    assert got["move"].tolist() == [0.25, -0.5] and got["move"].dtype == np.float32
    assert type(got["pick"][0]) is int and got["pick"][0] == 2  # a Discrete action: an int
    assert got["pick"][1].tolist() == [1, 0, 1, 0]
    assert SPACE.contains(got)
    got["move"][0] = 9.0  # a copy: the arrays keep their values
    assert arrays["a/move"][1, 0] == 0.25
    read = reader(array_tree(spaces.Discrete(3)), "a/pick/0", arrays)
    assert read(1) == 2 and type(read(1)) is int


WRITES = [
    # (a value of SPACE, the WriteError's where and expected, or None where it fits)
    ({"move": np.array([0.5, -0.5], np.float32), "pick": (2, np.ones(4, np.int8))}, None),
    ({"move": [0.5, -0.5], "pick": [1, [0, 1, 0, 1]], "extra": 1}, None),  # lists, as numpy
    ({"move": np.zeros(2)}, ("", "a dict with keys ['move', 'pick'], got dict {'move': ")),
    (None, ("", "a dict with keys ['move', 'pick'], got NoneType None")),
    ({"move": np.zeros(3), "pick": (0, np.zeros(4))}, ("['move']", "shape (2,), got array")),
    ({"move": np.zeros(2), "pick": (0,)}, ("['pick']", "a tuple of 2 values, got tuple (0,)")),
    ({"move": np.zeros(2), "pick": (0, np.zeros(5))}, ("['pick'][1]", "shape (4,), got array")),
    ({"move": np.zeros(2), "pick": (300, np.zeros(4))}, None),  # an int64 action: fits
    ({"move": np.array([1e300, 0.0]), "pick": (0, np.zeros(4))}, ("['move']", "values that")),
]


@pytest.mark.parametrize(("value", "error"), WRITES)
def test_writer_names_the_part_of_a_nested_value_that_does_not_fit(value, error) -> None:
    tree = array_tree(SPACE)
    arrays = _arrays(tree, "obs/g", (2,))
    write = writer(tree, "obs/g", arrays)
    if error is None:
        write((1,), value)
        assert arrays["obs/g/move"][1].tolist() == np.asarray(value["move"]).tolist()
        assert arrays["obs/g/pick/0"][1] == np.asarray(value["pick"][0])
        return
    with pytest.raises(WriteError) as info:
        write((1,), value)
    where, expected = error
    assert info.value.where == where
    assert info.value.expected.startswith(expected), info.value.expected
    assert str(info.value).startswith(f"{where}{': ' if where else ''}expected {expected}")
