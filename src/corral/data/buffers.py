"""Rollout and replay storage of per-agent transitions, one buffer per group.

Both store whatever fields the transitions carry (``obs``, ``action``,
``reward``, ``state``, ``action_mask``, a policy's ``log_prob``...): a buffer
is declared by its fields, not by a class per combination of features.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from corral.data.transitions import Transitions

FieldSpec = dict[str, tuple[tuple[int, ...], np.dtype]]


def fields_of(t: Transitions) -> FieldSpec:
    """The per-row shape and dtype of every field of ``t``."""
    return {name: (value.shape[1:], value.dtype) for name, value in t.items()}


class RolloutBuffer:
    """On-policy storage: transitions in the order they completed, until ``clear()``."""

    def __init__(self) -> None:
        self._chunks: list[Transitions] = []
        self._size = 0

    def add(self, t: Transitions) -> None:
        self._chunks.append(t)
        self._size += len(t["reward"])

    def __len__(self) -> int:
        return self._size

    def data(self) -> Transitions:
        """Every stored field as one array, rows in completion order."""
        if not self._chunks:
            return {}
        names = self._chunks[0].keys()
        return {name: np.concatenate([c[name] for c in self._chunks]) for name in names}

    def clear(self) -> None:
        self._chunks.clear()
        self._size = 0


def gae(
    t: Mapping[str, np.ndarray],
    value: np.ndarray,
    next_value: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns by GAE over each agent's own decision sequence.

    Rows of ``t`` are transitions in completion order; those of one agent in
    one env (``t["env"]``, ``t["agent"]``) form its sequence, one decision per
    row, discounted by ``gamma`` per decision. ``next_value`` is the value of
    each row's ``next_obs`` (or ``next_state``): it bootstraps truncated
    episodes and the end of the rollout; terminated rows bootstrap nothing.
    """
    reward = t["reward"].astype(np.float64)
    terminated = t["terminated"].astype(bool)
    ended = terminated | t["truncated"].astype(bool)
    delta = reward + gamma * np.where(terminated, 0.0, next_value) - value
    advantage = np.zeros_like(delta)
    later: dict[tuple[int, int], float] = {}  # the advantage of each sequence's next row
    for k in range(len(delta) - 1, -1, -1):
        key = (int(t["env"][k]), int(t["agent"][k]))
        carry = 0.0 if ended[k] else later.get(key, 0.0)
        advantage[k] = delta[k] + gamma * lam * carry
        later[key] = advantage[k]
    return advantage, advantage + value


class ReplayBuffer:
    """Off-policy storage of fixed capacity with uniform sampling.

    ``fields`` declares what each row holds; when omitted it is taken from the
    first transitions added.
    """

    def __init__(
        self, capacity: int, fields: FieldSpec | None = None, seed: int | None = None
    ) -> None:
        self.capacity = int(capacity)
        self.rng = np.random.default_rng(seed)
        self._data: dict[str, np.ndarray] = {}
        self._next = 0
        self._size = 0
        if fields is not None:
            self._allocate(fields)

    def _allocate(self, fields: FieldSpec) -> None:
        self._data = {
            name: np.zeros((self.capacity, *shape), dtype=dtype)
            for name, (shape, dtype) in fields.items()
        }

    def add(self, t: Transitions) -> None:
        """Store the rows of ``t``, overwriting the oldest once full."""
        if not self._data:
            self._allocate(fields_of(t))
        missing = set(self._data) - set(t)
        if missing:
            raise ValueError(f"transitions lack the declared fields {sorted(missing)}")
        n = min(len(t["reward"]), self.capacity)
        index = (self._next + np.arange(n)) % self.capacity
        for name, array in self._data.items():
            array[index] = t[name][-n:]
        self._next = int((self._next + n) % self.capacity)
        self._size = min(self._size + n, self.capacity)

    def __len__(self) -> int:
        return self._size

    def state_dict(self) -> dict[str, Any]:
        """The stored rows (only the filled ones), the write position and the sampler's state."""
        return {
            "capacity": self.capacity,
            "data": {name: array[: self._size].copy() for name, array in self._data.items()},
            "next": self._next,
            "size": self._size,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` into a buffer of the same capacity."""
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"a replay buffer of capacity {state['capacity']} cannot be loaded into one of "
                f"capacity {self.capacity}"
            )
        data = state["data"]
        self._size, self._next = int(state["size"]), int(state["next"])
        if data:
            self._allocate({name: (a.shape[1:], a.dtype) for name, a in data.items()})
            for name, array in data.items():
                self._data[name][: self._size] = array
        self.rng.bit_generator.state = state["rng"]

    def sample(self, batch_size: int) -> Transitions:
        """``batch_size`` rows drawn uniformly with replacement."""
        if self._size == 0:
            raise ValueError("cannot sample from an empty replay buffer")
        index = self.rng.integers(0, self._size, size=batch_size)
        return {name: array[index] for name, array in self._data.items()}
