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

from corral.arrays import import_torch
from corral.errors import InvalidActionError
from corral.spaces import action_rule
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
        self._rules = {name: action_rule(g.action_space) for name, g in layout.groups.items()}
        self._texts: list[tuple[str, str]] = []  # a problem's code -> (group, expected)
        self._codes: dict[tuple[str, str], Any] = {}  # (group, kind) -> its code, on the device
        for name, rule in self._rules.items():
            rule.prepare_device(device)  # its constants copied there now, not in a step
            for kind, text in rule.kinds.items():
                self._code(name, kind, text)
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
        self, group: str, action: Any, acting: Any, mask: Any | None
    ) -> tuple[Any, Any] | None:
        """The group's actions made safe and the clipped entries' counts per agent
        (``None`` without ``clip``), the problems of acting agents kept; ``None`` where this
        check does not apply (another space, or an array whose shape or dtype is wrong:
        the immediate checks say what is wrong)."""
        checked = self._rules[group].device_check(action, acting, mask, self._clip)
        if checked is None:
            return None
        for kind, bad in checked.faults:
            self._keep(bad, group, kind)
        return checked.safe, checked.counts

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
