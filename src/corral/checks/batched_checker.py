"""The conformance checker of batched envs: plays ``E`` copies and lists every way they break
the protocol of :class:`corral.BatchedEnv`.

:func:`check_batched_env` resets every copy with ``reset(seed=seed)`` and steps them all with
seeded random legal actions, leaving each copy whose episode ended idle for one step (it must
stay ended: an env never resets a copy by itself) before restarting it with
``reset(where=...)``. Every reset and step is checked against the rules of a
:class:`~corral.BatchedStep` (fields, shapes, dtypes and place; acting implies alive; masks;
no revival; rewards of ended agents are 0; ...). Then the same seed is played again (the env
must be deterministic), once more with one running copy restarted in the middle (the other
copies' episodes must go on untouched), once more with other values in the action entries of
agents that are not acting (the env must ignore them) and, given the dict env it implements,
each copy ``i`` is replayed on that env seeded ``seed + i`` (it must give the same arrays).

Messages read like :mod:`corral.checks.env_checker`'s and name the call, the copy and the
agent, e.g. ``"step 4, copy 1: agent 'prey_0' (group 'prey') was revived after its episode
ended at step 2"``.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays import Place
from corral.arrays.tree import index, map_space, map_tree, tree_leaves
from corral.checks.batched_rules import (
    ENV_RULES,
    FRAME_RULES,
    PLACE_RULES,
    READ_RULES,
    RESET_RULES,
    STEP_RULES,
    Frame,
    Layout,
    Track,
    any_alive,
    read_frame,
    row,
)
from corral.checks.engine import (
    STEP_CAP,
    CheckReport,
    EnvFailed,
    Findings,
    attempt,
    concluded,
    mask_of,
    reset_env,
    spaces_of,
    step_env,
)
from corral.checks.env_rules import (
    max_episode_steps_is_a_step_count,
    possible_agents_are_unique_ids,
    spaces_are_fixed_gymnasium_spaces,
)
from corral.returned_values import describe
from corral.vector.layout import ArraySpec, Tree, array_tree

NUM_ENVS = 4
"""Copies :func:`check_batched_env` builds when given an id."""

RTOL, ATOL = 1e-5, 1e-6
"""How close a float of a batched env must be to its dict env's (integers and flags: equal)."""


@dataclass
class BatchedCheckReport(CheckReport):
    """What :func:`check_batched_env` found: ``ok`` when ``violations`` is empty.

    ``steps`` counts batched steps (each steps every copy); ``episodes`` the episodes that
    ended, over all copies.
    """

    num_envs: int = 0
    place: Place = field(default_factory=Place)
    compared: bool = False
    """Whether each copy was compared with the dict env seeded ``seed + i``."""

    @property
    def head(self) -> str:
        where = "numpy" if not self.place.is_torch else f"torch on {self.place.device}"
        twin = ", compared with its dict env" if self.compared else ""
        return (
            f"{self.env} (batched: {self.num_envs} copies, {where}{twin}; seed {self.seed}, "
            f"{self.steps} steps, {self.episodes} episodes)"
        )

    @property
    def unchecked(self) -> str:
        if self.complete:
            return ""
        return (
            f"no copy's episode ended within {self.steps} steps, so the rules about how an "
            "episode ends (ended agents are not alive and earn 0, a copy stays ended until "
            "reset(where=...) restarts it) were not checked; raise step_cap (corral check "
            "--step-cap) or make the env's episodes shorter"
        )


def check_batched_env(
    env: Any,
    *,
    seed: int = 0,
    max_steps: int = 300,
    episodes: int = 2,
    step_cap: int = STEP_CAP,
    num_envs: int = NUM_ENVS,
    array: str = "numpy",
    device: str = "cpu",
    dict_env: Callable[[], Any] | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    raise_on_error: bool = True,
) -> BatchedCheckReport:
    """Check ``env`` (a :class:`~corral.BatchedEnv`, or an id with a batched implementation)
    against the batched-env protocol.

    Plays until every copy has ended ``episodes`` episodes or ``max_steps`` batched steps
    are taken, and on past ``max_steps`` (up to ``step_cap``) until some copy's episode
    ends; the report is not :attr:`~CheckReport.complete` (and a
    :class:`CheckIncompleteWarning` says so) if none did. ``dict_env`` builds the dict env
    the batched one implements (a class or any function of no arguments): copy ``i`` must
    then equal it seeded ``seed + i``, under the same actions, over every episode played.
    An id is built with ``num_envs`` copies in ``array`` on ``device`` (``env_kwargs``
    added) and closed at the end; its own dict env is the default ``dict_env``. Raises
    :class:`~corral.errors.EnvContractError` listing the violations if there are any and
    ``raise_on_error`` is true.
    """
    from corral.registry import make, spec

    built = isinstance(env, str)
    name = env if built else type(env).__name__
    if built:
        found = spec(env)
        kwargs = dict(env_kwargs or {})
        if dict_env is None and found.entry_point is not None:
            dict_env = functools.partial(make, env, **kwargs)
        env = found.make_batched(num_envs, array=array, device=device, **kwargs)
    try:
        report = _BatchedChecker(env, seed).run(name, max_steps, episodes, step_cap, dict_env)
    finally:
        if built:
            env.close()
    return concluded(report, name, raise_on_error)


# --------------------------------------------------------------------------- actions


class _Sampler:
    """Random actions of one agent in one copy, from its own seeded generator."""

    def __init__(self, space: spaces.Space, seed: list[int]) -> None:
        self._rng = np.random.default_rng(seed)
        self._space = space
        if not isinstance(space, spaces.Discrete):
            self._space = copy.deepcopy(space)
            self._space.seed(int(self._rng.integers(2**31)))

    def sample(self, mask: np.ndarray | None) -> Any:
        """An action, legal under a (usable) mask; draws the same amount whatever the mask."""
        space = self._space
        if not isinstance(space, spaces.Discrete):
            return space.sample()
        u = self._rng.random()
        legal = np.flatnonzero(mask) if mask is not None and mask.any() else np.arange(space.n)
        return int(space.start) + int(legal[int(u * len(legal))])


class _Actions:
    """Seeded random actions of every copy, legal under the masks of acting agents.

    Each (copy, agent) draws from its own generator, so a copy's actions depend only on
    its own masks; with ``other``, the entries of agents that are not acting are drawn
    from other generators.
    """

    def __init__(self, layout: Layout, seed: int, other: bool) -> None:
        self._layout = layout
        self._main: dict[tuple[int, str], _Sampler] = {}
        self._other: dict[tuple[int, str], _Sampler] = {}
        for n, (g, _, agent) in enumerate(layout.agents()):
            for i in range(layout.num_envs):
                space = layout.actions[g]
                self._main[i, agent] = _Sampler(space, [seed, i, n])
                if other:
                    self._other[i, agent] = _Sampler(space, [seed, i, n, 1])

    def __call__(self, track: Track) -> dict[str, Any]:
        """``{group: [E, n_g, ...] numpy actions}``."""
        actions = {}
        for g, agents in self._layout.groups.items():
            rows = []
            for i in range(self._layout.num_envs):
                row = []
                for k, agent in enumerate(agents):
                    acting = bool(track.acting[g][i, k])
                    mask = track.masks[g][i, k] if acting and g in track.masks else None
                    value = self._main[i, agent].sample(mask)
                    if not acting and self._other:
                        value = self._other[i, agent].sample(None)
                    row.append(value)
                rows.append(row)
            actions[g] = _stack(array_tree(self._layout.actions[g]), rows)
        return actions


def _stack(tree: Tree, rows: list[list[Any]]) -> Any:
    """The values ``rows[copy][agent]`` (each laid out as ``tree``) as arrays ``[copy,
    agent, ...]``, nested like ``tree``."""
    shape = (len(rows), len(rows[0]))

    def stack(spec: ArraySpec, *values: Any) -> np.ndarray:
        return np.asarray(values, dtype=spec.dtype).reshape(*shape, *spec.shape)

    return map_tree(stack, tree, *(value for row in rows for value in row))


def _in_place(place: Place, value: Any) -> Any:
    return map_tree(place.asarray, value, mappings=True)


def _dict_action(space: spaces.Space, value: Any) -> Any:
    """One agent's entry of the batched actions, as a dict env takes it."""
    return map_space(_leaf_action, space, value)


def _leaf_action(space: spaces.Space, value: Any) -> Any:
    return int(value) if isinstance(space, spaces.Discrete) else np.array(value)


# --------------------------------------------------------------------------- records


@dataclass
class _Record:
    """One call of a run: per copy it is about, its arrays by label; or what the env raised."""

    where: str
    copies: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    error: str | None = None


Key = tuple[int, int]
"""``(t, 0)``: the reset before step ``t``; ``(t, 1)``: step ``t``; ``(t, -1)``: a probe's
extra reset before step ``t``."""


@dataclass
class _Run:
    records: dict[Key, _Record] = field(default_factory=dict)
    actions: dict[int, dict[str, Any]] = field(default_factory=dict)
    """The (host) actions of each step."""
    running: dict[int, np.ndarray] = field(default_factory=dict)
    """The copies with an agent alive when each step began."""
    episode_steps: dict[int, np.ndarray] = field(default_factory=dict)
    """Each copy's steps into its episode when each step began."""
    steps: int = 0
    episodes: int = 0


def _leaf_items(value: Any, path: str) -> list[tuple[str, Any]]:
    return tree_leaves(value, path, index, mappings=True, lists=True)


class _Labels:
    """Builds the arrays of one copy by label, the same way for a batched and a dict env."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.out: dict[str, np.ndarray] = {}

    def per_agent(self, name: str, value_of: Callable[[str, int, str], Any]) -> None:
        for g, k, agent in self.layout.agents():
            value = value_of(g, k, agent)
            if value is not None:
                for path, leaf in _leaf_items(value, ""):
                    self.out[f"{name}{path} of agent {agent!r}"] = np.array(leaf)

    def state(self, value: Any) -> None:
        for path, leaf in _leaf_items(value, ""):
            self.out[f"state{path}"] = np.array(leaf)


def _batched_record(layout: Layout, frame: Frame, track: Track) -> dict[int, dict]:
    copies = {}
    running = any_alive(frame.alive)
    for i in map(int, np.flatnonzero(frame.rows)):
        labels = _Labels(layout)
        labels.per_agent("alive", _entries(frame.alive, i))
        labels.per_agent("acting", _entries(frame.acting, i))
        labels.per_agent("obs", _entries(frame.obs, i, only=track.observed))
        if frame.reward is not None:
            for name in ("reward", "terminated", "truncated"):
                labels.per_agent(name, _entries(getattr(frame, name), i))
        labels.per_agent("action_mask", _entries(frame.masks, i))
        if layout.state is not None and running[i]:
            labels.state(row(frame.state, i))
        copies[i] = labels.out
    return copies


def _entries(
    arrays: Mapping[str, Any], copy: int, only: Mapping[str, np.ndarray] | None = None
) -> Callable[[str, int, str], Any]:
    """The entry of each agent of ``copy`` (``None`` where ``only`` does not hold)."""

    def entry(g: str, k: int, agent: str) -> Any:
        if g not in arrays or (only is not None and not only[g][copy, k]):
            return None
        return row(arrays[g], copy, k)

    return entry


def _same(a: np.ndarray, b: np.ndarray, close: bool) -> bool:
    if a.shape != b.shape:
        return False
    floats = a.dtype.kind == "f" or b.dtype.kind == "f"
    if close and floats:
        with np.errstate(invalid="ignore"):
            return bool(np.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True))
    return bool(np.array_equal(a, b, equal_nan=floats))


def _show(value: np.ndarray | None) -> str:
    if value is None:
        return "nothing"
    return repr(value.tolist()) if value.size <= 8 else describe(value)


def _label_difference(
    a: dict, b: dict, close: bool
) -> tuple[str, np.ndarray | None, np.ndarray | None] | None:
    """The first label whose arrays differ, with both arrays (``None`` where one lacks it)."""
    for label in list(a) + [label for label in b if label not in a]:
        x, y = a.get(label), b.get(label)
        if x is None or y is None or not _same(x, y, close):
            return label, x, y
    return None


def _versus(found: tuple[str, Any, Any]) -> str:
    label, x, y = found
    return f"{label} ({_show(x)} vs {_show(y)})"


def _first_difference(a: _Run, b: _Run, copies: range | list[int]) -> str | None:
    """``"{where}, copy {i}: {what}"`` of the first place where two runs differ, or ``None``."""
    for key in sorted(set(a.records) | set(b.records)):
        ra, rb = a.records.get(key), b.records.get(key)
        where = (ra or b.records[key]).where
        if (ra and ra.error) or (rb and rb.error):
            first, second = (r.error if r else None for r in (ra, rb))
            if first != second:
                return f"{where}: what the env raised ({first!r} vs {second!r})"
            continue
        for i in copies:
            ca = ra.copies.get(i) if ra else None
            cb = rb.copies.get(i) if rb else None
            if (ca is None) != (cb is None):
                return f"{where}, copy {i}: whether this reset selected the copy"
            found = None if ca is None or cb is None else _label_difference(ca, cb, close=False)
            if found:
                return f"{where}, copy {i}: {_versus(found)}"
    return None


# --------------------------------------------------------------------------- the checker


class _Stop(Exception):
    """The run cannot go on; what stopped it is in its records."""


class _BatchedChecker(Findings):
    def __init__(self, env: Any, seed: int) -> None:
        super().__init__()
        self.env = env
        self.seed = seed

    def run(
        self,
        name: str,
        max_steps: int,
        episodes: int,
        step_cap: int,
        dict_env: Callable[[], Any] | None,
    ) -> BatchedCheckReport:
        self.limits = (max_steps, episodes, max(max_steps, step_cap))
        place = getattr(self.env, "place", None)
        report = BatchedCheckReport(
            name,
            self.seed,
            num_envs=getattr(self.env, "num_envs", 0),
            place=place if isinstance(place, Place) else Place(),
        )
        if not self._playable():
            report.violations = self.violations()
            return report
        main = self._play(check=True)
        try:
            self.check_spaces_unchanged(self.env, self.spaces)
        except EnvFailed as err:
            self.add("env_does_not_raise", str(err))
        self._compare_runs(main)
        if dict_env is not None:
            report.compared = True
            self._compare_with_dict_env(main, dict_env)
        report.steps, report.episodes = main.steps, main.episodes
        report.violations = self.violations()
        return report

    def _playable(self) -> bool:
        """Check the env-wide rules; whether the env can be played."""
        self.apply((possible_agents_are_unique_ids,), self.env)
        if self._messages:
            return False
        try:
            self.spaces = attempt("before reset", "getting the spaces", spaces_of, self.env)
            self.apply((spaces_are_fixed_gymnasium_spaces,), self.env)
            if self._messages:
                return False
            self.apply(ENV_RULES, self.env)
            self.apply((max_episode_steps_is_a_step_count,), self.env)
            if self._messages:
                return False
            self.layout = attempt("before reset", "reading env.groups", Layout.of, self.env)
        except EnvFailed as err:
            self.add("env_does_not_raise", str(err))
            return False
        return True

    # ----------------------------------------------------------------------- playing

    def _play(
        self,
        steps: int | None = None,
        *,
        check: bool = False,
        other: bool = False,
        restart: tuple[int, int] | None = None,
    ) -> _Run:
        """Play from ``reset(seed)``, checking the rules if ``check``.

        ``steps``: exactly that many steps (else the limits of :meth:`run`); ``other``: other
        actions for agents that are not acting; ``restart``: ``(t, copy)``, reset that copy
        alone before step ``t``.
        """
        layout, run = self.layout, _Run()
        track, policy = Track.empty(layout), _Actions(layout, self.seed, other)
        everything = np.ones(layout.num_envs, bool)
        try:
            self._reset(run, track, (0, 0), "reset", everything, check, self.seed)
            t = 0
            while not self._enough(run, track, t, steps):
                if restart is not None and t == restart[0]:
                    self._restart(run, track, *restart)
                due = (track.over_since >= 0) & (track.over_since <= t - 2)
                if due.any():
                    where = f"reset(where=...) before step {t}"
                    self._reset(run, track, (t, 0), where, due, check)
                self._step(run, track, t, policy, check)
                t += 1
        except _Stop:
            pass
        return run

    def _restart(self, run: _Run, track: Track, t: int, copy: int) -> None:
        """Reset the running ``copy`` alone, seeded as its first reset was (the rules are
        checked on this call alone: the main run restarts only ended copies)."""
        rows = np.arange(self.layout.num_envs) == copy
        seeds: list[int | None] = [None] * self.layout.num_envs
        seeds[copy] = self.seed + copy
        where = f"reset(seed=[...], where=...) of a running copy before step {t}"
        self._reset(run, track, (t, -1), where, rows, check=True, seed=seeds)

    def _enough(self, run: _Run, track: Track, t: int, steps: int | None) -> bool:
        if steps is not None:
            return t >= steps
        max_steps, episodes, cap = self.limits
        if t >= cap or (track.episodes >= episodes).all():
            return True
        return t >= max_steps and run.episodes > 0

    def _reset(
        self,
        run: _Run,
        track: Track,
        key: Key,
        where: str,
        rows: np.ndarray,
        check: bool = False,
        seed: int | list[int | None] | None = None,
    ) -> None:
        mask = None if key == (0, 0) else self.layout.place.asarray(rows)
        call = f"env.reset(seed={seed}{'' if mask is None else ', where=...'})"
        result = self._call(
            run, key, where, call, lambda: self.env.reset(seed=seed, where=mask), check
        )
        frame = self._read(run, key, where, result, False, rows, check)
        frame.episode_steps = np.zeros(self.layout.num_envs, np.int64)
        frame.stood = track
        if check:
            self.apply(FRAME_RULES + RESET_RULES, self.layout, frame)
        track.after_reset(frame, key[0])
        run.records[key] = _Record(where, _batched_record(self.layout, frame, track))

    def _step(self, run: _Run, track: Track, t: int, policy: _Actions, check: bool) -> None:
        layout = self.layout
        actions = policy(track)
        run.actions[t] = actions
        run.steps += 1  # a replay tries as many steps, the failed one included
        running = track.running()
        run.running[t], run.episode_steps[t] = running, track.episode_steps.copy()
        where = f"step {t}"
        placed = _in_place(layout.place, actions)
        result = self._call(run, (t, 1), where, "env.step", lambda: self.env.step(placed), check)
        frame = self._read(run, (t, 1), where, result, True, np.ones(layout.num_envs, bool), check)
        frame.before = track
        frame.episode_steps = track.episode_steps + running
        if check:
            self.apply(FRAME_RULES + STEP_RULES, layout, frame)
        over = track.after_step(frame, t)
        run.episodes += int(over.sum())
        run.records[t, 1] = _Record(where, _batched_record(layout, frame, track))

    def _call(
        self, run: _Run, key: Key, where: str, what: str, fn: Callable[[], Any], check: bool
    ) -> Any:
        try:
            return attempt(where, f"{what}", fn)
        except EnvFailed as err:
            run.records[key] = _Record(where, error=err.message)
            if check:
                self.add("env_does_not_raise", str(err))
            raise _Stop from err

    def _read(
        self,
        run: _Run,
        key: Key,
        where: str,
        result: Any,
        is_step: bool,
        rows: np.ndarray,
        check: bool,
    ) -> Frame:
        """``result`` as a frame; stops the run if its fields cannot be read."""
        for rule in READ_RULES:
            found = list(rule(self.layout, result, where, is_step))
            if found:
                run.records[key] = _Record(where, error=found[0])
                if check:
                    for message in found:
                        self.add(rule.__name__, message)
                raise _Stop
        if check:
            self.apply(PLACE_RULES, self.layout, result, where, is_step)
        return read_frame(self.layout, result, where, rows)

    # ----------------------------------------------------------------------- comparing

    def _compare_runs(self, main: _Run) -> None:
        every = range(self.layout.num_envs)
        replay = self._play(main.steps)
        if self._differs(
            "same_seed_same_arrays",
            _first_difference(main, replay, every),
            f"differs between two runs that both call reset(seed={self.seed}) and take the "
            "same actions; the env must be deterministic given the seed",
        ):
            return
        restart = _restart_point(main)
        if restart is not None:
            t, restarted = restart
            probe = self._play(main.steps, restart=restart)
            self._differs(
                "reset_where_restarts_only_the_selected_copies",
                _first_difference(main, probe, [i for i in every if i != restarted]),
                f"differs from a run that did not restart copy {restarted} alone with "
                f"reset(where=...) before step {t}; reset(where=mask) must start new episodes "
                "only in the selected copies, leaving the others' episodes as they were",
            )
            again, first = probe.records.get((t, -1)), main.records[0, 0]
            difference = None
            if again is not None:
                found = _label_difference(
                    again.copies.get(restarted, {}), first.copies[restarted], close=False
                )
                if found is not None:
                    difference = f"{again.where}, copy {restarted}: {_versus(found)}"
            self._differs(
                "reset_where_restarts_the_selected_copies",
                difference,
                f"differs from the copy's first reset(seed={self.seed}); a copy that "
                f"reset(seed=[...], where=mask) selects with the seed {self.seed + restarted} "
                "must start the episode that reset(seed=s) started in it, even mid-episode",
            )
        probe = self._play(main.steps, other=True)
        self._differs(
            "actions_of_idle_agents_are_ignored",
            _first_difference(main, probe, every),
            "differs from a run whose actions differ only in the entries of agents that are "
            "not acting; step must ignore those entries",
        )

    def _differs(self, rule: str, difference: str | None, message: str) -> bool:
        if difference is not None:
            self.add(rule, f"{difference} {message}")
        return difference is not None

    def _compare_with_dict_env(self, main: _Run, make: Callable[[], Any]) -> None:
        from corral.adapters import adapt

        try:
            env = attempt("before reset", "building the dict env", lambda: adapt(make()))
        except EnvFailed as err:
            self.add("copies_equal_the_dict_env", str(err))
            return
        try:
            possible = list(self.env.possible_agents)
            if sorted(env.possible_agents) != sorted(possible):
                self.add(
                    "copies_equal_the_dict_env",
                    f"the dict env's possible_agents {list(env.possible_agents)} differ from "
                    f"the batched env's {possible}",
                )
                return
            for i in range(self.layout.num_envs):
                self._compare_copy(env, main, i)
        finally:
            env.close()

    def _compare_copy(self, env: Any, main: _Run, i: int) -> None:
        """Replay copy ``i`` of ``main`` on the dict env ``env``; report the first difference."""
        twin = _DictTwin(self.layout, env)
        for key in sorted(main.records):
            record = main.records[key]
            if record.error is not None:
                return
            mine = record.copies.get(i)
            if mine is None:
                continue
            seed = self.seed + i if key == (0, 0) else None
            try:
                if key[1] == 0:
                    theirs = twin.reset(seed, record.where)
                else:
                    theirs = twin.step(main.actions[key[0]], i, record.where)
            except EnvFailed as err:
                self.add(
                    "copies_equal_the_dict_env",
                    f"{err.where}, copy {i}: the dict env: {err.message}",
                )
                return
            found = _label_difference(mine, theirs, close=True)
            if found:
                label, x, y = found
                self.add(
                    "copies_equal_the_dict_env",
                    f"{record.where}, copy {i}: {label} is {_show(x)}, but the dict env (seeded "
                    f"{self.seed + i}) gives {_show(y)}; copy i of reset(seed=s) must equal "
                    "the dict env reset with seed s + i, and follow it under the same actions",
                )
                return


def _restart_point(run: _Run) -> tuple[int, int] | None:
    """``(t, 0)``: a step before which copy 0 is in its episode, as is another copy."""
    for t in sorted(run.running):
        running = run.running[t]
        if running[0] and run.episode_steps[t][0] >= 1 and running[1:].any():
            return t, 0
    return None


class _DictTwin:
    """A dict env played along one copy, its results labelled like the copy's arrays."""

    def __init__(self, layout: Layout, env: Any) -> None:
        self.layout = layout
        self.env = env
        self.acting: list = []
        self.last: dict[Any, Any] = {}
        self.index = {a: (g, k) for g, k, a in layout.agents()}

    def reset(self, seed: int | None, where: str) -> dict[str, np.ndarray]:
        obs, infos = reset_env(self.env, seed, where)
        self.last = {}
        return self._labels(obs, infos, None, where)

    def step(self, actions: dict[str, Any], copy: int, where: str) -> dict[str, np.ndarray]:
        if not self.env.agents:  # the copy's episode is over: it stays so
            return self._labels({}, {}, ({}, {}, {}), where)
        mine = {}
        for agent in self.acting:
            g, k = self.index[agent]
            mine[agent] = _dict_action(self.layout.actions[g], row(actions[g], copy, k))
        obs, rewards, terms, truncs, infos = step_env(self.env, mine, where)
        return self._labels(obs, infos, (rewards, terms, truncs), where)

    def _labels(
        self, obs: dict, infos: dict, step: tuple | None, where: str
    ) -> dict[str, np.ndarray]:
        self.acting = list(obs)
        alive = set(self.env.agents)
        ended = (
            []
            if step is None
            else [a for a in {**step[1], **step[2]} if step[1].get(a) or step[2].get(a)]
        )
        self.last.update(obs)
        for agent in ended:
            info = infos.get(agent)
            if isinstance(info, Mapping) and "final_obs" in info:
                self.last[agent] = info["final_obs"]
        labels = _Labels(self.layout)
        labels.per_agent("alive", lambda g, k, a: a in alive)
        labels.per_agent("acting", lambda g, k, a: a in obs)
        labels.per_agent("obs", lambda g, k, a: self.last.get(a))
        if step is not None:
            labels.per_agent("reward", lambda g, k, a: float(step[0].get(a, 0.0)))
            labels.per_agent("terminated", lambda g, k, a: bool(step[1].get(a, False)))
            labels.per_agent("truncated", lambda g, k, a: bool(step[2].get(a, False)))
        labels.per_agent("action_mask", lambda g, k, a: self._mask(g, a, obs, infos))
        if self.layout.state is not None and alive:
            labels.state(attempt(where, "env.state()", self.env.state))
        return labels.out

    def _mask(self, g: str, agent: str, obs: dict, infos: dict) -> np.ndarray | None:
        n = self.layout.discrete.get(g)
        if n is None:
            return None
        mask = mask_of(infos, agent) if agent in obs else None
        return np.ones(n, bool) if mask is None else np.asarray(mask).astype(bool)
