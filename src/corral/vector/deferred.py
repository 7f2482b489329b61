"""Checks of actions on a device that read nothing back: the first problem waits there.

With ``VectorEnv(..., deferred_checks=True)`` on a place where the vector layer
computes in torch on a device (see :attr:`corral.Place.computes_on_host`), a
step checks ``Discrete`` and ``Box`` actions where they live: an invalid entry
of an acting agent is replaced by a legal stand-in, so that the step goes on
safely, and the first problem (its step, group, env, agent and what was
expected) is kept on the device until :meth:`DeferredChecks.raise_first` reads
it back, once. What needs no values (the shape and dtype of an array, a missing
group) and other spaces are checked at once, as without the option.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays import import_torch, torch_dtype
from corral.errors import InvalidActionError
from corral.vector.layout import Layout


class DeferredChecks:
    """Checks the actions of each step on the layout's device, keeping the first problem
    there (by step, then group, then kind of problem as the immediate checks order them,
    then env and agent).

    Stand-ins: a discrete entry out of its range or forbidden by its action mask becomes
    the first action its mask allows (the space's first without a mask); a ``Box`` entry
    NaN becomes its lower bound, and every entry is clipped into the bounds (with
    ``clip=True`` clipping is no problem: it is counted, as ``clip_actions`` does).
    Entries of agents that are not acting are made safe too, but not reported.
    """

    def __init__(self, layout: Layout, clip: bool) -> None:
        torch = self._torch = import_torch()
        device = self._device = layout.place.device
        self._clip = clip
        self._agents = {name: g.agents for name, g in layout.groups.items()}
        self._texts: list[tuple[str, str]] = []  # a problem's code -> (group, expected)
        self._codes: dict[tuple[str, str], Any] = {}  # (group, kind) -> its code, on the device
        self._bounds: dict[str, tuple[Any, Any, Any, Any]] = {}
        for name, group in layout.groups.items():
            space = group.action_space
            if isinstance(space, spaces.Discrete):
                low, high = int(space.start), int(space.start + space.n - 1)
                self._code(name, "range", f"an integer in [{low}, {high}]")
                self._code(name, "mask", "a legal action (its action mask forbids this one)")
            elif isinstance(space, spaces.Box):
                self._code(name, "finite", "finite values (got NaN or inf)")
                self._code(name, "bounds", f"values within [{space.low.min()}, {space.high.max()}]")
                least, most = _limits(space.dtype)
                if space.dtype.kind == "f":
                    self._code(
                        name,
                        "limit",
                        f"values that {space.dtype} holds (|x| <= {most:.6g}; more is inf)",
                    )
                put = lambda a: torch.as_tensor(a, dtype=torch.float64, device=device)  # noqa: E731
                self._bounds[name] = (
                    put(space.low),
                    put(space.high),
                    put(np.maximum(space.low, least)),  # the stand-ins' bounds: finite
                    put(np.minimum(space.high, most)),
                )
        self._first = torch.zeros(4, dtype=torch.int64, device=device)  # step, code, env, agent
        self._found = torch.zeros((), dtype=torch.bool, device=device)
        self._step = torch.zeros((), dtype=torch.int64, device=device)  # steps since the check
        self._steps = 0  # the same, on the host

    def _code(self, group: str, kind: str, text: str) -> None:
        code = len(self._texts)
        self._texts.append((group, text))
        self._codes[group, kind] = self._torch.tensor(code, device=self._device)

    def next_step(self) -> None:
        """Count a step (its problems are reported as of it)."""
        self._steps += 1
        self._step += 1

    def check(
        self, group: str, space: spaces.Space, action: Any, acting: Any, mask: Any | None
    ) -> tuple[Any, Any] | None:
        """The group's actions made safe and the clipped entries' counts per agent
        (``None`` without ``clip``), the problems of acting agents kept; ``None`` where this
        check does not apply (another space, or an array whose shape or dtype is wrong:
        the immediate checks say what is wrong)."""
        torch = self._torch
        if not isinstance(action, torch.Tensor) or action.device != acting.device:
            return None
        if isinstance(space, spaces.Discrete):
            if tuple(action.shape) != tuple(acting.shape):
                return None
            if action.is_floating_point() or action.is_complex():
                return None
            return self._discrete(group, space, action, acting, mask), None
        if isinstance(space, spaces.Box):
            if tuple(action.shape) != (*acting.shape, *space.shape) or action.is_complex():
                return None
            if action.is_floating_point() and space.dtype.kind != "f":
                return None  # not castable to the space's dtype
            return self._box(group, space, action, acting)
        return None

    def _discrete(
        self, group: str, space: spaces.Discrete, action: Any, acting: Any, mask: Any | None
    ) -> Any:
        low, n = int(space.start), int(space.n)
        index = action.long() - low
        outside = (index < 0) | (index >= n)
        self._keep(acting & outside, group, "range")
        index = index.clamp(0, n - 1)
        if mask is None:
            return index.where(~outside, 0) + low
        allowed = mask.gather(-1, index[..., None])[..., 0]
        forbidden = ~outside & ~allowed
        self._keep(acting & forbidden, group, "mask")
        first_legal = mask.to(self._torch.uint8).argmax(-1)
        return index.where(allowed & ~outside, first_legal) + low

    def _box(self, group: str, space: spaces.Box, action: Any, acting: Any) -> tuple[Any, Any]:
        torch = self._torch
        low, high, least, most = self._bounds[group]
        value = action if action.dtype == torch.float64 else action.to(torch.float64)
        lead = acting.reshape(*acting.shape, *([1] * len(space.shape)))
        per_agent = acting.shape

        def agents(flags: Any) -> Any:
            return flags.reshape(*per_agent, -1).any(-1) if space.shape else flags

        self._keep(agents(lead & ~torch.isfinite(value)), group, "finite")
        outside = (value < low) | (value > high)
        counts = None
        if self._clip:
            counts = outside.reshape(*per_agent, -1).sum(-1) * acting
        else:
            self._keep(agents(lead & outside), group, "bounds")
        if space.dtype.kind == "f" and action.dtype.itemsize > np.dtype(space.dtype).itemsize:
            kept = value.clamp(low, high) if self._clip else value  # clipping comes first
            over = kept.abs() > float(_limits(space.dtype)[1])
            self._keep(agents(lead & over), group, "limit")
        safe = value.where(~value.isnan(), least).clamp(least, most)
        return safe.to(torch_dtype(space.dtype)), counts

    def _keep(self, bad: Any, group: str, kind: str) -> None:
        """Keep the first ``[env, agent]`` where ``bad`` holds as the problem ``kind`` of
        ``group``, unless a problem is kept already."""
        torch = self._torch
        flat = bad.reshape(-1)
        hit = flat.any()
        first = flat.to(torch.uint8).argmax()  # the first True (0 where none)
        n = bad.shape[1]
        found = torch.stack((self._step, self._codes[group, kind], first // n, first % n))
        self._first = torch.where(hit & ~self._found, found, self._first)
        self._found = self._found | hit

    def raise_first(self) -> None:
        """Raise the :class:`~corral.errors.InvalidActionError` of the first problem since
        the last call (one read from the device), and forget it; nothing where there was
        none, or no step since."""
        if self._steps == 0:
            return
        torch, steps = self._torch, self._steps
        found, step, code, env, agent = torch.cat((self._found.long()[None], self._first)).tolist()
        self._found = torch.zeros_like(self._found)
        self._first.zero_()
        self._step.zero_()
        self._steps = 0
        if not found:
            return
        group, text = self._texts[code]
        raise InvalidActionError(
            f"group {group!r}, env {env}, agent {self._agents[group][agent]!r}: expected "
            f"{text} (in step {step} of the {steps} since the last check of deferred "
            "actions; a legal stand-in was played)"
        )


def _limits(dtype: np.dtype) -> tuple[float, float]:
    info: Any = np.finfo(dtype) if np.dtype(dtype).kind == "f" else np.iinfo(dtype)
    return float(info.min), float(info.max)
