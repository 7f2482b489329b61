"""What the vector layer checks of a natively batched env as it runs it: the rules of the
batched-env protocol that the episode bookkeeping relies on and that a broken env would
otherwise break silently.

After each step (:meth:`Promises.check_step`): an agent leaves ``alive`` only in a step
that sets its ``terminated`` or ``truncated`` (else its episode ends without either),
one whose episode ends there is no longer ``alive``, and a step that says ``same_alive``
changed no copy's ``alive`` (else the layer misses the episodes that ended in it). After
each ``reset(where=...)`` (:meth:`Promises.check_reset`): the copies it did not select
are as the step left them (a reset that ignores ``where`` restarts running episodes).

A step's checks are a few comparisons of ``[E, n]`` flags. Where the layer computes on
the host they run at every step; on a device, where each would read the device, only
in the first :data:`CHECKED_CALLS` steps (at every step with ``always``). A reset's
checks compare whole observations: they run in the first :data:`CHECKED_CALLS` resets
that leave a running copy unselected (always with ``always``). A broken rule raises an
:class:`~corral.errors.EnvError` naming the copy, the group's agent and the rule.
Packed dict envs judge each env's dicts themselves and are not checked here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np

from corral.arrays import to_numpy
from corral.batched_env import BatchedStep
from corral.errors import EnvError
from corral.vector.layout import Layout, leaves

CHECKED_CALLS = 32
"""Steps (on a device) and resets with ``where`` that are checked when not ``always``."""


class Promises:
    """Checks the steps and resets of a natively batched env (copies from ``offset``) whose
    batch rows are ``arrays``; ``on_device``: reading a value costs a device read."""

    def __init__(
        self,
        layout: Layout,
        arrays: Mapping[str, Any],
        offset: int,
        on_device: bool,
        always: bool,
    ) -> None:
        self.offset = offset
        self._steps_left = None if always or not on_device else CHECKED_CALLS
        self._resets_left = None if always else CHECKED_CALLS
        # Per group: its name, agents, alive rows and a copy of them as a step begins.
        self._groups = [
            (g, group.agents, arrays[f"alive/{g}"], _copy(arrays[f"alive/{g}"]))
            for g, group in layout.groups.items()
        ]
        # What a reset must leave as it stood in the copies it does not select.
        self._kept = [
            (g, group.agents, path, arrays[path], _part(path, f"obs/{g}"))
            for g, group in layout.groups.items()
            for path, _ in leaves(group.obs_tree, f"obs/{g}")
        ]
        self._kept += [(g, group.agents, f"alive/{g}", arrays[f"alive/{g}"], ())
                       for g, group in layout.groups.items()]  # fmt: skip

    @property
    def checks_steps(self) -> bool:
        """Whether the next step is checked (call :meth:`begin_step` before it)."""
        return self._steps_left is None or self._steps_left > 0

    def begin_step(self) -> None:
        """Keep who is alive as the step begins."""
        for _, _, alive, before in self._groups:
            before[...] = alive

    def check_step(self, out: BatchedStep) -> None:
        """Raise an :class:`EnvError` for the first copy of the step ``out`` whose ``alive``
        changed otherwise than its ``terminated`` and ``truncated`` say, or at all where
        ``out.same_alive``."""
        if self._steps_left is not None:
            self._steps_left -= 1
        for g, agents, _, before in self._groups:
            alive = _flags(out.alive[g])
            ended = _flags(out.terminated[g]) | _flags(out.truncated[g])
            wrong = (before & ~alive & ~ended) | (ended & alive)
            if out.same_alive:
                wrong = wrong | (alive != before)
            if bool(wrong.any()):
                self._step_fault(g, agents, wrong, to_numpy(before), to_numpy(alive), out)

    def _step_fault(
        self, g: str, agents: tuple[str, ...], wrong: Any, before: Any, alive: Any, out: Any
    ) -> NoReturn:
        i, k = (int(x) for x in np.argwhere(to_numpy(wrong))[0])
        who = f"agent {agents[k]!r} (group {g!r})"
        if before[i, k] and not alive[i, k] and not out.same_alive:
            text = (
                f"{who} was alive when the step began and is not alive after it, but neither "
                "terminated nor truncated is set: an agent leaves alive only in the step "
                "that ends its episode"
            )
        elif alive[i, k] and before[i, k] == alive[i, k]:
            text = (
                f"{who} ended (terminated or truncated) but is still alive: an agent whose "
                "episode ends in a step is not alive after it"
            )
        else:
            was, now = bool(before[i, k]), bool(alive[i, k])
            text = (
                f"the step said same_alive=True, but the alive of {who} changed from {was} "
                f"to {now}: same_alive promises that no agent ended or joined in the step"
            )
        self._fail(i, text)

    def check_reset(self, out: BatchedStep, selected: Any, running: Any) -> None:
        """Raise an :class:`EnvError` for the first copy that was ``running`` and that the
        ``reset(where=selected)`` returning ``out`` did not select, but changed (the batch
        rows still hold the step's values); in the first resets that leave such a copy."""
        if self._resets_left is not None and self._resets_left <= 0:
            return
        kept = to_numpy(running) & ~to_numpy(selected).astype(bool)
        if not kept.any():
            return
        if self._resets_left is not None:
            self._resets_left -= 1
        for g, agents, path, rows, keys in self._kept:
            field = out.obs[g] if path.startswith("obs/") else out.alive[g]
            for key in keys:
                field = field[key]
            now, then = to_numpy(field)[kept], to_numpy(rows)[kept]
            same = now == then
            if now.dtype.kind == "f":
                same |= np.isnan(now) & np.isnan(then)
            changed = ~same.reshape(len(same), len(agents), -1).all(axis=2)
            if changed.any():
                c, k = (int(x) for x in np.argwhere(changed)[0])
                i = int(np.flatnonzero(kept)[c])
                label = f"{path.partition('/')[0]}[{g!r}]" + "".join(f"[{k!r}]" for k in keys)
                self._fail(
                    i,
                    f"reset(where=...) did not select the copy, whose episode was running, but "
                    f"changed {label} of agent {agents[k]!r}: reset(where=mask) starts new "
                    "episodes in the selected copies only, and returns the other copies as "
                    "they stood (does the env's reset ignore where?)",
                )

    def _fail(self, copy: int, text: str) -> NoReturn:
        raise EnvError(self.offset + copy, text)


def _flags(value: Any) -> Any:
    """A bool array of flags given as bools or 0/1 numbers (checked to be so before)."""
    if isinstance(value, np.ndarray):
        return value if value.dtype == np.bool_ else value != 0
    return value if str(value.dtype) == "torch.bool" else value != 0


def _copy(array: Any) -> Any:
    return array.copy() if isinstance(array, np.ndarray) else array.clone()


def _part(path: str, root: str) -> tuple[str, ...]:
    """The keys from a group's observation down to the leaf at ``path`` (Dict and Tuple
    spaces: string keys and tuple indices)."""
    keys = path[len(root) :].strip("/")
    return tuple(int(k) if k.isdigit() else k for k in keys.split("/")) if keys else ()
