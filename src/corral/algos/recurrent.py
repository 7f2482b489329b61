"""Recurrent networks: a GRU after a network's first layer, a memory per agent, and the
chunks that truncated backpropagation through time (BPTT) learns from.

With ``recurrent=true`` (MAPPO/IPPO; the Q-learners, see :mod:`corral.algos.recurrent_q`,
keep their memories the same way), the actor and the critic of a group each
read an observation through their first layer (behind the encoder, where
there is one) and then a :class:`RecurrentCore`'s GRU cell, whose new hidden
state is what their heads read. The policy keeps a memory per acting mode
(exploring, greedy), per group ``[E, n, rnn_hidden]`` for each network, on
its device:

- it is zero before each agent's first decision of an episode, read from
  ``Batch.decision == 0`` (the vector layer counts every agent's decisions in
  its running episode, so an agent waiting for its first turn, and one whose
  env restarted, both read 0);
- it advances only where the agent acts: an agent of a turn-based or
  asynchronous env that is not acting keeps its memory unchanged;
- the hidden state before each decision is kept with it in the rollout (the
  extras ``actor_hidden`` and ``critic_hidden``), so learning can start
  anywhere in an agent's sequence from what acting saw.

Learning (:func:`chunk_rows`) splits each agent's decisions in a rollout, in
the order it made them, into chunks of at most ``bptt`` consecutive decisions
of one episode: a chunk never spans two episodes (a new chunk starts where an
episode starts, so the hidden state resets only between chunks), and starts
from the stored hidden state of its first decision. Minibatches are made of
whole chunks. With ``bptt`` at least an episode's length in decisions (and
rollouts that hold whole episodes), the gradient is that of the full sequence.

Memories are not saved in checkpoints: a resumed run's agents start from a
zero memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import numpy as np
import torch
from torch import nn

from corral.algos.base import AlgoConfig
from corral.algos.encoders import Encoded, encoded_mlp
from corral.arrays import to_numpy
from corral.errors import ConfigError
from corral.settings import Range


@dataclass
class RecurrentSettings(AlgoConfig):
    """The settings of an algorithm whose networks may have a GRU (MAPPO/IPPO, DQN, VDN, QMIX)."""

    recurrent: bool = False
    """A GRU in each network after its first layer: each agent keeps a memory of its episode
    (see :mod:`corral.algos.recurrent`); trained by truncated BPTT."""
    rnn_hidden: Annotated[int, Range(ge=1)] = 64
    """Recurrent: the size of each GRU's hidden state."""
    bptt: Annotated[int, Range(ge=1)] = 16
    """Recurrent: the most decisions of an agent that one chunk of truncated BPTT spans."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.recurrent and not self.hidden:
            raise ConfigError(
                "recurrent=true needs at least one hidden layer (hidden), before the GRU"
            )


class RecurrentCore(nn.Module):
    """A first layer (behind ``front`` where there is one) with a tanh, then a GRU cell:
    ``core(x, h)`` is the next hidden state ``[..., hidden_size]`` of inputs ``[..., in_dim]``
    and hidden states ``[..., hidden_size]``."""

    def __init__(self, front: Encoded | None, in_dim: int, width: int, hidden_size: int) -> None:
        super().__init__()
        self.first = encoded_mlp(front, in_dim, width, ())
        self.gru = nn.GRUCell(width, hidden_size)
        self.width, self.hidden_size = width, hidden_size

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        features = torch.tanh(self.first(x)).reshape(-1, self.width)
        return self.gru(features, h.reshape(-1, self.hidden_size)).reshape(*lead, -1)

    def unroll(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The hidden states ``[C, L, hidden_size]`` after each step of sequences ``x``
        ``[C, L, in_dim]`` that start from ``h`` ``[C, hidden_size]``."""
        features = torch.tanh(self.first(x))
        out = []
        for step in range(x.shape[1]):
            h = self.gru(features[:, step], h)
            out.append(h)
        return torch.stack(out, dim=1)


def start_hidden(
    previous: torch.Tensor | None, decision: Any, size: int, device: str
) -> torch.Tensor:
    """The hidden states ``[E, n, size]`` before each agent's decision: ``previous``, zero
    where the agent's decision index in its episode (``decision`` ``[E, n]``) is 0, and
    everywhere when there is no ``previous`` of that shape."""
    index = torch.as_tensor(decision, device=device)
    if previous is None or previous.shape[:2] != index.shape:
        return torch.zeros((*index.shape, size), device=device)
    return torch.where((index == 0).unsqueeze(-1), torch.zeros_like(previous), previous)


def advanced(acting: Any, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """``new`` hidden states where the agent acted (``acting`` ``[E, n]``), ``old`` elsewhere."""
    where = torch.as_tensor(acting, device=new.device, dtype=torch.bool).unsqueeze(-1)
    return torch.where(where, new, old)


@dataclass
class Chunks:
    """Decision rows laid out as chunks: ``index[c, l]`` is the row of chunk ``c``'s ``l``-th
    decision where ``valid[c, l]`` (elsewhere any row: padding); ``first[c]`` its first row."""

    index: torch.Tensor
    valid: torch.Tensor
    first: torch.Tensor

    def __len__(self) -> int:
        return int(self.index.shape[0])


def chunk_rows(
    step: Any, env: Any, agent: Any, decision: Any, *, agents: int, bptt: int, device: str
) -> Chunks:
    """The :class:`Chunks` of decision rows made at ``step`` by ``agent`` of ``env`` (arrays
    ``[N]``), each its agent's ``decision``-th of its episode; ``agents``: agents per env.

    A chunk holds one agent's consecutive decisions of one episode, in order, at most
    ``bptt`` of them; chunks are ordered by env, agent and time."""
    step, env, agent, decision = (
        np.asarray(to_numpy(x), np.int64) for x in (step, env, agent, decision)
    )
    sequence = env * agents + agent
    order = np.lexsort((step, sequence))
    seq, dec = sequence[order], decision[order]
    rows = len(order)
    new = np.ones(rows, dtype=bool)  # where a run of consecutive decisions starts
    new[1:] = (seq[1:] != seq[:-1]) | (dec[1:] != dec[:-1] + 1)
    at = np.arange(rows)
    position = at - np.maximum.accumulate(np.where(new, at, 0))
    offset = position % bptt
    starts = offset == 0
    chunk = np.cumsum(starts) - 1
    index = np.zeros((int(chunk[-1]) + 1, int(offset.max()) + 1), dtype=np.int64)
    valid = np.zeros(index.shape, dtype=bool)
    index[chunk, offset] = order
    valid[chunk, offset] = True
    return Chunks(
        index=torch.as_tensor(index, device=device),
        valid=torch.as_tensor(valid, device=device),
        first=torch.as_tensor(order[starts], device=device),
    )
