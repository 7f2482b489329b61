"""Episode bookkeeping, written once for every source: same-step autoreset as array operations.

An :class:`Episodes` runs a :class:`~corral.BatchedEnv` (packed dict envs or a
native one) into the arrays of a :class:`~corral.vector.layout.Layout`. It is
the only place that decides an episode ended (after a step, none of the copy's
agents is alive), records it (``done``, ``final_obs``, ``final_state``,
``episode_return``, ``episode_length``), restarts the copy with
``reset(where=done)`` in the same step, and keeps masks of agents that are not
acting all legal. It works in the arrays' own namespace (numpy, or torch on
their device); a step reads the host only for whether any copy ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from corral.batched_env import BatchedEnv, BatchedStep
from corral.errors import EnvError
from corral.vector.backend import first_fault
from corral.vector.layout import Layout, array_tree, assemble, leaves
from corral.vector.validation import ReturnedArrays

Arrays = Mapping[str, Any]


class Episodes:
    """Runs ``env`` (global copy indices from ``offset``) into ``arrays``, each holding this
    slice's rows of a field of ``layout``.

    ``share``: a source that can write straight into ``arrays`` may (one copy less per
    step). Not where a worker can die in a step: its replacement reads the arrays as they
    stood before the step.

    A fault of a copy that the env restarts itself (packed dict envs: an env that raised
    or returned a bad value) leaves the other copies' step complete; the first fault, by
    env index, is raised once the batch is complete, listing all of them.
    """

    def __init__(
        self, env: BatchedEnv, layout: Layout, arrays: Arrays, offset: int = 0, share: bool = False
    ) -> None:
        self.env = env
        self.layout = layout
        self.arrays = arrays
        self.offset = offset
        self.groups = list(layout.groups)
        self._obs = {
            g: [p for p, _ in leaves(group.obs_tree, f"obs/{g}")]
            for g, group in layout.groups.items()
        }
        state = layout.state_space
        self._state = [] if state is None else [p for p, _ in leaves(array_tree(state), "state")]
        self._masks = {g for g, group in layout.groups.items() if group.num_actions is not None}
        self._alive = [arrays[f"alive/{g}"] for g in self.groups]
        self._live = self._any_alive()
        self._actions = {
            g: assemble(group.action_tree, f"action/{g}", arrays)
            for g, group in layout.groups.items()
        }
        self._step_arrays = [
            (g, *(arrays[f"{field}/{g}"] for field in _STEP_FIELDS)) for g in self.groups
        ]
        write_into = getattr(env, "write_into", None)  # a source that can skip a copy
        if write_into is not None and share:
            write_into(arrays)
        # A source that keeps the rules itself (packed dict envs judge every value, and
        # leave masks of agents that are not acting all legal) needs no second look.
        keeps_rules = getattr(env, "keeps_rules", False)
        self._check_finite = layout.check_finite and not keeps_rules
        self._keeps_masks = keeps_rules
        self._returned = None if keeps_rules else ReturnedArrays(layout, arrays, offset)

    # -- commands -------------------------------------------------------------------

    def reset(self, seeds: Sequence[int | None], options: dict[str, Any] | None = None) -> None:
        """Start a new episode in every copy, copy ``i`` seeded with ``seeds[i]``."""
        clear_step_fields(self.arrays, self.groups)
        out = self.env.reset(seed=list(seeds), options=options)
        self._write_observed(out, None)
        self._zero_running(None)
        self._count_restarts(out)
        self._live = self._any_alive()
        _raise_first(out.faults)

    def step(self) -> None:
        """Step every copy with the actions in the action arrays; restart the copies that
        ended, in the same step."""
        a = self.arrays
        before = self._live  # the copies with an episode running
        out = self.env.step(self._actions)
        self._write_observed(out, None)  # checks every array of out first
        for g, reward, terminated, truncated, running in self._step_arrays:
            _put(reward, out.reward[g], None)
            _put(terminated, out.terminated[g], None)
            _put(truncated, out.truncated[g], None)
            running += reward
        a["running_length"] += before if out.failed is None else before & ~out.failed
        live = self._any_alive()
        done = before & ~live
        a["done"][...] = done
        self._count_restarts(out)
        faults = out.faults
        if bool(done.any()):
            self._end_episodes(done)
            restarted = self.env.reset(where=done)
            self._write_observed(restarted, done)
            self._count_restarts(restarted)
            faults = [*faults, *restarted.faults]
            live = self._any_alive()
        self._live = live
        _raise_first(faults)

    def restart_all(self, seeds: Sequence[int | None]) -> None:
        """Take over from a dead worker with a fresh env: the episodes it was running end
        truncated, and every copy resets (copy ``i`` with ``seeds[i]``).

        The step fields hold what the dead worker wrote of its last step, cleared before
        it (:func:`clear_step_fields`): an episode that ended in that step is reported as
        it ended, the others are cut where they stand.
        """
        a = self.arrays
        cut = ~a["done"]
        for g in self.groups:
            a[f"truncated/{g}"] |= a[f"alive/{g}"] & cut[:, None]
        self._end_episodes(cut)
        a["done"][...] = True
        a["worker_restarts"] += 1
        out = self.env.reset(seed=list(seeds))
        self._write_observed(out, None)
        self._zero_running(None)
        self._live = self._any_alive()
        _raise_first(out.faults)

    # -- bookkeeping ------------------------------------------------------------------

    def _any_alive(self) -> Any:
        alive = self._alive[0].any(1)
        for more in self._alive[1:]:
            alive = alive | more.any(1)
        return alive

    def _write_observed(self, out: BatchedStep, rows: Any) -> None:
        """Copy what ``out`` observed into the arrays (only ``rows``, a bool mask, if given)."""
        a = self.arrays
        if self._returned is not None:
            self._returned.check(out)
        if self._check_finite:
            self._check_values(out, rows)
        for g, group in self.layout.groups.items():
            for path, value in _leaf_values(group.obs_tree, f"obs/{g}", out.obs[g]):
                _put(a[path], value, rows)
            _put(a[f"alive/{g}"], out.alive[g], rows)
            acting = out.acting[g]
            _put(a[f"acting/{g}"], acting, rows)
            if g in self._masks:
                mask = out.action_mask.get(g)
                if mask is None:
                    _fill(a[f"action_mask/{g}"], True, rows)
                elif self._keeps_masks:
                    _put(a[f"action_mask/{g}"], mask, rows)
                else:  # agents that are not acting have every action legal
                    _put(a[f"action_mask/{g}"], mask | ~acting[..., None], rows)
        if self._state:
            for path, value in _leaf_values(
                array_tree(self.layout.state_space), "state", out.state
            ):
                _put(a[path], value, rows)

    def _end_episodes(self, ended: Any) -> None:
        """Record the episodes of the copies ``ended`` (a bool mask) as they stand."""
        a = self.arrays
        for g in self.groups:
            for path in self._obs[g]:
                a["final_" + path][ended] = a[path][ended]
            a[f"episode_return/{g}"][ended] = a[f"running_return/{g}"][ended]
        for path in self._state:
            a["final_" + path][ended] = a[path][ended]
        a["episode_length"][ended] = a["running_length"][ended]
        self._zero_running(ended)

    def _zero_running(self, rows: Any) -> None:
        for g in self.groups:
            _fill(self.arrays[f"running_return/{g}"], 0, rows)
        _fill(self.arrays["running_length"], 0, rows)

    def _count_restarts(self, out: BatchedStep) -> None:
        if out.restarted is not None:
            self.arrays["worker_restarts"] += out.restarted

    def _check_values(self, out: BatchedStep, rows: Any) -> None:
        """An :class:`EnvError` for the first NaN or inf an env returned (``check_finite``)."""
        for g, group in self.layout.groups.items():
            checks = [("observation", v) for _, v in _leaf_values(group.obs_tree, "", out.obs[g])]
            if out.reward is not None:
                checks.append(("reward", out.reward[g]))
            for what, value in checks:
                hit = _first_bad(value, rows)
                if hit is not None:
                    i, j = hit
                    raise EnvError(
                        self.offset + i,
                        f"{what} of agent {group.agents[j]!r}: expected finite values, "
                        "got NaN or inf",
                    )
        if self._state:
            tree = array_tree(self.layout.state_space)
            for _, value in _leaf_values(tree, "", out.state):
                hit = _first_bad(value, rows)
                if hit is not None:
                    raise EnvError(self.offset + hit[0], "state: expected finite values")


# What a step writes per group, in the order Episodes.step reads them.
_STEP_FIELDS = ("reward", "terminated", "truncated", "running_return")


def clear_step_fields(arrays: Arrays, groups: Iterable[str]) -> None:
    """Clear what a step reports (rewards, ends, ``done``) before the step."""
    for g in groups:
        arrays[f"reward/{g}"][...] = 0
        arrays[f"terminated/{g}"][...] = False
        arrays[f"truncated/{g}"][...] = False
    arrays["done"][...] = False


def _leaf_values(tree: Any, path: str, value: Any) -> list[tuple[str, Any]]:
    """``(path, array)`` of every leaf of a nested value laid out as ``tree``."""
    if isinstance(tree, dict):
        return [kv for k, sub in tree.items() for kv in _leaf_values(sub, f"{path}/{k}", value[k])]
    if isinstance(tree, tuple):
        return [
            kv for i, sub in enumerate(tree) for kv in _leaf_values(sub, f"{path}/{i}", value[i])
        ]
    return [(path, value)]


def _put(dst: Any, src: Any, rows: Any) -> None:
    """``dst[rows] = src[rows]`` (all rows for ``None``); nothing where ``src`` is ``dst``."""
    if src is dst:
        return
    if rows is None:
        dst[...] = src
    else:
        dst[rows] = src[rows]


def _fill(dst: Any, value: Any, rows: Any) -> None:
    if rows is None:
        dst[...] = value
    else:
        dst[rows] = value


def _first_bad(value: Any, rows: Any) -> tuple[int, int] | None:
    """The first ``(copy, agent)`` (or ``(copy, 0)``) holding NaN or inf, among ``rows``."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind != "f":
            return None
        bad = ~np.isfinite(value)
    else:
        if not value.is_floating_point():
            return None
        bad = ~value.isfinite()
    if rows is not None:
        bad = bad & rows.reshape(-1, *([1] * (bad.ndim - 1)))
    if not bool(bad.any()):
        return None
    index = np.argwhere(np.asarray(bad.cpu() if hasattr(bad, "cpu") else bad))[0]
    return int(index[0]), int(index[1]) if len(index) > 1 else 0


def _raise_first(faults: list[EnvError]) -> None:
    """Raise the first fault by env index, listing all of them."""
    if faults:
        raise first_fault(faults)
