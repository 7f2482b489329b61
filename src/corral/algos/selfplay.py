"""Self-play for zero-sum games: the learner against frozen copies of itself.

Self-play is one use of the policy map (see :mod:`corral.training.policy_map`
and :mod:`corral.training.self_play`): a map by a function of agent and
episode seats the learner (the policy ``main``) in one seat of each episode,
the next seat for each next episode, and sends every other seat to the
policy ``opponent``, a :class:`SnapshotPool`. A seat is a *slot*
``(group, index in the group)`` of the learned groups: with the default group
map both seats of ``tictactoe_v3`` form one group ``player`` (one shared
network; the observation is given from the mover's side), with
``group_map="agent"`` each seat is a group of its own.

The :class:`SnapshotPool` is a :class:`~corral.algos.policy.Policy`: frozen
copies of the learner's policy (:meth:`~corral.algos.base.Algorithm.snapshot`,
its weights as an opponent acts with them; they never change) and, per env, an
opponent drawn where that env's episode begins (uniformly random legal play
while the pool is empty or with probability ``random_prob``, else a member).
The members act as the learner's policy does when exploring (MAPPO's sample
from their actors, DQN's play epsilon-greedy with ``opponent_epsilon``). After
each update of the learner the collector calls :meth:`SnapshotPool.learned`,
which adds a snapshot every ``snapshot_interval`` of the learner's
:meth:`~corral.algos.base.Algorithm.snapshot_clock` (MAPPO: updates; DQN:
gradient steps), keeping the newest ``pool_size``. From the learner's side the
opponent is part of the env: its decision runs from its move to its next move,
and the reward of the opponent's winning move is credited to the learner's last
move; it learns only its own decisions (the extra ``learner``). Greedy acting,
evaluations included, plays every seat with the learner itself.

The game must be one whose agents play against each other: :func:`check_game`
refuses an env that does not declare ``metadata["zero_sum"] = True``.
Measuring a learner in one seat against another player is evaluation, in
:mod:`corral.training.selfplay_eval`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from corral.algos.policy import Actions, Extras, Policy, Weights
from corral.arrays import is_tensor
from corral.errors import UnsupportedEnvError
from corral.vector.sampling import sample_array

if TYPE_CHECKING:
    from corral.vector.protocols import Batch, VecEnv


def check_game(venv: VecEnv) -> None:
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


class SnapshotPool(Policy):
    """Frozen copies of a learner's policy, and the opponent of each env's episode.

    Args:
        learner: the :class:`~corral.algos.base.Algorithm` it copies (its groups are
            the pool's).
        action_space: per group, the action space (for random legal play).
        pool_size: the most snapshots kept; the oldest is dropped first.
        snapshot_interval: a snapshot joins every so many of the learner's
            :meth:`~corral.algos.base.Algorithm.snapshot_clock`.
        random_prob: probability that an episode's opponent is the uniformly
            random legal player even when the pool holds snapshots.
        seed: seed of the opponent draws, random play and the members' own draws.
    """

    def __init__(
        self,
        learner: Any,
        action_space: Mapping[str, Any],
        *,
        pool_size: int,
        snapshot_interval: int,
        random_prob: float = 0.0,
        seed: int | None = None,
    ) -> None:
        super().__init__(learner.groups)
        if pool_size < 1:
            raise ValueError(f"pool_size must be at least 1, got {pool_size}")
        self.learner = learner
        self.action_space = {g: action_space[g] for g in self.groups}
        self.pool_size = pool_size
        self.snapshot_interval = snapshot_interval
        self.random_prob = random_prob
        self.members: list[Weights] = []
        """The snapshots, oldest first: :meth:`~corral.algos.base.Algorithm.snapshot`."""
        self.rng = np.random.default_rng(seed)
        self.player = copy.deepcopy(learner.policy)
        """A copy of the learner's policy whose generators every member acts with."""
        _seed_generators(self.player, int(self.rng.integers(2**31)))
        self.opponent: list[Weights | None] = []
        """The member playing in each env's episode (``None``: random legal play)."""
        self.clock = learner.snapshot_clock()
        """The learner's clock when :meth:`learned` last looked."""
        self._copies: dict[int, tuple[Weights, Policy]] = {}
        """Per member (by ``id``), a copy of :attr:`player` acting with its weights."""

    def add(self, snapshot: Weights) -> None:
        """Add a snapshot, dropping the oldest beyond ``pool_size``."""
        self.members.append(snapshot)
        del self.members[: -self.pool_size]

    def learned(self, learner: Any) -> dict[str, float]:
        """Called after each update of a learner: when it is the one copied, add its
        snapshot if a multiple of ``snapshot_interval`` of its clock has passed since
        the last look. Returns the metric ``selfplay/pool`` (the members)."""
        if learner is not self.learner:
            return {}
        clock = learner.snapshot_clock()
        if clock // self.snapshot_interval > self.clock // self.snapshot_interval:
            self.add(learner.snapshot())
        self.clock = clock
        return {"selfplay/pool": float(len(self.members))}

    def act(
        self,
        batch: Batch,
        *,
        explore: bool = True,
        decisions: Mapping[str, Any] | None = None,
    ) -> tuple[Actions, Extras]:
        """Each env's opponent's actions for every agent of its groups (drawn anew in the
        envs whose episode begins at ``batch``); no extras. NumPy batches only."""
        if is_tensor(batch.done):
            raise ValueError(
                "self_play plays numpy batches only, got torch tensors: build the vector env "
                "with array='numpy'"
            )
        self._begin(np.asarray(batch.done, dtype=bool))
        actions: Actions = {}
        for member, envs in self._opponents():
            if member is None:
                theirs = {
                    g: sample_array(
                        space,
                        (len(batch.done), len(self.groups[g])),
                        self.rng,
                        batch.action_mask.get(g),
                    )
                    for g, space in self.action_space.items()
                }
            else:
                theirs, _ = self._acting(member).act(batch, explore=explore, decisions=decisions)
            for g, acted in theirs.items():
                acted = np.asarray(acted)
                if g not in actions:
                    actions[g] = acted.copy()
                else:
                    actions[g][envs] = acted[envs]
        return actions, {}

    def _acting(self, member: Weights) -> Policy:
        """The copy of :attr:`player` acting with ``member``'s weights and the player's
        generators, made at its first use."""
        kept = self._copies.get(id(member))
        if kept is None or kept[0] is not member:  # an id of a member gone may come back
            policy = copy.deepcopy(self.player)
            policy.load_weights(member)
            for name, generator in _generators(self.player).items():
                setattr(policy, name, generator)  # one stream for all: the player's
            kept = self._copies[id(member)] = (member, policy)
            playing = {id(m) for m in [*self.members, *self.opponent] if m is not None}
            self._copies = {key: c for key, c in self._copies.items() if key in playing}
        return kept[1]

    def _begin(self, done: np.ndarray) -> None:
        """Draw the opponents of the envs whose episode begins: every env at the first
        batch (or after a restore), later those that are ``done``."""
        if len(self.opponent) != len(done):
            self.opponent = [None] * len(done)
            done = np.ones(len(done), dtype=bool)
        for e in np.flatnonzero(done):
            self.opponent[e] = self._draw()

    def _draw(self) -> Weights | None:
        if not self.members or self.rng.random() < self.random_prob:
            return None
        return self.members[int(self.rng.integers(len(self.members)))]

    def _opponents(self) -> list[tuple[Weights | None, np.ndarray]]:
        """Each distinct current opponent (``None``: random legal play) and its envs."""
        envs: dict[int, list[int]] = {}
        first: dict[int, Weights | None] = {}
        for e, member in enumerate(self.opponent):
            envs.setdefault(id(member), []).append(e)
            first.setdefault(id(member), member)
        return [(first[key], np.array(index)) for key, index in envs.items()]

    def state_dict(self) -> dict[str, Any]:
        """The members, the learner's clock at the last look and every generator (the
        draws', the members' acting): what a resumed run continues with."""
        return {
            "members": list(self.members),
            "clock": self.clock,
            "rng": self.rng.bit_generator.state,
            "player": _generator_states(self.player),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; every env draws its opponent anew at the next batch."""
        self.members = list(state["members"])
        self.clock = int(state["clock"])
        self.rng.bit_generator.state = state["rng"]
        _set_generator_states(self.player, state["player"])
        self.opponent, self._copies = [], {}


def _generators(policy: Policy) -> dict[str, Any]:
    """The policy's own random generators (its NumPy and torch generator attributes)."""
    import torch

    kinds = (np.random.Generator, torch.Generator)
    return {name: value for name, value in vars(policy).items() if isinstance(value, kinds)}


def _seed_generators(policy: Policy, seed: int) -> None:
    """Give each of the policy's generators its own stream from ``seed``."""
    for i, (name, gen) in enumerate(sorted(_generators(policy).items())):
        if isinstance(gen, np.random.Generator):
            setattr(policy, name, np.random.default_rng([seed, i]))
        else:
            gen.manual_seed(seed + i)


def _generator_states(policy: Policy) -> dict[str, Any]:
    return {
        name: gen.bit_generator.state if isinstance(gen, np.random.Generator) else gen.get_state()
        for name, gen in _generators(policy).items()
    }


def _set_generator_states(policy: Policy, states: Mapping[str, Any]) -> None:
    for name, gen in _generators(policy).items():
        if isinstance(gen, np.random.Generator):
            gen.bit_generator.state = states[name]
        else:
            gen.set_state(states[name])
