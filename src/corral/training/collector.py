"""Drive a vector env with an algorithm's actions and feed it the transitions.

The collector also keeps what acting needs to know about the episodes and
the algorithm must not count itself (its ``act`` has no side effects): each
agent's decisions so far in its episode (:class:`DecisionCounter`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from corral.algos.base import Algorithm, FixedPolicy
from corral.arrays import Place, is_tensor, place_of, to_numpy, tree_to_numpy
from corral.data.transitions import TransitionAssembler
from corral.training.whole_episodes import CutEpisodes, whole_ended


class DecisionCounter:
    """Each agent's decisions in its running episode, counted from the batches acted on.

    Call :meth:`step` once per batch acted on, in order; an env whose batch
    says ``done`` starts counting again. Arrays live where the batches' do
    (NumPy, or tensors on their device), one ``[E, n]`` int64 array per group;
    every array returned is new, never changed afterwards.
    """

    def __init__(self) -> None:
        self.made: dict[str, Any] = {}
        """Per group ``[E, n]``: the decisions made so far in the episode that ran in the
        last step counted (the index a decision after that step would have in that
        episode); empty before the first :meth:`step`."""

    def index(self, batch: Any) -> dict[str, Any]:
        """Each agent's decision index at ``batch`` (0 where an episode starts there)."""
        done = batch.done[:, None]
        index = {}
        for g, acting in batch.acting.items():
            made = self.made.get(g)
            if is_tensor(acting):
                import torch

                if made is None:
                    made = torch.zeros(acting.shape, dtype=torch.int64, device=acting.device)
                index[g] = torch.where(done, 0, made)
            else:
                made = np.zeros(acting.shape, dtype=np.int64) if made is None else made
                index[g] = np.where(done, 0, made)
        return index

    def step(self, batch: Any) -> dict[str, Any]:
        """:meth:`index` at ``batch``, then count the decisions of its acting agents."""
        index = self.index(batch)
        self.made = {g: index[g] + batch.acting[g] for g in index}
        return index


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


class Collector:
    """Steps ``venv`` with ``algo`` (and fixed policies for other groups).

    ``fixed`` maps groups that ``algo`` does not learn to :data:`FixedPolicy`
    callables. Episode returns count only the learned groups. For an
    algorithm with ``uses_decisions`` it counts each agent's decisions in its
    episode (:attr:`decisions`) and passes them to ``act``.
    """

    def __init__(
        self,
        venv: Any,
        algo: Algorithm,
        fixed: Mapping[str, FixedPolicy] | None = None,
        seed: int | None = None,
    ) -> None:
        self.venv = venv
        self.algo = algo
        self.fixed = dict(fixed or {})
        missing = set(venv.groups) - set(algo.groups) - set(self.fixed)
        if missing:
            raise ValueError(f"groups {sorted(missing)} have neither a learner nor a fixed policy")
        self.rng = np.random.default_rng(seed)
        self.assembler = TransitionAssembler(venv)
        self.batch = venv.reset(seed=seed)
        self.decisions = DecisionCounter()

    @property
    def rollout_open(self) -> bool:
        """Whether a rollout is partly collected: what a checkpoint cannot hold (the
        transition collector hands every step over at once: never)."""
        return False

    def rollout_left(self) -> int:
        """The env steps until the rollout being collected ends (0 where none is open)."""
        return 0

    def actions(self, batch: Any, explore: bool) -> tuple[dict[str, np.ndarray], dict]:
        """Actions of every group at ``batch`` (the next batch acted on) and ``algo``'s extras."""
        if getattr(self.algo, "uses_decisions", False):  # any player with act() and groups
            decisions = self.decisions.step(batch)
            actions, extras = self.algo.act(batch, explore=explore, decisions=decisions)
        else:
            actions, extras = self.algo.act(batch, explore=explore)
        if not self.fixed:
            return actions, extras
        place = place_of(batch.done)
        for g, policy in self.fixed.items():
            # fixed policies play on the host: a torch batch's observations and mask are
            # read back (one copy per step), the actions placed where the batch lives
            obs, mask = batch.obs[g], batch.action_mask.get(g)
            if place.is_torch:
                obs, mask = tree_to_numpy(obs), None if mask is None else to_numpy(mask)
            actions[g] = _placed(place, policy(obs, mask, self.rng))
        return actions, extras

    def run(
        self,
        env_steps: int,
        *,
        learn: bool = True,
        on_step: Callable[[int], None] | None = None,
    ) -> Progress:
        """Collect at least ``env_steps`` env steps, updating ``algo`` whenever it is ready.

        ``on_step`` is called after every vector step with the env steps it took. Learning
        (``learn``) needs an algorithm that learns from transitions (``observe``, ``ready``,
        ``update``); one that learns only from rollouts raises ``TypeError`` naming the
        :class:`~corral.training.rollout_collector.RolloutCollector` to use instead.
        """
        if learn:
            _check_learns_from_transitions(self.algo)
        progress = Progress()
        while progress.env_steps < env_steps:
            actions, extras = self.actions(self.batch, explore=learn)
            self.assembler.act(self.batch, actions, **extras)
            restarts = int(self.batch.worker_restarts.sum())
            self.batch = self.venv.step(actions)
            progress.env_steps += self.venv.num_envs
            progress.env_restarts += int(self.batch.worker_restarts.sum()) - restarts
            done = self.assembler.observe(self.batch)
            if learn:
                self.algo.collected(self.batch)
                own = {g: t for g, t in done.items() if g in self.algo.groups}
                if own:
                    self.algo.observe(own)
                if self.algo.ready():
                    progress.updates.append(self.algo.update())
            self._record_episodes(progress)
            if on_step is not None:
                on_step(self.venv.num_envs)
        return progress

    def _record_episodes(self, progress: Progress, batch: Any = None) -> None:
        """Add the whole episodes that ended at ``batch`` (default: the current one) to
        ``progress``; those that a fault cut are left out.

        ``batch`` needs only NumPy ``done`` ``[S]``, ``episode_cut``, ``episode_return`` and
        ``episode_length``, so several steps' batches flattened to ``S = steps * E`` rows
        record their episodes in step order."""
        batch = self.batch if batch is None else batch
        finished = np.flatnonzero(whole_ended(batch))
        if len(finished) == 0:
            return
        returns = np.concatenate(
            [batch.episode_return[g][finished] for g in self.algo.groups], axis=1
        )
        progress.episode_returns.extend(returns.mean(axis=1).tolist())
        for g, agents in self.venv.groups.items():
            group_returns = batch.episode_return[g][finished]
            for j, agent in enumerate(agents):
                progress.agent_returns.setdefault(agent, []).extend(group_returns[:, j].tolist())
        progress.episode_lengths.extend(batch.episode_length[finished].tolist())


def _check_learns_from_transitions(algo: Any) -> None:
    """Raise ``TypeError`` if ``algo`` does not implement learning from transitions."""
    kind = type(algo)
    missing = [
        name
        for name in ("observe", "ready", "update")
        if getattr(kind, name, None) is getattr(Algorithm, name)
    ]
    if missing:
        raise TypeError(
            f"{kind.__name__} learns from rollouts (learns_from={algo.learns_from!r}), not "
            f"from transitions (it has no {', '.join(missing)} of its own), so the transition "
            "Collector cannot train it: use corral.training.rollout_collector.RolloutCollector "
            "(the Collector only plays it, with run(learn=False))"
        )


def evaluate(
    venv: Any,
    algo: Algorithm,
    episodes: int,
    fixed: Mapping[str, FixedPolicy] | None = None,
    seed: int | None = None,
) -> Progress:
    """Play ``episodes`` whole episodes greedily (no exploration, no learning).

    Episodes that a fault cut are left out and replaced, and counted in
    ``episodes_cut``; past ``episodes`` of them it raises
    :class:`~corral.errors.EvaluationError` (see :mod:`corral.training.whole_episodes`).
    """
    collector = Collector(venv, algo, fixed, seed)
    progress = Progress()
    cut = CutEpisodes(episodes)
    while len(progress.episode_returns) < episodes:
        part = collector.run(venv.num_envs, learn=False)  # one vector step
        cut.see(collector.batch, played=len(progress.episode_returns) + len(part.episode_returns))
        progress.episodes_cut = cut.count
        progress.env_steps += part.env_steps
        progress.episode_returns += part.episode_returns
        for agent, returns in part.agent_returns.items():
            progress.agent_returns.setdefault(agent, []).extend(returns)
        progress.episode_lengths += part.episode_lengths
    progress.episode_returns = progress.episode_returns[:episodes]
    progress.agent_returns = {a: r[:episodes] for a, r in progress.agent_returns.items()}
    progress.episode_lengths = progress.episode_lengths[:episodes]
    return progress


def _placed(place: Place, actions: Any) -> Any:
    """A fixed policy's actions (nested for Dict and Tuple spaces) in ``place``."""
    if isinstance(actions, dict):
        return {k: _placed(place, v) for k, v in actions.items()}
    if isinstance(actions, tuple):
        return tuple(_placed(place, v) for v in actions)
    return place.asarray(actions) if place.is_torch else actions
