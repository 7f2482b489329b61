"""A tiny env with image observations, and a user's encoder, for the encoder tests."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from corral.env import AgentID, InfoDict, MultiAgentEnv, ObsDict, StepResult

SIZE = 8
"""Side of the square images, in pixels."""


class Lights(MultiAgentEnv):
    """Two agents each see an image ``[8, 8, 3]`` with a lit square on its left or right
    half, and are rewarded 1 for naming that half (``Discrete(2)``); episodes last 4 steps.

    ``kind``: ``uint8`` (pixels 0 or 255), ``float`` (``float32`` 0 or 1) or ``dict`` (the
    ``uint8`` image under ``image`` and the step's fraction under ``time``). ``sides``:
    ``random`` (drawn from the env's generator) or ``alternate`` (agent ``i``'s lit half at
    step ``t`` is ``(i + t) % 2``: episodes that do not depend on how the env was seeded, so
    a resumed run's envs replay an uninterrupted run's). ``actions``: ``discrete`` or ``box``
    (a ``Box(-1, 1, (1,))`` action, naming the right half where positive). ``state``: the env
    has a global state, both agents' images side by side (``[8, 16, 3]``, the image's dtype;
    ``uint8`` or ``float`` kinds only).
    """

    metadata = {"render_modes": [], "name": "lights"}
    STEPS = 4

    def __init__(
        self,
        kind: str = "uint8",
        sides: str = "random",
        actions: str = "discrete",
        state: bool = False,
    ) -> None:
        if kind not in ("uint8", "float", "dict"):
            raise ValueError(f"kind must be uint8, float or dict, got {kind!r}")
        if sides not in ("random", "alternate"):
            raise ValueError(f"sides must be random or alternate, got {sides!r}")
        if actions not in ("discrete", "box"):
            raise ValueError(f"actions must be discrete or box, got {actions!r}")
        self.kind = kind
        self.sides = sides
        self.actions = actions
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents = []
        high, dtype = (1.0, np.float32) if kind == "float" else (255, np.uint8)
        image = spaces.Box(0, high, shape=(SIZE, SIZE, 3), dtype=dtype)
        time = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
        self._space = spaces.Dict({"image": image, "time": time}) if kind == "dict" else image
        if state:
            if kind == "dict":
                raise ValueError("state needs an image kind (uint8 or float), got 'dict'")
            self.state_space = spaces.Box(0, high, shape=(SIZE, 2 * SIZE, 3), dtype=dtype)
        self._rng = np.random.default_rng()
        self._sides: dict[str, int] = {}
        self._step = 0

    def observation_space(self, agent: AgentID) -> spaces.Space:
        return self._space

    def action_space(self, agent: AgentID) -> spaces.Space:
        if self.actions == "box":
            return spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        return spaces.Discrete(2)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[ObsDict, InfoDict]:
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._step = 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: Mapping[AgentID, Any]) -> StepResult:
        rewards = {a: float(self._named(actions[a]) == self._sides[a]) for a in self.agents}
        self._step += 1
        done = self._step == self.STEPS
        terms = {a: False for a in self.agents}
        truncs = {a: done for a in self.agents}
        obs = self._observe()
        if done:
            infos: InfoDict = {a: {"final_obs": obs[a]} for a in self.agents}
            self.agents = []
            return {}, rewards, terms, truncs, infos
        return obs, rewards, terms, truncs, {a: {} for a in self.agents}

    def state(self) -> np.ndarray:
        """Both agents' current images side by side (blank once the episode ended)."""
        if not self._sides:
            return np.zeros(self.state_space.shape, dtype=self.state_space.dtype)
        return np.concatenate([self._image(self._sides[a]) for a in self.possible_agents], axis=1)

    def _named(self, action: Any) -> int:
        """The half an action names."""
        return int(np.asarray(action).reshape(-1)[0] > 0) if self.actions == "box" else int(action)

    def _observe(self) -> ObsDict:
        if self.sides == "alternate":
            self._sides = {a: (i + self._step) % 2 for i, a in enumerate(self.agents)}
        else:
            self._sides = {a: int(self._rng.integers(2)) for a in self.agents}
        return {a: self._image(side) for a, side in self._sides.items()}

    def _image(self, side: int) -> Any:
        image = np.zeros((SIZE, SIZE, 3), dtype=np.float32)
        left = side * SIZE // 2
        image[2:6, left + 1 : left + 3] = 1.0
        if self.kind == "float":
            return image
        pixels = (image * 255).astype(np.uint8)
        if self.kind == "uint8":
            return pixels
        time = np.array([self._step / self.STEPS], dtype=np.float32)
        return {"image": pixels, "time": time}


LIGHTS = f"{Lights.__module__}:Lights"
"""The env id of :class:`Lights` (``module:attr``)."""


class SmallEncoder(nn.Module):
    """A user's encoder as the tests write one: the observation flattened, then 16 features."""

    def __init__(self, space: spaces.Space) -> None:
        super().__init__()
        self.out_dim = 16
        self.linear = nn.Linear(spaces.flatdim(space), self.out_dim)

    def forward(self, x: Any) -> Any:
        if isinstance(x, Mapping):
            x = torch.cat([v.reshape(len(v), -1) for v in x.values()], dim=-1)
        return torch.relu(self.linear(x.reshape(len(x), -1)))


SMALL_ENCODER = f"{SmallEncoder.__module__}:SmallEncoder"
"""How a config names :class:`SmallEncoder` (``module:attr``)."""
