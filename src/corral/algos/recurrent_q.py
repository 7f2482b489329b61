"""Recurrent Q-networks: DQN's, VDN's and QMIX's agent network with a GRU (``recurrent=true``).

The network reads an input through its first layer (behind the encoder, where
there is one) and a GRU cell (a :class:`~corral.algos.recurrent.RecurrentCore`),
whose new hidden state the Q head reads. Acting keeps each agent's memory as
recurrent MAPPO does (:func:`~corral.algos.recurrent.start_hidden`,
:func:`~corral.algos.recurrent.advanced`: zero at each of its episodes,
advancing only where it acts) and stores the hidden state each decision
started from, the extra ``hidden``.

Learning (see :class:`~corral.data.sequence_replay.SequenceReplay`) takes
chunks of at most ``bptt`` consecutive decisions of one episode and unrolls
the online and the target network from the chunk's stored start state (R2D2's
stored state, no burn-in): the Q value of each decision is read after its
observation, and the value of its next observation after that one too, from
the state the decision left. Losses are means over the chunks' valid rows.
"""

from __future__ import annotations

import torch
from torch import nn

from corral.algos.encoders import Encoded, encoded_mlp
from corral.algos.recurrent import RecurrentCore


class RecurrentQNet(nn.Module):
    """A :class:`~corral.algos.recurrent.RecurrentCore` (first layer ``hidden[0]`` wide, a GRU of
    ``rnn_hidden``) and an MLP head (``hidden[1:]``) to ``actions`` Q values."""

    def __init__(
        self,
        front: Encoded | None,
        in_dim: int,
        actions: int,
        hidden: tuple[int, ...],
        rnn_hidden: int,
    ) -> None:
        super().__init__()
        self.core = RecurrentCore(front, in_dim, hidden[0], rnn_hidden)
        self.head = encoded_mlp(None, rnn_hidden, actions, tuple(hidden[1:]))
        self.hidden_size = rnn_hidden

    def step(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The Q values ``[..., actions]`` of inputs ``[..., in_dim]`` from hidden states
        ``[..., rnn_hidden]``, and the hidden states they lead to."""
        new = self.core(x, h)
        return self.head(new), new

    def sequence(
        self, x: torch.Tensor, next_x: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The Q values ``[B, L, ..., actions]`` of sequences of inputs ``x`` ``[B, L, ...,
        in_dim]`` unrolled from ``h`` ``[B, ..., rnn_hidden]``, and those of each step's next
        input ``next_x`` (same layout) read from the state that step left."""
        batch, length = x.shape[:2]
        middle = x.shape[2:-1]
        flat = x.movedim(1, -2).reshape(-1, length, x.shape[-1])
        states = self.core.unroll(flat, h.reshape(-1, self.hidden_size))
        states = states.reshape(batch, *middle, length, self.hidden_size).movedim(-2, 1)
        return self.head(states), self.head(self.core(next_x, states))
