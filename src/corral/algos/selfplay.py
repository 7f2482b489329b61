"""Self-play for zero-sum games: the learner against frozen copies of itself.

Design. Self-play needs nothing from the collector: the algorithm acts for
every seat of the game and decides, per env and episode, which seat it
learns in. (A :data:`~corral.algos.base.FixedPolicy` for the opponent would
not do: the collector gives a fixed policy a whole group for the whole run,
while the learner's seat changes per env and episode and may share a group
with the opponent's.) With the default group map both seats of ``tictactoe_v3`` form one
group ``player`` (one shared network; the observation is given from the
mover's side), with ``group_map="agent"`` each seat is a group of its own
(one network per seat). A seat is a *slot* ``(group, index in the group)``.

The game must be one whose agents play against each other: :func:`check_game`,
called by the algorithms that offer self-play, refuses an env that does not
declare ``metadata["zero_sum"] = True``.

:class:`SelfPlay` keeps the pool of frozen snapshots and, for each env,
the learner's slot and the opponent of the current episode. When an episode
starts the learner moves to the next slot (so every env alternates between
moving first and second) and an opponent is drawn from the pool (a uniformly
random legal player while the pool is empty, or with probability
``random_prob``); every slot but the learner's is played by that opponent.
The algorithm's exploring ``act`` merges its own and the opponent's actions
with :meth:`SelfPlay.merge` and passes the :meth:`SelfPlay.learner_slots`
mask to the transition assembler as the extra ``learner``, so each transition
records who chose its action and ``observe`` keeps only the learner's. From
the learner's side the opponent is part of the env: its transition runs from
its move to its next move, and the reward of the opponent's winning move is
credited to the learner's last move. The algorithm adds snapshots to the pool
(DQN: every ``snapshot_interval`` gradient steps; MAPPO: every
``snapshot_interval`` updates). Greedy acting (``explore=False``) plays every
seat with the learner's own policy: self-play is for training only.

Measuring a learner in one seat against another player is evaluation, in
:mod:`corral.training.selfplay_eval`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from corral.errors import UnsupportedEnvError

OpponentActions = Callable[[Any, str, np.ndarray], np.ndarray]
"""``(snapshot, group, envs) -> actions [len(envs), n, ...]``: what ``snapshot`` plays for the
agents of ``group`` in the envs ``envs`` (``snapshot`` ``None``: uniformly random legal play)."""


def check_game(venv: Any) -> None:
    """Raise :class:`~corral.errors.UnsupportedEnvError` unless ``venv``'s env is a game whose
    agents play against each other, which an env says by declaring ``metadata["zero_sum"] =
    True`` (see the env contract). Elsewhere the frozen copies would not be the learner's
    opponents (team-mates in a cooperative env), and its score against a reference opponent
    (``eval_vs_opponent``) would measure no contest.
    """
    metadata = getattr(venv, "metadata", None) or {}
    declared = metadata.get("zero_sum")
    if declared is True:
        return
    env = f"the env {metadata['name']!r}" if metadata.get("name") else "this env"
    if declared is False:
        said = f"{env} declares zero_sum=False"
    else:
        said = f"{env} does not declare it (a zero-sum game of your own can)"
    raise UnsupportedEnvError(
        "self_play needs a game whose agents play against each other, declared by its env as "
        "metadata zero_sum=True (corral/rps, tic-tac-toe, the zero-sum PettingZoo classic and "
        f"OpenSpiel games); {said}, so the learner's frozen copies would not be its opponents "
        "and eval_vs_opponent would score no contest: train without self_play"
    )


class SelfPlay:
    """Seats and opponents of the learner, per env and episode, and the snapshot pool.

    Args:
        groups: the groups the learner acts for (group -> its agents); their
            slots are the seats of the game.
        pool_size: the most snapshots kept; the oldest is dropped first.
        random_prob: probability that an episode's opponent is the uniformly
            random legal player even when the pool holds snapshots.
        seed: seed of the opponent draws.
    """

    def __init__(
        self,
        groups: Mapping[str, Sequence[str]],
        pool_size: int,
        random_prob: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self.slots = [(g, j) for g, agents in groups.items() for j in range(len(agents))]
        if len(self.slots) < 2:
            raise ValueError(
                f"self-play needs at least two seats among the learned groups, got {self.slots}"
            )
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size}")
        self.group_sizes = {g: len(agents) for g, agents in groups.items()}
        self.pool_size = pool_size
        self.random_prob = random_prob
        self.pool: list[Any] = []
        self.rng = np.random.default_rng(seed)
        self.seat = np.zeros(0, dtype=np.int64)
        """Index in :attr:`slots` of the learner's seat, per env."""
        self.opponent: list[Any] = []
        """The snapshot playing the other seats, per env (``None``: random legal play)."""
        self.seat_counts = np.zeros(len(self.slots), dtype=np.int64)
        """Episodes begun with the learner in each slot."""
        self._returns: list[float] = []

    def add(self, snapshot: Any) -> None:
        """Add a frozen copy of the learner, dropping the oldest beyond ``pool_size``."""
        self.pool.append(snapshot)
        del self.pool[: -self.pool_size]

    def begin_episodes(self, batch: Any) -> None:
        """Seat the learner and draw opponents in the envs whose episode starts at ``batch``.

        Every env starts an episode at the first batch seen (or when the
        number of envs changes); later, those with ``batch.done``.
        """
        num_envs = len(batch.done)
        if len(self.seat) != num_envs:
            self.seat = np.arange(num_envs, dtype=np.int64) % len(self.slots) - 1
            self.opponent = [None] * num_envs
            new = np.ones(num_envs, dtype=bool)
        else:
            new = np.asarray(batch.done, dtype=bool)
            for e in np.flatnonzero(new):
                g, j = self.slots[self.seat[e]]
                self._returns.append(float(batch.episode_return[g][e, j]))
        for e in np.flatnonzero(new):
            self.seat[e] = (self.seat[e] + 1) % len(self.slots)
            self.seat_counts[self.seat[e]] += 1
            self.opponent[e] = self._draw_opponent()

    def _draw_opponent(self) -> Any:
        if not self.pool or self.rng.random() < self.random_prob:
            return None
        return self.pool[int(self.rng.integers(len(self.pool)))]

    def merge(
        self, batch: Any, actions: dict[str, np.ndarray], opponent_actions: OpponentActions
    ) -> dict[str, np.ndarray]:
        """Seat the learner and draw opponents where episodes start at ``batch`` (see
        :meth:`begin_episodes`), then replace in ``actions`` the actions of every slot but
        the learner's by its opponent's. Returns :meth:`learner_slots` (the extra ``learner``).
        """
        self.begin_episodes(batch)
        learner = self.learner_slots()
        for snapshot, envs in self.opponents():
            for g in self.group_sizes:
                theirs = np.asarray(opponent_actions(snapshot, g, envs))
                mine = learner[g][envs]
                mine = mine.reshape(mine.shape + (1,) * (theirs.ndim - mine.ndim))
                actions[g][envs] = np.where(mine, actions[g][envs], theirs)
        return learner

    def learner_slots(self) -> dict[str, np.ndarray]:
        """Per group, ``[E, n]`` booleans: the slots the learner plays."""
        mask = {g: np.zeros((len(self.seat), n), dtype=bool) for g, n in self.group_sizes.items()}
        for e, seat in enumerate(self.seat):
            g, j = self.slots[seat]
            mask[g][e, j] = True
        return mask

    def opponents(self) -> list[tuple[Any, np.ndarray]]:
        """Each distinct current opponent (``None``: random legal play) and its envs."""
        envs: dict[int, list[int]] = {}
        first: dict[int, Any] = {}
        for e, opponent in enumerate(self.opponent):
            envs.setdefault(id(opponent), []).append(e)
            first.setdefault(id(opponent), opponent)
        return [(first[key], np.array(index)) for key, index in envs.items()]

    def pop_returns(self) -> list[float]:
        """The learner's returns of the episodes ended since the last call."""
        returns, self._returns = self._returns, []
        return returns

    def state_dict(self) -> dict[str, Any]:
        """The draw generator and counters; the pool is the algorithm's to save."""
        return {"rng": self.rng.bit_generator.state, "seat_counts": self.seat_counts.tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; seats and opponents are drawn anew at the next batch."""
        self.rng.bit_generator.state = state["rng"]
        self.seat_counts = np.array(state["seat_counts"], dtype=np.int64)
        self.seat = np.zeros(0, dtype=np.int64)
        self.opponent = []
