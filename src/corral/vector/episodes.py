"""Episode bookkeeping, written once for every source: same-step autoreset as array operations.

An :class:`Episodes` runs a :class:`~corral.BatchedEnv` (packed dict envs or a
native one) into the arrays of a :class:`~corral.vector.layout.Layout`. It is
the only place that decides an episode ended (after a step, none of the copy's
agents is alive), records it (``done``, ``final_obs``, ``final_state``,
``episode_return``, ``episode_length``, ``episode_decisions``, and ``episode_cut``
where a fault cut it), restarts the copy with ``reset(where=done)`` in the same
step, counts each agent's decisions in its running episode (``decision``), and
keeps masks of agents that are not acting all legal. It works in the arrays' own
namespace: on the host (numpy, or torch on the CPU through numpy views) a step
reads only whether any copy ended; on a device (see
:attr:`corral.Place.computes_on_host`) it reads nothing back: it calls
``reset(where=done)`` in every step (a copy not selected goes on unchanged) and
writes what ended and what restarted with masked blends (``check_finite``, a
debugging aid, still reads each step's values).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, MutableMapping, Sequence
from typing import Any, NoReturn

from corral.arrays import ops_for, to_numpy, tree_to_numpy
from corral.arrays.tree import leaves_of
from corral.batched_env import BatchedEnv, BatchedStep
from corral.errors import EnvError, envs_text
from corral.returned_values import nonfinite_cells
from corral.vector.env_calls import env_error, first_fault
from corral.vector.layout import Layout, array_tree, assemble, leaves
from corral.vector.promises import Promises
from corral.vector.validation import ReturnedArrays

Arrays = MutableMapping[str, Any]


class Episodes:
    """Runs ``env`` (global copy indices from ``offset``) into ``arrays``, each holding this
    slice's rows of a field of ``layout``.

    ``share``: a source that can write straight into ``arrays`` may (one copy less per
    step): packed dict envs write only once every env stepped, a natively batched env as
    it computes. A worker that dies in a step then leaves part of the step there; the
    ``subproc`` backend takes its step fields and ``alive`` back before the replacement
    reports the cut episodes (:meth:`restart_all`), whose ``final_obs`` may still hold
    part of the lost step.

    A fault of a copy that the env restarts itself (packed dict envs: an env that raised
    or returned a bad value) leaves the other copies' step complete; the first fault, by
    env index, is raised once the batch is complete, listing all of them. An env that
    raises in its step (a natively batched env, which cannot say which copy failed) is
    handled as a dead worker is (:meth:`restart_all`): every copy's episode ends where it
    stands, truncated with its stats, and every copy restarts. With ``check_finite``, a
    copy of a natively batched env that returns NaN or inf is cut and restarted alone.
    """

    def __init__(
        self, env: BatchedEnv, layout: Layout, arrays: Arrays, offset: int = 0, share: bool = False
    ) -> None:
        self.env = env
        self.layout = layout
        # Torch tensors on the CPU are kept through numpy views of their memory: the same
        # values at numpy's lower cost per call; the env still sees tensors.
        self._given = arrays
        place = layout.place
        self._on_host = place.is_torch and place.computes_on_host
        self._on_device = not place.computes_on_host  # no host read per step
        if self._on_host:
            arrays = {path: to_numpy(array) for path, array in arrays.items()}
        self.arrays = arrays
        # A tensor of the batch that the env returns (it wrote into it) -> its numpy view.
        self._views = {id(self._given[path]): view for path, view in arrays.items()}
        self._done = self._given["done"]  # which copies reset after a step, as the env's
        self.offset = offset
        self.groups = list(layout.groups)
        self._obs = {
            g: [p for p, _ in leaves(group.obs_tree, f"obs/{g}")]
            for g, group in layout.groups.items()
        }
        state = layout.state_space
        self._state_tree = None if state is None else array_tree(state)
        self._state = (
            [] if self._state_tree is None else [p for p, _ in leaves(self._state_tree, "state")]
        )
        self._masks = {g for g, group in layout.groups.items() if group.num_actions is not None}
        ops = self._ops = ops_for(place)  # numpy on the host, torch on a device
        self._write_rows, self._fill_rows = ops.write_rows, ops.fill_rows
        self._any_alive = _any_alive([ops.rows_any(arrays[f"alive/{g}"]) for g in self.groups])
        """Whether any agent of each copy is alive: a new bool array ``[E]``."""
        # What an observation writes per group: (group, obs tree, obs array where one leaf
        # else None, alive array, acting array, action mask array or None).
        self._observed = [
            (
                g,
                group.obs_tree,
                None if isinstance(group.obs_tree, (dict, tuple)) else arrays[f"obs/{g}"],
                arrays[f"alive/{g}"],
                arrays[f"acting/{g}"],
                arrays[f"action_mask/{g}"] if g in self._masks else None,
            )
            for g, group in layout.groups.items()
        ]
        self._done_array = arrays["done"]  # the done array as the bookkeeping writes it
        self._cut = arrays["episode_cut"]
        self._cut_marked = False  # some copy's episode_cut is set: cleared at the next step
        self._running_length = arrays["running_length"]
        # Per group: its decision indices, its acting flags, and where a step keeps the flags
        # it was taken from (the env overwrites them) to count those decisions once it
        # happened, as the running length counts the step.
        self._decisions = [
            (arrays[f"decision/{g}"], arrays[f"acting/{g}"], ops.copy(arrays[f"acting/{g}"]))
            for g in self.groups
        ]
        self._live = self._any_alive()
        self._actions = {
            g: assemble(group.action_tree, f"action/{g}", self._given)
            for g, group in layout.groups.items()
        }
        # What an ended episode's record copies: (final, running) arrays.
        self._finals = [
            (arrays["final_" + path], arrays[path]) for g in self.groups for path in self._obs[g]
        ]
        self._finals += [
            (arrays[f"episode_return/{g}"], arrays[f"running_return/{g}"]) for g in self.groups
        ]
        self._finals += [
            (arrays[f"episode_decisions/{g}"], arrays[f"decision/{g}"]) for g in self.groups
        ]
        self._finals += [(arrays["final_" + path], arrays[path]) for path in self._state]
        self._finals.append((arrays["episode_length"], arrays["running_length"]))
        self._finals = [(ops.as_rows(final), ops.as_rows(now)) for final, now in self._finals]
        self._step_arrays = [
            (g, *(arrays[f"{field}/{g}"] for field in _STEP_FIELDS)) for g in self.groups
        ]
        # A source that keeps the rules itself (packed dict envs judge every value, and
        # leave masks of agents that are not acting all legal) needs no second look.
        keeps_rules = env.keeps_rules
        self._check_finite = layout.check_finite and not keeps_rules
        # One that only says it leaves those masks all legal (keeps_masks) is taken at
        # its word there; the batches the tests compare with packed dict envs check it.
        self._keeps_masks = keeps_rules or env.keeps_masks
        # A source that can write straight into the arrays skips a copy of every value;
        # not where its values are judged after the step (check_finite cuts a copy that
        # returned NaN where it stood before the step).
        shared = share and not self._check_finite and bool(env.write_into(self._given))
        # It then writes every step and reset there and returns those arrays (the
        # protocol's promise): with its masks kept too, and numpy arrays, what it returns
        # needs no look.
        self._written = shared and self._keeps_masks and not self._on_host
        self._returned = None if keeps_rules else ReturnedArrays(layout, arrays, offset)
        # The protocol's rules that the bookkeeping relies on: read on the host, so on a
        # device only with check_finite, which reads every step anyway.
        checks = not keeps_rules and (not self._on_device or self._check_finite)
        self._promises = (
            Promises(layout, arrays, offset, self._check_finite, shared) if checks else None
        )
        self._broken = False  # its last restart failed: tried again at each step
        self._retry: tuple[list | None, dict[str, Any] | None] = (None, None)
        """The seeds and options of the reset that failed (``None``: none, or a restart)."""
        self._copies = range(offset, offset + len(arrays["done"]))

    # -- commands -------------------------------------------------------------------

    def reset(self, seeds: Sequence[int | None], options: dict[str, Any] | None = None) -> None:
        """Start a new episode in every copy, copy ``i`` seeded with ``seeds[i]``."""
        clear_step_fields(self.arrays, self.groups)
        out = self._reset_all(list(seeds), options)
        self._count_restarts(out)
        _raise_first(out.faults)

    def _reset_all(self, seeds: list | None, options: dict[str, Any] | None) -> BatchedStep:
        """Reset every copy and record what it observes. Where the env raises (a natively
        batched env: packed dict envs restart their own envs), no copy has an episode, each
        later step tries this reset again, and the :class:`EnvError` is raised."""
        try:
            out = self._host(self.env.reset(seed=seeds, options=options))
            self._write_observed(out, None)
        except Exception as err:
            self._lose_episodes(seeds, options)
            raised = env_error(self.offset, "reset()", err)
            raise EnvError(
                raised.env_index,
                f"{raised.message}; no copy of the env ({envs_text(self._copies)}) has an "
                "episode: each step tries the reset again",
                raised.remote_traceback,
                copies=self._copies,
            ) from err
        self._zero_running(None)
        self._live = self._any_alive()
        self._broken = False
        self._retry = (None, None)
        return out

    def step(self) -> None:
        """Step every copy with the actions in the action arrays; restart the copies that
        ended, in the same step."""
        if self._cut_marked:
            self._fill_rows(self._cut, False, None)
            self._cut_marked = False
        if self._broken:  # its last restart failed: try again instead
            self._restart_broken()
            return
        before = self._live  # the copies with an episode running
        for _, acting, acted in self._decisions:  # kept: the step overwrites them
            acted[...] = acting
        bad = faults = None
        promises = self._promises
        try:
            if promises is not None:
                promises.begin_step()
            out = self.env.step(self._actions)
            if not self._written:
                out, bad, faults = self._take_step(out)
            elif promises is not None:
                promises.check_step(out)
        except Exception as err:
            self._fail("step()", err, stepped=False)
        for _, reward, _, _, running in self._step_arrays:
            running += reward
        failed = out.failed  # copies whose step did not happen
        if bad is not None:
            failed = bad if failed is None else failed | bad
            self.arrays["worker_restarts"] += bad
        self._running_length += before if failed is None else before & ~failed
        for decision, _, acted in self._decisions:
            decision += acted if failed is None else acted & ~failed[:, None]
        done = self._done_array
        if out.same_alive and bad is None:  # no episode ended (the source says so)
            live = before
            self._fill_rows(done, False, None)
            ended = None
        else:
            live = self._any_alive()
            done[...] = before > live  # had an episode running, has none now
            # On the host, one read: whether (and which) copies ended; on a device, none:
            # every step restarts the copies ``done`` selects, none or some.
            ended = done if self._on_device else done.nonzero()[0]  # on the host: numpy
        if failed is not None:  # their episode ended where it stood: cut
            self._mark_cut(failed & done)
        self._count_restarts(out)
        faults = [*out.faults, *faults] if faults else out.faults
        if ended is not None and (self._on_device or len(ended)):
            self._end_episodes(ended)
            try:
                restarted = self.env.reset(where=self._done)
                if not self._written:
                    restarted = self._host(restarted)
                    self._write_observed(restarted, ended)  # the rows of the ended copies
                    if self._promises is not None:  # the others still hold the step's
                        self._promises.check_reset(restarted, done, live)
            except Exception as err:
                self._fail("reset()", err, stepped=True, also=faults)
            self._count_restarts(restarted)
            faults = [*faults, *restarted.faults]
            live = self._any_alive()
        self._live = live
        _raise_first(faults)

    def _take_step(self, out: BatchedStep) -> tuple[BatchedStep, Any, list[EnvError] | None]:
        """Check the step ``out`` and copy it into the arrays: ``out`` on the host, the
        copies that returned bad values (``check_finite``: a bool mask, or ``None``) and the
        fault of each."""
        if self._on_host:
            out = self._host(out)
        if self._returned is not None:  # every array of out, before any is used
            self._returned.check(out, step=True)
        if self._promises is not None:
            self._promises.check_step(out)
        bad, faults = self._bad_copies(out) if self._check_finite else (None, None)
        self._write_step(out, bad)
        return out, bad, faults

    def _write_step(self, out: BatchedStep, bad: Any) -> None:
        """Copy the step ``out`` into the arrays; the copies ``bad`` (a bool mask, or
        ``None``) returned bad values: their step did not happen, their episode is cut."""
        a, put = self.arrays, self._write_rows
        rewards, terminations, truncations = out.reward, out.terminated, out.truncated
        assert rewards is not None and terminations is not None and truncations is not None
        for g, reward, terminated, truncated, _ in self._step_arrays:
            # A source that writes into the arrays returns them: nothing to copy.
            if (value := rewards[g]) is not reward:
                put(reward, value, None)
            if (value := terminations[g]) is not terminated:
                put(terminated, value, None)
            if (value := truncations[g]) is not truncated:
                put(truncated, value, None)
            if bad is not None:  # cut where it stood before the step
                reward[bad] = 0
                terminated[bad] = False
                truncated[bad] = a[f"alive/{g}"][bad]
        self._write_observed(out, None if bad is None else ~bad, checked=True)
        if bad is not None:
            for g in self.groups:
                a[f"alive/{g}"][bad] = False
                a[f"acting/{g}"][bad] = False

    def restart_all(self, seeds: Sequence[int | None]) -> None:
        """Take over from a dead worker with a fresh env: the episodes it was running end
        truncated, and every copy resets (copy ``i`` with ``seeds[i]``).

        The step fields hold the dead worker's last step where it finished it (it died in
        the autoreset that follows), else nothing (:func:`clear_step_fields`): an episode
        that ended in that step is reported as it ended, the others are cut where they
        stand.
        """
        self._cut_all()
        _raise_first(self._reset_all(list(seeds), None).faults)

    def _cut_all(self) -> None:
        """End every copy's episode where it stands (one that ended in this step's fields
        as it ended), truncated, and count a restart of each copy."""
        a = self.arrays
        cut = ~a["done"]
        for g in self.groups:
            a[f"truncated/{g}"] |= a[f"alive/{g}"] & cut[:, None]
        self._end_episodes(cut)
        self._mark_cut(cut)
        a["done"][...] = True
        a["worker_restarts"] += 1

    def _fail(
        self, what: str, err: Exception, stepped: bool, also: Sequence[EnvError] = ()
    ) -> NoReturn:
        """The env raised ``err`` (being handled) in ``what`` of a step (``stepped``: after
        the env stepped): end every copy's episode where it stands and restart them all, as
        :meth:`restart_all` does; then raise the fault (with the faults ``also`` found)."""
        raised = env_error(self.offset, what, err)
        if not stepped:  # nothing of the step was written: none of it is reported
            clear_step_fields(self.arrays, self.groups)
        envs = self._copies
        message = f"{raised.message}; every copy of the env ({envs_text(envs)}) restarts"
        self._cut_all()
        again = self._restart()
        if again is None:
            fault = EnvError(
                raised.env_index, message, raised.remote_traceback, restarted=True, copies=envs
            )
        else:
            fault = EnvError(
                raised.env_index,
                f"{message}, but its reset() raised too: {again.message}",
                f"{raised.remote_traceback}\n{again.remote_traceback}",
                copies=envs,
            )
        raise first_fault([fault, *also])

    def _restart(self) -> EnvError | None:
        """Reset every copy after a fault (with the seeds of the reset that failed, if one
        did); what the reset raised, if it did (every copy then has no episode, and the
        next step tries again)."""
        try:
            self._reset_all(*self._retry)
        except EnvError as err:
            return err
        return None

    def _lose_episodes(self, seeds: list | None, options: dict[str, Any] | None) -> None:
        """No copy has an episode (none of their agents lives) until a reset with ``seeds``
        and ``options`` succeeds: each step tries it (instead of stepping)."""
        for g in self.groups:
            self.arrays[f"alive/{g}"][...] = False
            self.arrays[f"acting/{g}"][...] = False
        self._live = self._any_alive()
        self._broken = True
        self._retry = (seeds, options)

    def _restart_broken(self) -> None:
        """Try again to restart an env whose restart failed; raise if it fails again."""
        clear_step_fields(self.arrays, self.groups)
        again = self._restart()
        if again is not None:
            message = f"restarting the env failed again: {again.message}"
            raise EnvError(self.offset, message, again.remote_traceback)
        self.arrays["worker_restarts"] += 1

    # -- bookkeeping ------------------------------------------------------------------

    def _host(self, out: BatchedStep) -> BatchedStep:
        """``out`` with its CPU tensors as numpy views of their memory (where the arrays are
        kept so), as is otherwise."""
        if not self._on_host:
            return out
        get = self._views.get
        fields = {}
        for name in _STEP_ATTRIBUTES:
            value = getattr(out, name)
            if type(value) is dict:  # per group: mostly the batch's own tensors
                host = {}
                for g, v in value.items():
                    view = get(id(v))
                    host[g] = tree_to_numpy(v) if view is None else view
                value = host
            elif value is not None and not (type(value) is list and not value):
                view = get(id(value))
                value = tree_to_numpy(value) if view is None else view
            fields[name] = value
        return BatchedStep(**fields)

    def _write_observed(self, out: BatchedStep, rows: Any, checked: bool = False) -> None:
        """Copy what ``out`` observed into the arrays (only ``rows``, a bool mask or indices,
        if given); ``checked``: its arrays and values were checked already."""
        a, put = self.arrays, self._write_rows
        if not checked and self._returned is not None:
            self._returned.check(out)
        if self._check_finite and not checked:
            self._check_values(out, rows)
        observed, alives, actings, masks = out.obs, out.alive, out.acting, out.action_mask
        # A source that writes into the arrays returns them: nothing to copy there.
        for g, obs_tree, obs, alive, acting, dst in self._observed:
            if obs is not None:  # the observations: one array
                if (value := observed[g]) is not obs:
                    put(obs, value, rows)
            else:
                for path, value in _leaf_values(obs_tree, f"obs/{g}", observed[g]):
                    put(a[path], value, rows)
            if (value := alives[g]) is not alive:
                put(alive, value, rows)
            if (value := actings[g]) is not acting:
                put(acting, value, rows)
            if dst is not None:  # the group's action masks
                mask = masks.get(g)
                if mask is None:
                    self._fill_rows(dst, True, rows)
                    continue
                if mask is not dst:
                    put(dst, mask, rows)
                if not self._keeps_masks:  # agents that are not acting have every action legal
                    # in place over every row: the rows not written kept the rule already
                    dst |= ~acting[..., None]
        if self._state_tree is not None:
            for path, value in _leaf_values(self._state_tree, "state", out.state):
                put(a[path], value, rows)

    def _end_episodes(self, ended: Any) -> None:
        """Record the episodes of the copies ``ended`` (a bool mask or indices) as they
        stand."""
        copy_rows = self._ops.copy_rows
        for final, now in self._finals:
            copy_rows(final, now, ended)
        self._zero_running(ended)

    def _mark_cut(self, rows: Any) -> None:
        """Set ``episode_cut`` of the copies ``rows`` (a bool mask)."""
        self._cut |= rows
        self._cut_marked = True

    def _zero_running(self, rows: Any) -> None:
        fill = self._fill_rows
        for g in self.groups:
            fill(self.arrays[f"running_return/{g}"], 0, rows)
            fill(self.arrays[f"decision/{g}"], 0, rows)
        fill(self.arrays["running_length"], 0, rows)

    def _count_restarts(self, out: BatchedStep) -> None:
        if out.restarted is not None:
            self.arrays["worker_restarts"] += out.restarted

    def _check_values(self, out: BatchedStep, rows: Any) -> None:
        """An :class:`EnvError` for the first copy (among ``rows``) that returned NaN or inf
        (``check_finite``); ``rows`` a bool mask or indices."""
        if rows is not None and rows.dtype != self._live.dtype:  # indices: as a mask
            mask = self._live & False
            mask[rows] = True
            rows = mask
        faults = self._value_faults(out, rows)
        if faults:
            raise faults[min(faults)]

    def _bad_copies(self, out: BatchedStep) -> tuple[Any, list[EnvError]]:
        """The copies whose step returned NaN or inf (``check_finite``) as a bool mask
        (``None`` for none), and the fault of each; they are cut and restarted."""
        faults = self._value_faults(out, None)
        if not faults:
            return None, []
        bad = self._live & False  # a new mask of the arrays' kind
        bad[sorted(faults)] = True
        for fault in faults.values():
            fault.restarted = True
        return bad, [faults[i] for i in sorted(faults)]

    def _value_faults(self, out: BatchedStep, rows: Any) -> dict[int, EnvError]:
        """The first NaN or inf of each copy among ``rows`` (all for ``None``), by copy."""
        faults: dict[int, EnvError] = {}
        for g, group in self.layout.groups.items():
            checks = [("observation", v) for _, v in _leaf_values(group.obs_tree, "", out.obs[g])]
            if out.reward is not None:
                checks.append(("reward", out.reward[g]))
            for what, value in checks:
                for i, j in nonfinite_cells(value, rows).items():
                    if i not in faults:
                        faults[i] = EnvError(
                            self.offset + i,
                            f"{what} of agent {group.agents[j]!r}: expected finite values, "
                            "got NaN or inf",
                        )
        if self._state_tree is not None:
            for _, value in _leaf_values(self._state_tree, "", out.state):
                for i in nonfinite_cells(value, rows):
                    if i not in faults:
                        faults[i] = EnvError(self.offset + i, "state: expected finite values")
        return faults


_STEP_ATTRIBUTES = [f.name for f in dataclasses.fields(BatchedStep)]

# What a step writes per group, in the order Episodes.step reads them.
_STEP_FIELDS = ("reward", "terminated", "truncated", "running_return")


def clear_step_fields(arrays: Arrays, groups: Iterable[str]) -> None:
    """Clear what a step reports (rewards, ends, ``done``, ``episode_cut``) before the step."""
    for g in groups:
        arrays[f"reward/{g}"][...] = 0
        arrays[f"terminated/{g}"][...] = False
        arrays[f"truncated/{g}"][...] = False
    arrays["done"][...] = False
    arrays["episode_cut"][...] = False


def _leaf_values(tree: Any, path: str, value: Any) -> list[tuple[str, Any]]:
    """``(path, array)`` of every leaf of a nested value laid out as ``tree``."""
    if not isinstance(tree, (dict, tuple)):
        return [(path, value)]  # the common case (one array), without a call
    return leaves_of(tree, value, path)


def _any_alive(rows_any: list[Callable[[], Any]]) -> Callable[[], Any]:
    """A function returning whether any of each copy's agents is alive (a new bool array
    ``[E]``) from each group's ``rows_any`` (see :meth:`corral.arrays.Ops.rows_any`)."""
    if len(rows_any) == 1:
        return rows_any[0]

    def any_alive() -> Any:
        alive = rows_any[0]()
        for more in rows_any[1:]:
            alive |= more()
        return alive

    return any_alive


def _raise_first(faults: list[EnvError]) -> None:
    """Raise the first fault by env index, listing all of them."""
    if faults:
        raise first_fault(faults)
