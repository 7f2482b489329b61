"""Network inputs of many rows kept as their parts, made into floats a minibatch at a time.

A learner that reads image observations from a whole rollout would hold them as
``float32`` (four times their ``uint8`` bytes) once per network; :class:`RowInputs` keeps
the observations as they were stored (their dtype, a ``Dict``'s leaves apart), shared by
the networks that see them, and the few float columns that follow them (an agent's
one-hot id, its time) apart; it gives the float inputs ``[K, flat_dim + extra]`` of the
rows asked for: row by row the numbers of ``as_input`` of all rows with the columns joined.
"""

from __future__ import annotations

from typing import Any

import torch
from gymnasium import spaces

from corral.algos.encoders import Parts, shaped
from corral.algos.networks import as_input
from corral.arrays.tree import first_leaf, map_tree


class StoredRows:
    """Observations of ``space`` as stored (a tensor ``[N, ...]`` or a dict of them, in
    their dtype, moved to ``device``), and the float inputs of the rows last asked for."""

    def __init__(self, obs: Any, space: spaces.Space, device: Any) -> None:
        self.obs = map_tree(lambda x: torch.as_tensor(x, device=device), obs)
        self.space = space
        self.device = device
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(first_leaf(self.obs))

    def floats(self, index: torch.Tensor) -> torch.Tensor:
        """``as_input`` of the rows at ``index``; asked again for the same ``index`` object
        (the actor's and the critic's minibatch), the same tensor."""
        if self._last is not None and self._last[0] is index:
            return self._last[1]
        x = as_input(map_tree(lambda leaf: leaf[index], self.obs), self.space, self.device)
        self._last = (index, x)
        return x


class RowInputs:
    """Rows of a network's inputs: the observations of ``stored`` with the float columns
    ``extra`` ``[N, k]`` after them (``k`` may be 0).

    ``rows[index]`` is what the network reads of the rows at ``index`` (a tensor of row
    indices): for a network behind an :class:`~corral.algos.encoders.Encoded` front
    (``parts``) the two apart, as :class:`~corral.algos.encoders.Parts`, else
    :meth:`floats`."""

    def __init__(self, stored: StoredRows, extra: torch.Tensor, *, parts: bool) -> None:
        if len(extra) != len(stored):
            raise ValueError(f"{len(extra)} rows of extra columns for {len(stored)} observations")
        self.stored = stored
        self.extra = extra
        self.parts = parts

    def __len__(self) -> int:
        return len(self.stored)

    def floats(self, index: torch.Tensor) -> torch.Tensor:
        """The float inputs ``[len(index), flat_dim + k]`` of the rows at ``index``."""
        x = self.stored.floats(index)
        return torch.cat([x, self.extra[index]], dim=-1) if self.extra.shape[-1] else x

    def __getitem__(self, index: torch.Tensor) -> torch.Tensor | Parts:
        if self.parts:
            return Parts(shaped(self.stored.floats(index), self.stored.space), self.extra[index])
        return self.floats(index)


def minibatches(rows: torch.Tensor | RowInputs, perm: torch.Tensor, size: int, chunks: Any) -> Any:
    """The minibatches of ``rows`` in the order ``perm``, ``size`` rows each (the last may be
    shorter; ``chunks`` is ``perm.split(size)``): a tensor's gathered at once, a
    :class:`RowInputs`' made one at a time."""
    if isinstance(rows, RowInputs):
        return (rows[index] for index in chunks)
    return rows.index_select(0, perm).split(size)
