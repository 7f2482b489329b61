"""Encoders: what a group's observation goes through before the networks' heads.

An encoder is an :class:`nn.Module` with an ``int`` attribute ``out_dim``,
built by a factory ``(space) -> nn.Module`` from an observation space (or
MAPPO's global state space). Its forward takes a batch of observations as
the space lays them out, as float tensors with one leading batch axis: a
``Box`` of shape ``S`` as ``[B, *S]`` (unscaled: a ``uint8`` image stays in
``[0, 255]``), a ``Discrete`` as a one-hot ``[B, n]``, a ``Dict`` as a dict of
those per key; it returns features ``[B, out_dim]``, which the heads' MLPs
(``hidden``) read.

The ``encoder`` setting of MAPPO/IPPO (actor and critic) and DQN names one:

- ``mlp`` (the default): no encoder; the flattened observation is the MLP
  heads' input, as corral has always done.
- ``cnn``: a convolution stack for each image of the observation (see
  :class:`CNN`), every other part flattened; a ``Dict`` observation is
  encoded per key and the features concatenated.
- ``module:attr``: a user's factory, imported as a config's other code is
  (a run's saved config names it only where ``--allow-import`` allows);
  in Python the factory itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from corral.algos.encoder_setting import OBJECT, check_setting
from corral.algos.networks import MLP, flat_dim, mlp
from corral.errors import ConfigError
from corral.registry import resolve

EncoderFactory = Callable[[spaces.Space], nn.Module]
"""What builds an encoder: ``(observation space) -> nn.Module`` with an ``int`` ``out_dim``."""

FEATURES = 512
"""Width of the linear layer that ends :class:`CNN` (Nature DQN's)."""


def is_image(space: spaces.Space) -> bool:
    """Whether ``space`` is an image: a ``Box`` ``[H, W, C]`` (channels last), or ``[H, W]``
    of ``uint8``."""
    if not isinstance(space, spaces.Box):
        return False
    return len(space.shape) == 3 or (len(space.shape) == 2 and space.dtype == np.uint8)


def has_image(space: spaces.Space) -> bool:
    """Whether ``space`` is an image or a ``Dict`` holding one."""
    if isinstance(space, spaces.Dict):
        return any(has_image(s) for s in space.spaces.values())
    return is_image(space)


class CNN(nn.Module):
    """Features ``[B, 512]`` of images ``[B, H, W, C]`` (channels last; ``[B, H, W]`` is one
    channel): pixels over 255 for ``uint8`` images, channels moved first, then Nature DQN's
    convolutions (32 8x8 stride 4, 64 4x4 stride 2, 64 3x3 stride 1; images smaller than
    36 pixels a side get 32 and 64 3x3 stride 1 instead), a linear layer and a ReLU."""

    def __init__(self, space: spaces.Box) -> None:
        super().__init__()
        if not is_image(space):
            raise ConfigError(f"encoder cnn reads images [H, W, C], got {space}")
        height, width, *channels = space.shape
        self.scale = 1 / 255 if space.dtype == np.uint8 else 1.0
        self.channels = channels[0] if channels else 1
        if min(height, width) >= 36:
            layout = [(32, 8, 4), (64, 4, 2), (64, 3, 1)]
        elif min(height, width) >= 5:
            layout = [(32, 3, 1), (64, 3, 1)]
        else:
            raise ConfigError(f"encoder cnn needs images of at least 5x5 pixels, got {space}")
        layers: list[nn.Module] = []
        before = self.channels
        for after, kernel, stride in layout:
            layers += [_init(nn.Conv2d(before, after, kernel, stride)), nn.ReLU()]
            before = after
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            size = self.convs(torch.zeros(1, self.channels, height, width)).shape[-1]
        self.linear = _init(nn.Linear(size, FEATURES))
        self.out_dim = FEATURES

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.unsqueeze(-1) if x.ndim == 3 else x
        x = x.permute(0, 3, 1, 2) * self.scale
        return torch.relu(self.linear(self.convs(x)))


class Flat(nn.Module):
    """Features of any space: its value flattened (``[B, flat_dim]``)."""

    def __init__(self, space: spaces.Space) -> None:
        super().__init__()
        self.out_dim = flat_dim(space)

    def forward(self, x: Any) -> torch.Tensor:
        if isinstance(x, Mapping):
            return torch.cat([self(v) for v in x.values()], dim=-1)
        return x.reshape(len(x), -1)


class PerKey(nn.Module):
    """Features of a ``Dict`` space: each key's encoder, the features concatenated in the
    space's key order."""

    def __init__(self, space: spaces.Dict, factory: EncoderFactory) -> None:
        super().__init__()
        self.parts = nn.ModuleDict({key: factory(s) for key, s in space.spaces.items()})
        self.out_dim = sum(_out_dim(part) for part in self.parts.values())

    def forward(self, x: Mapping[str, Any]) -> torch.Tensor:
        return torch.cat([part(x[key]) for key, part in self.parts.items()], dim=-1)


def cnn(space: spaces.Space) -> nn.Module:
    """The ``cnn`` encoder of ``space``: :class:`CNN` for an image, per key for a ``Dict``,
    :class:`Flat` otherwise."""
    if isinstance(space, spaces.Dict):
        return PerKey(space, cnn)
    return CNN(cast(spaces.Box, space)) if is_image(space) else Flat(space)


def shaped(x: torch.Tensor, space: spaces.Space) -> Any:
    """Flat inputs ``[B, flat_dim]`` (as ``as_input`` gives them) laid out as ``space``'s
    values: ``[B, *shape]`` for a ``Box``, a dict of those per key for a ``Dict``."""
    if isinstance(space, spaces.Dict):
        parts = x.split([flat_dim(s) for s in space.spaces.values()], dim=-1)
        return {key: shaped(p, s) for (key, s), p in zip(space.spaces.items(), parts, strict=True)}
    if isinstance(space, spaces.Box):
        return x.reshape(len(x), *space.shape)
    return x


@dataclass
class Parts:
    """Inputs of an :class:`Encoded` network given apart, without joining them into one
    tensor: observations ``obs`` as :func:`shaped` lays them out (``[B, ...]`` floats, a dict
    of them for a ``Dict``) and the extra columns ``extra`` ``[B, k]``."""

    obs: Any
    extra: torch.Tensor


class Encoded(nn.Module):
    """The front of a network whose inputs are ``[..., obs_dim + extra]``: the first
    ``obs_dim`` columns (an observation as ``as_input`` flattens it) through ``encoder``, the
    ``extra`` ones (an agent's one-hot id, its time) passed on after its features. Inputs
    given as :class:`Parts` (rows ``[B]``) give the same features without the columns'
    copies."""

    def __init__(self, encoder: nn.Module, space: spaces.Space) -> None:
        super().__init__()
        self.encoder = encoder
        self.space = space
        self.obs_dim = flat_dim(space)
        self.out_dim = _out_dim(encoder)

    def forward(self, x: torch.Tensor | Parts) -> torch.Tensor:
        if isinstance(x, Parts):
            return torch.cat([self.encoder(x.obs), x.extra], dim=-1)
        lead = x.shape[:-1]
        obs = x[..., : self.obs_dim].reshape(-1, self.obs_dim)
        features = self.encoder(shaped(obs, self.space)).reshape(*lead, self.out_dim)
        return torch.cat([features, x[..., self.obs_dim :]], dim=-1)


def make_encoder(setting: Any, space: spaces.Space) -> nn.Module | None:
    """The encoder that the ``encoder`` setting names for observations in ``space``;
    ``None`` for ``mlp`` (the flattened observation feeds the heads)."""
    check_setting(setting)
    if isinstance(setting, str) and setting.startswith(OBJECT):
        raise ConfigError(
            f"encoder {setting!r}: the run was made with a factory object that a config file "
            "cannot hold; build it in Python with that factory in encoder=..."
        )
    if setting == "mlp":
        return None
    if setting == "cnn":
        if not has_image(space):
            raise ConfigError(
                f"encoder cnn reads image observations [H, W, C] (or a Dict holding one), "
                f"got {space}: use encoder=mlp"
            )
        return cnn(space)
    factory = setting
    if isinstance(setting, str):
        try:
            factory = resolve(setting)
        except (ImportError, AttributeError, ValueError) as err:
            raise ConfigError(f"encoder {setting!r}: cannot import it: {err}") from None
    encoder = factory(space)
    name = setting if isinstance(setting, str) else getattr(setting, "__qualname__", setting)
    out_dim = getattr(encoder, "out_dim", None)
    if not isinstance(encoder, nn.Module) or not isinstance(out_dim, int) or out_dim < 1:
        raise ConfigError(
            f"encoder {name!r} returned {type(encoder).__name__} for {space}: expected an "
            "nn.Module with a positive int attribute out_dim"
        )
    _check_output(encoder, space, name)
    return encoder


def _check_output(encoder: nn.Module, space: spaces.Space, name: Any) -> None:
    """Raise :class:`~corral.errors.ConfigError` unless ``encoder`` maps two observations to
    features ``[2, out_dim]``."""
    probe = shaped(torch.zeros(2, flat_dim(space)), space)
    with torch.no_grad():
        out = encoder(probe)
    expected = (2, encoder.out_dim)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(
            f"encoder {name!r} maps a batch of 2 observations of {space} to {got}: "
            f"expected features of shape {expected} (out_dim {encoder.out_dim})"
        )


def encoded_mlp(
    front: Encoded | None,
    in_dim: int,
    out_dim: int,
    hidden: tuple[int, ...],
    out_gain: float = 1.0,
    activation: str = "tanh",
) -> MLP:
    """:func:`~corral.algos.networks.mlp` of inputs ``[..., in_dim]`` (a flattened observation
    first), behind ``front`` where there is one; its last layer stays last."""
    if front is None:
        return mlp(in_dim, out_dim, hidden, out_gain, activation)
    head = mlp(front.out_dim + in_dim - front.obs_dim, out_dim, hidden, out_gain, activation)
    return MLP(front, *head)


def front(setting: Any, space: spaces.Space) -> Encoded | None:
    """The :class:`Encoded` front of a network over observations in ``space`` by the
    ``encoder`` setting; ``None`` for ``mlp``."""
    encoder = make_encoder(setting, space)
    return None if encoder is None else Encoded(encoder, space)


def _out_dim(encoder: nn.Module) -> int:
    return int(cast(int, encoder.out_dim))


def _init(layer: nn.Conv2d | nn.Linear) -> Any:
    nn.init.orthogonal_(layer.weight, math.sqrt(2))
    nn.init.zeros_(layer.bias)  # type: ignore[arg-type]  # both layers have a bias
    return layer
