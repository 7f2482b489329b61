"""corral.arrays.tree: the one walk over Dict/Tuple trees, and the walks that use it."""

from __future__ import annotations

from collections import OrderedDict
from types import MappingProxyType

import numpy as np
import pytest
from gymnasium import spaces

from corral.arrays.tree import (
    Mismatch,
    first_leaf,
    follow,
    index,
    leaf_keys,
    leaves_found,
    leaves_of,
    map_paths,
    map_space,
    map_tree,
    tree_leaves,
)
from corral.vector.layout import ArraySpec, array_tree, assemble, leaves
from corral.vector.sampling import sample_array

SPACE = spaces.Dict(
    pos=spaces.Box(-1, 1, (2,), np.float32),
    parts=spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(4))),
)


def test_map_tree_zips_trees_by_the_first_trees_keys() -> None:
    tree = {"a": (1, 2), "b": 3}
    other = {"b": 30, "a": (10, 20), "extra": "not read"}
    assert map_tree(lambda x, y: x + y, tree, other) == {"a": (11, 22), "b": 33}


def test_lists_and_other_mappings_are_branches_only_when_asked() -> None:
    value = {"a": [1, 2], "b": MappingProxyType({"c": 3})}
    assert map_tree(repr, value) == {"a": "[1, 2]", "b": repr(value["b"])}
    assert map_tree(str, value, lists=True, mappings=True) == {"a": ["1", "2"], "b": {"c": "3"}}
    assert map_tree(str, OrderedDict(a=1)) == {"a": "1"}  # a dict subclass is a dict


def test_leaves_have_slash_paths_for_arrays_and_index_paths_for_messages() -> None:
    tree = {"pos": np.zeros(2), "parts": (0, np.ones(4))}
    assert [p for p, _ in tree_leaves(tree, "obs/agent")] == [
        "obs/agent/pos",
        "obs/agent/parts/0",
        "obs/agent/parts/1",
    ]
    assert [p for p, _ in tree_leaves(tree, "obs", index)] == [
        "obs['pos']",
        "obs['parts'][0]",
        "obs['parts'][1]",
    ]
    assert tree_leaves(5, "x") == [("x", 5)]
    assert map_paths(lambda path, leaf: path, tree, "o") == {
        "pos": "o/pos",
        "parts": ("o/parts/0", "o/parts/1"),
    }
    assert first_leaf(({"a": 7, "b": 8}, 9)) == 7


def test_map_space_reads_values_at_the_spaces_keys() -> None:
    value = {"parts": (2, [1, 0, 0, 1]), "pos": [0.5, -0.5]}
    out = map_space(lambda space, v: (type(space).__name__, v), SPACE, value)
    assert out == {
        "pos": ("Box", [0.5, -0.5]),
        "parts": (("Discrete", 2), ("MultiBinary", [1, 0, 0, 1])),
    }


def test_the_vector_layout_lays_out_a_nested_space_by_the_tree() -> None:
    tree = array_tree(SPACE)
    assert tree == {
        "pos": ArraySpec((2,), np.dtype(np.float32)),
        "parts": (ArraySpec((), np.dtype(np.int64)), ArraySpec((4,), np.dtype(np.int8))),
    }
    paths = [p for p, _ in leaves(tree, "obs/g")]
    assert paths == ["obs/g/pos", "obs/g/parts/0", "obs/g/parts/1"]
    arrays = {p: np.full(3, i) for i, p in enumerate(paths)}
    nested = assemble(tree, "obs/g", arrays)
    assert nested["pos"] is arrays["obs/g/pos"] and nested["parts"][1] is arrays["obs/g/parts/1"]


def test_sampling_a_nested_space_draws_its_leaves_in_order() -> None:
    lead = (2, 3)
    drawn = sample_array(SPACE, lead, np.random.default_rng(7))
    rng = np.random.default_rng(7)  # the reference: each leaf drawn by hand, in order
    pos = sample_array(SPACE["pos"], lead, rng)
    first = sample_array(SPACE["parts"][0], lead, rng)
    second = sample_array(SPACE["parts"][1], lead, rng)
    np.testing.assert_array_equal(drawn["pos"], pos)
    np.testing.assert_array_equal(drawn["parts"][0], first)
    np.testing.assert_array_equal(drawn["parts"][1], second)


def test_leaves_of_a_value_follow_the_layout_tree() -> None:
    tree = {"pos": 0, "parts": (0, 0)}
    value = {"parts": ("p0", "p1"), "pos": "x", "extra": "not read"}
    assert leaves_of(tree, value, "obs") == [
        ("obs/pos", "x"),
        ("obs/parts/0", "p0"),
        ("obs/parts/1", "p1"),
    ]


def test_leaves_found_reads_what_a_value_has_and_gives_none_for_the_rest() -> None:
    tree = {"pos": "P", "parts": ("A", "B")}
    assert leaves_found(tree, {"parts": ["a"], "pos": 1, "extra": 2}, "obs", index) == [
        ("obs['pos']", "P", 1),
        ("obs['parts'][0]", "A", "a"),
        ("obs['parts'][1]", "B", None),  # a list too short
    ]
    for broken in (None, 3.5, ("not", "a", "mapping")):  # no mapping: no part of it
        assert [part for _, _, part in leaves_found(tree, broken)] == [None] * 3
    proxy = MappingProxyType({"pos": 1, "parts": "no tuple"})  # any mapping is read
    assert [part for _, _, part in leaves_found(tree, proxy)] == [1, None, None]
    assert leaves_found("leaf", 7, "x") == [("x", "leaf", 7)]


def test_leaf_keys_are_the_keys_and_indices_down_to_each_leaf() -> None:
    tree = array_tree(SPACE)
    assert leaf_keys(tree) == [("pos",), ("parts", 0), ("parts", 1)]
    assert leaf_keys(ArraySpec((), np.dtype(bool))) == [()]
    paths = ["/".join(("obs/g", *map(str, keys))) for keys in leaf_keys(tree)]
    assert paths == [p for p, _ in leaves(tree, "obs/g")]  # the vector layer's paths


def test_follow_reads_a_value_that_must_follow_its_tree_and_says_where_it_does_not() -> None:
    tree = {"pos": "P", "parts": ("A", "B")}
    value = {"parts": ["a", "b"], "pos": 1, "extra": 2}
    assert list(follow(tree, value)) == [
        (("pos",), "P", 1),
        (("parts", 0), "A", "a"),
        (("parts", 1), "B", "b"),
    ]
    assert list(follow("leaf", 7)) == [((), "leaf", 7)]
    for broken, keys, node in [
        ({"pos": 1}, (), tree),  # a key missing
        (3.5, (), tree),
        ({"pos": 1, "parts": ("a",)}, ("parts",), tree["parts"]),  # a tuple too short
        ({"pos": 1, "parts": "ab"}, ("parts",), tree["parts"]),  # no tuple
    ]:
        with pytest.raises(Mismatch) as info:
            list(follow(tree, broken))
        assert (info.value.keys, info.value.tree, info.value.value) == (
            keys,
            node,
            broken if not keys else broken["parts"],
        )
    got = []
    with pytest.raises(Mismatch):
        for keys, _, part in follow(tree, {"pos": 1}):  # read as it goes: pos comes first
            got.append((keys, part))
    assert got == [(("pos",), 1)]
