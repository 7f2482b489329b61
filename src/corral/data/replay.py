"""Replay memory of fixed capacity, stored as arrays where its rows live.

A :class:`Replay` keeps rows (``obs``, ``action``, ``reward``...: whatever
fields the first rows written carry) in arrays of the rows' namespace and
device: NumPy, or torch tensors on the rows' device. Writing is one scatter
per field, at positions computed from a cumulative sum of the rows' ``keep``
mask, so rows made on a GPU are written without reading anything back; the
write position and the number of rows stored stay on the device too.
Sampling draws uniformly (with replacement) from the stored rows with a
generator of the same namespace and device.

Usage::

    replay = Replay(capacity=100_000, seed=0)
    replay.add(rows, keep=mask)       # rows: {field: [K, ...]}, mask: [K] (default: all)
    batch = replay.sample(256)        # {field: [256, ...]}
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from corral.arrays import is_tensor, zeros
from corral.arrays import xp as namespace
from corral.arrays.tree import first_leaf, leaves_of, map_tree, tree_leaves

Transitions = dict[str, Any]
"""Rows of decisions, one array ``[K, ...]`` per field (``obs``, ``action``, ``reward``,
``next_obs``...; see :func:`corral.data.rollouts.decisions`): what a :class:`Replay` stores.
A field may be a dict or tuple of such arrays (a ``Dict`` observation): it is stored leaf by
leaf and sampled as it was written."""


class Replay:
    """Rows of fixed capacity (the oldest overwritten first), sampled uniformly.

    ``len()`` counts the stored rows (on torch: a read of the device);
    :attr:`size` is the same count as an array, left where it is.
    """

    def __init__(self, capacity: int, seed: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"a replay memory needs a capacity of at least 1, got {capacity}")
        self.capacity = int(capacity)
        self.rng = np.random.default_rng(seed)
        self._seed = seed
        # capacity + 1 rows per field: the last one takes the rows not kept
        self._data: dict[str, Any] = {}
        self._next: Any = 0
        self._size: Any = 0
        self._generator: Any = None  # a torch.Generator on the storage's device, once needed
        self._generator_state: tuple[str, Any] | None = None  # loaded, for that generator

    # -- writing -------------------------------------------------------------------------

    def add(self, rows: Mapping[str, Any], keep: Any = None) -> None:
        """Write the rows of ``rows`` (``[K, ...]`` per field) where ``keep`` ``[K]`` is true
        (default: all), overwriting the oldest once full; of more than ``capacity`` rows
        kept at once, the last ``capacity`` stay."""
        if not rows:
            raise ValueError("no fields to write")
        first = first_leaf(next(iter(rows.values())))
        if not self._data:
            self._allocate(rows)
        else:
            self._follow(first)
            self._check(rows)
        xp = namespace(first)
        count = len(first)
        if keep is None:
            keep = (
                np.ones(count, bool)
                if xp is np
                else xp.ones(count, dtype=xp.bool, device=first.device)
            )
        rank = xp.cumsum(keep, 0) - 1  # the place of each kept row among those kept
        total = rank[-1] + 1 if count else rank.sum() * 0
        stays = keep & (rank >= total - self.capacity)  # the newest `capacity` of them
        index = xp.where(stays, (self._next + rank) % self.capacity, self.capacity)
        for name, stored in self._data.items():
            map_tree(functools.partial(_scatter, index), stored, rows[name])
        if xp is np:
            self._next = int((self._next + total) % self.capacity)
            self._size = int(min(self._size + total, self.capacity))
        else:
            self._next = (self._next + total) % self.capacity
            self._size = (self._size + total).clamp(max=self.capacity)

    def _allocate(self, rows: Mapping[str, Any]) -> None:
        self._data = {}
        for name, tree in rows.items():
            self._data[name] = map_tree(lambda x: zeros(x, (self.capacity + 1, *x.shape[1:])), tree)
        self._follow(first_leaf(next(iter(rows.values()))))

    def _check(self, rows: Mapping[str, Any]) -> None:
        missing = sorted(set(self._data) - set(rows))
        if missing:
            raise ValueError(f"the rows lack the fields {missing} of this replay memory")
        for name, stored in self._data.items():
            try:
                given = leaves_of(stored, rows[name], name)
            except (KeyError, IndexError, TypeError):
                raise ValueError(
                    f"field {name!r}: the rows are laid out unlike this replay memory's"
                ) from None
            for (path, array), (_, x) in zip(tree_leaves(stored, name), given, strict=True):
                if not hasattr(x, "shape") or tuple(x.shape[1:]) != tuple(array.shape[1:]):
                    got = tuple(x.shape[1:]) if hasattr(x, "shape") else type(x).__name__
                    raise ValueError(
                        f"field {path!r}: rows of shape {got}, but this replay memory holds "
                        f"rows of shape {tuple(array.shape[1:])}"
                    )

    def _follow(self, like: Any) -> None:
        """Move the storage to ``like``'s namespace and device (after a load, say)."""
        stored = first_leaf(next(iter(self._data.values())))
        if is_tensor(like) == is_tensor(stored) and (
            not is_tensor(like) or like.device == stored.device
        ):
            if is_tensor(like) and not is_tensor(self._next):
                self._next, self._size = _counters(self._next, self._size, like.device)
            return
        if is_tensor(like):
            import torch

            self._data = map_tree(lambda v: torch.as_tensor(v).to(like.device), self._data)
            self._next, self._size = _counters(int(self._next), int(self._size), like.device)
            self._generator = None
        else:
            self._data = map_tree(lambda v: v.cpu().numpy(), self._data)
            self._next, self._size = int(self._next), int(self._size)

    # -- reading --------------------------------------------------------------------------

    @property
    def size(self) -> Any:
        """The number of rows stored: an int on NumPy, a 0-d tensor on the device on torch."""
        return self._size

    def __len__(self) -> int:
        return int(self._size)

    def sample(self, batch_size: int) -> dict[str, Any]:
        """``batch_size`` rows drawn uniformly with replacement, on the storage's device.

        On NumPy an empty memory raises ``ValueError``; on torch (where that
        check would read the device) the caller makes sure rows were written."""
        if not self._data or (not is_tensor(self._size) and self._size == 0):
            raise ValueError("cannot sample from an empty replay memory")
        if is_tensor(self._size):
            import torch

            device = self._size.device
            draw = torch.rand(
                batch_size, generator=self._torch_generator(device), device=device,
                dtype=torch.float64,
            )  # fmt: skip
            index = (draw * self._size).long()
        else:
            index = self.rng.integers(0, self._size, size=batch_size)
        return map_tree(lambda array: array[index], self._data)

    def _torch_generator(self, device: Any) -> Any:
        import torch

        if self._generator is None or self._generator.device != device:
            self._generator = torch.Generator(device)
            seed = self._seed if self._seed is not None else int(self.rng.integers(2**63))
            self._generator.manual_seed(seed)
            if self._generator_state is not None and self._generator_state[0] == device.type:
                self._generator.set_state(self._generator_state[1])
            self._generator_state = None
        return self._generator

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The stored rows (only the filled ones, on the host), the write position and the
        samplers' states."""
        size = int(self._size)
        data = map_tree(
            lambda array: array[:size].cpu().clone() if is_tensor(array) else array[:size].copy(),
            self._data,
        )
        state: dict[str, Any] = {
            "capacity": self.capacity,
            "data": data,
            "next": int(self._next),
            "size": size,
            "rng": self.rng.bit_generator.state,
        }
        if self._generator is not None:
            state["torch_rng"] = (self._generator.device.type, self._generator.get_state())
        elif self._generator_state is not None:  # restored, not drawn from since
            state["torch_rng"] = self._generator_state
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` into a memory of the same capacity (also the state of
        corral's earlier ``ReplayBuffer``, which has the same layout). The rows stay on the
        host until the next rows written or :meth:`to` move them."""
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"a replay memory of capacity {state['capacity']} cannot be loaded into one of "
                f"capacity {self.capacity}"
            )
        size = int(state["size"])
        for path, array in tree_leaves(state["data"]):
            if len(array) != size:
                raise ValueError(
                    f"replay field {path[1:]!r} holds {len(array)} rows, but the state says {size}"
                )

        def stored(array: Any) -> Any:
            out = zeros(array, (self.capacity + 1, *array.shape[1:]))
            out[:size] = array
            return out

        self._data = map_tree(stored, dict(state["data"]))
        self._size, self._next = size, int(state["next"])
        self.rng.bit_generator.state = state["rng"]
        self._generator = None
        self._generator_state = state.get("torch_rng")

    def to(self, like: Any) -> None:
        """Move the stored rows to ``like``'s namespace and device (an array or tensor)."""
        if self._data:
            self._follow(like)


def _scatter(index: Any, array: Any, rows: Any) -> None:
    array[index] = rows


def _counters(next_: int, size: int, device: Any) -> tuple[Any, Any]:
    import torch

    return (
        # filled on the device (torch.tensor would copy from the host)
        torch.full((), next_, dtype=torch.int64, device=device),
        torch.full((), size, dtype=torch.int64, device=device),
    )
