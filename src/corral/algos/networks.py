"""Small torch building blocks shared by the algorithms."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn


def flat_dim(space: spaces.Space) -> int:
    """Length of a value of ``space`` once flattened to floats (one-hot for Discrete)."""
    return int(spaces.flatdim(space))


def as_input(obs: Any, space: spaces.Space, device: str | torch.device) -> torch.Tensor:
    """A float tensor ``[..., flat_dim]`` on ``device`` of observations laid out
    ``[..., *obs_shape]`` (a NumPy array, or a tensor: no host copy), one-hot for
    ``Discrete`` and ``MultiDiscrete``; a ``Dict`` or ``Tuple`` space's value is a mapping or
    sequence of such per entry, flattened in the space's order."""
    if isinstance(space, spaces.Dict):
        parts = [as_input(obs[key], sub, device) for key, sub in space.spaces.items()]
        return torch.cat(parts, dim=-1)
    if isinstance(space, spaces.Tuple):
        parts = [as_input(obs[i], sub, device) for i, sub in enumerate(space.spaces)]
        return torch.cat(parts, dim=-1)
    if isinstance(space, spaces.MultiDiscrete):
        return _one_hots(obs, space, device)
    if isinstance(obs, torch.Tensor):
        if isinstance(space, spaces.Discrete):
            index = (obs.to(device) - space.start).long()
            return nn.functional.one_hot(index, int(space.n)).float()
        lead = obs.shape[: obs.ndim - len(space.shape or ())]
        return obs.to(device=device, dtype=torch.float32).reshape(*lead, -1)
    if isinstance(space, spaces.Discrete):
        index = torch.as_tensor(np.asarray(obs) - space.start, device=device, dtype=torch.long)
        return nn.functional.one_hot(index, int(space.n)).float()
    lead = np.shape(obs)[: np.ndim(obs) - len(space.shape or ())]
    array = np.asarray(obs, dtype=np.float32).reshape(*lead, -1)
    return torch.as_tensor(array, device=device)


def _one_hots(obs: Any, space: spaces.MultiDiscrete, device: str | torch.device) -> torch.Tensor:
    """Values ``[..., *nvec_shape]`` of ``space`` as one-hots ``[..., sum(nvec)]``, one per
    entry in order (as ``gymnasium.spaces.flatten`` makes them)."""
    nvec = np.asarray(space.nvec).reshape(-1)
    start = np.broadcast_to(np.asarray(getattr(space, "start", 0)), space.shape).reshape(-1)
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]]) - start
    values = torch.as_tensor(obs, dtype=torch.long, device=device)
    lead = values.shape[: values.ndim - len(space.shape)]
    index = values.reshape(*lead, len(nvec)) + torch.as_tensor(offsets, device=device)
    out = torch.zeros(*lead, int(nvec.sum()), device=device)
    return out.scatter_(-1, index, 1.0)


def to_device(x: torch.Tensor, device: str | torch.device) -> torch.Tensor:
    """``x`` (a CPU tensor) on ``device``. To a GPU through pinned memory, without waiting
    for the GPU's queued work: drawing from a CPU generator then costs no synchronisation."""
    device = torch.device(device)
    if device.type != "cuda":
        return x.to(device, non_blocking=True)  # asynchronous, as to a GPU (a no-op on the CPU)
    return x.pin_memory().to(device, non_blocking=True)


ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}
"""Hidden-layer activations by the name a config gives."""

_FUNCTIONS: dict[type[nn.Module], Any] = {nn.Tanh: torch.tanh, nn.ReLU: torch.relu}
"""What each activation module's ``forward`` computes, as the function it calls."""


class MLP(nn.Sequential):
    """An :class:`nn.Sequential` of linear layers and activations whose forward calls
    ``F.linear`` and the activations' functions directly: the same numbers as the modules'
    calls, without their per-call overhead (an MLP runs at every step and minibatch)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self._modules.values():
            if type(layer) is nn.Linear:
                x = nn.functional.linear(x, layer.weight, layer.bias)
            else:
                function = _FUNCTIONS.get(type(layer))
                x = layer(x) if function is None else function(x)
        return x


def mlp(
    in_dim: int,
    out_dim: int,
    hidden: Sequence[int],
    out_gain: float = 1.0,
    activation: str = "tanh",
) -> MLP:
    """MLP with orthogonal initialisation; the last layer scaled by ``out_gain``."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
    layers: list[nn.Module] = []
    dims = [in_dim, *hidden]
    for a, b in itertools.pairwise(dims):
        layers += [_init(nn.Linear(a, b), np.sqrt(2)), ACTIVATIONS[activation]()]
    layers.append(_init(nn.Linear(dims[-1], out_dim), out_gain))
    return MLP(*layers)


def _init(layer: nn.Linear, gain: float) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def masked_logits(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Logits with illegal actions (``mask`` false) pushed to a large negative value."""
    if mask is None:
        return logits
    return logits.masked_fill(~mask.bool(), torch.finfo(logits.dtype).min / 2)


def frozen_copy(net: nn.Module) -> nn.Module:
    """A copy of ``net`` that takes no gradients (a target network)."""
    clone = copy.deepcopy(net)
    clone.requires_grad_(False)
    return clone


def soft_update(
    targets: Iterable[torch.Tensor], onlines: Iterable[torch.Tensor], tau: float
) -> None:
    """Polyak averaging of target networks: ``target <- tau * online + (1 - tau) * target``
    for each pair of ``targets`` and ``onlines`` (parameters, in the same order)."""
    with torch.no_grad():
        for target, online in zip(targets, onlines, strict=True):
            target.lerp_(online, tau)


def gradient_step(
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    *clipped: Iterable[nn.Parameter],
    max_norm: float,
) -> None:
    """One step of ``optimizer`` down ``loss``: its gradients cleared, ``loss``
    backpropagated, each of the parameter sets ``clipped`` clipped to ``max_norm`` apart."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    for params in clipped:
        nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    optimizer.step()
