"""Nested values, as Dict and Tuple spaces hold them: the one walk over such trees.

A tree is a leaf, a dict of trees or a tuple of trees (with ``lists=True`` a list
too, kept a list; with ``mappings=True`` any mapping, rebuilt as a dict). A space
tree is a gymnasium space: ``Dict`` and ``Tuple`` spaces are its branches.

* :func:`map_tree`: a function over the leaves of a tree and of others laid out
  like it, nested like it;
* :func:`tree_leaves`, :func:`leaves_of` and :func:`map_paths`: the leaves with their paths
  (``obs/agent/pos/0`` by :func:`slash`, ``obs['pos'][0]`` by :func:`index`);
  :func:`leaves_found` for a value that may not follow its tree (the checkers read what
  an env returned), :func:`follow` for one that must (a :class:`Mismatch` where it does
  not), :func:`leaf_keys` for the keys down to each leaf;
* :func:`map_space`: a function over the leaf spaces of a space (and the values
  laid out like it), nested like the space.

Examples:
    >>> tree = {"pos": (1, 2), "id": 3}
    >>> map_tree(lambda x, y: x + y, tree, {"pos": (10, 20), "id": 30})
    {'pos': (11, 22), 'id': 33}
    >>> tree_leaves(tree, "obs", join=index)
    [("obs['pos'][0]", 1), ("obs['pos'][1]", 2), ("obs['id']", 3)]
    >>> leaves_found(tree, {"pos": [10]}, "obs", join=index)
    [("obs['pos'][0]", 1, 10), ("obs['pos'][1]", 2, None), ("obs['id']", 3, None)]
    >>> leaf_keys(tree)
    [('pos', 0), ('pos', 1), ('id',)]
    >>> from gymnasium import spaces
    >>> map_space(lambda s: int(s.n), spaces.Dict(a=spaces.Discrete(2), b=spaces.Discrete(3)))
    {'a': 2, 'b': 3}
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

from gymnasium import spaces

Tree = Any
Join = Callable[[str, Hashable], str]


def slash(path: str, key: Hashable) -> str:
    """``path/key``: the paths of the vector layer's arrays."""
    return f"{path}/{key}"


def index(path: str, key: Hashable) -> str:
    """``path['key']`` or ``path[0]``: the paths of error messages, as Python indexes them."""
    return f"{path}[{key!r}]"


def map_tree(
    fn: Callable[..., Any],
    tree: Tree,
    *others: Tree,
    mappings: bool = False,
    lists: bool = False,
) -> Tree:
    """``fn(leaf, *other_leaves)`` over the leaves of ``tree``, nested like it; each of
    ``others`` is read at ``tree``'s keys and indices (its other keys are not read)."""
    if not others:
        return _map_one(fn, tree, mappings, lists)
    if isinstance(tree, dict) or (mappings and isinstance(tree, Mapping)):
        return {
            key: map_tree(fn, sub, *(o[key] for o in others), mappings=mappings, lists=lists)
            for key, sub in tree.items()
        }
    if isinstance(tree, tuple) or (lists and isinstance(tree, list)):
        return type(tree)(
            map_tree(fn, sub, *(o[i] for o in others), mappings=mappings, lists=lists)
            for i, sub in enumerate(tree)
        )
    return fn(tree, *others)


def _map_one(fn: Callable[[Any], Any], tree: Tree, mappings: bool, lists: bool) -> Tree:
    """:func:`map_tree` of one tree (the common case, with fewer calls per node)."""
    if isinstance(tree, dict) or (mappings and isinstance(tree, Mapping)):
        return {key: _map_one(fn, sub, mappings, lists) for key, sub in tree.items()}
    if isinstance(tree, tuple) or (lists and isinstance(tree, list)):
        return type(tree)([_map_one(fn, sub, mappings, lists) for sub in tree])
    return fn(tree)


def map_paths(
    fn: Callable[[str, Any], Any], tree: Tree, path: str = "", join: Join = slash
) -> Tree:
    """``fn(leaf_path, leaf)`` over the leaves of ``tree``, nested like it; paths extend
    ``path`` by ``join``."""
    if isinstance(tree, dict):
        return {key: map_paths(fn, sub, join(path, key), join) for key, sub in tree.items()}
    if isinstance(tree, tuple):
        return tuple(map_paths(fn, sub, join(path, i), join) for i, sub in enumerate(tree))
    return fn(path, tree)


def tree_leaves(
    tree: Tree,
    path: str = "",
    join: Join = slash,
    *,
    mappings: bool = False,
    lists: bool = False,
) -> list[tuple[str, Any]]:
    """``(path, leaf)`` of every leaf of ``tree`` in order, paths extending ``path`` by
    ``join``."""
    out: list[tuple[str, Any]] = []
    _collect(tree, path, join, mappings, lists, out)
    return out


def _collect(
    tree: Tree,
    path: Any,
    join: Callable[[Any, Hashable], Any],
    mappings: bool,
    lists: bool,
    out: list[tuple[Any, Any]],
) -> None:
    if isinstance(tree, dict) or (mappings and isinstance(tree, Mapping)):
        for key, sub in tree.items():
            _collect(sub, join(path, key), join, mappings, lists, out)
    elif isinstance(tree, tuple) or (lists and isinstance(tree, list)):
        for i, sub in enumerate(tree):
            _collect(sub, join(path, i), join, mappings, lists, out)
    else:
        out.append((path, tree))


def leaves_of(tree: Tree, value: Tree, path: str = "", join: Join = slash) -> list[tuple[str, Any]]:
    """``(path, leaf of value)`` for every leaf of ``tree`` in order: ``value`` is read at
    ``tree``'s keys and indices (its other keys are not read)."""
    out: list[tuple[str, Any]] = []
    _collect_of(tree, value, path, join, out)
    return out


def _collect_of(tree: Tree, value: Tree, path: str, join: Join, out: list) -> None:
    if isinstance(tree, dict):
        for key, sub in tree.items():
            _collect_of(sub, value[key], join(path, key), join, out)
    elif isinstance(tree, tuple):
        for i, sub in enumerate(tree):
            _collect_of(sub, value[i], join(path, i), join, out)
    else:
        out.append((path, value))


def leaves_found(
    tree: Tree, value: Any, path: str = "", join: Join = slash
) -> list[tuple[str, Any, Any]]:
    """``(path, leaf of tree, leaf of value)`` for every leaf of ``tree`` in order, where
    ``value`` need not follow ``tree``: it is read at ``tree``'s keys where it is a mapping
    and at its indices where it is a tuple or list; a part it does not have is ``None``."""
    out: list[tuple[str, Any, Any]] = []
    _collect_found(tree, value, path, join, out)
    return out


def _collect_found(tree: Tree, value: Any, path: str, join: Join, out: list) -> None:
    if isinstance(tree, dict):
        mapping = isinstance(value, Mapping)
        for key, sub in tree.items():
            part = value.get(key) if mapping else None
            _collect_found(sub, part, join(path, key), join, out)
    elif isinstance(tree, tuple):
        sequence = isinstance(value, (tuple, list))
        for i, sub in enumerate(tree):
            part = value[i] if sequence and i < len(value) else None
            _collect_found(sub, part, join(path, i), join, out)
    else:
        out.append((path, tree, value))


class Mismatch(LookupError):
    """A value that does not follow its tree: at ``keys``, where the tree holds ``tree`` (a
    dict or a tuple), the value holds ``value``."""

    def __init__(self, keys: tuple[Hashable, ...], tree: Tree, value: Any) -> None:
        super().__init__(f"the value does not follow its tree at {list(keys)}")
        self.keys = keys
        self.tree = tree
        self.value = value


def follow(tree: Tree, value: Any) -> Iterator[tuple[tuple[Hashable, ...], Any, Any]]:
    """``(keys, leaf of tree, leaf of value)`` for every leaf of ``tree`` in order, read as
    it goes; a :class:`Mismatch` where ``value`` does not follow ``tree``: it lacks one of
    a dict's keys, or is no tuple or list of a tuple's length."""
    return _follow(tree, value, ())


def _follow(tree: Tree, value: Any, keys: tuple[Hashable, ...]) -> Iterator[tuple[Any, Any, Any]]:
    if isinstance(tree, dict):
        for key, sub in tree.items():
            try:
                part = value[key]
            except (KeyError, TypeError, IndexError):
                raise Mismatch(keys, tree, value) from None
            yield from _follow(sub, part, (*keys, key))
    elif isinstance(tree, tuple):
        if not isinstance(value, (tuple, list)) or len(value) != len(tree):
            raise Mismatch(keys, tree, value)
        for i, (sub, part) in enumerate(zip(tree, value, strict=True)):
            yield from _follow(sub, part, (*keys, i))
    else:
        yield keys, tree, value


def leaf_keys(tree: Tree) -> list[tuple[Hashable, ...]]:
    """The keys and indices down to each leaf of ``tree``, in order (``()`` for a leaf)."""
    out: list[tuple[Any, Any]] = []
    _collect(tree, (), _extend, False, False, out)
    return [keys for keys, _ in out]


def _extend(keys: tuple[Hashable, ...], key: Hashable) -> tuple[Hashable, ...]:
    return (*keys, key)


def first_leaf(tree: Tree) -> Any:
    """The first leaf of ``tree`` (its first key's or index's, all the way down)."""
    while isinstance(tree, (dict, tuple)):
        tree = next(iter(tree.values())) if isinstance(tree, dict) else tree[0]
    return tree


def map_space(fn: Callable[..., Any], space: spaces.Space, *values: Tree) -> Tree:
    """``fn(leaf_space, *leaf_values)`` over the leaf spaces of ``space``, nested like it: a
    dict for a ``Dict`` space, a tuple for a ``Tuple``; each of ``values`` is read at the
    space's keys and indices."""
    if isinstance(space, spaces.Dict):
        return {
            key: map_space(fn, sub, *(v[key] for v in values)) for key, sub in space.spaces.items()
        }
    if isinstance(space, spaces.Tuple):
        return tuple(
            map_space(fn, sub, *(v[i] for v in values)) for i, sub in enumerate(space.spaces)
        )
    return fn(space, *values)
