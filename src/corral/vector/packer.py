"""The packer of :class:`~corral.vector.dict_envs.DictEnvs`: what ``E`` dict envs return
in one call, gathered per group and written into the group arrays.

A call is :meth:`Packer.begin`, then for each env :meth:`~Packer.record_step` or
:meth:`~Packer.record_reset` (with :meth:`~Packer.add_state`, and the alive agents where
they are not those observed), then :meth:`~Packer.flush`, which writes each field of
each group with one array operation.
Where some value does not fit its array (an unknown agent, the wrong shape or type, a
number its dtype cannot hold, with ``check_finite`` NaN or inf), flush judges the values
one by one instead and returns, by env, an :class:`~corral.errors.EnvError` naming the
env, the agent and the field; every other env's values are written.

Invariants. Per group of ``n`` agents each array is ``[E, n, ...]`` (also seen flat,
``[E * n, ...]``, index ``env * n + agent``). A step writes every env's rows; a reset
writes the rows of the envs it resets, and first clears there who acts, who is alive,
the observations (to 0) and the masks (to all legal). After a call, in the rows it
wrote:

* ``alive``: the agent is in its env's episode, that is in ``env.agents``. At a reset:
  the agents the env observed where ``env.agents`` holds as many, every agent where
  ``env.agents`` is ``possible_agents``, else ``env.agents`` read. At a step: as before
  it, less the agents whose end flag is set; where ``env.agents`` then holds another
  number of agents (some joined), it is read from ``env.agents`` ("read alive").
* ``acting``: the agent observed in this call (its key in the observations): it acts at
  the next step.
* ``obs``: each acting agent's observation; an agent that ended with ``final_obs`` in
  its info (and did not observe) holds that. The others' rows keep what they held (a
  reset zeroes its rows).
* ``action_mask``: ``True`` everywhere but the masks acting agents gave in their info.
* ``reward``, ``terminated``, ``truncated`` (a step only; a reset leaves them): the
  env's values, ``0`` or ``False`` where it gave none; every row is written anew at
  each step.
* ``state``: each env's ``state()``, where the env has a ``state_space``.

A fault of env ``i`` (its call raised, or a value did not fit) leaves its step undone:
:meth:`~Packer.put_back` (before flush wrote) or :meth:`~Packer.put_back_written` (after)
puts back its alive agents, observations and state as they stood before the step, with
no reward and no end flag; :meth:`~Packer.truncate` then ends its live agents' episode,
and :meth:`~Packer.forget` leaves an env without episode (nothing alive or acting).
:meth:`~Packer.same_alive` says whether a step in which no env failed or restarted
left every ``alive`` as it was (the promise :attr:`~corral.BatchedStep.same_alive`).

Judging a value follows :mod:`corral.returned_values` (``describe``, ``exactly_as``,
``is_finite``), with one difference on purpose, named there (``packed_reward``,
``packed_flag``): the packer runs the envs it is given, and takes a bool reward as
``0.0``/``1.0``, a one-element array as the number it holds, and an integer ``0``/``1``
as an end flag, which :func:`corral.check_env` reports (the contract asks for a real
number and a bool).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from corral.errors import EnvError
from corral.returned_values import (
    describe,
    exactly_as,
    holds_numbers,
    is_finite,
    packed_flag,
    packed_reward,
)
from corral.vector.layout import (
    ArraySpec,
    Layout,
    WriteError,
    array_tree,
    leaves,
    reader,
    store,
    writer,
)


class _Gathered:
    """One group's values gathered in a call, by flat index ``env * n + agent`` (rewards:
    see :attr:`GroupArrays.rewards`)."""

    __slots__ = (
        "alive",
        "final_idx",
        "final_val",
        "lists",
        "mask_idx",
        "mask_val",
        "obs_idx",
        "obs_val",
        "term",
        "trunc",
    )

    def __init__(self) -> None:
        self.obs_idx: list[int] = []
        self.obs_val: list[Any] = []
        self.final_idx: list[int] = []
        self.final_val: list[Any] = []
        self.mask_idx: list[int] = []
        self.mask_val: list[Any] = []
        self.alive: list[int] = []  # agents alive at a reset
        self.term: list[int] = []
        self.trunc: list[int] = []
        # Every list above (each is only ever changed in place).
        self.lists = tuple(getattr(self, name) for name in self.__slots__ if name != "lists")

    def drop(self, lo: int, hi: int) -> None:
        """Forget the entries of flat indices ``lo <= f < hi`` (one env's agents)."""
        for idx, val in (
            (self.obs_idx, self.obs_val),
            (self.final_idx, self.final_val),
            (self.mask_idx, self.mask_val),
        ):
            keep = [k for k, f in enumerate(idx) if not lo <= f < hi]
            if len(keep) != len(idx):
                idx[:], val[:] = [idx[k] for k in keep], [val[k] for k in keep]
        for idx in (self.alive, self.term, self.trunc):
            idx[:] = [f for f in idx if not lo <= f < hi]


class _ReadActions:
    """A group's actions read from its action arrays, by flat index ``env * n + agent``."""

    __slots__ = ("n", "read")

    def __init__(self, read: Callable[[tuple[int, int]], Any], n: int) -> None:
        self.read, self.n = read, n

    def __getitem__(self, f: int) -> Any:
        return self.read(divmod(f, self.n))


class GroupArrays:
    """A group's arrays, each also as a flat view ``[E * n, ...]``, and its gathered values."""

    def __init__(
        self, name: str, layout: Layout, arrays: dict[str, np.ndarray], check_finite: bool
    ) -> None:
        group = layout.groups[name]
        self.name = name
        self.agents = group.agents
        self.n = len(group.agents)
        self.leaf = isinstance(group.obs_tree, ArraySpec)

        def flat(field: str) -> np.ndarray:
            array = arrays[f"{field}/{name}"]
            return array.reshape(-1, *array.shape[2:])

        # The observations as one array only where they are one (a leaf), the masks only
        # where the group's actions are discrete.
        self.obs = flat("obs") if self.leaf else None
        self.reward, self.terminated, self.truncated = (
            flat("reward"),
            flat("terminated"),
            flat("truncated"),
        )
        self.alive, self.acting = flat("alive"), flat("acting")
        self.mask = flat("action_mask") if f"action_mask/{name}" in arrays else None
        self.alive_rows = arrays[f"alive/{name}"]  # [E, n]
        self.write_obs = writer(group.obs_tree, f"obs/{name}", arrays, check_finite)
        self.write_mask = (
            None
            if group.num_actions is None
            else writer(
                ArraySpec((group.num_actions,), np.dtype(bool)), f"action_mask/{name}", arrays
            )
        )
        self.read_actions = _ReadActions(
            reader(group.action_tree, f"action/{name}", arrays), self.n
        )
        self.action_leaf = (
            isinstance(group.action_tree, ArraySpec) and group.action_tree.shape == ()
        )
        self.actions: list[Any] | _ReadActions = self.read_actions  # by flat index
        self.got = _Gathered()
        # A step's rewards: for each agent, a list by env, 0.0 unless the env gave one (a
        # store per reward, no index to keep, and one array of them all to write).
        num_envs = layout.num_envs
        self.no_rewards = [0.0] * num_envs
        self.rewards = [list(self.no_rewards) for _ in self.agents]
        self.reward_rows = arrays[f"reward/{name}"]  # [E, n]
        self.reward_cols = self.reward_rows.T  # [n, E], as the rewards are gathered
        self.every = list(range(len(self.acting)))  # the flat index of every agent, in order
        got = self.got
        # Each kind of value gathered: (its indices, its values, its array, whether a leaf
        # array, whether it must be finite with check_finite).
        self.values = (
            (got.final_idx, got.final_val, self.obs, self.leaf, True),
            (got.obs_idx, got.obs_val, self.obs, self.leaf, True),
            (got.mask_idx, got.mask_val, self.mask, True, False),
        )
        self.ends = ((self.terminated, got.term), (self.truncated, got.trunc))

    def rows(self, idx: list[int]) -> np.ndarray | slice:
        """Flat indices ``idx`` as a slice where they are every agent, or the same agent of
        every env, in order (a cheaper write), else as an index array (converted once for
        every write)."""
        if idx == self.every:
            return _EVERY
        n = self.n
        if len(idx) * n == len(self.every) and idx[0] < n and idx == self.every[idx[0] :: n]:
            return slice(idx[0], None, n)
        return np.array(idx, np.intp)


class Packer:
    """Gathers one call's values per group and writes each field with one array operation."""

    def __init__(
        self, layout: Layout, arrays: dict[str, np.ndarray], offset: int, check_finite: bool
    ) -> None:
        self.layout, self.arrays, self.offset = layout, arrays, offset
        self.num_envs = layout.num_envs
        self.check_finite = check_finite
        self.groups = [GroupArrays(g, layout, arrays, check_finite) for g in layout.groups]
        self.by_name = by_name = {g.name: g for g in self.groups}
        # agent -> (its group's arrays, its index in the group, the group's size)
        self.slot = {a: (by_name[g], j, by_name[g].n) for a, (g, j) in layout.position.items()}
        # agent -> (its index, its group's size, its group's gathered values, the group)
        self.place = {a: (j, g.n, g.got, g) for a, (g, j, _) in self.slot.items()}
        # agent -> what record does with its observation: (its index, its group's size, the
        # appends of the group's gathered observations, the group, whether it has masks)
        self.observe = {
            a: (j, n, g.got.obs_idx.append, g.got.obs_val.append, g, g.mask is not None)
            for a, (g, j, n) in self.slot.items()
        }
        self.rewards_of = {a: g.rewards[j] for a, (g, j, _) in self.slot.items()}
        self.unset = dict.fromkeys(self.slot, False)  # no agent's end flag set
        state = layout.state_space
        self._state_tree = None if state is None else array_tree(state)
        self._state_write = (
            None if state is None else writer(self._state_tree, "state", arrays, check_finite)
        )
        self._obs_paths = [
            path
            for g, group in layout.groups.items()
            for path, _ in leaves(group.obs_tree, f"obs/{g}")
        ]
        # The observation and state arrays, each with a copy of it as flush found it, taken
        # where flush judges values one by one (see put_back_written).
        kept = list(self._obs_paths)
        if state is not None:
            kept += [path for path, _ in leaves(self._state_tree, "state")]
        self._before_flush = [(arrays[path], np.empty_like(arrays[path])) for path in kept]
        # What a call gathers besides each group's values (see begin), made once.
        self.states: tuple[list[int], list[Any]] = ([], [])  # envs and their state()
        self.alive_obs: list[int] = []  # envs whose alive agents are those they observe
        self.alive_as_acting = self.alive_obs.append
        self.alive_all: list[int] = []  # envs whose every agent is alive
        self.alive_as_all = self.alive_all.append
        self.alive_read: set[int] = set()  # envs whose alive row read_alive set
        # Each group's alive array, with a copy of it as it stood when the step began.
        self._alive_before = [(g.alive, np.empty_like(g.alive)) for g in self.groups]
        # Everything a call gathers, emptied by the next begin.
        self._gathered = (
            *self.states,
            self.alive_obs,
            self.alive_all,
            self.alive_read,
            *(values for g in self.groups for values in g.got.lists),
        )

    # -- a call -------------------------------------------------------------------

    def begin(self, rows: np.ndarray | None) -> None:
        """Start a call: a step (``rows`` ``None``), which writes every env's rows, or a
        reset of the envs ``rows``. There, every action is legal until an env gives a
        mask; a step has no reward and no end flag until an env gives one (flush writes
        who acts anew), a reset clears who acts, who is alive and the observations."""
        a = self.arrays
        where: np.ndarray | slice | None = rows
        if rows is not None and len(rows) == self.num_envs:
            where = _EVERY  # a cheaper write
        for gathered in filter(None, self._gathered):  # those not empty
            gathered.clear()
        for g in self.groups:
            if where is None:  # a step: flush writes every reward, and sets the end flags
                for rewards in g.rewards:
                    rewards[:] = g.no_rewards
                g.terminated.fill(False)
                g.truncated.fill(False)
                if g.mask is not None:
                    g.mask.fill(True)
                continue
            a[f"acting/{g.name}"][where] = False
            a[f"alive/{g.name}"][where] = False
            if g.mask is not None:
                a[f"action_mask/{g.name}"][where] = True
        if where is not None:
            for path in self._obs_paths:
                a[path][where] = 0
        else:
            for alive, before in self._alive_before:
                np.copyto(before, alive)
        self.stepping = rows is None
        self.num_rows = self.num_envs if rows is None else len(rows)

    def same_alive(self) -> bool:
        """Whether this step, if no env failed or restarted in it, left every env's alive
        agents as they were: no agent ended, and no env's alive row was read anew."""
        return not self.alive_read and not any(g.got.term or g.got.trunc for g in self.groups)

    def put_back_written(self, i: int) -> None:
        """What :meth:`put_back` does, after :meth:`flush` wrote env ``i``'s values: its
        observations and state are put back too, as flush found them."""
        for array, copy in self._before_flush:
            array[i] = copy[i]
        self.put_back(i)

    def put_back(self, i: int) -> None:
        """Env ``i``'s step did not happen (before :meth:`flush` wrote): its alive agents
        are put back as they stood before it, with no reward and no agent ended."""
        for g, (alive, before) in zip(self.groups, self._alive_before, strict=True):
            flat = slice(i * g.n, (i + 1) * g.n)
            alive[flat] = before[flat]
            g.reward[flat] = 0
            g.terminated[flat] = False
            g.truncated[flat] = False

    def store_actions(self, group: str, value: Any) -> None:
        """The group's actions as Python values by flat index ``env * n + agent`` where a leaf
        array, else via the action arrays."""
        g = self.by_name[group]
        tree = self.layout.groups[group].action_tree
        if g.action_leaf and isinstance(value, np.ndarray):
            g.actions = value.reshape(-1).tolist()
        else:
            g.actions = g.read_actions
            store(tree, f"action/{group}", self.arrays, value)

    # -- gathering ----------------------------------------------------------------------

    def record_reset(self, i: int, obs: Any, infos: Any) -> Sequence[tuple[str, int, GroupArrays]]:
        """Gather what env ``i``'s reset returned; the agents that act next (see
        :meth:`record_step`)."""
        if type(obs) is not dict or type(infos) is not dict:
            self._check_dicts(i, "reset()", {"obs": obs, "infos": infos})
        return self._observe(i, obs, infos)

    def record_step(
        self,
        i: int,
        obs: Any,
        rewards: Any,
        terminations: Any,
        truncations: Any,
        infos: Any,
        num_alive: list[int],
    ) -> Sequence[tuple[str, int, GroupArrays]]:
        """Gather what env ``i``'s step returned, its ended agents counted off
        ``num_alive[i]``. The agents that act next, each with its flat index in its group
        and its group's arrays."""
        if not (
            type(obs) is dict
            and type(rewards) is dict
            and type(terminations) is dict
            and type(truncations) is dict
            and type(infos) is dict
        ):
            parts = {"obs": obs, "rewards": rewards, "terminations": terminations}
            parts.update(truncations=truncations, infos=infos)
            self._check_dicts(i, "step()", parts)
        rewards_of = self.rewards_of
        for agent, reward in rewards.items():
            try:
                rewards_of[agent][i] = reward
            except KeyError:
                self._unknown(i, agent, "rewards")
        # Whether any flag may be set: a truthy one, or one whose truth is not plain.
        # Every agent's flag False, the common case, is one comparison.
        unset = self.unset
        try:
            ends = terminations != unset and any(terminations.values())
        except (ValueError, TypeError):
            ends = True
        if ends:
            num_alive[i] -= self._gather_ends(i, terminations, infos, True)
        try:
            ends = truncations != unset and any(truncations.values())
        except (ValueError, TypeError):
            ends = True
        if ends:
            num_alive[i] -= self._gather_ends(i, truncations, infos, False)
        if not obs:
            return ()
        return self._observe(i, obs, infos)

    def _observe(
        self, i: int, obs: dict[str, Any], infos: dict[str, Any]
    ) -> list[tuple[str, int, GroupArrays]]:
        """Gather env ``i``'s observations and action masks; who acts next."""
        observe = self.observe
        acting = []
        for agent, value in obs.items():
            try:
                j, n, add_index, add_value, g, masked = observe[agent]
            except KeyError:
                self._unknown(i, agent, "obs")
            f = i * n + j
            acting.append((agent, f, g))
            add_index(f)
            add_value(value)
            if masked:
                got = g.got
                info = infos.get(agent)
                if info:
                    try:
                        mask = info.get("action_mask")
                    except AttributeError:
                        mask = self._info(i, infos, agent, "action_mask")  # raises
                    if mask is not None:
                        got.mask_idx.append(f)
                        got.mask_val.append(mask)
                elif info is not None and type(info) is not dict:
                    self._info(i, infos, agent, "action_mask")  # raises
        return acting

    def _gather_ends(self, i: int, flags: Mapping[str, Any], infos: Any, terminated: bool) -> int:
        """Gather the agents of env ``i`` whose flag is set (terminated or truncated); how
        many (checked against ``env.agents`` after the step)."""
        place = self.place
        ended = 0
        for agent, flag in flags.items():
            if flag is not True:
                if flag is False:
                    continue
                if not self._flag(i, agent, "terminated" if terminated else "truncated", flag):
                    continue
            try:
                j, n, got, _ = place[agent]
            except KeyError:
                self._unknown(i, agent, "terminations" if terminated else "truncations")
            f = i * n + j
            (got.term if terminated else got.trunc).append(f)
            ended += 1
            info = infos.get(agent)
            if info:
                try:
                    final = info.get("final_obs")
                except AttributeError:
                    final = self._info(i, infos, agent, "final_obs")  # raises
                if final is not None:
                    got.final_idx.append(f)
                    got.final_val.append(final)
            elif info is not None and type(info) is not dict:
                self._info(i, infos, agent, "final_obs")  # raises
        return ended

    def add_state(self, i: int, value: Any) -> None:
        self.states[0].append(i)
        self.states[1].append(value)

    def gather_alive(self, i: int, agents: Sequence[str]) -> int:
        """Gather env ``i``'s alive agents at a reset (its row was cleared); how many."""
        place = self.place
        for agent in agents:
            j, n, got, _ = place.get(agent) or self._unknown(i, agent, "env.agents")
            got.alive.append(i * n + j)
        return len(agents)

    def check_leaving(
        self, i: int, agents: Sequence[str], terminations: Any, truncations: Any
    ) -> None:
        """Raise an :class:`EnvError` where env ``i``'s step took an agent out of
        ``env.agents`` without ending its episode, or ended one that it kept there (its
        alive row still holds who was alive when the step began)."""
        now = set(agents)
        ended = {a for flags in (terminations, truncations) for a, f in flags.items() if f}
        for g in self.groups:
            for j in np.flatnonzero(g.alive_rows[i]).tolist():
                agent = g.agents[j]
                if agent not in now and agent not in ended:
                    raise EnvError(
                        self.offset + i,
                        f"agent {agent!r} left env.agents in this step, but neither its "
                        "terminations nor its truncations is True: an agent leaves only in the "
                        "step that ends its episode",
                    )
        stayed = [agent for agent in agents if agent in ended]
        if stayed:
            raise EnvError(
                self.offset + i,
                f"agent {stayed[0]!r} ended in this step (terminations or truncations True) but "
                "is still in env.agents: an agent whose episode ends leaves env.agents",
            )

    def read_alive(self, i: int, agents: Sequence[str]) -> int:
        """Set env ``i``'s alive row to exactly ``agents`` now (agents that joined
        included); how many."""
        slots = [self.slot.get(agent) or self._unknown(i, agent, "env.agents") for agent in agents]
        self.alive_read.add(i)  # its agents that ended are not cleared again by flush
        for g in self.groups:
            g.alive[i * g.n : (i + 1) * g.n] = False
        for g, j, n in slots:
            g.alive[i * n + j] = True
        return len(agents)

    def truncate(self, i: int) -> None:
        """End env ``i``'s episode where it stands: its live agents are truncated."""
        for g in self.groups:
            row = slice(i * g.n, (i + 1) * g.n)
            g.truncated[row] |= g.alive[row]
            g.alive[row] = False
            g.acting[row] = False
        self._drop(i)

    def forget(self, i: int) -> None:
        """Env ``i`` has no episode: nothing of it is alive, acting or pending."""
        for g in self.groups:
            row = slice(i * g.n, (i + 1) * g.n)
            g.alive[row] = False
            g.acting[row] = False
        self._drop(i)

    def clear_obs(self, i: int) -> None:
        for path in self._obs_paths:
            self.arrays[path][i] = 0

    def _drop(self, i: int) -> None:
        """Forget what env ``i`` gathered in this call (after its fault)."""
        while i in self.alive_obs:
            self.alive_obs.remove(i)
        while i in self.alive_all:
            self.alive_all.remove(i)
        for g in self.groups:
            g.got.drop(i * g.n, (i + 1) * g.n)
            for rewards in g.rewards:
                rewards[i] = 0.0
        envs, values = self.states
        if i in envs:
            keep = [k for k, e in enumerate(envs) if e != i]
            envs[:], values[:] = [envs[k] for k in keep], [values[k] for k in keep]

    # -- writing --------------------------------------------------------------------------

    def flush(self) -> dict[int, EnvError]:
        """Write what was gathered; the fault of each env that returned a value that does
        not fit, by env."""
        ready = self._stacked()
        if ready is None:  # some value does not fit
            return self._flush_judging()
        for g, observed, rewards, writes in ready:
            self._write_ends(g, observed)
            if rewards is not None:
                g.reward_cols[...] = rewards
            for target, index, values in writes:
                target[index] = values
        return {}

    def _stacked(self) -> list[tuple[GroupArrays, Any, Any, list[tuple[Any, Any, Any]]]] | None:
        """What was gathered as arrays that fit, writing nothing: by group, the group, its
        observed rows, its rewards ``[n, E]`` (``None`` at a reset) and its values as
        ``(array, index, values)``; ``None`` where some value does not fit."""
        ready = []
        for g in self.groups:
            got = g.got
            observed = g.rows(got.obs_idx) if got.obs_idx else None
            rewards = None
            if self.stepping:
                rewards = self._rewards(g)
                if rewards is None:
                    return None
            writes: list[tuple[Any, Any, np.ndarray]] = []
            for idx, values, target, leaf, finite in g.values:
                if idx:
                    stacked = self._stack(target, values, finite) if leaf else None
                    if stacked is None:
                        return None
                    writes.append(
                        (target, observed if idx is got.obs_idx else g.rows(idx), stacked)
                    )
            ready.append((g, observed, rewards, writes))
        envs, values = self.states
        if envs:
            state = self.arrays.get("state")
            stacked = None if state is None else self._stack(state, values, True)
            if stacked is None:
                return None
            ready[-1][3].append((state, envs, stacked))
        return ready

    def _flush_judging(self) -> dict[int, EnvError]:
        """Write what was gathered, judging the values one by one where an array of them does
        not fit: the fault of each env that returned a value that does not, by env."""
        for array, copy in self._before_flush:  # before anything is written
            np.copyto(copy, array)
        faults: dict[int, EnvError] = {}
        for g in self.groups:
            got = g.got
            observed = g.rows(got.obs_idx) if got.obs_idx else None
            self._write_ends(g, observed)
            if self.stepping:
                self._flush_rewards(g, faults)
            self._flush_values(g, got.final_idx, got.final_val, g.obs, g.write_obs, g.leaf,
                               "final_obs", faults)  # fmt: skip
            self._flush_values(g, got.obs_idx, got.obs_val, g.obs, g.write_obs, g.leaf,
                               "observation", faults, rows=observed)  # fmt: skip
            if g.mask is not None and g.write_mask is not None:
                self._flush_values(g, got.mask_idx, got.mask_val, g.mask, g.write_mask, True,
                                   "action_mask", faults, finite=False)  # fmt: skip
        self._flush_states(faults)
        return faults

    def _write_ends(self, g: GroupArrays, observed: Any) -> None:
        """Write group ``g``'s alive agents, end flags and acting agents (``observed``: the
        rows it observed, as from ``g.rows``, or ``None``), before its values."""
        got = g.got
        if self.alive_obs and observed is not None:
            # the envs whose alive agents are those they observe: every env of the call, or
            # some of them
            every = len(self.alive_obs) == self.num_rows
            g.alive[observed if every else _of_envs(got.obs_idx, self.alive_obs, g.n)] = True
        if got.alive:
            g.alive[got.alive] = True
        if self.alive_all:
            g.alive_rows[self.alive_all if len(self.alive_all) < self.num_envs else ...] = True
        for flags, ended in g.ends:
            if ended:
                rows: np.ndarray | slice | list[int] = g.rows(ended)
                flags[rows] = True
                if self.alive_read:  # not those whose alive row was read after the step
                    rows = [f for f in ended if f // g.n not in self.alive_read]
                g.alive[rows] = False
        if self.stepping:  # acting is written anew (see begin)
            if observed is _EVERY:
                g.acting.fill(True)
                return
            g.acting.fill(False)
        if observed is not None:
            g.acting[observed] = True

    def _rewards(self, g: GroupArrays) -> np.ndarray | None:
        """Group ``g``'s rewards as an array ``[n, E]``, if every one is a real number (finite
        with ``check_finite``); else ``None``."""
        try:
            array = np.array(g.rewards)
        except (TypeError, ValueError, OverflowError):
            return None
        if array.shape != g.reward_cols.shape or not holds_numbers(array):
            return None
        if self.check_finite and not is_finite(array):
            return None
        return array

    def _flush_rewards(self, g: GroupArrays, faults: dict[int, EnvError]) -> None:
        array = self._rewards(g)
        if array is not None:
            g.reward_cols[...] = array
            return
        for i, rewards in enumerate(zip(*g.rewards, strict=True)):
            for j, reward in enumerate(rewards):
                if i in faults:
                    break
                try:
                    g.reward_rows[i, j] = self._real(i, g.agents[j], reward)
                except EnvError as err:
                    faults[i] = err

    def _flush_values(
        self,
        g: GroupArrays,
        idx: list[int],
        values: list[Any],
        target: Any,
        write: Callable[[tuple[int, ...], Any], None],
        leaf: bool,
        field: str,
        faults: dict[int, EnvError],
        finite: bool = True,
        rows: np.ndarray | slice | None = None,
    ) -> None:
        """Write ``values`` at flat indices ``idx`` (``rows``: the same, as from ``g.rows``)."""
        if not idx:
            return
        if leaf and self._bulk(target, g.rows(idx) if rows is None else rows, values, finite):
            return
        for f, value in zip(idx, values, strict=True):
            i, j = divmod(f, g.n)
            if i in faults:
                continue
            try:
                write((i, j), value)
            except WriteError as err:
                faults[i] = self._error(
                    i, f"{field}{err.where} of agent {g.agents[j]!r}: expected {err.expected}"
                )

    def _flush_states(self, faults: dict[int, EnvError]) -> None:
        envs, values = self.states
        write = self._state_write
        if not envs or write is None:
            return
        if isinstance(self._state_tree, ArraySpec) and self._bulk(
            self.arrays["state"], envs, values, True
        ):
            return
        for i, value in zip(envs, values, strict=True):
            if i in faults:
                continue
            try:
                write((i,), value)
            except WriteError as err:
                faults[i] = self._error(i, f"state{err.where}: expected {err.expected}")

    def _bulk(
        self, target: Any, index: np.ndarray | list[int] | slice, values: list[Any], finite: bool
    ) -> bool:
        """Write ``values`` at ``index`` with one operation, if every one fits; else
        write nothing and return ``False`` (the caller then finds the bad ones)."""
        stacked = self._stack(target, values, finite)
        if stacked is not None:
            target[index] = stacked
        return stacked is not None

    def _stack(self, target: Any, values: list[Any], finite: bool) -> np.ndarray | None:
        """``values`` (arrays) as one array to write into rows of ``target``, if every one
        fits: the right shape, real numbers its dtype holds (finite with ``check_finite``
        where ``finite``); else ``None``."""
        for value in values:
            if type(value) is not np.ndarray:
                return None
        try:
            stacked = np.asarray(values)
            if stacked.shape != (len(values), *target.shape[1:]):
                return None
            if not holds_numbers(stacked):
                return None
            if stacked.dtype != target.dtype:
                stacked = exactly_as(stacked, target.dtype)
        except (TypeError, ValueError, OverflowError, RuntimeWarning):
            return None
        finite = finite and self.check_finite and stacked.dtype.kind == "f"
        return None if finite and not is_finite(stacked) else stacked

    # -- judging an env's values ---------------------------------------------------------

    def _error(self, i: int, message: str) -> EnvError:
        return EnvError(self.offset + i, message)

    def _unknown(self, i: int, agent: Any, field: str) -> NoReturn:
        raise self._error(
            i,
            f"{field} names agent {agent!r}, which is not one of possible_agents {list(self.slot)}",
        )

    def _check_dicts(self, i: int, call: str, parts: dict[str, Any]) -> None:
        for name, part in parts.items():
            if not isinstance(part, Mapping):
                raise self._error(
                    i,
                    f"{call} must return {len(parts)} dicts ({', '.join(parts)}), "
                    f"but {name} is {describe(part)}",
                )

    def _real(self, i: int, agent: str, reward: Any) -> float:
        """``reward`` as a float, if the packer takes it for one (:func:`packed_reward`)."""
        value = packed_reward(reward)
        if value is None:
            raise self._error(
                i, f"reward of agent {agent!r}: expected a real number, got {describe(reward)}"
            )
        if self.check_finite and not is_finite(value):
            raise self._error(
                i, f"reward of agent {agent!r}: expected a finite number, got {value}"
            )
        return value

    def _flag(self, i: int, agent: str, ended: str, flag: Any) -> bool:
        """``flag`` as a bool, if the packer takes it for one (:func:`packed_flag`)."""
        value = packed_flag(flag)
        if value is not None:
            return value
        field = _END_FLAGS[ended][1]
        raise self._error(i, f"{field} of agent {agent!r}: expected a bool, got {describe(flag)}")

    def _info(self, i: int, infos: Mapping[str, Any], agent: str, key: str) -> Any:
        """``infos[agent][key]``, or ``None`` where there is none."""
        info = infos.get(agent)
        if info is None:
            return None
        try:
            return info.get(key)
        except AttributeError:
            raise self._error(
                i, f"info of agent {agent!r}: expected a dict, got {describe(info)}"
            ) from None


_EVERY = slice(None)  # every row of an array

# The batch array of each end flag -> the dict that holds it and its name in messages.
_END_FLAGS = {
    "terminated": ("terminations", "termination"),
    "truncated": ("truncations", "truncation"),
}


def _of_envs(idx: list[int], envs: list[int], n: int) -> Any:
    """The flat indices ``idx`` (agents of groups of ``n``) of the envs ``envs``."""
    flat = np.asarray(idx, np.intp)
    return flat[np.isin(flat // n, envs)]
