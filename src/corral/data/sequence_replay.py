"""Replay of sequences: each stream's decisions kept in order, sampled as chunks of one episode.

A recurrent Q-learner learns from consecutive decisions, so its memory keeps
rows per *stream* (an agent of an env for DQN, an env's team for VDN/QMIX)
in the order they were made, each with its index in its episode
(``decision``) and whatever else the learner stores (the hidden state the
decision started from, R2D2's stored state). :meth:`SequenceReplay.sample`
draws a start row uniformly among the stored ones and returns the ``length``
rows that follow it in its stream, with ``valid`` marking those of the same
episode (consecutive decision indices, none overwritten): a chunk never
crosses an episode's end, and its padding repeats rows that mean nothing.

The rows live as torch tensors on the device they are written on; the
counts of rows written per stream are read back at each write (a few ints).

Usage::

    replay = SequenceReplay(capacity=100_000, streams=E * n, seed=0)
    replay.add(rows, keep)           # rows: {field: [T, S, ...]} with "decision"; keep: [T, S]
    chunks = replay.sample(64, 16)   # {field: [64, 16, ...], "valid": [64, 16]}
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from corral.arrays.tree import first_leaf, map_tree


class SequenceReplay:
    """Rows of ``streams`` streams, ``ceil(capacity / streams)`` per stream (the oldest of a
    stream overwritten first), sampled as chunks of consecutive decisions of one episode."""

    def __init__(self, capacity: int, streams: int, seed: int | None = None) -> None:
        if capacity < 1 or streams < 1:
            raise ValueError(
                f"a sequence replay needs a capacity and streams of at least 1, got "
                f"capacity={capacity}, streams={streams}"
            )
        self.streams = int(streams)
        self.per_stream = -(-int(capacity) // self.streams)
        self.rng = np.random.default_rng(seed)
        self._data: dict[str, Any] = {}
        self._serial: torch.Tensor | None = None  # [S, C]: each slot's row number in its stream
        self._written = np.zeros(self.streams, dtype=np.int64)  # rows ever written per stream

    def __len__(self) -> int:
        return int(np.minimum(self._written, self.per_stream).sum())

    def add(self, rows: Mapping[str, Any], keep: Any) -> None:
        """Append, per stream, the rows of ``rows`` (``[T, S, ...]`` per field, with the int
        field ``decision``) where ``keep`` ``[T, S]`` is true, in the order of ``T``."""
        if "decision" not in rows:
            raise ValueError("a sequence replay's rows need the field 'decision'")
        like = first_leaf(next(iter(rows.values())))
        device = like.device if isinstance(like, torch.Tensor) else torch.device("cpu")
        rows = map_tree(lambda x: torch.as_tensor(x, device=device), dict(rows))
        keep = torch.as_tensor(keep, device=device, dtype=torch.bool)
        if keep.ndim != 2 or keep.shape[1] != self.streams:
            raise ValueError(
                f"keep must be laid out [T, streams={self.streams}], got {tuple(keep.shape)}"
            )
        if not self._data:
            self._allocate(rows, device)
        elif self._serial is not None and self._serial.device != device:
            self.to(device)  # after a load, the rows follow the new ones
        assert self._serial is not None
        size = self.per_stream
        rank = torch.cumsum(keep.long(), 0) - 1  # each kept row's place in its stream's rows
        total = rank[-1] + 1
        stays = keep & (rank >= total - size)  # of more than a stream holds, the newest
        step, stream = stays.nonzero(as_tuple=True)
        written = torch.as_tensor(self._written, device=device)
        serial = written[stream] + rank[step, stream]
        slot = serial % size
        for name, stored in self._data.items():
            put = functools.partial(_put, stream, slot, step)
            map_tree(put, stored, rows[name])
        self._serial[stream, slot] = serial
        self._written += total.cpu().numpy()

    def _allocate(self, rows: Mapping[str, Any], device: torch.device) -> None:
        shape = (self.streams, self.per_stream)
        self._data = {
            name: map_tree(lambda x: x.new_zeros((*shape, *x.shape[2:])), tree)
            for name, tree in rows.items()
        }
        self._serial = torch.full(shape, -1, dtype=torch.long, device=device)

    def sample(self, batch_size: int, length: int) -> dict[str, Any]:
        """``batch_size`` chunks of ``length`` rows (``[B, L, ...]`` per field) whose first rows
        are drawn uniformly (with replacement) among the stored ones, and ``valid``
        ``[B, L]``: the row is the ``l``-th decision after the first of the same episode."""
        if self._serial is None or len(self) == 0:
            raise ValueError("cannot sample from an empty replay memory")
        count = np.minimum(self._written, self.per_stream)
        draw = self.rng.integers(0, int(count.sum()), size=batch_size)
        ends = np.cumsum(count)
        stream = np.searchsorted(ends, draw, side="right")
        oldest = self._written[stream] - count[stream]  # serial of the stream's oldest row
        first = oldest + draw - (ends[stream] - count[stream])
        device = self._serial.device
        serial = torch.as_tensor(first[:, None] + np.arange(length), device=device)
        streams = torch.as_tensor(stream, device=device)[:, None].expand_as(serial)
        slot = serial % self.per_stream
        out = map_tree(lambda array: array[streams, slot], self._data)
        decision = out["decision"].long()
        out["valid"] = (self._serial[streams, slot] == serial) & (
            decision == decision[:, :1] + torch.arange(length, device=device)
        )
        return out

    def state_dict(self) -> dict[str, Any]:
        """The stored rows (on the host), their row numbers, the counts and the sampler."""
        return {
            "per_stream": self.per_stream,
            "streams": self.streams,
            "data": map_tree(lambda x: x.cpu().clone(), self._data),
            "serial": None if self._serial is None else self._serial.cpu().clone(),
            "written": self._written.copy(),
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` into a memory of the same layout."""
        layout = (int(state["streams"]), int(state["per_stream"]))
        if layout != (self.streams, self.per_stream):
            raise ValueError(
                f"a sequence replay of {layout[0]} streams of {layout[1]} rows cannot be loaded "
                f"into one of {self.streams} streams of {self.per_stream} rows"
            )
        self._data = map_tree(lambda x: x.clone(), dict(state["data"]))
        self._serial = None if state["serial"] is None else state["serial"].clone()
        self._written = np.asarray(state["written"], dtype=np.int64).copy()
        self.rng.bit_generator.state = state["rng"]

    def to(self, device: Any) -> None:
        """Move the stored rows to ``device``."""
        self._data = map_tree(lambda x: x.to(device), self._data)
        if self._serial is not None:
            self._serial = self._serial.to(device)


def _put(stream: Any, slot: Any, step: Any, array: torch.Tensor, rows: torch.Tensor) -> None:
    array[stream, slot] = rows[step, stream]
