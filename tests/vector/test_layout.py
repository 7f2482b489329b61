"""corral.vector.layout: a space's values laid out in arrays, stored and read back."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from corral.vector.layout import array_tree, leaves, reader, store

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
