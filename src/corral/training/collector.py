"""Drive a vector env with an algorithm's actions; learning, feed it time-major rollouts.

The :class:`Collector` is corral's one loop of acting and stepping: training
(the runner), greedy evaluation (:func:`evaluate`), rendering, ``corral eval``
and self-play evaluation all play through it. While it learns it records every
vector step into a :class:`~corral.data.rollouts.RolloutBuilder` and hands the
learner one :class:`~corral.data.rollouts.Rollout` per group every
``rollout_steps`` vector steps, with no per-agent rows assembled in Python;
``run(..., learn=False)`` plays without recording or learning. With
several learners (a policy map, see :mod:`corral.training.policy_map`) each
records its own rollouts and learns at their end; fixed policies play the
agents no learner plays. What acting needs to know about the episodes (each
agent's decision index) the batches carry (``Batch.decision``).

On a vector env of torch tensors (``make_vec(..., array="torch")``) the
collector reads nothing back to the host per step (fixed policies of groups
not learned aside: they play on the host): the learner acts and learns on the
batches' device, and the episodes that ended are kept there and read back
once per rollout and at the end of :meth:`Collector.run` (the
:class:`Progress` holds the same numbers as on NumPy), as is the first invalid
action of a vector env that checks them on its device (``deferred_checks``,
which the runner turns on there): it raises then.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from corral.algos.base import Algorithm, FixedPolicy
from corral.arrays import Place, is_tensor, place_of, to_numpy
from corral.data.rollouts import Rollout, RolloutBuilder
from corral.training.policy_map import MAIN, FixedPlayer, Seating
from corral.training.whole_episodes import CutEpisodes, episode_quota, whole_ended

if TYPE_CHECKING:
    from corral.vector.protocols import Batch, EndedEpisodes, VecEnv


@dataclass
class Progress:
    """What a stretch of collection produced."""

    env_steps: int = 0
    """Env steps taken (one per env per vector step)."""
    episode_returns: list[float] = field(default_factory=list)
    """Each whole episode's return of the learned groups, averaged over their agents (an
    episode that a fault cut, ``batch.episode_cut``, is left out)."""
    agent_returns: dict[str, list[float]] = field(default_factory=dict)
    """Each finished episode's return of every agent of the env (learned or not), in the
    order of ``episode_returns``."""
    episode_lengths: list[int] = field(default_factory=list)
    updates: list[dict[str, float]] = field(default_factory=list)
    """The metrics of each update that learned (of a replay learner: took gradient steps)."""
    env_restarts: int = 0
    """Envs restarted after a fault (an env that raised, a dead or late worker)."""
    episodes_cut: int = 0
    """Episodes that faults cut, left out of the returns (counted by :func:`evaluate`)."""
    rollouts_dropped: int = 0
    """Rollouts of rollout workers not learned from (too stale, see ``max_staleness``)."""
    runner_restarts: int = 0
    """Rollout workers replaced after they were lost (died, or missed ``sample_timeout``)."""
    rollouts_lost: int = 0
    """Samples of rollout workers lost with their worker (their partial rollouts dropped)."""

    def joined(self, later: Progress) -> Progress:
        """This stretch followed by ``later``, as one."""
        agents = {
            a: [*self.agent_returns.get(a, []), *later.agent_returns.get(a, [])]
            for a in {**self.agent_returns, **later.agent_returns}
        }
        counts = {f: getattr(self, f) + getattr(later, f) for f in COUNTS}
        return Progress(
            episode_returns=[*self.episode_returns, *later.episode_returns],
            agent_returns=agents,
            episode_lengths=[*self.episode_lengths, *later.episode_lengths],
            updates=[*self.updates, *later.updates],
            **counts,
        )

    def state(self) -> dict[str, Any]:
        """This progress as plain lists, dicts, ints and floats (for a checkpoint)."""
        return {
            "episode_returns": [float(x) for x in self.episode_returns],
            "agent_returns": {a: [float(x) for x in v] for a, v in self.agent_returns.items()},
            "episode_lengths": [int(x) for x in self.episode_lengths],
            "updates": [{k: float(v) for k, v in u.items()} for u in self.updates],
            **{f: int(getattr(self, f)) for f in COUNTS},
        }

    @classmethod
    def from_state(cls, state: Any) -> Progress:
        """The progress :meth:`state` gave as ``state``; ``ValueError`` naming what is wrong
        where ``state`` is not what a progress holds (a file read back may hold anything)."""
        if not isinstance(state, dict) or set(state) != {f.name for f in fields(cls)}:
            raise ValueError(f"a progress holds the fields {[f.name for f in fields(cls)]}")
        numbers = _numbers(state["episode_returns"]) and _numbers(state["episode_lengths"])
        agents = state["agent_returns"]
        by_agent = isinstance(agents, dict) and all(
            isinstance(a, str) and _numbers(v) for a, v in agents.items()
        )
        updates = isinstance(state["updates"], list) and all(
            isinstance(u, dict)
            and all(isinstance(k, str) for k in u)
            and _numbers(list(u.values()))
            for u in state["updates"]
        )
        counts = all(type(state[f]) is int and state[f] >= 0 for f in COUNTS)
        for name, fine in (("returns", numbers), ("agent_returns", by_agent)):
            if not fine:
                raise ValueError(f"its {name} are not lists of numbers")
        if not updates or not counts:
            raise ValueError("its updates or counts are not what a progress holds")
        return cls(**{**state, "agent_returns": dict(agents), "updates": list(state["updates"])})


COUNTS = (
    "env_steps",
    "env_restarts",
    "episodes_cut",
    "rollouts_dropped",
    "runner_restarts",
    "rollouts_lost",
)
"""The fields of a :class:`Progress` that count."""


def _numbers(values: Any) -> bool:
    return isinstance(values, list) and all(type(v) in (int, float) for v in values)


class Collector:
    """Steps ``venv`` with the learners' actions (and fixed policies' for other agents);
    learning, each learner learns from rollouts of its ``rollout_steps`` vector steps.

    ``algo``: the learner, or several by policy id (see
    :mod:`corral.training.policy_map`), each playing whole groups of its own.
    ``fixed`` maps the ids of policies that are not learned to a
    :class:`~corral.training.policy_map.FixedPlayer` (a :data:`FixedPolicy`
    keyed by its group plays that whole group). Episode returns count only the
    learned groups.

    A learner (:class:`~corral.algos.policy.Learner`) is played by its ``policy``:
    ``act`` gives, with its actions, any per-decision arrays it learns from and,
    for a policy with a critic, the extra ``value`` (of every agent's
    observation); ``bootstrap_values`` the values of the batch after a rollout's
    last step (``None``: no values). The learner's ``learn`` learns from the
    rollouts. A decision still
    open when a rollout ends (a turn-based agent waiting for its turn) is
    learned from in the next one.
    """

    def __init__(
        self,
        venv: VecEnv,
        algo: Algorithm | Mapping[str, Algorithm],
        fixed: Mapping[str, FixedPlayer | FixedPolicy] | None = None,
        seed: int | None = None,
        *,
        seating: Seating | None = None,
    ) -> None:
        self.venv = venv
        self.learners: dict[str, Algorithm] = (
            dict(algo) if isinstance(algo, Mapping) else {MAIN: algo}
        )
        self.fixed = {pid: _player(venv, pid, p) for pid, p in (fixed or {}).items()}
        self.seating = seating
        """A policy map by a function of agent and episode: which agents each policy plays
        changes with the episodes (``None``: the learners' and fixed players' own)."""
        self.overridden = [] if seating else _check_cover(venv, self.learners, self.fixed)
        """Agents of learners that fixed policies play instead (to evaluate a learner against
        another run's policy); a collector with any cannot learn."""
        taken = {g: np.zeros(len(venv.groups[g]), dtype=bool) for g in venv.groups}
        for player in [] if seating else self.fixed.values():
            for g, mask in player.slots.items():
                taken[g] |= mask
        learned = [g for learner in self.learners.values() for g in learner.groups]
        self.learned_groups = tuple(g for g in dict.fromkeys(learned) if not taken[g].all())
        """The groups whose returns are the learners': learned and not all played by fixed
        policies instead."""
        self.untaken = {g: ~taken[g] for g in self.learned_groups if taken[g].any()}
        """The agents left to the learners in a learned group that fixed policies play in part
        (the others' returns are not the learners')."""
        self.rng = np.random.default_rng(seed)
        self.batch = venv.reset(seed=seed)
        self.builders: dict[str, RolloutBuilder] = {}
        """Each learner's rollout being recorded; made by the first :meth:`run` that learns."""
        self._taken: dict[str, dict[str, Rollout]] | None = None
        """While :meth:`sample` collects: the rollouts finished so far, by policy id."""
        self._ended: list[tuple[Any, dict[str, Any], Any, Any]] = []
        """Torch batches: each step's ``done``, ``episode_return``, ``episode_length`` and
        ``episode_cut``, on the device until :meth:`_read_episodes`."""
        self.quota: np.ndarray | None = None
        """The whole episodes each env still counts (:func:`evaluate` sets it; ``None``:
        every episode counts)."""
        self.current_progress: Progress | None = None
        """What the :meth:`run` under way has produced so far (``None`` between runs), for a
        checkpoint written during it: at a rollout's end, where its episodes were read."""

    @property
    def algo(self) -> Algorithm:
        """The only learner (a collector of several learners raises ``ValueError``)."""
        if len(self.learners) != 1:
            raise ValueError(f"this collector has several learners: {sorted(self.learners)}")
        return next(iter(self.learners.values()))

    @property
    def builder(self) -> RolloutBuilder | None:
        """The only learner's rollout builder (``None`` before it learned)."""
        return self.builders.get(next(iter(self.learners))) if len(self.learners) == 1 else None

    @property
    def rollout_open(self) -> bool:
        """Whether a rollout is partly collected: its steps would be lost to a checkpoint."""
        return any(b.recorded > 0 for b in self.builders.values())

    def rollout_left(self) -> int:
        """The env steps until no learner's rollout is open (0 where none is open): learners
        of different ``rollout_steps`` close theirs together every so many steps."""
        if not self.rollout_open:
            return 0
        builders = self.builders.values()
        for steps in range(1, math.lcm(*(b.steps for b in builders)) + 1):
            if all((b.recorded + steps) % b.steps == 0 for b in builders):
                return steps * self.venv.num_envs
        raise AssertionError("unreachable: every rollout closes within their lcm")

    def actions(self, batch: Batch, explore: bool) -> tuple[dict[str, Any], dict[str, dict]]:
        """Actions of every group at ``batch`` (the next batch acted on), and each learner's
        extras by policy id."""
        if self.seating is not None:
            self.seating.begin(to_numpy(batch.done))
        place = place_of(batch.done)
        actions: dict[str, Any] = {}
        extras: dict[str, dict] = {}
        for pid, learner in self.learners.items():
            own, extras[pid] = learner.policy.act(batch, explore=explore)
            if self.seating is not None:
                extras[pid]["learner"] = {g: m.copy() for g, m in self.seating.owned[pid].items()}
            for g, theirs in own.items():
                actions[g] = self._merge(place, pid, g, theirs, actions.get(g))
        for pid, player in self.fixed.items():
            for g, theirs in player.actions(batch, place, explore, self.rng).items():
                actions[g] = self._merge(place, pid, g, theirs, actions.get(g))
        return actions, extras

    def _merge(self, place: Place, pid: str, g: str, theirs: Any, others: Any) -> Any:
        """Group ``g``'s actions with ``pid``'s (``theirs``) in the agents it plays."""
        if self.seating is not None:
            mine = self.seating.owned[pid][g]
        elif pid in self.fixed:
            mine = self.fixed[pid].slots[g]
        else:
            return theirs  # a learner of whole groups, before any fixed player
        if others is None or mine.all():
            return theirs
        return _merged(place, mine, theirs, others)

    def run(
        self,
        env_steps: int,
        *,
        learn: bool = True,
        explore: bool | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> Progress:
        """Collect at least ``env_steps`` env steps; ``learn``: exploring, each learner
        learning at the end of each of its rollouts, else acting greedily and recording
        nothing. ``explore`` (default: ``learn``): act exploring all the same.

        ``on_step`` is called after every vector step with the env steps it took.
        """
        if learn and self.overridden:
            raise ValueError(
                f"the agents {self.overridden} are played by both a learner and a fixed policy: "
                "a collector plays so only without learning"
            )
        progress = self.current_progress = Progress()
        try:
            return self._run(progress, env_steps, learn, explore, on_step)
        finally:
            self.current_progress = None

    def _run(
        self,
        progress: Progress,
        env_steps: int,
        learn: bool,
        explore: bool | None,
        on_step: Callable[[int], None] | None,
    ) -> Progress:
        builders = self._builders() if learn else {}
        if not learn:
            for builder in self.builders.values():
                builder.reset()  # a rollout never spans acting without learning
        # worker_restarts only grows: the restarts of the run are its growth over the run
        restarts = self.batch.worker_restarts.sum()
        explore = learn if explore is None else explore
        while progress.env_steps < env_steps:
            actions, extras = self.actions(self.batch, explore=explore)
            for pid, builder in builders.items():
                own = extras[pid]
                value = own.pop("value", None)
                groups = self.learners[pid].groups
                builder.act(self.batch, {g: actions[g] for g in groups}, value, **own)
            self.batch = self.venv.step(actions)
            progress.env_steps += self.venv.num_envs
            self._record_episodes(progress)
            for pid, builder in builders.items():
                self._learned(pid, builder, progress)
            if on_step is not None:
                on_step(self.venv.num_envs)
        self._read_episodes(progress)
        self._raise_deferred()
        progress.env_restarts += int(self.batch.worker_restarts.sum() - restarts)
        return progress

    def sample(self) -> tuple[dict[str, dict[str, Rollout]], Progress]:
        """Collect exactly one rollout of every learner, exploring, and return them (by policy
        id) instead of learning from them, with what the collection produced: a rollout
        worker's sample (:mod:`corral.workers`), whose learners learn elsewhere.

        Every learner must have the same ``rollout_steps``, so that their rollouts end
        together; a rollout left open by :meth:`run` is finished first."""
        builders = self._builders()
        steps = {b.steps for b in builders.values()}
        if len(steps) > 1:
            lengths = {pid: b.steps for pid, b in builders.items()}
            raise ValueError(
                f"sampling one rollout of every learner needs them all of the same "
                f"rollout_steps; these have {lengths}"
            )
        left = max(b.steps - b.recorded for b in builders.values())
        self._taken = {}
        try:
            progress = self.run(left * self.venv.num_envs)
            taken = self._taken
        finally:
            self._taken = None
        return taken, progress

    def _builders(self) -> dict[str, RolloutBuilder]:
        """Each learner's rollout builder, made at the first use."""
        for pid, learner in self.learners.items():
            if pid not in self.builders:
                groups = SimpleNamespace(num_envs=self.venv.num_envs, groups=learner.groups)
                self.builders[pid] = RolloutBuilder(
                    groups, learner.rollout_steps, record_next=learner.records_next
                )
        return self.builders

    def _learned(self, pid: str, builder: RolloutBuilder, progress: Progress) -> None:
        """After a step that learning recorded: close it in ``pid``'s rollout, and learn at
        that rollout's end."""
        learner = self.learners[pid]
        builder.observe(self.batch, learner.policy.final_values(self.batch))
        if not builder.full:
            return
        next_value = learner.policy.bootstrap_values(self.batch)
        rollouts = builder.finish(next_value)
        self._read_episodes(progress)
        self._raise_deferred()  # not learning from a bad action's stand-in
        if self._taken is not None:  # sampled: the learner learns elsewhere
            self._taken[pid] = rollouts
            return
        metrics = learner.learn(rollouts)
        told = self.told_learned(learner)
        if metrics:  # a replay learner's rollout that took no gradient step: none
            progress.updates.append(named_metrics(pid, {**metrics, **told}))

    def told_learned(self, learner: Algorithm) -> dict[str, float]:
        """Tell every fixed player that ``learner`` has just learned (self-play's pool then
        adds a snapshot when due); returns the metrics they report."""
        return tell_learned(self.fixed, learner)

    def _raise_deferred(self) -> None:
        """Raise an invalid action that the vector env checked on its device
        (``deferred_checks``) since the last look: one read per rollout."""
        raise_deferred = getattr(self.venv, "raise_deferred", None)
        if raise_deferred is not None:
            raise_deferred()

    def _record_episodes(self, progress: Progress) -> None:
        """Add the whole episodes that ended at the current batch to ``progress``; a torch
        batch's stay on the device until :meth:`_read_episodes`."""
        batch = self.batch
        if not is_tensor(batch.done):
            self._add_episodes(progress, batch)
            return
        returns = {g: batch.episode_return[g] for g in self.venv.groups}
        ended = (batch.done, batch.episode_length, batch.episode_cut)
        if getattr(self.venv, "copy", True) is False:  # views the next step overwrites
            returns = {g: r.clone() for g, r in returns.items()}
            ended = tuple(x.clone() for x in ended)
        done, length, cut = ended
        self._ended.append((done, returns, length, cut))

    def _read_episodes(self, progress: Progress) -> None:
        """Read the kept steps' episodes back to the host at once, into ``progress``."""
        if not self._ended:
            return
        import torch

        steps, self._ended = self._ended, []
        flat = SimpleNamespace(
            done=to_numpy(torch.cat([done for done, _, _, _ in steps])),
            episode_return={
                g: to_numpy(torch.cat([r[g] for _, r, _, _ in steps])) for g in self.venv.groups
            },
            episode_length=to_numpy(torch.cat([length for _, _, length, _ in steps])),
            episode_cut=to_numpy(torch.cat([cut for _, _, _, cut in steps])),
        )
        self._add_episodes(progress, flat)

    def _add_episodes(self, progress: Progress, batch: EndedEpisodes) -> None:
        """Add the whole episodes that ended at ``batch`` to ``progress``; those that a fault
        cut are left out.

        ``batch`` needs only NumPy ``done`` ``[S]``, ``episode_cut``, ``episode_return`` and
        ``episode_length``, so several steps' batches flattened to ``S = steps * E`` rows
        record their episodes in step order."""
        finished = np.flatnonzero(whole_ended(batch))
        if self.quota is not None:
            finished = self._within_quota(finished)
        if len(finished) == 0:
            return
        if self.seating is not None:  # the learners' agents of each ended episode
            owned = self.seating.owned
            mine = {
                g: np.asarray(sum(owned[pid][g] for pid in self.learners) > 0)
                for g in self.venv.groups
            }
            total = sum((batch.episode_return[g] * mine[g]).sum(axis=1) for g in mine)
            count = sum(mine[g].sum(axis=1) for g in mine)
            progress.episode_returns.extend((total / count)[finished].tolist())
        else:  # the learned groups' agents (every agent's where nothing learns)
            groups = self.learned_groups or tuple(self.venv.groups)
            returns = np.concatenate(
                [self._learners_columns(g, batch.episode_return[g][finished]) for g in groups],
                axis=1,
            )
            progress.episode_returns.extend(returns.mean(axis=1).tolist())
        for g, agents in self.venv.groups.items():
            group_returns = batch.episode_return[g][finished]
            for j, agent in enumerate(agents):
                progress.agent_returns.setdefault(agent, []).extend(group_returns[:, j].tolist())
        progress.episode_lengths.extend(batch.episode_length[finished].tolist())

    def _learners_columns(self, g: str, returns: np.ndarray) -> np.ndarray:
        """Group ``g``'s ``returns`` ``[episodes, n]`` of the agents the learners play."""
        untaken = self.untaken.get(g)
        return returns if untaken is None else returns[:, untaken]

    def _within_quota(self, rows: np.ndarray) -> np.ndarray:
        """The ``rows`` (env rows of flattened steps, in step order) whose env has not played
        its :attr:`quota`, which each one uses up."""
        quota, num_envs = self.quota, self.venv.num_envs
        assert quota is not None
        kept = []
        for row in rows.tolist():
            if quota[row % num_envs] > 0:
                quota[row % num_envs] -= 1
                kept.append(row)
        return np.asarray(kept, dtype=np.int64)


def evaluate(
    venv: VecEnv,
    algo: Algorithm | Mapping[str, Algorithm],
    episodes: int,
    fixed: Mapping[str, FixedPlayer | FixedPolicy] | None = None,
    seed: int | None = None,
    *,
    seating: Seating | None = None,
    explore: bool = False,
) -> Progress:
    """Play ``episodes`` whole episodes greedily (``explore``: exploring as in training),
    learning nothing, each env its share (:func:`~corral.training.whole_episodes.episode_quota`);
    ``seating``: as the :class:`Collector`'s.

    Episodes that a fault cut are left out and replaced, and counted in
    ``episodes_cut``; past ``episodes`` of them it raises
    :class:`~corral.errors.EvaluationError` (see :mod:`corral.training.whole_episodes`).
    """
    collector = Collector(venv, algo, fixed, seed, seating=seating)
    collector.quota = quota = episode_quota(episodes, venv.num_envs)
    progress = Progress()
    cut = CutEpisodes(episodes)
    while quota.any():
        part = collector.run(venv.num_envs, learn=False, explore=explore)  # one vector step
        played = len(progress.episode_returns) + len(part.episode_returns)
        cut.see(collector.batch, quota > 0, played=played)
        progress.episodes_cut = cut.count
        progress.env_steps += part.env_steps
        progress.episode_returns += part.episode_returns
        for agent, returns in part.agent_returns.items():
            progress.agent_returns.setdefault(agent, []).extend(returns)
        progress.episode_lengths += part.episode_lengths
    return progress


def _merged(place: Place, mine: np.ndarray, theirs: Any, others: Any) -> Any:
    """``theirs`` in the agents ``mine`` (``[n]``, or ``[E, n]`` per env) marks, ``others``
    elsewhere (``[E, n, ...]`` arrays or tensors)."""
    if mine.ndim == 1:
        mine = mine[None]
    if place.is_torch:
        import torch

        where = torch.as_tensor(mine, device=others.device)
        return torch.where(where.reshape(*where.shape, *[1] * (others.ndim - 2)), theirs, others)
    return np.where(mine.reshape(*mine.shape, *[1] * (np.ndim(others) - 2)), theirs, others)


def _player(venv: VecEnv, pid: str, player: FixedPlayer | FixedPolicy) -> FixedPlayer:
    """A :class:`FixedPlayer`; a bare :data:`FixedPolicy` keyed by a group plays all of it."""
    if isinstance(player, FixedPlayer):
        return player
    if pid not in venv.groups:
        raise ValueError(
            f"a fixed policy given without its agents must be keyed by a group of the env; "
            f"{pid!r} is none of {sorted(venv.groups)}"
        )
    return FixedPlayer(player, {pid: np.ones(len(venv.groups[pid]), dtype=bool)})


def _check_cover(
    venv: VecEnv, learners: Mapping[str, Any], fixed: Mapping[str, FixedPlayer]
) -> list[str]:
    """Every agent is played by a learner or a fixed policy, by one learner at most and by
    one fixed policy at most; returns the agents of learners that fixed policies play."""
    owner: dict[tuple[str, int], str] = {}
    for pid, learner in learners.items():
        for g in learner.groups:
            for j in range(len(venv.groups[g])):
                if (g, j) in owner:
                    raise ValueError(
                        f"the agent {venv.groups[g][j]!r} is played by both {owner[g, j]!r} "
                        f"and {pid!r}"
                    )
                owner[g, j] = pid
    overridden = []
    for pid, player in fixed.items():
        for g, mask in player.slots.items():
            for j in np.flatnonzero(mask).tolist():
                if (g, int(j)) in owner and owner[g, int(j)] not in learners:
                    raise ValueError(
                        f"the agent {venv.groups[g][j]!r} is played by both "
                        f"{owner[g, int(j)]!r} and {pid!r}"
                    )
                if (g, int(j)) in owner:
                    overridden.append(f"{venv.groups[g][j]} ({owner[g, int(j)]} and {pid})")
                owner[g, int(j)] = pid
    missing = [
        a for g, agents in venv.groups.items() for j, a in enumerate(agents) if (g, j) not in owner
    ]
    if missing:
        raise ValueError(f"the agents {missing} have neither a learner nor a fixed policy")
    return overridden


def tell_learned(players: Mapping[str, FixedPlayer], learner: Algorithm) -> dict[str, float]:
    """Tell every player of ``players`` that ``learner`` has just learned (see
    :meth:`~corral.training.policy_map.FixedPlayer.learned`); the metrics they report."""
    told: dict[str, float] = {}
    for player in players.values():
        told.update(player.learned(learner))
    return told


def named_metrics(pid: str, metrics: dict[str, float]) -> dict[str, float]:
    """A learner's metrics as the run logs them: those of the policy :data:`MAIN` as they
    are, others' prefixed ``pid/`` (unless their names already start so)."""
    if pid == MAIN:
        return metrics
    return {k if k.startswith(f"{pid}/") else f"{pid}/{k}": v for k, v in metrics.items()}
