"""Mixers of value decomposition: per-agent Q values of a team into the team's ``Q_tot``.

* :class:`VDNMixer` (Sunehag et al. 2018): ``Q_tot = sum_a Q_a``.
* :class:`QMixer` (Rashid et al. 2018): a two-layer network over the agents'
  values whose weights and biases are made by hypernetworks of the global
  state; the weights pass through ``abs()``, so ``Q_tot`` is monotonic in
  every ``Q_a`` (``dQ_tot/dQ_a >= 0``), and the greedy joint action is each
  agent's own greedy action.

Both take ``q`` ``[B, n]`` and ``state`` ``[B, state_dim]`` (ignored by VDN)
and return ``[B]``.

QMIX's hypernetworks read the state rescaled where its space bounds it beyond
``[-1, 1]`` (:func:`unit_bounds`): the mixing weights grow with the state's
scale, and on raw grid coordinates (LBF's) ``Q_tot`` rose far above any return
(benchmarks/JOURNAL.md, "QMIX on LBF").
"""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from torch import nn


class VDNMixer(nn.Module):
    """``Q_tot``: the sum of the agents' values (no parameters, no state)."""

    def forward(self, q: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
        return q.sum(-1)


class QMixer(nn.Module):
    """QMIX's monotonic mixing network with hypernetworks of the state.

    ``Q_tot = w2 . elu(w1^T q + b1) + b2`` with ``w1`` ``[n, embed]`` and ``w2``
    ``[embed]`` the absolute values of hypernetwork outputs (two layers of
    ``hypernet_hidden`` units each), ``b1`` one linear layer of the state and
    ``b2`` a two-layer network of it.
    """

    def __init__(
        self,
        n_agents: int,
        state_dim: int,
        embed: int,
        hypernet_hidden: int,
        bounds: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        super().__init__()
        self.n_agents, self.embed = int(n_agents), int(embed)
        # the state's affine map onto [-1, 1] where bounded beyond it (not saved: the space's)
        offset, scale = unit_bounds(bounds, state_dim)
        self.state_offset: torch.Tensor
        self.state_scale: torch.Tensor
        self.register_buffer("state_offset", offset, persistent=False)
        self.register_buffer("state_scale", scale, persistent=False)

        def hyper(out: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Linear(state_dim, hypernet_hidden), nn.ReLU(), nn.Linear(hypernet_hidden, out)
            )

        self.hyper_w1 = hyper(self.n_agents * self.embed)
        self.hyper_w2 = hyper(self.embed)
        self.hyper_b1 = nn.Linear(state_dim, self.embed)
        self.hyper_b2 = nn.Sequential(
            nn.Linear(state_dim, self.embed), nn.ReLU(), nn.Linear(self.embed, 1)
        )

    def forward(self, q: torch.Tensor, state: torch.Tensor | None = None) -> torch.Tensor:
        if state is None:
            raise ValueError("QMixer mixes on the global state: pass state [B, state_dim]")
        state = (state - self.state_offset) * self.state_scale
        w1 = self.hyper_w1(state).abs().view(-1, self.n_agents, self.embed)
        b1 = self.hyper_b1(state)
        hidden = nn.functional.elu(torch.bmm(q.unsqueeze(1), w1).squeeze(1) + b1)
        w2 = self.hyper_w2(state).abs()
        return (hidden * w2).sum(-1) + self.hyper_b2(state).squeeze(-1)


def unit_bounds(
    bounds: tuple[np.ndarray, np.ndarray] | None, dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(offset, scale)`` ``[dim]`` such that ``(x - offset) * scale`` maps each dimension
    whose ``(low, high)`` bounds are finite and reach beyond ``[-1, 1]`` onto ``[-1, 1]``,
    and leaves the others (unbounded, or already within ``[-1, 1]``) as they are."""
    offset, scale = torch.zeros(dim), torch.ones(dim)
    if bounds is None:
        return offset, scale
    low = np.asarray(bounds[0], dtype=np.float64).reshape(-1)
    high = np.asarray(bounds[1], dtype=np.float64).reshape(-1)
    if low.shape != (dim,) or high.shape != (dim,):
        raise ValueError(f"state bounds of shape {low.shape}/{high.shape}, expected ({dim},)")
    wide = np.isfinite(low) & np.isfinite(high) & (high > low) & ((low < -1) | (high > 1))
    low, high = low[wide], high[wide]
    offset[wide] = torch.as_tensor((high + low) / 2, dtype=torch.float32)
    scale[wide] = torch.as_tensor(2 / (high - low), dtype=torch.float32)
    return offset, scale


def box_bounds(space: spaces.Space, copies: int = 1) -> tuple[np.ndarray, np.ndarray] | None:
    """The flattened ``(low, high)`` of a ``Box`` space, repeated ``copies`` times (a state
    made of several agents' observations joined); ``None`` for any other space."""
    if not isinstance(space, spaces.Box):
        return None
    low, high = space.low.reshape(-1), space.high.reshape(-1)
    return np.tile(low, copies), np.tile(high, copies)
