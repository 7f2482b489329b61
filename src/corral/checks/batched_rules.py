"""The rules of the batched-env protocol, each a function that yields one message per violation.

A :class:`~corral.BatchedStep` is read into a :class:`Frame` (its arrays on the host, with
what the rules need: the copies it is about, where each copy stood before a step); the
rules judge it copy by copy and agent by agent, and name the call, the copy and the agent,
e.g. ``"step 4, copy 1: agent 'prey_0' (group 'prey') was revived after its episode ended
at step 2"``. :mod:`corral.checks.batched_checker` plays an env and applies them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from corral.arrays import Place, import_torch, place_of, to_numpy, torch_dtype
from corral.arrays.tree import index as indexed
from corral.arrays.tree import leaves_found, map_tree, tree_leaves
from corral.batched_env import BatchedStep
from corral.checks.engine import in_space, is_step_count, spaces_of, unfinite_parts
from corral.errors import GroupError
from corral.returned_values import changed_agents, describe, has_dtype, not_finite
from corral.vector.layout import Tree, array_tree

# --------------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """What the arrays of one env hold: its groups and the spaces of each."""

    num_envs: int
    place: Place
    groups: dict[str, tuple[str, ...]]
    obs: dict[str, spaces.Space]
    actions: dict[str, spaces.Space]
    state: spaces.Space | None
    limit: int | None
    """``env.max_episode_steps`` where it is a step count."""

    @classmethod
    def of(cls, env: Any) -> Layout:
        groups = {g: tuple(agents) for g, agents in env.groups.items()}
        limit = getattr(env, "max_episode_steps", None)
        return cls(
            env.num_envs,
            env.place,
            groups,
            {g: env.observation_space(agents[0]) for g, agents in groups.items()},
            {g: env.action_space(agents[0]) for g, agents in groups.items()},
            env.state_space,
            limit if is_step_count(limit) else None,
        )

    @property
    def discrete(self) -> dict[str, int]:
        """The number of actions of each group with a Discrete action space."""
        return {g: int(s.n) for g, s in self.actions.items() if isinstance(s, spaces.Discrete)}

    def agents(self) -> Iterator[tuple[str, int, str]]:
        """``(group, index in the group, agent)`` of every agent."""
        for g, agents in self.groups.items():
            for k, agent in enumerate(agents):
                yield g, k, agent


def fields(
    layout: Layout, result: BatchedStep, is_step: bool
) -> Iterator[tuple[str, Any, tuple[int, ...], np.dtype]]:
    """``(label, array, expected shape, expected dtype)`` of every array ``result`` owes."""
    E = layout.num_envs
    per_agent = ["alive", "acting"] + (["reward", "terminated", "truncated"] if is_step else [])
    for g, agents in layout.groups.items():
        n = len(agents)
        obs = result.obs.get(g) if isinstance(result.obs, Mapping) else None
        leaves = leaves_found(array_tree(layout.obs[g]), obs, f"obs[{g!r}]", indexed)
        for path, spec, value in leaves:
            yield path, value, (E, n, *spec.shape), spec.dtype
        for name in per_agent:
            values = getattr(result, name)
            dtype = np.dtype(np.float64 if name == "reward" else bool)
            yield f"{name}[{g!r}]", _get(values, g), (E, n), dtype
        mask = _get(result.action_mask, g)
        if g in layout.discrete and mask is not None:
            yield f"action_mask[{g!r}]", mask, (E, n, layout.discrete[g]), np.dtype(bool)
    if layout.state is not None:
        for path, spec, value in leaves_found(
            array_tree(layout.state), result.state, "state", indexed
        ):
            yield path, value, (E, *spec.shape), spec.dtype


def _get(values: Any, key: str) -> Any:
    return values.get(key) if isinstance(values, Mapping) else None


def _describe(value: Any) -> str:
    if type(value).__module__.startswith("torch") and hasattr(value, "device"):
        return f"torch tensor of shape {tuple(value.shape)}, dtype {value.dtype} on {value.device}"
    return describe(value)


def _place_problem(value: Any, place: Place) -> str | None:
    """How ``value`` is not an array of ``place``, or ``None``."""
    if not place.is_torch:
        return None if isinstance(value, np.ndarray) else "a numpy array"
    expected = f"a torch tensor on {place.device}"
    got = place_of(value)
    if not got.is_torch:
        return expected
    torch = import_torch()
    want, have = torch.device(place.device), torch.device(got.device)
    same = want.type == have.type and want.index in (None, have.index)
    return None if same else expected


# --------------------------------------------------------------------------- frames


@dataclass
class Track:
    """Where every copy stands, carried from call to call."""

    groups: dict[str, tuple[str, ...]]
    alive: dict[str, np.ndarray]
    acting: dict[str, np.ndarray]
    masks: dict[str, np.ndarray]
    """Of every discrete group: all True where the env gives no mask."""
    observed: dict[str, np.ndarray]
    """Agents that got an observation in the copy's current episode."""
    episode_steps: np.ndarray
    over_since: np.ndarray
    """The step in which each copy's episode ended; -1 while it goes on."""
    episodes: np.ndarray
    """Episodes each copy has ended."""
    ended_at: dict[tuple[int, str], str] = field(default_factory=dict)
    """``(copy, agent)`` -> where the agent's episode ended, in the copy's episode."""
    obs: dict[str, Any] = field(default_factory=dict)
    """Every group's observation rows as the last call left them (copies on the host; empty
    before the first reset)."""

    @classmethod
    def empty(cls, layout: Layout) -> Track:
        E = layout.num_envs
        flags = {g: np.zeros((E, len(a)), bool) for g, a in layout.groups.items()}
        masks = {
            g: np.ones((E, len(layout.groups[g]), n), bool) for g, n in layout.discrete.items()
        }
        return cls(
            layout.groups,
            {g: f.copy() for g, f in flags.items()},
            {g: f.copy() for g, f in flags.items()},
            masks,
            {g: f.copy() for g, f in flags.items()},
            np.zeros(E, np.int64),
            np.full(E, -1),
            np.zeros(E, np.int64),
        )

    def running(self) -> np.ndarray:
        """``[E]``: the copies with an agent alive."""
        return any_alive(self.alive)

    def after_reset(self, frame: Frame, t: int) -> None:
        """Take in the copies a reset before step ``t`` selected."""
        rows = frame.rows
        for g in self.alive:
            self.alive[g][rows] = frame.alive[g][rows]
            self.acting[g][rows] = frame.acting[g][rows]
            self.observed[g][rows] = frame.acting[g][rows]
        for g in self.masks:
            self.masks[g][rows] = frame.masks[g][rows]
        self.episode_steps[rows] = 0
        # a copy the reset left without a live agent counts as ended just before step t
        self.over_since[rows] = np.where(any_alive(frame.alive)[rows], -1, t - 1)
        for i, agent in [key for key in self.ended_at if rows[key[0]]]:
            del self.ended_at[i, agent]
        self.obs = _copied(frame.obs)

    def after_step(self, frame: Frame, t: int) -> np.ndarray:
        """Take in step ``t``; returns ``[E]``, the copies whose episode ended in it."""
        # Every agent alive ended: the episode is over, even in an env that (wrongly)
        # restarts the copy itself, unless an agent new to the episode joined.
        left = any_alive({g: self.alive[g] & ~frame.ended(g) for g in self.alive})
        over = self.running() & (~any_alive(frame.alive) | (~left & ~self._joined(frame)))
        for g, agents in self.groups.items():
            for i, k in np.argwhere(self.alive[g] & ~frame.alive[g]):
                self.ended_at[int(i), agents[k]] = frame.where
            self.observed[g] |= frame.acting[g] | frame.ended(g)
        self.alive, self.acting, self.masks = frame.alive, frame.acting, frame.masks
        self.obs = _copied(frame.obs)
        self.episode_steps = frame.steps
        self.over_since[over] = t
        self.episodes += over
        return over

    def _joined(self, frame: Frame) -> np.ndarray:
        """``[E]``: copies where an agent alive for the first time in the episode joined."""
        joined = np.zeros(len(self.episodes), bool)
        for g, agents in self.groups.items():
            for i, k in np.argwhere(frame.alive[g] & ~self.alive[g]):
                joined[i] |= (int(i), agents[k]) not in self.ended_at
        return joined


def _copied(obs: dict[str, Any]) -> dict[str, Any]:
    """Host copies of observation rows (an env may write its next ones over the same arrays)."""
    return {g: map_tree(np.copy, value, mappings=True, lists=True) for g, value in obs.items()}


def changed_rows(now: Any, then: Any) -> np.ndarray:
    """``[E, n]``: the agents whose observation differs between two of a group's observation
    values (nested alike; NaN equals NaN)."""
    changed: np.ndarray | None = None
    for (_, a), (_, b) in zip(
        tree_leaves(now, mappings=True, lists=True),
        tree_leaves(then, mappings=True, lists=True),
        strict=True,
    ):
        rows = changed_agents(a, b)
        changed = rows if changed is None else changed | rows
    assert changed is not None
    return changed


def any_alive(alive: dict[str, np.ndarray]) -> np.ndarray:
    return np.any([a.any(axis=1) for a in alive.values()], axis=0)


@dataclass
class Frame:
    """What one ``reset`` or ``step`` returned, on the host, with what the rules need."""

    where: str
    rows: np.ndarray
    """The copies this call is about: every copy for a step, the selected ones for a reset."""
    obs: dict[str, Any]
    alive: dict[str, np.ndarray]
    acting: dict[str, np.ndarray]
    masks: dict[str, np.ndarray]
    given_masks: frozenset[str]
    reward: dict[str, np.ndarray] | None = None
    terminated: dict[str, np.ndarray] | None = None
    truncated: dict[str, np.ndarray] | None = None
    state: Any = None
    before: Track | None = None
    """Where the copies stood when the step began; ``None`` for a reset."""
    stood: Track | None = None
    """For a reset: where the copies stood before it (those it does not select stay so)."""
    episode_steps: np.ndarray | None = None
    same_alive: bool = False
    """The step's promise that no copy's ``alive`` changed in it."""

    @property
    def start(self) -> Track:
        """:attr:`before` of a step's frame (the step rules read steps only)."""
        if self.before is None:
            raise TypeError(f"{self.where}: a reset's frame has no start of a step")
        return self.before

    @property
    def rewards(self) -> dict[str, np.ndarray]:
        """:attr:`reward` of a step's frame."""
        if self.reward is None:
            raise TypeError(f"{self.where}: a reset's frame has no rewards")
        return self.reward

    @property
    def steps(self) -> np.ndarray:
        """:attr:`episode_steps` of a step's frame."""
        if self.episode_steps is None:
            raise TypeError(f"{self.where}: a reset's frame has no episode steps")
        return self.episode_steps

    def at(self, copy: int) -> str:
        return f"{self.where}, copy {copy}"

    def ended(self, g: str) -> np.ndarray:
        """``[E, n_g]``: agents whose episode ends in this step."""
        if self.terminated is None or self.truncated is None:
            return np.zeros_like(self.alive[g])
        return self.terminated[g] | self.truncated[g]


def _host(tree: Tree, value: Any) -> Any:
    return map_tree(lambda _, leaf: to_numpy(leaf), tree, value)


def read_frame(layout: Layout, result: BatchedStep, where: str, rows: np.ndarray) -> Frame:
    """``result`` on the host; its arrays were found to have their shapes."""

    def flags(values: Any) -> dict[str, np.ndarray]:
        return {g: to_numpy(values[g]).astype(bool) for g in layout.groups}

    masks = {
        g: to_numpy(result.action_mask[g]).astype(bool)
        if g in result.action_mask
        else np.ones((layout.num_envs, len(layout.groups[g]), n), bool)
        for g, n in layout.discrete.items()
    }
    frame = Frame(
        where,
        rows,
        {g: _host(array_tree(layout.obs[g]), result.obs[g]) for g in layout.groups},
        flags(result.alive),
        flags(result.acting),
        masks,
        frozenset(g for g in layout.discrete if g in result.action_mask),
    )
    frame.same_alive = result.same_alive is True
    if result.reward is not None:
        frame.reward = {g: to_numpy(result.reward[g]).astype(np.float64) for g in layout.groups}
        frame.terminated = flags(result.terminated)
        frame.truncated = flags(result.truncated)
    if layout.state is not None:
        frame.state = _host(array_tree(layout.state), result.state)
    return frame


def row(value: Any, *index: int) -> Any:
    """The entry at ``index`` of each leaf of a nested value."""
    return map_tree(lambda leaf: leaf[index], value, mappings=True, lists=True)


def cells(frame: Frame, flags: Mapping[str, np.ndarray], layout: Layout):
    """``(copy, group, index, agent)`` where ``flags`` holds, in the frame's copies."""
    for g, agents in layout.groups.items():
        for i, k in np.argwhere(flags[g] & frame.rows[:, None]):
            yield int(i), g, int(k), agents[k]


def _who(agent: str, g: str) -> str:
    return f"agent {agent!r} (group {g!r})"


# --------------------------------------------------------------------------- rules

Rule = Callable[[Layout, Frame], Iterator[str]]


def _acting_agents_are_alive(layout: Layout, frame: Frame) -> Iterator[str]:
    idle = {g: frame.acting[g] & ~frame.alive[g] for g in layout.groups}
    for i, g, _, agent in cells(frame, idle, layout):
        yield (
            f"{frame.at(i)}: {_who(agent, g)} is acting but not alive; acting implies alive "
            "(an agent whose episode ended cannot act)"
        )


def _copies_that_go_on_ask_an_agent(layout: Layout, frame: Frame) -> Iterator[str]:
    stuck = frame.rows & any_alive(frame.alive) & ~any_alive(frame.acting)
    for i in np.flatnonzero(stuck):
        yield (
            f"{frame.at(int(i))}: agents are alive but none is acting; a copy whose episode "
            "goes on must ask at least one agent to act, or it can never end"
        )


def _reset_starts_an_episode(layout: Layout, frame: Frame) -> Iterator[str]:
    if frame.before is None:
        for i in np.flatnonzero(frame.rows & ~any_alive(frame.alive)):
            yield (
                f"{frame.at(int(i))}: no agent is alive after the reset; reset must start an "
                "episode in every copy it selects"
            )


def _observed(layout: Layout, frame: Frame) -> Iterator[tuple[int, str, str, str, Any]]:
    """``(copy, group, agent, what, value)`` of each observation an agent gets in the frame."""
    for what, flags in (
        ("observation", frame.acting),
        ("final observation", {g: frame.ended(g) for g in layout.groups}),
    ):
        for i, g, k, agent in cells(frame, flags, layout):
            yield i, g, agent, what, row(frame.obs[g], i, k)


def _obs_in_observation_spaces(layout: Layout, frame: Frame) -> Iterator[str]:
    for i, g, agent, what, value in _observed(layout, frame):
        space = layout.obs[g]
        if not in_space(space, value):
            yield (
                f"{frame.at(i)}: {what} of {_who(agent, g)} is not in its observation space "
                f"{space}: got {describe(value)}"
            )


def _observations_are_finite(layout: Layout, frame: Frame) -> Iterator[str]:
    for i, g, agent, what, value in _observed(layout, frame):
        for path, problem in unfinite_parts(layout.obs[g], value, ""):
            yield f"{frame.at(i)}: {what}{path} of {_who(agent, g)}: expected {problem}"


def _masks_allow_an_action(layout: Layout, frame: Frame) -> Iterator[str]:
    empty = {g: np.zeros_like(a) for g, a in frame.acting.items()}
    for g in frame.given_masks:
        empty[g] = frame.acting[g] & ~frame.masks[g].any(axis=2)
    for i, g, _, agent in cells(frame, empty, layout):
        yield (
            f"{frame.at(i)}: action_mask of {_who(agent, g)} is all False; an acting agent "
            "must have at least one legal action"
        )


def _masks_of_idle_agents_are_all_true(layout: Layout, frame: Frame) -> Iterator[str]:
    partial = {g: np.zeros_like(a) for g, a in frame.acting.items()}
    for g in frame.given_masks:
        partial[g] = ~frame.acting[g] & ~frame.masks[g].all(axis=2)
    for i, g, k, agent in cells(frame, partial, layout):
        forbidden = np.flatnonzero(~frame.masks[g][i, k]).tolist()
        yield (
            f"{frame.at(i)}: action_mask of {_who(agent, g)} forbids actions {forbidden}, but "
            "the agent is not acting; the mask rows of agents that are not acting are all True"
        )


def _state_parts(layout: Layout, frame: Frame) -> Iterator[tuple[int, Any]]:
    """``(copy, state)`` of the frame's copies whose episode goes on (an ended one owes none)."""
    if layout.state is not None:
        for i in np.flatnonzero(frame.rows & any_alive(frame.alive)):
            yield int(i), row(frame.state, int(i))


def _state_in_state_space(layout: Layout, frame: Frame) -> Iterator[str]:
    space = layout.state
    if space is None:  # no state: nothing to check
        return
    for i, state in _state_parts(layout, frame):
        if not in_space(space, state):
            yield (
                f"{frame.at(i)}: state is not in env.state_space {layout.state}: "
                f"got {describe(state)}"
            )


def _state_is_finite(layout: Layout, frame: Frame) -> Iterator[str]:
    space = layout.state
    if space is None:
        return
    for i, state in _state_parts(layout, frame):
        for path, problem in unfinite_parts(space, state, ""):
            yield f"{frame.at(i)}: state{path}: expected {problem}"


def _unselected_copies_stand_as_they_were(layout: Layout, frame: Frame) -> Iterator[str]:
    stood = frame.stood
    if stood is None or not stood.obs:
        return
    kept = ~frame.rows
    for g, agents in layout.groups.items():
        changed = changed_rows(frame.obs[g], stood.obs[g]) | (frame.alive[g] != stood.alive[g])
        for i, k in np.argwhere(changed & kept[:, None]):
            yield (
                f"{frame.at(int(i))}: reset(where=...) did not select the copy but changed "
                f"the observation or alive flag of {_who(agents[k], g)}; a reset returns the "
                "copies it does not select as they stood (the vector layer refuses an env "
                "whose reset ignores where)"
            )


FRAME_RULES: tuple[Rule, ...] = (
    _acting_agents_are_alive,
    _copies_that_go_on_ask_an_agent,
    _reset_starts_an_episode,
    _obs_in_observation_spaces,
    _observations_are_finite,
    _masks_allow_an_action,
    _masks_of_idle_agents_are_all_true,
    _state_in_state_space,
    _state_is_finite,
)
"""Rules checked on what every ``reset`` and ``step`` returns, in the copies it is about."""


def _rewards_are_finite(layout: Layout, frame: Frame) -> Iterator[str]:
    bad = {g: not_finite(frame.rewards[g]) for g in layout.groups}
    for i, g, k, agent in cells(frame, bad, layout):
        yield (
            f"{frame.at(i)}: reward of {_who(agent, g)} is {frame.rewards[g][i, k]}; rewards "
            "must be finite"
        )


def _ended_copies_stay_ended(layout: Layout, frame: Frame) -> Iterator[str]:
    over = frame.start.over_since >= 0
    for i in np.flatnonzero(over & any_alive(frame.alive)):
        alive = [a for g, k, a in layout.agents() if frame.alive[g][i, k]]
        yield (
            f"{frame.at(int(i))}: agents {alive} are alive again, but the copy's episode ended "
            f"at step {frame.start.over_since[i]} and reset(where=...) did not select it; an "
            "env never resets a copy by itself (no autoreset): an ended copy stays ended"
        )


def _no_revived_agents(layout: Layout, frame: Frame) -> Iterator[str]:
    before = frame.start
    back = {g: frame.alive[g] & ~before.alive[g] for g in layout.groups}
    for i, g, _, agent in cells(frame, back, layout):
        ended_at = before.ended_at.get((i, agent))
        if ended_at is not None and before.over_since[i] < 0:
            yield (
                f"{frame.at(i)}: {_who(agent, g)} was revived after its episode ended at {ended_at}"
            )


def _ended_agents_earn_nothing(layout: Layout, frame: Frame) -> Iterator[str]:
    paid = {  # a NaN is reported by _rewards_are_finite
        g: ~frame.start.alive[g] & (frame.rewards[g] != 0) & ~not_finite(frame.rewards[g])
        for g in layout.groups
    }
    for i, g, k, agent in cells(frame, paid, layout):
        yield (
            f"{frame.at(i)}: reward of {_who(agent, g)} is {frame.rewards[g][i, k]}, but the "
            f"agent was not alive when the step began{_since(frame, i, agent)}; an agent that "
            "is not alive earns 0"
        )


def _since(frame: Frame, copy: int, agent: str) -> str:
    ended_at = frame.start.ended_at.get((copy, agent))
    return f" (its episode ended at {ended_at})" if ended_at else ""


def _only_live_agents_end(layout: Layout, frame: Frame) -> Iterator[str]:
    for name in ("terminated", "truncated"):
        flags = getattr(frame, name)
        late = {g: ~frame.start.alive[g] & flags[g] for g in layout.groups}
        for i, g, _, agent in cells(frame, late, layout):
            yield (
                f"{frame.at(i)}: {name} of {_who(agent, g)} is True, but the agent was not "
                f"alive when the step began{_since(frame, i, agent)}; {name} marks the step in "
                "which an agent's episode ends"
            )


def _ended_agents_are_not_alive(layout: Layout, frame: Frame) -> Iterator[str]:
    stays = {g: frame.ended(g) & frame.alive[g] for g in layout.groups}
    for i, g, _, agent in cells(frame, stays, layout):
        yield (
            f"{frame.at(i)}: {_who(agent, g)} ended (terminated or truncated) but is still "
            "alive; an agent whose episode ends in a step is not alive after it"
        )


def _agents_leave_only_by_ending(layout: Layout, frame: Frame) -> Iterator[str]:
    gone = {g: frame.start.alive[g] & ~frame.alive[g] & ~frame.ended(g) for g in layout.groups}
    for i, g, _, agent in cells(frame, gone, layout):
        yield (
            f"{frame.at(i)}: {_who(agent, g)} was alive when the step began and is not alive "
            "after it, but neither terminated nor truncated is set"
        )


def _same_alive_is_true(layout: Layout, frame: Frame) -> Iterator[str]:
    if not frame.same_alive:
        return
    changed = {g: frame.alive[g] != frame.start.alive[g] for g in layout.groups}
    for i, g, k, agent in cells(frame, changed, layout):
        yield (
            f"{frame.at(i)}: the step says same_alive=True, but alive of {_who(agent, g)} "
            f"went from {bool(frame.start.alive[g][i, k])} to {bool(frame.alive[g][i, k])}; "
            "same_alive promises that no agent ended or joined in the step (the vector layer "
            "then looks for no ended episode, and records this one a step late, if at all)"
        )


def _episode_ends_within_max_episode_steps(layout: Layout, frame: Frame) -> Iterator[str]:
    limit = layout.limit
    if limit is None:
        return
    for i in np.flatnonzero(any_alive(frame.alive) & (frame.episode_steps == limit)):
        yield (
            f"{frame.at(int(i))}: the episode goes on after {limit} steps, but "
            f"env.max_episode_steps is {limit}; an episode must end within max_episode_steps"
        )


def _agents_that_do_not_act_keep_their_observation(layout: Layout, frame: Frame) -> Iterator[str]:
    before = frame.start
    if not before.obs:
        return
    for g, agents in layout.groups.items():
        kept = ~frame.acting[g] & ~frame.ended(g)
        for i, k in np.argwhere(kept & changed_rows(frame.obs[g], before.obs[g])):
            yield (
                f"{frame.at(int(i))}: the observation of {_who(agents[k], g)} changed, but "
                "it neither acts next nor ended in the step; an agent keeps its last "
                "observation until it acts again (an ended agent's stays its final one)"
            )


STEP_RULES: tuple[Rule, ...] = (
    _rewards_are_finite,
    _ended_copies_stay_ended,
    _no_revived_agents,
    _ended_agents_earn_nothing,
    _only_live_agents_end,
    _ended_agents_are_not_alive,
    _agents_leave_only_by_ending,
    _same_alive_is_true,
    _episode_ends_within_max_episode_steps,
    _agents_that_do_not_act_keep_their_observation,
)
"""Rules checked on what every ``step`` returns."""

RESET_RULES: tuple[Rule, ...] = (_unselected_copies_stand_as_they_were,)
"""Rules checked on what a ``reset(where=...)`` returns for the copies it does not select."""


# --------------------------------------------------------------------------- what a call returns

CallRule = Callable[[Layout, Any, str, bool], Iterator[str]]


def _every_field_is_returned(layout: Layout, result: Any, where: str, is_step: bool):
    call = "step" if is_step else "reset"
    if not isinstance(result, BatchedStep):
        yield f"{where}: env.{call} must return a corral.BatchedStep, got {_describe(result)}"
        return
    groups = list(layout.groups)
    names = ["obs", "alive", "acting"] + (["reward", "terminated", "truncated"] if is_step else [])
    for name in names:
        values = getattr(result, name)
        if not isinstance(values, Mapping):
            yield f"{where}: {name} must be a dict of arrays, one per group {groups}, got " + (
                _describe(values)
            )
            continue
        missing = [g for g in groups if g not in values]
        if missing:
            yield f"{where}: {name} has no array for group(s) {missing}; it holds one per group"
    if not isinstance(result.action_mask, Mapping):
        got = _describe(result.action_mask)
        yield f"{where}: action_mask must be a dict of arrays, one per discrete group, got {got}"
        return
    for g in result.action_mask:
        if g not in layout.discrete:
            space = layout.actions.get(g)
            why = "is no group" if space is None else f"has the action space {space}"
            yield (
                f"{where}: action_mask holds group {g!r}, which {why}; only groups with a "
                "Discrete action space have masks"
            )
    if layout.state is not None and result.state is None:
        yield f"{where}: state is None, but env.state_space is {layout.state}"


def _arrays_have_their_shapes(layout: Layout, result: Any, where: str, is_step: bool):
    for label, value, shape, _ in fields(layout, result, is_step):
        got = getattr(value, "shape", None)
        if got is None or tuple(got) != shape:
            yield (
                f"{where}: {label} must be an array of shape {shape} ([copies, agents of the "
                f"group, ...]), got {_describe(value)}"
            )


def _arrays_have_their_dtypes_and_place(
    layout: Layout, result: Any, where: str, is_step: bool
) -> Iterator[str]:
    place = layout.place
    for label, value, _, dtype in fields(layout, result, is_step):
        problem = _place_problem(value, place)
        if problem is not None:
            yield (
                f"{where}: {label} must be {problem}, where the env's arrays live "
                f"(env.place is {place}), got {_describe(value)}"
            )
        elif not has_dtype(value, dtype):
            expected = torch_dtype(dtype) if place.is_torch else dtype
            yield f"{where}: {label} must have dtype {expected}, got {_describe(value)}"


READ_RULES: tuple[CallRule, ...] = (_every_field_is_returned, _arrays_have_their_shapes)
"""Rules on what a call returns; the checker cannot read a result that breaks one."""

PLACE_RULES: tuple[CallRule, ...] = (_arrays_have_their_dtypes_and_place,)
"""Rules on the dtype and place of every array a call returns."""


# --------------------------------------------------------------------------- env-wide rules


def _num_envs_is_a_copy_count(env: Any) -> Iterator[str]:
    if not is_step_count(getattr(env, "num_envs", None)):
        yield (
            "env.num_envs must be a positive int (the number of copies), got "
            f"{describe(getattr(env, 'num_envs', None))}"
        )


def _place_is_a_place(env: Any) -> Iterator[str]:
    place = getattr(env, "place", None)
    if not isinstance(place, Place):
        yield (
            "env.place must be a corral.Place (Place('numpy') or Place('torch', device)), "
            f"got {describe(place)}"
        )


def _groups_partition_the_agents(env: Any) -> Iterator[str]:
    try:
        groups = env.groups
    except GroupError as err:
        yield f"env.groups: {err}"
        return
    if not isinstance(groups, Mapping) or not groups:
        yield f"env.groups must be a dict of group name -> agents, got {describe(groups)}"
        return
    possible = list(env.possible_agents)
    listed = [a for agents in groups.values() for a in agents]
    for agent in possible:
        if listed.count(agent) != 1:
            yield (
                f"env.groups lists agent {agent!r} {listed.count(agent)} times; each of "
                "possible_agents is in exactly one group"
            )
    for agent in dict.fromkeys(a for a in listed if a not in possible):
        yield f"env.groups lists {agent!r}, which is not one of possible_agents {possible}"
    for g, agents in groups.items():
        yield from _group_shares_its_spaces(env, g, list(agents))


def _group_shares_its_spaces(env: Any, g: str, agents: list) -> Iterator[str]:
    if not agents:
        yield f"env.groups[{g!r}] is empty; a group has at least one agent"
    for other in agents[1:]:
        for kind in ("observation_space", "action_space"):
            first, second = getattr(env, kind)(agents[0]), getattr(env, kind)(other)
            if first != second:
                yield (
                    f"env.groups puts {agents[0]!r} and {other!r} in group {g!r}, but their "
                    f"{kind}s differ ({first} vs {second}); the agents of a group share spaces"
                )


def _spaces_have_an_array_layout(env: Any) -> Iterator[str]:
    found = {f"{kind}({agent!r})": space for (kind, agent), space in spaces_of(env).items()}
    state = getattr(env, "state_space", None)
    if state is not None and not isinstance(state, spaces.Space):
        yield f"env.state_space must be a gymnasium space or None, got {describe(state)}"
    elif state is not None:
        found["state_space"] = state
    for name, space in found.items():
        try:
            array_tree(space)
        except TypeError as err:
            yield f"env.{name} is {space}: {err}"


ENV_RULES = (
    _num_envs_is_a_copy_count,
    _place_is_a_place,
    _groups_partition_the_agents,
    _spaces_have_an_array_layout,
)
"""Rules checked once, before playing; the env cannot be played if one is broken."""
