"""What the vector layer checks of a natively batched env as it runs it: the rules of the
batched-env protocol that the episode bookkeeping relies on and that a broken env would
otherwise break silently.

After each step (:meth:`Promises.check_step`): an agent leaves ``alive`` only in a step
that sets its ``terminated`` or ``truncated`` (else its episode ends without either),
one whose episode ends there is no longer ``alive``, and a step that says ``same_alive``
changed no copy's ``alive`` (else the layer misses the episodes that ended in it). After
each ``reset(where=...)`` (:meth:`Promises.check_reset`): the copies it did not select
are as the step left them (a reset that ignores ``where`` restarts running episodes).

A step's checks are a few comparisons of ``[E, n]`` flags, run at every step; a reset's
compare whole observations, run in the first :data:`CHECKED_CALLS` resets that leave a
running copy unselected (in every one with ``always``). They read values on the host:
the vector layer runs them where it computes on the host, and on a device only with
``check_finite`` (which reads every step anyway). A broken rule raises an
:class:`~corral.errors.EnvError` naming the copy, the group's agent and the rule. Packed
dict envs judge each env's dicts themselves and are not checked here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np

from corral.arrays import to_numpy
from corral.arrays.tree import leaf_keys
from corral.batched_env import BatchedStep
from corral.errors import EnvError
from corral.returned_values import changed_agents
from corral.vector.layout import Layout, leaves

CHECKED_CALLS = 32
"""Resets with ``where`` leaving a running copy that are checked when not ``always``."""


class Promises:
    """Checks the steps and resets of a natively batched env (copies from ``offset``) whose
    batch rows are ``arrays``; ``always``: check every reset too; ``shared``: the env
    writes into ``arrays`` (who was alive is kept aside)."""

    def __init__(
        self,
        layout: Layout,
        arrays: Mapping[str, Any],
        offset: int,
        always: bool = False,
        shared: bool = False,
    ) -> None:
        self.offset = offset
        self._resets_left = None if always else CHECKED_CALLS
        # Per group: its name, agents, alive rows, and where they stand as a step begins
        # (the rows themselves, until the step's values are written after the check).
        self._groups = [
            (g, group.agents, arrays[f"alive/{g}"]) for g, group in layout.groups.items()
        ]
        self._before = [_copy(rows) if shared else rows for _, _, rows in self._groups]
        self._shared = shared
        # What a reset must leave as it stood in the copies it does not select.
        self._kept = [
            (g, group.agents, path, arrays[path], keys)
            for g, group in layout.groups.items()
            for (path, _), keys in zip(
                leaves(group.obs_tree, f"obs/{g}"), leaf_keys(group.obs_tree), strict=True
            )
        ]
        self._kept += [(g, group.agents, f"alive/{g}", arrays[f"alive/{g}"], ())
                       for g, group in layout.groups.items()]  # fmt: skip

    def begin_step(self) -> None:
        """Keep who is alive as the step begins, where the env will write over it."""
        if self._shared:
            for (_, _, rows), before in zip(self._groups, self._before, strict=True):
                before[...] = rows

    def check_step(self, out: BatchedStep) -> None:
        """Raise an :class:`EnvError` for the first copy of the step ``out`` (not yet
        written) whose ``alive`` changed otherwise than its ``terminated`` and
        ``truncated`` say, or at all where ``out.same_alive``."""
        for (g, agents, _), before in zip(self._groups, self._before, strict=True):
            # a step's batch has them (a step without fails here, as an env's fault)
            alive, ended = out.alive[g], out.terminated[g] | out.truncated[g]  # type: ignore[index]
            if alive.dtype != before.dtype:  # 0/1 numbers (checked before) as flags
                alive, ended = alive != 0, ended != 0
            # The agents that end in the step are exactly those that leave alive in it.
            wrong = ended != (before & ~alive)
            if out.same_alive:
                wrong |= alive != before
            if wrong.any():
                self._step_fault(g, agents, wrong, before, alive, ended, out.same_alive)

    def _step_fault(
        self,
        g: str,
        agents: tuple[str, ...],
        wrong: Any,
        before: Any,
        alive: Any,
        ended: Any,
        same_alive: bool,
    ) -> NoReturn:
        i, k = (int(x) for x in np.argwhere(to_numpy(wrong))[0])
        was, now, end = (bool(to_numpy(a)[i, k]) for a in (before, alive, ended))
        who = f"agent {agents[k]!r} (group {g!r})"
        if was and not now and not end:
            text = (
                f"{who} was alive when the step began and is not alive after it, but neither "
                "terminated nor truncated is set: an agent leaves alive only in the step "
                "that ends its episode"
            )
        elif end and now:
            text = (
                f"{who} ended (terminated or truncated) but is still alive: an agent whose "
                "episode ends in a step is not alive after it"
            )
        elif end and not was:
            text = (
                f"{who} ended (terminated or truncated), but was not alive when the step "
                "began: only an agent in its episode can end it"
            )
        else:
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
            changed = changed_agents(to_numpy(field)[kept], to_numpy(rows)[kept])
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


def _copy(array: Any) -> Any:
    return array.copy() if isinstance(array, np.ndarray) else array.clone()
