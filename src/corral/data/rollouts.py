"""Time-major rollouts and GAE as a masked reverse scan.

A :class:`Rollout` holds one group's experience of ``T`` vector steps as
arrays ``[T, E, n, ...]`` (NumPy or torch, on the batches' device), written
by a :class:`RolloutBuilder` without a loop over envs or agents. Row ``t`` is
the step taken from the batch acted on at ``t``: ``obs[t]``, ``acting[t]``,
``action[t]``, ``value[t]`` are that batch's, ``reward[t]``,
``terminated[t]``, ``truncated[t]`` those of the batch the step returned.

Decisions are per-agent transitions (which the row-by-row assembler of the
tests, ``tests/oracles/transitions.py``, the oracle of this module, makes):
agent ``i`` of env ``e`` decided at ``t`` where ``acting[t, e, i]``; that
decision earns ``reward[t..u]``, where ``u >= t`` is the first step at which
the agent's episode ends (``terminated``/``truncated``) or after which it
acts again (``acting[u + 1]``, or ``next_acting`` for ``u = T - 1``). A
decision still open after the last step (a turn-based or asynchronous agent
waiting for its turn) is *incomplete* here: the builder carries it into the
next rollout's row 0 (``carried``), with the reward it has earned so far
added to ``reward[0]``, where it completes exactly as the assembler's row
would. Rewards earned before an agent's first decision of an episode, or
after it died, belong to no decision.

Usage::

    builder = RolloutBuilder(venv, steps=T)
    batch = venv.reset(seed=0)
    for t in range(T):
        actions, value = policy(batch)          # value: {group: [E, n]}
        builder.act(batch, actions, value, log_prob=...)
        batch = venv.step(actions)
        builder.observe(batch, final_value=...)  # optional: bootstraps truncations
    rollouts = builder.finish(next_value)        # {group: Rollout}, value of batch's obs
    advantage, returns, complete = masked_gae(rollouts[g], gamma, lam)

An off-policy learner passes no values and builds the builder with
``record_next=True``: each rollout then also holds, per step, what the step
returned for every agent (``Rollout.next``: the next observation, with the
final one where the env ended, and the next state, action mask and acting
flag), from which :func:`decisions` makes the assembler's transitions as
arrays, ready to write into a :class:`~corral.data.replay.Replay`.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from corral.arrays import ops_of, zeros
from corral.arrays.tree import leaf_keys, leaves_of, map_tree, tree_leaves

if TYPE_CHECKING:
    from corral.vector.protocols import Batch, Groups


@dataclass
class Rollout:
    """One group's ``T`` vector steps, time-major: ``[T, E, n, ...]`` unless said otherwise.

    ``obs`` (and ``next["obs"]``) is laid out as the batches' observations: an array, or a
    dict or tuple of arrays (a ``Dict`` or ``Tuple`` space), stored leaf by leaf.

    ``reward[t]`` is what each agent earned in step ``t`` (``Batch.reward``);
    where ``carried``, ``reward[0]`` also holds what the carried decision
    earned before this rollout. ``truncated[t]``: the agent's episode was cut
    short in step ``t`` (the agent was truncated, or its env ended without
    terminating it), as ``Transitions["truncated"]``. ``final_value[t]``: the
    value of the agent's next observation where ``truncated[t]`` (0 where not
    bootstrapped). ``next_value``/``next_acting`` ``[E, n]``: the value of
    each agent's observation after the last step and whether it acts there.
    ``carried`` ``[E, n]``: row 0 holds a decision carried over from the
    previous rollout (its ``obs``, ``action``, ``value`` and extras are that
    decision's). ``state`` ``[T, E, ...]`` and ``action_mask`` are ``None``
    where the batches had none; ``extras`` are the per-decision arrays passed
    to :meth:`RolloutBuilder.act` (a policy's ``log_prob``, say). ``state`` is
    per env, so a carried decision's state is ``carried_state`` ``[E, n, ...]``
    (``None`` without states), not ``state[0]``. ``value``, ``final_value`` and
    ``next_value`` are ``None`` where the learner passed no values. ``decision``
    (int64): each agent's decision index in its episode (``Batch.decision``;
    ``None`` where the batches had none).

    ``next`` (filled only by a builder with ``record_next=True``): per step,
    what the batch the step returned holds for the next decision, as the
    assembler's transitions see it: ``obs`` ``[T, E, n, ...]`` (``final_obs``
    where the env ended at the step), ``acting`` (false where the env ended),
    ``action_mask`` (all legal where the env ended) and, with states,
    ``state`` ``[T, E, ...]`` (``final_state`` where the env ended).
    """

    obs: Any
    action: Any
    acting: Any
    alive: Any
    reward: Any
    terminated: Any
    truncated: Any
    value: Any
    final_value: Any
    next_value: Any
    next_acting: Any
    carried: Any
    state: Any = None
    action_mask: Any = None
    extras: dict[str, Any] = field(default_factory=dict)
    carried_state: Any = None
    next: dict[str, Any] = field(default_factory=dict)
    decision: Any = None

    @property
    def steps(self) -> int:
        return int(self.acting.shape[0])


def masked_gae(rollout: Rollout, gamma: float, lam: float) -> tuple[Any, Any, Any]:
    """Advantages, returns and the ``complete`` mask of every decision, ``[T, E, n]`` each.

    The same numbers as the row-wise GAE of the tests' oracle over the assembler's
    rows: each agent's own decisions form its sequence, discounted by
    ``gamma`` per decision; terminated decisions bootstrap nothing, truncated
    ones from ``final_value``, the last of the rollout from ``next_value``.
    ``complete`` marks the decisions to learn from: those an agent made
    (``acting``) and that did not stay open past the last step (these are
    carried into the next rollout; their advantage here bootstraps from
    ``next_value`` and feeds no earlier decision). Elsewhere advantages are 0.
    """
    xp = ops_of(rollout.reward).xp
    acting, reward, value = rollout.acting, rollout.reward, rollout.value
    ended = rollout.terminated | rollout.truncated
    boot_at_end = xp.where(rollout.terminated, xp.zeros_like(value), rollout.final_value)
    # closes[s]: the decision running at s closes because the agent acts again at s + 1.
    closes = xp.zeros_like(acting)
    closes[:-1] = acting[1:] & ~ended[:-1]
    advantage = xp.zeros_like(value)
    complete = xp.zeros_like(acting)
    zero = xp.zeros_like(value[0])
    acc = zero  # reward earned from step s to the end of the running decision
    boot = rollout.next_value  # the value its end bootstraps from
    carry = zero  # the advantage of the agent's next decision
    open_ = ~rollout.next_acting  # the running decision stays open past the last step
    for s in range(rollout.steps - 1, -1, -1):
        if s + 1 < rollout.steps:
            after = closes[s]
            boot = xp.where(after, value[s + 1], boot)
            carry = xp.where(after, xp.where(complete[s + 1], advantage[s + 1], zero), carry)
            acc = xp.where(after, zero, acc)
            open_ = open_ & ~after
        boot = xp.where(ended[s], boot_at_end[s], boot)
        carry = xp.where(ended[s], zero, carry)
        acc = xp.where(ended[s], zero, acc) + reward[s]
        open_ = open_ & ~ended[s]
        delta = acc + gamma * boot - value[s]
        advantage[s] = xp.where(acting[s], delta + gamma * lam * carry, zero)
        complete[s] = acting[s] & ~open_
    return advantage, advantage + value, complete


PER_ENV = frozenset({"next_value", "next_acting", "carried", "carried_state"})
"""The fields of a :class:`Rollout` whose first axis is the envs (the others' is the steps)."""


def concat_envs(parts: list[Rollout]) -> Rollout:
    """The rollouts ``parts`` of the same steps on different envs as one rollout of all their
    envs, in order (``[T, E1 + E2 + ..., ...]``): what several rollout workers collected
    with the same weights, as one rollout of one collector that stepped all of their envs.

    Each part was finished on its own envs (bootstrap values, carried decisions), which
    no other env's rows touch, so the joined rollout holds what a builder of all the envs
    would have recorded."""
    if not parts:
        raise ValueError("concat_envs needs at least one rollout")
    if len({p.steps for p in parts}) > 1:
        raise ValueError(f"rollouts of different steps: {[p.steps for p in parts]}")
    first = parts[0]

    def joined(name: str, values: list[Any]) -> Any:
        axis = 0 if name in PER_ENV else 1
        if name == "carried_state":
            values = _carried_states(parts)
        if values[0] is None:
            return None
        return map_tree(lambda *leaves: ops_of(leaves[0]).concat(list(leaves), axis), *values)

    changes = {
        f.name: joined(f.name, [getattr(p, f.name) for p in parts])
        for f in fields(Rollout)
        if f.name not in ("extras", "next")
    }
    for name in ("extras", "next"):  # per step, each of them
        changes[name] = {
            key: joined(key, [getattr(p, name)[key] for p in parts]) for key in getattr(first, name)
        }
    return Rollout(**changes)


def _carried_states(parts: list[Rollout]) -> list[Any]:
    """The parts' ``carried_state``; where some carried no decision (``None``: a worker
    whose envs just started) and others did, zeros in its place, which its ``carried``
    (all false) masks."""
    states = [p.carried_state for p in parts]
    present = next((s for s in states if s is not None), None)
    if present is None:
        return states
    return [
        map_tree(lambda a, p=p: zeros(a, (p.carried.shape[0], *a.shape[1:])), present)
        if s is None
        else s
        for p, s in zip(parts, states, strict=True)
    ]


class RolloutBuilder:
    """Writes batches into one :class:`Rollout` per group, ``steps`` vector steps each.

    Arrays live where the batches' do (NumPy or torch, their device); each
    rollout gets fresh arrays, so a returned :class:`Rollout` stays valid.
    ``record_next``: also record :attr:`Rollout.next` (what replay rows need
    and on-policy learners do not).
    """

    def __init__(self, venv: Groups, steps: int, *, record_next: bool = False) -> None:
        if steps < 1:
            raise ValueError(f"a rollout needs at least one step, got steps={steps}")
        self.steps = int(steps)
        self.record_next = bool(record_next)
        self.num_envs = int(venv.num_envs)
        self.groups = {g: tuple(agents) for g, agents in venv.groups.items()}
        self.reset()

    @property
    def full(self) -> bool:
        """Whether ``steps`` steps are recorded: :meth:`finish` is due."""
        return self._t >= self.steps

    @property
    def recorded(self) -> int:
        """The vector steps recorded in the rollout being built (0 between rollouts)."""
        return self._t

    def reset(self) -> None:
        """Forget open decisions and any partly recorded rollout (call after ``venv.reset()``)."""
        self._t = 0
        self._acted = False
        self._data: dict[str, dict[str, Any]] = {}
        self._extras: dict[str, dict[str, Any]] = {}
        self._state: Any = None
        self._next: dict[str, dict[str, Any]] = {}  # record_next: Rollout.next per group
        self._next_state: Any = None
        # Per group [E, n]: the agent's decision is open, at which row, and what it earned so far.
        self._open: dict[str, Any] = {}
        self._row: dict[str, Any] = {}
        self._earned: dict[str, Any] = {}
        self._next_acting: dict[str, Any] = {}
        self._carry: dict[str, dict[str, Any]] = {}  # decisions carried into the next rollout
        self._carried: dict[str, Any] = {}  # the current rollout's row-0 carried decisions
        self._carried_state: dict[str, Any] = {}

    def _store(self, g: str, name: str, x: Any, store: dict[str, Any] | None = None) -> None:
        """Write ``x`` (an array ``[E, n, ...]``, or a dict or tuple of them: a ``Dict``
        observation) at row ``t`` of ``name``, leaf by leaf."""
        store = self._data[g] if store is None else store
        lead = (self.num_envs, len(self.groups[g]))
        leaves = tree_leaves(x, name)
        for path, leaf in leaves:
            if not hasattr(leaf, "shape"):
                raise TypeError(
                    f"group {g!r}: {path} must be an array [E, n, ...] (or a dict or tuple of "
                    f"them), got {type(leaf).__name__}"
                )
            if tuple(leaf.shape[:2]) != lead:
                raise ValueError(
                    f"group {g!r}: {path} has shape {tuple(leaf.shape)}, expected [E, n, ...] "
                    f"with E={self.num_envs} envs and n={lead[1]} agents {self.groups[g]}"
                )
        if name not in store:
            store[name] = map_tree(lambda leaf: zeros(leaf, (self.steps, *leaf.shape)), x)
        try:
            targets = [target for _, target in leaves_of(x, store[name])]
        except (KeyError, IndexError, TypeError):
            targets = []
        if not all(hasattr(target, "shape") for target in targets) or len(targets) != len(leaves):
            raise ValueError(
                f"group {g!r}: {name} is laid out unlike its first step's ({_layout(store[name])})"
            )
        for (path, leaf), target in zip(leaves, targets, strict=True):
            if tuple(leaf.shape) != tuple(target.shape[1:]):
                raise ValueError(
                    f"group {g!r}: {path} has shape {tuple(leaf.shape)}, expected "
                    f"{tuple(target.shape[1:])} (num_envs={self.num_envs}, "
                    f"agents={self.groups[g]})"
                )
            target[self._t] = leaf

    def act(
        self,
        batch: Batch,
        actions: Mapping[str, Any],
        value: Mapping[str, Any] | None = None,
        **extras: Mapping[str, Any],
    ) -> None:
        """Record step ``t``'s decisions: ``batch`` acted on, every agent's action and value.

        ``actions``, ``value`` and each of ``extras`` are per-group arrays
        ``[E, n, ...]`` in the batch's namespace (only acting agents' entries count);
        ``value`` may be omitted by a learner that needs none (no :func:`masked_gae`).
        """
        if self._acted:
            raise RuntimeError("act() twice without observe(): call observe(batch) after a step")
        if self._t >= self.steps:
            raise RuntimeError(f"the rollout is full ({self.steps} steps): call finish()")
        if batch.state is not None:
            if self._state is None:
                self._state = zeros(batch.state, (self.steps, *batch.state.shape))
            self._state[self._t] = batch.state
        decision = getattr(batch, "decision", None)  # the vector layer's (a test's may lack it)
        for g in self.groups:
            self._data.setdefault(g, {})
            self._extras.setdefault(g, {})
            fields = {
                "obs": batch.obs[g],
                "acting": batch.acting[g],
                "alive": batch.alive[g],
                "action": actions[g],
            }
            if value is not None:
                fields["value"] = value[g]
            if g in batch.action_mask:
                fields["action_mask"] = batch.action_mask[g]
            if decision is not None:
                fields["decision"] = decision[g]
            for name, x in fields.items():
                self._store(g, name, x)
            for name, per_group in extras.items():
                self._store(g, name, per_group[g], self._extras[g])
            acting = batch.acting[g]
            if g not in self._open:
                self._open[g] = zeros(acting, tuple(acting.shape), np.bool_)
                self._row[g] = zeros(acting, tuple(acting.shape), np.int64)
                # what an open decision earned, in the values' dtype (else the rewards')
                like = batch.reward[g] if value is None else value[g]
                self._earned[g] = zeros(like, tuple(acting.shape))
            if self._t == 0 and g in self._carry:
                self._restore(g, self._carry.pop(g))
            xp = ops_of(acting).xp
            self._open[g] = self._open[g] | acting
            self._row[g] = xp.where(acting, self._t, self._row[g])
            self._earned[g] = xp.where(acting, xp.zeros_like(self._earned[g]), self._earned[g])
        self._acted = True

    def _restore(self, g: str, carry: dict[str, Any]) -> None:
        """Write the decisions carried from the last rollout into row 0."""
        xp, where = ops_of(carry["mask"]).xp, carry["mask"]
        self._carried_state[g] = carry["state"]
        # the fields and the extras apart: an extra may share a field's name ("decision")
        for arrays, kept in ((self._data[g], carry["fields"]), (self._extras[g], carry["extras"])):
            for name, saved in kept.items():
                map_tree(functools.partial(_write_row0, xp, where), arrays[name], saved)
        self._data[g]["acting"][0] = self._data[g]["acting"][0] | where
        self._carried[g] = where
        self._row[g] = xp.where(where, 0, self._row[g])

    def observe(self, batch: Batch, final_value: Mapping[str, Any] | None = None) -> None:
        """Record what step ``t`` returned; ``final_value`` bootstraps truncated decisions.

        ``final_value[g]`` ``[E, n]``: the value of each agent's next observation
        (``final_obs`` where the env is done) where its episode was cut short;
        omitted, truncated decisions bootstrap nothing.
        """
        if not self._acted:
            raise RuntimeError("observe() without act(): record the step's actions first")
        t = self._t
        for g in self.groups:
            reward = batch.reward[g]
            xp = ops_of(reward).xp
            terminated = batch.terminated[g]
            done = batch.done[:, None]
            truncated = batch.truncated[g] | (done & ~terminated)
            if t == 0 and g in self._carried:
                # The carried decisions' earlier rewards, added first as the assembler does.
                reward = xp.where(self._carried[g], self._earned[g] + reward, reward)
            self._store(g, "reward", reward)
            self._store(g, "terminated", terminated)
            self._store(g, "truncated", truncated)
            if "value" in self._data[g]:
                fv = xp.zeros_like(reward) if final_value is None else final_value[g]
                self._store(g, "final_value", fv)
            if self.record_next:
                self._record_next(g, batch)
            open_ = self._open[g]
            self._earned[g] = xp.where(open_, self._earned[g] + batch.reward[g], self._earned[g])
            self._open[g] = open_ & ~(terminated | truncated | batch.acting[g])
            self._next_acting[g] = batch.acting[g]
        if self.record_next and batch.state is not None:
            done = batch.done.reshape(-1, *([1] * (batch.state.ndim - 1)))
            state = ops_of(done).where(done, batch.final_state, batch.state)
            if self._next_state is None:
                self._next_state = zeros(state, (self.steps, *state.shape))
            self._next_state[t] = state
        self._t += 1
        self._acted = False

    def _record_next(self, g: str, batch: Batch) -> None:
        """Step ``t``'s :attr:`Rollout.next` fields of group ``g``, as the assembler's rows."""
        store = self._next.setdefault(g, {})
        xp, done = ops_of(batch.done).xp, batch.done[:, None]
        obs = map_tree(
            lambda x, final: xp.where(_widen(done, x.ndim), final, x),
            batch.obs[g],
            batch.final_obs[g],
        )
        self._store(g, "obs", obs, store)
        self._store(g, "acting", batch.acting[g] & ~done, store)
        if g in batch.action_mask:
            # no mask comes with a final observation: every action counts as legal there
            self._store(g, "action_mask", batch.action_mask[g] | done[..., None], store)

    def finish(self, next_value: Mapping[str, Any] | None = None) -> dict[str, Rollout]:
        """The rollouts of the steps recorded so far; ``next_value``: values after the last one
        (omitted by a learner that passed no values).

        Decisions still open are carried into the next rollout's row 0.
        """
        if self._acted:
            raise RuntimeError("finish() between act() and observe()")
        if self._t == 0:
            raise RuntimeError("finish() before any step was recorded")
        t = self._t
        out: dict[str, Rollout] = {}
        for g in self.groups:
            data, extras = self._data[g], self._extras[g]
            cut = {name: map_tree(lambda x: x[:t], tree) for name, tree in data.items()}
            acting = cut["acting"]
            out[g] = Rollout(
                obs=cut["obs"],
                action=cut["action"],
                acting=acting,
                alive=cut["alive"],
                reward=cut["reward"],
                terminated=cut["terminated"],
                truncated=cut["truncated"],
                value=cut.get("value"),
                final_value=cut.get("final_value"),
                next_value=None if next_value is None else next_value[g],
                next_acting=self._next_acting[g],
                carried=self._carried.get(g, zeros(acting, tuple(acting.shape[1:]))),
                state=None if self._state is None else self._state[:t],
                action_mask=cut.get("action_mask"),
                decision=cut.get("decision"),
                extras={name: map_tree(lambda x: x[:t], tree) for name, tree in extras.items()},
                carried_state=self._carried_state.get(g),
                next=self._finished_next(g, t),
            )
            self._save_open(g, data, extras)
        self._data, self._extras, self._state = {}, {}, None
        self._next, self._next_state = {}, None
        self._carried, self._carried_state = {}, {}
        self._t = 0
        return out

    def _finished_next(self, g: str, t: int) -> dict[str, Any]:
        if not self.record_next:
            return {}
        out = {name: map_tree(lambda x: x[:t], tree) for name, tree in self._next[g].items()}
        if self._next_state is not None:
            out["state"] = self._next_state[:t]
        return out

    def _save_open(self, g: str, data: Mapping[str, Any], extras: Mapping[str, Any]) -> None:
        """Keep the fields and extras of ``g``'s open decisions for the next rollout's row 0."""
        mask = self._open[g]  # not tested for any(): that would read a device back
        ops = ops_of(mask)
        n_env, n = mask.shape
        env = ops.arange(n_env, mask).reshape(-1, 1)  # made there: no copy from the host
        agent = ops.arange(n, mask).reshape(1, -1)

        def kept(arrays: Mapping[str, Any]) -> dict[str, Any]:
            names = [name for name in arrays if name not in _STEP_OUTPUTS and name != "acting"]
            at = (self._row[g], env, agent)
            return {name: map_tree(lambda x: x[at], arrays[name]) for name in names}

        state = None if self._state is None else self._state[self._row[g], env]
        fields, extra = kept(data), kept(extras)
        self._carry[g] = {"mask": mask, "fields": fields, "extras": extra, "state": state}


def _widen(mask: Any, ndim: int) -> Any:
    """``mask`` ``[E, n]`` with axes of length 1 appended up to ``ndim`` axes."""
    return mask.reshape(*mask.shape, *([1] * (ndim - mask.ndim)))


def _write_row0(xp: Any, where: Any, array: Any, saved: Any) -> None:
    """Row 0 of ``array`` ``[T, E, n, ...]`` takes ``saved`` ``[E, n, ...]`` where ``where``."""
    array[0] = xp.where(_widen(where, array.ndim - 1), saved, array[0])


def _layout(tree: Any) -> str:
    """The keys down to each leaf of ``tree``, for an error message."""
    return ", ".join("/".join(map(str, keys)) or "an array" for keys in leaf_keys(tree))


_STEP_OUTPUTS = ("reward", "terminated", "truncated", "final_value")
"""Fields written by :meth:`RolloutBuilder.observe`: a carried decision does not take them."""


def decisions(
    rollout: Rollout, fields: Collection[str] | None = None
) -> tuple[dict[str, Any], Any]:
    """Every decision of ``rollout`` as the assembler's transition, at the place it was made.

    Returns, per field, an array ``[T, E, n, ...]`` whose ``[t, e, i]`` is the
    row of the decision agent ``i`` of env ``e`` made at step ``t``, and the
    mask ``[T, E, n]`` of the *complete* decisions (made, and ended within the
    rollout; elsewhere the rows mean nothing). The fields are those of
    :data:`~corral.data.replay.Transitions`: ``obs``, ``action``,
    ``reward`` (summed over the decision, in the assembler's order),
    ``next_obs``, ``terminated``, ``truncated``, ``next_acting``, with masks
    ``action_mask`` and ``next_action_mask``, with states ``state`` and
    ``next_state`` (per agent), ``decision`` (the decision's index in its agent's
    episode, where recorded), and every extra; ``fields`` picks some of them
    (default: all). Needs a rollout recorded with ``record_next=True``. No
    loop over envs or agents and no read of the device: the rows are gathered
    at each decision's last step.
    """
    if not rollout.next:
        raise ValueError("decisions() needs a rollout from RolloutBuilder(..., record_next=True)")
    xp = ops_of(rollout.acting).xp
    steps, num_envs, n = rollout.acting.shape
    acting, nxt = rollout.acting, rollout.next
    # The decision running at step s ends there if the agent's episode ends or it acts next.
    closes = xp.zeros_like(acting)
    closes[:-1] = acting[1:]
    closes[-1] = rollout.next_acting
    closes = closes | rollout.terminated | rollout.truncated
    step, env, agent = (ops_of(acting).arange(size, acting).reshape(shape) for size, shape in (
        (steps, (-1, 1, 1)), (num_envs, (1, -1, 1)), (n, (1, 1, -1))))  # fmt: skip
    at = xp.where(closes, step, steps)  # the first end at or after each step
    if xp is np:
        end = np.minimum.accumulate(at[::-1], axis=0)[::-1]
    else:
        end = at.flip(0).cummin(0).values.flip(0)
    complete = acting & (end < steps)
    last = xp.where(complete, end, step)  # in range everywhere

    available: dict[str, Any] = {
        "obs": lambda: rollout.obs,
        "action": lambda: rollout.action,
        "reward": lambda: _decision_rewards(rollout)[last, env, agent],
        "next_obs": lambda: map_tree(lambda x: x[last, env, agent], nxt["obs"]),
        "terminated": lambda: rollout.terminated[last, env, agent],
        "truncated": lambda: rollout.truncated[last, env, agent],
        "next_acting": lambda: nxt["acting"][last, env, agent],
    }
    if rollout.decision is not None:
        available["decision"] = lambda: rollout.decision
    if rollout.action_mask is not None:
        available["action_mask"] = lambda: rollout.action_mask
        available["next_action_mask"] = lambda: nxt["action_mask"][last, env, agent]
    if rollout.state is not None:
        available["state"] = lambda: _decision_states(rollout)
        available["next_state"] = lambda: nxt["state"][last, env]
    for name, x in rollout.extras.items():
        available[name] = lambda x=x: x
    names = list(available) if fields is None else list(fields)
    unknown = [name for name in names if name not in available]
    if unknown:
        raise KeyError(
            f"the rollout's decisions have no fields {unknown}; known: {list(available)}"
        )
    return {name: available[name]() for name in names}, complete


def decision_rows(
    rollout: Rollout, fields: Collection[str] | None = None, keep: Any = None
) -> dict[str, Any]:
    """The complete decisions of :func:`decisions` (and ``keep`` ``[T, E, n]``) as rows, in the
    order ``(t, e, i)`` of where they were made, with ``env`` and ``agent`` (index in the group).

    On torch this reads the device once (the number of rows)."""
    rows, complete = decisions(rollout, fields)
    if keep is not None:
        complete = complete & keep
    at = ops_of(complete).nonzero(complete)
    out = {name: map_tree(lambda x: x[at], tree) for name, tree in rows.items()}
    out["env"], out["agent"] = at[1], at[2]
    return out


def _decision_rewards(rollout: Rollout) -> Any:
    """``[T, E, n]``: what the decision running at each step earned from its start to there,
    summed forward from 0 as the assembler does (bit for bit)."""
    xp = ops_of(rollout.reward).xp
    total = xp.zeros_like(rollout.reward)
    earned = xp.zeros_like(rollout.reward[0])
    for s in range(rollout.steps):
        earned = xp.where(rollout.acting[s], xp.zeros_like(earned), earned) + rollout.reward[s]
        total[s] = earned
    return total


def _decision_states(rollout: Rollout) -> Any:
    """``[T, E, n, ...]``: the state each decision was made in (a carried one keeps its own)."""
    state = rollout.state
    n = rollout.acting.shape[2]
    ops = ops_of(state)
    shape = (*state.shape[:2], n, *state.shape[2:])
    out = ops.copy(ops.broadcast_to(state[:, :, None], shape))
    if rollout.carried_state is not None:
        carried = rollout.carried.reshape(*rollout.carried.shape, *([1] * (state.ndim - 2)))
        out[0] = ops.where(carried, rollout.carried_state, out[0])
    return out
