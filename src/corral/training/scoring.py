"""What an evaluation measures, and which measure selects a run's ``best.pt``.

Columns. Besides ``eval_return`` (the learned agents' mean return), every
evaluation writes ``eval_return/<name>`` for each group and each agent of the
env, learned or not: the mean return of the group's agents, or the agent's
own (an agent alone in a group of its own name is one column). Training rows
have the same columns under ``train_return``.

Competitive games. A game is *two-player zero-sum* when its env has two
agents and declares ``metadata["zero_sum"] = True`` (``corral/rps``, the
zero-sum PettingZoo classic games, OpenSpiel games whose type says so); a
declaration rather than a guess from rewards, which cannot tell a zero-sum
game from one whose rewards happened to cancel. In such games, and in
self-play runs, the mean return over both seats is 0 by construction, so
evaluations also play the learner against a reference opponent
(``eval_opponent``: uniformly random legal play, or a saved run) from each
seat the learner plays: ``eval_vs_opponent/<seat>`` is its mean return in
that seat and ``eval_vs_opponent`` its mean over all those games.

Selection. ``select_by`` names the column whose best value selects
``best.pt``; ``auto`` is ``eval_vs_opponent`` in competitive games and
``eval_return`` otherwise. With several learned groups ``eval_return``
averages them, which suits groups that cooperate; for groups that compete
(``corral/tag``'s predators and prey) name one: ``select_by=eval_return/predator``.
A run warns once when its metric is constant by construction (the mean
return over every agent of a zero-sum game): from the structure when the env
declares itself zero-sum, else when the metric took one value in every
episode of two evaluations and in every training episode.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from corral.training.selfplay_eval import Player, play_against
from corral.training.whole_episodes import CutEpisodes

if TYPE_CHECKING:
    from corral.vector.protocols import VecEnv

RETURN = "eval_return"
"""The learned agents' mean return: the column a run has always written."""
VERSUS = "eval_vs_opponent"
"""The learner's mean return against the reference opponent, over its seats."""
CUT = "eval_cut"
"""The episodes of an evaluation that faults cut: left out of every mean and replaced
(see :mod:`corral.training.whole_episodes`)."""
AUTO = "auto"


@dataclass(frozen=True)
class Score:
    """A measure over episodes: its mean and the standard error of that mean."""

    mean: float
    sem: float
    """The standard error of :attr:`mean` (the episodes' sample deviation / sqrt(episodes));
    NaN for one episode, where it is unknown."""
    episodes: int

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray) -> Score:
        """The score of one value per episode (at least one)."""
        values = np.asarray(values, dtype=np.float64)
        if len(values) == 0:
            raise ValueError("a score needs at least one episode, got none")
        sem = values.std(ddof=1) / math.sqrt(len(values)) if len(values) > 1 else math.nan
        return cls(float(values.mean()), float(sem), len(values))

    def __str__(self) -> str:
        sem = "n/a" if math.isnan(self.sem) else f"{self.sem:.2f}"
        return f"{self.mean:.2f} +- {sem}"


@dataclass
class Evaluation:
    """One evaluation: every column's value in each episode it was measured on.

    ``episodes["eval_return"]`` holds the learned agents' mean return per
    episode; the other keys are the per-group, per-agent and versus columns
    (see the module docstring).
    """

    episodes: dict[str, list[float]] = field(default_factory=dict)
    metric: str = RETURN
    """The column that selects the run's ``best.pt`` (its ``select_by``, see
    :func:`choose_selection`)."""
    cut: int = 0
    """Episodes that faults cut while it played: in no column's values (``eval_cut``)."""

    @property
    def returns(self) -> list[float]:
        """The learned agents' mean return in each greedy episode."""
        return self.episodes[RETURN]

    @property
    def mean(self) -> float:
        """``eval_return``: the mean of :attr:`returns`."""
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        """The standard deviation of :attr:`returns` over episodes."""
        return float(np.std(self.returns))

    def score(self, column: str) -> Score:
        """The mean of ``column`` over its episodes, with its standard error."""
        return Score.of(self.episodes[column])

    def columns(self) -> dict[str, float]:
        """The metrics row entries: each column's mean, ``eval_return_std`` and ``eval_cut``."""
        row = {RETURN: self.mean, f"{RETURN}_std": self.std}
        row.update({k: float(np.mean(v)) for k, v in self.episodes.items() if k != RETURN})
        row[CUT] = self.cut
        return row


def return_columns(groups: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """The agents averaged by each per-group and per-agent column: ``{name: agents}``.

    Raises ``ValueError`` when an agent has the name of a group it is not alone in.
    """
    columns = {g: tuple(agents) for g, agents in groups.items()}
    for agents in groups.values():
        for agent in agents:
            if columns.setdefault(agent, (agent,)) != (agent,):
                raise ValueError(
                    f"agent {agent!r} has the name of the group {agent!r} of agents "
                    f"{list(columns[agent])}, so their return columns would clash; "
                    "choose other group names (group_map)"
                )
    return columns


def episode_columns(
    prefix: str, agent_returns: Mapping[str, Sequence[float]], groups: Mapping[str, Sequence[str]]
) -> dict[str, list[float]]:
    """``prefix/<name>`` for every group and agent: its mean return in each episode."""
    out = {}
    for name, agents in return_columns(groups).items():
        if all(a in agent_returns for a in agents):
            per_agent = np.array([agent_returns[a] for a in agents], dtype=np.float64)
            out[f"{prefix}/{name}"] = per_agent.mean(axis=0).tolist()
    return out


def two_player_zero_sum(venv: VecEnv) -> bool:
    """Whether ``venv``'s env has two agents and declares ``metadata["zero_sum"]``."""
    metadata = getattr(venv, "metadata", None) or {}
    return len(venv.possible_agents) == 2 and metadata.get("zero_sum") is True


def versus_columns(
    algo: Player,
    venv: VecEnv,
    seats: Sequence[str],
    episodes: int,
    opponent: Player | None,
    seed: int,
    cut: CutEpisodes | None = None,
    explore: bool = False,
) -> dict[str, list[float]]:
    """``eval_vs_opponent/<seat>`` and ``eval_vs_opponent``: ``algo``'s returns against
    ``opponent`` (``None``: uniformly random legal play), ``episodes`` whole games shared by
    the seats; the games that faults cut are counted in ``cut`` (by default one
    :class:`CutEpisodes` of ``episodes`` for all seats). ``explore``: ``algo`` explores (the
    reference opponent stays greedy)."""
    out: dict[str, list[float]] = {VERSUS: []}
    cut = CutEpisodes(episodes) if cut is None else cut
    for k, seat in enumerate(seats):
        games = episodes // len(seats) + (k < episodes % len(seats))
        if games:
            returns = play_against(
                algo, venv, games, seat, opponent, seed=seed, cut=cut, explore=explore
            )
            out[f"{VERSUS}/{seat}"] = returns
            out[VERSUS] += returns
    return out


@dataclass(frozen=True)
class Selection:
    """Which column selects ``best.pt``, and what evaluations must measure for it."""

    metric: str
    """The column whose highest value selects ``best.pt``."""
    reason: str
    """Why this metric, as logged at the start of a run."""
    versus: bool
    """Whether evaluations play the reference opponent (the ``eval_vs_opponent`` columns)."""
    seats: tuple[str, ...]
    """The agents the learner plays: the seats of the versus evaluation."""
    constant: str | None = None
    """Why the metric is constant by construction, when it is."""

    def check_episodes(self, episodes: int) -> None:
        """Refuse evaluations of ``episodes`` that would play no game in the seat whose column
        :attr:`metric` is (the games are shared among the seats)."""
        if self.versus and self.metric.startswith(VERSUS + "/") and episodes < len(self.seats):
            raise ValueError(
                f"select_by={self.metric} needs a game in each of the {len(self.seats)} seats "
                f"{list(self.seats)} per evaluation: eval_episodes (or --episodes) must be at "
                f"least {len(self.seats)}, got {episodes}"
            )

    @property
    def train_metric(self) -> str | None:
        """The training column that measures what :attr:`metric` does, if there is one."""
        if self.metric == RETURN or self.metric.startswith(RETURN + "/"):
            return "train_return" + self.metric[len(RETURN) :]
        return None


def choose_selection(
    select_by: str,
    venv: VecEnv,
    learned: Mapping[str, Sequence[str]],
    *,
    self_play: bool = False,
    versus: bool = False,
    learners: int = 1,
) -> Selection:
    """The :class:`Selection` of a run whose ``select_by`` setting is given (see the module
    docstring); ``versus`` asks for the versus evaluation whatever the game. ``learners``:
    how many learned policies play ``learned``; with several, a two-player zero-sum game's
    evaluations play the reference opponent only where ``select_by`` names its column (it
    plays one learner).

    Raises ``ValueError`` naming the columns when ``select_by`` is not one, or when it is
    ``auto`` in a two-player zero-sum game of several learners (no column suits both).
    """
    seats = tuple(a for agents in learned.values() for a in agents)
    competitive = self_play or (two_player_zero_sum(venv) and learners == 1)
    columns = return_columns(venv.groups)
    if select_by == AUTO and learners > 1 and two_player_zero_sum(venv):
        raise ValueError(
            f"select_by=auto in a two-player zero-sum game of {learners} learners: the learners "
            "play each other, so the mean return is 0 and the score against the reference "
            "opponent is one learner's; set select_by to one learner's column, "
            f"one of {[f'{RETURN}/{n}' for n in columns]}"
        )
    if select_by == AUTO:
        if competitive:
            game = "self-play" if self_play else "a two-player zero-sum game"
            metric, reason = VERSUS, f"{game}: the learner's score against the reference opponent"
        else:
            metric, reason = RETURN, "the mean return of the learned agents"
            if len(learned) > 1:
                reason += (
                    f" of the groups {list(learned)}, which suits groups that cooperate; "
                    "for competing groups set select_by=eval_return/<group>"
                )
    else:
        known = [RETURN, *(f"{RETURN}/{n}" for n in columns), VERSUS]
        known += [f"{VERSUS}/{a}" for a in seats]
        if select_by not in known:
            raise ValueError(f"select_by must be 'auto' or one of {known}, got {select_by!r}")
        metric, reason = select_by, "select_by"
    constant = None
    averaged: Sequence[str] = ()  # the agents whose mean return the metric is
    if metric == RETURN:
        averaged = seats
    elif metric.startswith(RETURN + "/"):
        averaged = columns[metric.partition("/")[2]]
    if averaged and _zero_sum_whole(venv, averaged):
        constant = (
            f"{metric} averages the returns of every agent of a zero-sum game, which sum to 0 "
            f"in every episode; select on {VERSUS} (the score against a reference opponent) or "
            "one agent's column instead"
        )
    return Selection(
        metric,
        reason,
        versus=competitive or versus or metric.startswith(VERSUS),
        seats=seats,
        constant=constant,
    )


def selected_column(select_by: str, columns: Collection[str]) -> str:
    """The column that selected ``best.pt`` in a run whose ``select_by`` setting is
    ``select_by`` and whose evaluations wrote ``columns``, as :func:`choose_selection`
    chose it: ``select_by`` itself unless it is ``auto``, which chose ``eval_vs_opponent``
    where evaluations played the reference opponent (self-play, two-player zero-sum
    games) and ``eval_return`` elsewhere."""
    if select_by != AUTO:
        return select_by
    return VERSUS if VERSUS in columns else RETURN


def _zero_sum_whole(venv: VecEnv, agents: Iterable[str]) -> bool:
    metadata = getattr(venv, "metadata", None) or {}
    return metadata.get("zero_sum") is True and set(agents) >= set(venv.possible_agents)


class ConstantWatch:
    """Notices a selection metric that takes one value in every episode, exploring or not.

    Two evaluations and the training episodes between them all giving the
    same value (the mean over both seats of a zero-sum game the env does not
    declare) mean the metric cannot tell checkpoints apart. A greedy policy
    may well score the same in every evaluation episode; exploring training
    episodes then still vary, which is why they count too. A metric without a
    training column (``eval_vs_opponent``) is never flagged.
    """

    def __init__(self, selection: Selection) -> None:
        self.selection = selection
        self.values: set[float] = set()
        self.evaluations = 0
        self.train_episodes = 0
        self.warned = False
        """Whether the run has warned about its metric (it does so once)."""

    def see(
        self, train: Mapping[str, Sequence[float]], evaluation: Mapping[str, Sequence[float]]
    ) -> bool:
        """Take a row's per-episode training and evaluation columns; whether the metric has
        been constant over at least two evaluations and some training episodes."""
        name = self.selection.train_metric
        if name is None:
            return False
        self.values.update(train.get(name, ()))
        self.train_episodes += len(train.get(name, ()))
        if self.selection.metric in evaluation:
            self.values.update(evaluation[self.selection.metric])
            self.evaluations += 1
        return self.evaluations >= 2 and self.train_episodes > 0 and len(self.values) == 1
