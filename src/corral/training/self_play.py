"""``self_play`` as a policy map: the learner in one seat per episode, its past copies in
the others (see :mod:`corral.algos.selfplay`).

The map is a function of agent and episode (:class:`SeatSwap`): in episode
``k`` (each env's episodes numbered from the env's index, see
:class:`~corral.training.policy_map.Seating`) the learner, the policy
:data:`~corral.training.policy_map.MAIN`, plays the seat ``k mod seats``, and the
policy :data:`OPPONENT`, a :class:`~corral.algos.selfplay.SnapshotPool` of the
learner, plays every other seat. The runner builds it for ``self_play=True``;
:func:`self_play` gives a collector's ``fixed`` players and ``seating`` outside
the runner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from corral.training.policy_map import MAIN, FixedPlayer, PolicyMap, Seating

if TYPE_CHECKING:
    from corral.vector.protocols import VecEnv

OPPONENT = "opponent"
"""The policy id of the learner's past copies in a self-play run."""
SELF_PLAY_RETURN = "selfplay/return"
"""The metric of the learner's mean return in its own seats (the run's ``train_return``)."""


def seats(groups: Mapping[str, Sequence[str]]) -> list[str]:
    """The seats of a game, in the order the learner takes them: the agents of the learned
    groups, each group's in order (a seat is a slot ``(group, index)``, named by its agent)."""
    return [agent for agents in groups.values() for agent in agents]


class SeatSwap:
    """The self-play map ``(agent, episode) -> policy id``: :data:`MAIN` for the seat
    ``episode mod len(seats)`` of ``seats``, :data:`OPPONENT` for every other agent."""

    def __init__(self, seats: Sequence[str]) -> None:
        if len(seats) < 2:
            raise ValueError(
                f"self-play needs at least two seats among the learned groups, got {list(seats)}"
            )
        self.seats = tuple(seats)

    def __call__(self, agent: str, episode: int) -> str:
        return MAIN if agent == self.seats[episode % len(self.seats)] else OPPONENT

    def __repr__(self) -> str:
        return f"SeatSwap({list(self.seats)})"


def self_play_map(groups: Mapping[str, Sequence[str]]) -> PolicyMap:
    """The policy map of a self-play run on an env of ``groups`` (all learned)."""
    tuples = {g: tuple(agents) for g, agents in groups.items()}
    return PolicyMap(tuples, {}, by=SeatSwap(seats(tuples)), named=(MAIN, OPPONENT))


def opponent_pool(venv: VecEnv, learner: Any) -> Any:
    """The :class:`~corral.algos.selfplay.SnapshotPool` of ``learner`` on ``venv``, from the
    learner's config (``pool_size``, ``snapshot_interval``, ``random_opponent_prob``,
    ``seed``); raises :class:`~corral.errors.UnsupportedEnvError` for a game whose agents do
    not play against each other (:func:`~corral.algos.selfplay.check_game`)."""
    from corral.algos.selfplay import SnapshotPool, check_game

    check_game(venv)
    cfg = learner.config
    return SnapshotPool(
        learner,
        {g: venv.action_space(g) for g in learner.groups},
        pool_size=cfg.pool_size,
        snapshot_interval=cfg.snapshot_interval,
        random_prob=cfg.random_opponent_prob,
        seed=cfg.seed,
    )


def opponent_player(venv: VecEnv, learner: Any, pmap: PolicyMap) -> FixedPlayer:
    """The fixed player of :data:`OPPONENT` in ``pmap``: the learner's snapshot pool."""
    return FixedPlayer(opponent_pool(venv, learner), pmap.slots(OPPONENT))


def self_play(venv: VecEnv, learner: Any) -> dict[str, Any]:
    """A collector's ``fixed`` and ``seating`` for ``learner`` (the policy :data:`MAIN`,
    learning every group of ``venv``) in self-play: ``Collector(venv, learner, **found)``."""
    pmap = self_play_map({g: venv.groups[g] for g in learner.groups})
    assert pmap.by is not None  # a self-play map seats its agents by episode
    return {
        "fixed": {OPPONENT: opponent_player(venv, learner, pmap)},
        "seating": Seating(venv.groups, pmap.by, pmap.ids, venv.num_envs),
    }
