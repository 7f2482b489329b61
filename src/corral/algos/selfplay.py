"""Self-play for turn-based games: the learner against frozen copies of itself.

Design. Self-play needs nothing from the collector: the algorithm acts for
every seat of the game and decides, per env and episode, which seat it
learns in. (A :data:`~corral.algos.base.FixedPolicy` for the opponent would
not do: the collector gives a fixed policy a whole group for the whole run,
while the learner's seat changes per env and episode and may share a group
with the opponent's.) With the default group map both seats of ``tictactoe_v3`` form one
group ``player`` (one shared network; the observation is given from the
mover's side), with ``group_map="agent"`` each seat is a group of its own
(one network per seat). A seat is a *slot* ``(group, index in the group)``.

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

:func:`play_against` measures a learner in one seat against another player
(a uniformly random legal one by default) in the others;
:func:`evaluate_vs_random` does so on a fresh vector env of a registered id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

OpponentActions = Callable[[Any, str, np.ndarray], np.ndarray]
"""``(snapshot, group, envs) -> actions [len(envs), n, ...]``: what ``snapshot`` plays for the
agents of ``group`` in the envs ``envs`` (``snapshot`` ``None``: uniformly random legal play)."""


class Player(Protocol):
    """Anything that acts for some groups of a batch, as an algorithm does."""

    def act(self, batch: Any, *, explore: bool = True) -> tuple[dict[str, np.ndarray], Any]: ...


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


def play_against(
    learner: Player,
    venv: Any,
    games: int,
    seat: str,
    opponent: Player | None = None,
    *,
    seed: int = 0,
) -> list[float]:
    """The returns of ``learner`` playing agent ``seat`` greedily in ``games`` episodes of
    ``venv`` against ``opponent``.

    ``learner`` acts (``act(batch, explore=False)``) for the group of ``seat``
    and only its action for ``seat`` is used; ``opponent`` plays greedily for
    its groups, and uniformly random legal actions fill every other agent (all
    of them when ``opponent`` is ``None``). ``venv`` is reset with ``seed``, so
    the same seed plays the same games; each env plays its share of ``games``.
    """
    where = [(g, agents.index(seat)) for g, agents in venv.groups.items() if seat in agents]
    if not where:
        raise ValueError(f"seat {seat!r} is not an agent of the env: {venv.possible_agents}")
    g, j = where[0]
    num_envs = venv.num_envs
    quota = games // num_envs + (np.arange(num_envs) < games % num_envs)
    rng = np.random.default_rng(seed)
    returns: list[float] = []
    played = np.zeros(num_envs, dtype=np.int64)
    batch = venv.reset(seed=seed)
    while (played < quota).any():
        actions = venv.sample_actions(batch, rng)
        if opponent is not None:
            theirs, _ = opponent.act(batch, explore=False)
            actions.update({group: np.array(a) for group, a in theirs.items()})
        mine, _ = learner.act(batch, explore=False)
        actions[g][:, j] = mine[g][:, j]
        batch = venv.step(actions)
        counted = batch.done & (played < quota)
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
    """Mean episode return of ``algo`` playing greedily against a uniformly random legal player.

    ``algo`` plays the agent ``possible_agents[seat]`` (in ``tictactoe_v3`` and
    ``corral/rps`` seat 0 moves first), on a vector env of ``env_id`` whose
    groups are those of ``algo`` (agents outside them form groups of their
    own); see :func:`play_against`. In a win/draw/loss game the result is the
    mean of +1, 0 and -1 over ``games`` games.
    """
    import corral

    env_kwargs = dict(env_kwargs or {})
    probe = corral.make(env_id, **env_kwargs)
    agents = list(probe.possible_agents)
    probe.close()
    group_of = {a: g for g, members in algo.groups.items() for a in members}
    group_map = {a: group_of.get(a, a) for a in agents}
    num_envs = max(1, min(num_envs, games))
    venv = corral.make_vec(env_id, num_envs, seed=seed, group_map=group_map, env_kwargs=env_kwargs)
    try:
        return float(np.mean(play_against(algo, venv, games, agents[seat], seed=seed)))
    finally:
        venv.close()
