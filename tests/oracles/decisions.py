"""Each agent's decision index, counted by the collector from the batches it acted on:
the oracle of the vector layer's ``Batch.decision`` (the collector's ``DecisionCounter``
as it was before the vector layer kept the index)."""

from __future__ import annotations

from typing import Any

import numpy as np

from corral.arrays import is_tensor


class DecisionCounter:
    """Each agent's decisions in its running episode, counted from the batches acted on.

    Call :meth:`step` once per batch acted on, in order; an env whose batch
    says ``done`` starts counting again. Arrays live where the batches' do
    (NumPy, or tensors on their device), one ``[E, n]`` int64 array per group;
    every array returned is new, never changed afterwards.
    """

    def __init__(self) -> None:
        self.made: dict[str, Any] = {}
        """Per group ``[E, n]``: the decisions made so far in the episode that ran in the
        last step counted (the index a decision after that step would have in that
        episode); empty before the first :meth:`step`."""

    def index(self, batch: Any) -> dict[str, Any]:
        """Each agent's decision index at ``batch`` (0 where an episode starts there)."""
        done = batch.done[:, None]
        index = {}
        for g, acting in batch.acting.items():
            made = self.made.get(g)
            if is_tensor(acting):
                import torch

                if made is None:
                    made = torch.zeros(acting.shape, dtype=torch.int64, device=acting.device)
                index[g] = torch.where(done, 0, made)
            else:
                made = np.zeros(acting.shape, dtype=np.int64) if made is None else made
                index[g] = np.where(done, 0, made)
        return index

    def step(self, batch: Any) -> dict[str, Any]:
        """:meth:`index` at ``batch``, then count the decisions of its acting agents."""
        index = self.index(batch)
        self.made = {g: index[g] + batch.acting[g] for g in index}
        return index
