"""Mixers of value decomposition: per-agent Q values of a team into the team's ``Q_tot``.

* :class:`VDNMixer` (Sunehag et al. 2018): ``Q_tot = sum_a Q_a``.
* :class:`QMixer` (Rashid et al. 2018): a two-layer network over the agents'
  values whose weights and biases are made by hypernetworks of the global
  state; the weights pass through ``abs()``, so ``Q_tot`` is monotonic in
  every ``Q_a`` (``dQ_tot/dQ_a >= 0``), and the greedy joint action is each
  agent's own greedy action.

Both take ``q`` ``[B, n]`` and ``state`` ``[B, state_dim]`` (ignored by VDN)
and return ``[B]``.
"""

from __future__ import annotations

import torch
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

    def __init__(self, n_agents: int, state_dim: int, embed: int, hypernet_hidden: int) -> None:
        super().__init__()
        self.n_agents, self.embed = int(n_agents), int(embed)

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
        w1 = self.hyper_w1(state).abs().view(-1, self.n_agents, self.embed)
        b1 = self.hyper_b1(state)
        hidden = nn.functional.elu(torch.bmm(q.unsqueeze(1), w1).squeeze(1) + b1)
        w2 = self.hyper_w2(state).abs()
        return (hidden * w2).sum(-1) + self.hyper_b2(state).squeeze(-1)
