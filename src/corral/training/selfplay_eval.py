"""Self-play evaluation: a learner in one seat of a game against another player.

:func:`play_against` measures a learner in one seat against another player
(a uniformly random legal one by default) in the others;
:func:`evaluate_vs_random` does so on a fresh vector env of a registered id.
Training against past copies of the learner is :mod:`corral.algos.selfplay`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from corral.algos.policy import Policy
from corral.registry import make
from corral.training.collector import Collector
from corral.training.policy_map import FixedPlayer
from corral.training.whole_episodes import CutEpisodes, episode_quota, whole_ended
from corral.vector import make_vec

if TYPE_CHECKING:
    from corral.vector.protocols import Batch, VecEnv


class Player(Protocol):
    """Anything that acts for some groups of a batch, as a policy does (a learner's
    ``policy``)."""

    @property
    def groups(self) -> Mapping[str, Sequence[str]]:
        """The groups it acts for (group -> its agents)."""
        ...

    def act(self, batch: Batch, *, explore: bool = True) -> tuple[Mapping[str, Any], Any]: ...


class _Seated(Policy):
    """Every agent of ``venv``: ``learner``'s action for agent ``j`` of group ``g`` (exploring
    where ``act`` is asked to), ``opponent``'s (greedy) for its groups, uniformly random
    legal actions elsewhere."""

    def __init__(
        self, venv: VecEnv, learner: Player, g: str, j: int, opponent: Player | None, seed: int
    ) -> None:
        super().__init__(venv.groups)
        self.venv, self.learner, self.g, self.j, self.opponent = venv, learner, g, j, opponent
        self.rng = np.random.default_rng(seed)

    def act(
        self,
        batch: Batch,
        *,
        explore: bool = True,
        decisions: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, np.ndarray], dict]:
        actions = self.venv.sample_actions(batch, self.rng)
        if self.opponent is not None:
            theirs, _ = self.opponent.act(batch, explore=False)
            actions.update({group: np.array(a) for group, a in theirs.items()})
        mine, _ = self.learner.act(batch, explore=explore)
        actions[self.g][:, self.j] = mine[self.g][:, self.j]
        return actions, {}


def play_against(
    learner: Player,
    venv: VecEnv,
    games: int,
    seat: str,
    opponent: Player | None = None,
    *,
    seed: int = 0,
    cut: CutEpisodes | None = None,
    explore: bool = False,
) -> list[float]:
    """The returns of ``learner`` playing agent ``seat`` greedily (``explore``: exploring)
    in ``games`` episodes of ``venv`` against ``opponent``.

    ``learner`` acts (``act(batch, explore=False)``) for the group of ``seat``
    and only its action for ``seat`` is used; ``opponent`` plays greedily for
    its groups, and uniformly random legal actions fill every other agent (all
    of them when ``opponent`` is ``None``). ``venv`` is reset with ``seed``, so
    the same seed plays the same games; each env plays its share of ``games``.
    Only whole episodes count: one that a fault cut is played again and counted in
    ``cut`` (by default its own :class:`CutEpisodes` of ``games``), which gives up past
    its bound (:mod:`corral.training.whole_episodes`).
    """
    where = [(g, agents.index(seat)) for g, agents in venv.groups.items() if seat in agents]
    if not where:
        raise ValueError(f"seat {seat!r} is not an agent of the env: {venv.possible_agents}")
    g, j = where[0]
    num_envs = venv.num_envs
    quota = episode_quota(games, num_envs)
    returns: list[float] = []
    played = np.zeros(num_envs, dtype=np.int64)
    cut = CutEpisodes(games) if cut is None else cut
    seated = _Seated(venv, learner, g, j, opponent, seed)
    every = {group: np.ones(len(agents), dtype=bool) for group, agents in venv.groups.items()}
    collector = Collector(venv, {}, {"seated": FixedPlayer(seated, every)}, seed=seed)
    while (played < quota).any():
        collector.run(num_envs, learn=False, explore=explore)  # one vector step
        batch = collector.batch
        cut.see(batch, played < quota, played=len(returns))
        counted = whole_ended(batch) & (played < quota)
        returns.extend(batch.episode_return[g][counted, j].tolist())
        played += counted
    return returns


def evaluate_vs_random(
    algo: Any,
    env_id: str,
    games: int,
    seat: int,
    *,
    num_envs: int = 16,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
) -> float:
    """Mean episode return of ``algo`` (a :class:`Player`: a learner's ``policy``) playing
    greedily against a uniformly random legal player.

    ``algo`` plays the agent ``possible_agents[seat]`` (in ``tictactoe_v3`` and
    ``corral/rps`` seat 0 moves first), on a vector env of ``env_id`` whose
    groups are those of ``algo`` (agents outside them form groups of their
    own); see :func:`play_against`. In a win/draw/loss game the result is the
    mean of +1, 0 and -1 over ``games`` games.
    """
    env_kwargs = dict(env_kwargs or {})
    probe = make(env_id, **env_kwargs)
    agents = list(probe.possible_agents)
    probe.close()
    group_of = {a: g for g, members in algo.groups.items() for a in members}
    group_map = {a: group_of.get(a, a) for a in agents}
    num_envs = max(1, min(num_envs, games))
    venv = make_vec(env_id, num_envs, seed=seed, group_map=group_map, env_kwargs=env_kwargs)
    try:
        return float(np.mean(play_against(algo, venv, games, agents[seat], seed=seed)))
    finally:
        venv.close()
