"""What evaluations measure and what selects best.pt: returns per group and agent, the score
against a reference opponent in two-player zero-sum games, ``select_by`` and the warning about
selection metrics that are constant by construction (with the tabular learner of
``support.tabular``)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("yaml")

from support.games import UndeclaredRPS
from support.runs import config, train
from support.tabular import TINY

import corral
from corral import cli
from corral.training import ConfigError, RunConfig, Runner, load_run
from corral.training import checkpoint as ckpt
from corral.training.metrics import COLUMNS, MetricsLog, read_metrics
from corral.training.plot import curves
from corral.training.runner import BEST, evaluate_policy
from corral.training.scoring import (
    Score,
    choose_selection,
    return_columns,
    selected_column,
    two_player_zero_sum,
)

TAG = {"env": "corral/tag", "env_kwargs": {"size": 5, "max_cycles": 10}, "total_steps": 240}
RPS = {"env": "corral/rps", "env_kwargs": {"num_rounds": 3}, "total_steps": 120}
ROCK = {"prefer": 0, "lr": 0.0}  # an untrained table that never learns: always rock
PAPER = {"prefer": 1, "lr": 0.0}


def eval_rows(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    return [r for r in rows if "eval_return" in r]


# -- returns per group and per agent ---------------------------------------------------------


def test_rows_hold_returns_per_group_and_per_agent(tmp_path: Path) -> None:
    results = train(config(tmp_path, **TAG))
    rows = read_metrics(tmp_path / "run")
    agents = ["predator_0", "predator_1", "prey_0", "prey_1"]
    for prefix in ("train_return", "eval_return"):
        found = [r for r in rows if prefix in r]
        assert found
        for r in found:
            assert r[f"{prefix}/predator"] == pytest.approx(
                (r[f"{prefix}/predator_0"] + r[f"{prefix}/predator_1"]) / 2
            )
            assert r[f"{prefix}/prey"] == pytest.approx(
                (r[f"{prefix}/prey_0"] + r[f"{prefix}/prey_1"]) / 2
            )
            # every group is learned: the unsuffixed column is the mean over all four agents
            assert r[prefix] == pytest.approx(np.mean([r[f"{prefix}/{a}"] for a in agents]))
    # predators earn +1 per prey caught by either, prey -1 when caught: they compete
    caught = [r for r in eval_rows(rows) if r["eval_return/prey"] < 0]
    assert caught and all(r["eval_return/predator"] > 0 for r in caught)
    assert results.select_by == "eval_return"


def test_per_group_columns_reach_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(config(tmp_path, tensorboard=True, **TAG))
    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    tags = set(events.Tags()["tensors"]) | set(events.Tags()["scalars"])
    assert {"eval_return/predator", "eval_return/prey_1", "train_return/predator_0"} <= tags


def test_parts_of_a_column_are_written_next_to_each_other(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, tensorboard=False)
    log.add({"env_steps": 0, "eval_return": 1.0, "eval_return/a": 1.0, "loss": 0.5})
    log.add({"env_steps": 1, "eval_return/b": 2.0, "loss/x": 0.1})
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header == [*COLUMNS, "eval_return/a", "eval_return/b", "loss", "loss/x"]


def test_an_agent_named_like_another_group_is_refused() -> None:
    assert return_columns({"team": ("a", "b"), "c": ("c",)}) == {
        "team": ("a", "b"),
        "c": ("c",),
        "a": ("a",),
        "b": ("b",),
    }
    with pytest.raises(ValueError, match="agent 'b' has the name of the group 'b'"):
        return_columns({"b": ("a",), "team": ("b", "c")})


def test_plot_draws_a_per_group_column(tmp_path: Path) -> None:
    train(config(tmp_path, **TAG))
    (curve,) = curves([tmp_path / "run"], metric="eval_return/prey")
    assert curve.metric == "eval_return/prey"
    expected = [r["eval_return/prey"] for r in eval_rows(read_metrics(tmp_path / "run"))]
    np.testing.assert_allclose(curve.returns[0], expected)
    with pytest.raises(ConfigError, match=r"no column 'eval_return/wolf'.*eval_return/prey"):
        curves([tmp_path / "run"], metric="eval_return/wolf")


# -- two-player zero-sum games ----------------------------------------------------------------


def test_two_player_zero_sum_is_what_the_env_declares() -> None:
    pytest.importorskip("pettingzoo")
    declared = {
        "corral/rps": True,
        "pettingzoo/classic/tictactoe_v3": True,
        "corral/rps4": False,  # zero-sum, but four players
        "corral/tag": False,
        "mdp/climbing": False,  # cooperative
    }
    for env_id, expected in declared.items():
        venv = corral.make_vec(env_id, 1)
        assert two_player_zero_sum(venv) is expected, env_id
        venv.close()


def test_zero_sum_runs_select_best_on_the_score_against_random_from_both_seats(
    tmp_path: Path,
) -> None:
    results = train(config(tmp_path, eval_every=40, eval_episodes=40, **RPS))
    rows = eval_rows(results.metrics)
    assert results.select_by == "eval_vs_opponent"
    # both seats are the one learned group: their mean return is 0 in every game
    assert all(r["eval_return"] == 0 and r["eval_return_std"] == 0 for r in rows)
    for r in rows:
        seats = (r["eval_vs_opponent/player_0"] + r["eval_vs_opponent/player_1"]) / 2
        assert r["eval_vs_opponent"] == pytest.approx(seats)
    best = max(rows, key=lambda r: r["eval_vs_opponent"])
    assert results.best_eval == best["eval_vs_opponent"]
    assert (
        results.best_steps == best["env_steps"] == ckpt.load(tmp_path / "run" / BEST)["env_steps"]
    )
    assert results.final_eval == rows[-1]["eval_vs_opponent"]
    assert len({r["eval_vs_opponent"] for r in rows}) > 1  # it tells checkpoints apart


def test_a_saved_run_is_a_reference_opponent_in_each_seat(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train(config(tmp_path, "rock", **RPS, **ROCK))
    versus_rock = config(tmp_path, "paper", eval_opponent=str(tmp_path / "rock"), **RPS, **PAPER)
    results = train(versus_rock)
    for r in eval_rows(results.metrics):  # paper beats rock in every round, from either seat
        assert r["eval_vs_opponent/player_0"] == r["eval_vs_opponent/player_1"] == 3.0
    cfg, algo, _ = load_run(tmp_path / "paper", allow_imports=[TINY])
    against_random = evaluate_policy(cfg, algo, 200, opponent="random")
    assert abs(against_random.columns()["eval_vs_opponent"]) < 0.6  # rock wins as often as not
    code = cli.main(
        [
            "eval",
            str(tmp_path / "paper"),
            "--episodes",
            "4",
            "--opponent",
            str(tmp_path / "rock" / BEST),
            "--allow-import",
            TINY,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    against = f"against {tmp_path / 'rock' / BEST}; by seat: player_0 +3, player_1 +3"
    assert f"  eval_vs_opponent 3.00 +- 0.00 (selects best.pt) {against}" in out


def test_an_unusable_reference_opponent_is_a_config_error(tmp_path: Path) -> None:
    train(config(tmp_path, "tag", **{**TAG, "total_steps": 40}))
    with pytest.raises(ConfigError, match="trained on corral/tag, not on corral/rps"):
        cfg = config(tmp_path, "a", eval_opponent=str(tmp_path / "tag"), **RPS)
        Runner(cfg, progress=False, allow_imports=[TINY])
    with pytest.raises(ConfigError, match="eval_opponent must be 'random', a run directory"):
        Runner(
            config(tmp_path, "b", eval_opponent=str(tmp_path / "nowhere"), **RPS), progress=False
        )


def test_a_relative_reference_opponent_is_kept_as_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ref").mkdir()
    monkeypatch.chdir(tmp_path)
    run = RunConfig(env="corral/rps", eval_opponent="ref")
    assert run.eval_opponent == str(tmp_path / "ref")  # a resume from elsewhere still finds it
    assert RunConfig(env="corral/rps", eval_opponent="random").eval_opponent == "random"


# -- select_by and constant metrics ------------------------------------------------------------


def test_select_by_names_the_column_that_chooses_best(tmp_path: Path) -> None:
    results = train(config(tmp_path, eval_every=40, select_by="eval_return/prey", **TAG))
    rows = eval_rows(results.metrics)
    best = max(rows, key=lambda r: r["eval_return/prey"])
    assert results.select_by == "eval_return/prey" and results.best_eval == best["eval_return/prey"]
    assert ckpt.load(tmp_path / "run" / BEST)["env_steps"] == best["env_steps"]
    with pytest.raises(
        ConfigError, match=r"select_by must be 'auto' or one of \[.*'eval_return/prey'"
    ):
        Runner(config(tmp_path, "bad", select_by="eval_return/wolf", **TAG), progress=False)


@pytest.mark.parametrize(
    "case",
    [
        {**TAG, "total_steps": 40},  # auto: eval_return
        {**TAG, "total_steps": 40, "select_by": "eval_return/prey"},
        RPS,  # auto on a two-player zero-sum game: eval_vs_opponent
        {**RPS, "select_by": "eval_vs_opponent/player_1"},
    ],
    ids=["tag", "tag-prey", "rps", "rps-seat"],
)
def test_the_column_read_back_from_a_run_is_the_one_that_selected_it(
    tmp_path: Path, case: dict
) -> None:
    results = train(config(tmp_path, eval_every=40, **case))
    columns = {k for r in read_metrics(tmp_path / "run") for k in r}
    assert selected_column(case.get("select_by", "auto"), columns) == results.select_by


def test_plot_draws_each_runs_selection_column_unless_they_differ(tmp_path: Path) -> None:
    short = {**TAG, "total_steps": 40}
    train(config(tmp_path, "auto", eval_every=40, **short))
    train(config(tmp_path, "prey", eval_every=40, select_by="eval_return/prey", **short))
    (prey,) = curves([tmp_path / "prey"])
    assert prey.metric == "eval_return/prey"
    differ = r"different columns \['eval_return', 'eval_return/prey'\]"
    with pytest.raises(ConfigError, match=differ):
        curves([tmp_path / "auto", tmp_path / "prey"])
    (both,) = curves([tmp_path / "auto", tmp_path / "prey"], metric="eval_return")
    assert both.metric == "eval_return" and len(both.returns) == 2


def test_a_score_is_the_mean_and_its_standard_error() -> None:
    values = [1.0, 2.0, 4.0, 7.0]
    score = Score.of(values)
    assert score.mean == 3.5 and score.episodes == 4
    assert score.sem == pytest.approx(np.std(values, ddof=1) / 2)
    assert str(score) == "3.50 +- 1.32"
    one = Score.of([2.0])
    assert np.isnan(one.sem) and str(one) == "2.00 +- n/a"
    with pytest.raises(ValueError, match="at least one episode"):
        Score.of([])


def test_auto_selection_says_what_it_chose() -> None:
    tag = SimpleNamespace(
        possible_agents=["predator_0", "prey_0"],
        groups={"predator": ("predator_0",), "prey": ("prey_0",)},
        metadata={"lockstep": False},
    )
    both = choose_selection("auto", tag, tag.groups)
    assert both.metric == "eval_return" and not both.versus
    assert "for competing groups set select_by=eval_return/<group>" in both.reason
    one = choose_selection("auto", tag, {"prey": ("prey_0",)})
    assert one.metric == "eval_return" and "competing" not in one.reason
    game = SimpleNamespace(**{**vars(tag), "metadata": {"zero_sum": True}})
    assert choose_selection("auto", game, game.groups).metric == "eval_vs_opponent"
    selfplay = choose_selection("auto", tag, tag.groups, self_play=True)
    assert selfplay.metric == "eval_vs_opponent" and selfplay.seats == ("predator_0", "prey_0")


def warnings_logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "cannot be chosen well" in r.getMessage()
    ]


def test_a_metric_constant_by_construction_is_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="corral"):
        train(config(tmp_path, eval_every=40, select_by="eval_return", **RPS))
    (warning,) = warnings_logged(caplog)
    assert "eval_return averages the returns of every agent of a zero-sum game" in warning
    assert "cannot be chosen well" in (tmp_path / "run" / "train.log").read_text()
    assert "best.pt is selected on eval_return" in (tmp_path / "run" / "train.log").read_text()


def test_a_metric_seen_constant_in_every_episode_is_warned_about_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, isolated_registry: None
) -> None:
    corral.register("test/undeclared_rps", UndeclaredRPS)
    settings = {**RPS, "env": "test/undeclared_rps", "eval_every": 40}
    with caplog.at_level(logging.INFO, logger="corral"):
        results = train(config(tmp_path, **settings))
    assert results.select_by == "eval_return"  # nothing says it is a zero-sum game
    (warning,) = warnings_logged(caplog)
    assert "eval_return has been 0 in every episode of 2 evaluations" in warning


def test_a_greedy_policy_scoring_the_same_in_every_evaluation_is_not_flagged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="corral"):
        results = train(config(tmp_path, **ROCK))  # the climbing game: greedy play never changes
    assert len({r["eval_return"] for r in eval_rows(results.metrics)}) == 1
    assert not warnings_logged(caplog)


class _Drawing:
    """A player of ``groups`` whose every action is a legal one drawn from its own generator
    (greedy or not): two loops that ask it in the same order get the same actions."""

    def __init__(self, venv, groups: list[str], seed: int) -> None:
        self.venv, self.groups = venv, {g: venv.groups[g] for g in groups}
        self.rng = np.random.default_rng(seed)

    def act(self, batch, *, explore: bool = True):
        actions = self.venv.sample_actions(batch, self.rng)
        return {g: actions[g] for g in self.groups}, {}


@pytest.mark.parametrize("opponent", [False, True])
@pytest.mark.parametrize("seat", ["player_0", "player_2"])
def test_games_against_an_opponent_play_as_stepping_the_envs_directly(seat, opponent) -> None:
    from oracles.seats import play_against_directly

    from corral.training.selfplay_eval import play_against

    venv = corral.make_vec("corral/rps4", 3, seed=0, group_map="agent")
    returns = []
    for play in (play_against, play_against_directly):
        learner = _Drawing(venv, list(venv.groups), seed=1)
        other = _Drawing(venv, ["player_1", "player_3"], seed=2) if opponent else None
        returns.append(play(learner, venv, 7, seat, other, seed=5))
    assert len(returns[0]) == 7 and len(set(returns[0])) > 1
    assert returns[0] == returns[1]
    venv.close()


class _Asked(_Drawing):
    """:class:`_Drawing` that notes the ``explore`` of every call."""

    def __init__(self, venv, groups: list[str], seed: int) -> None:
        super().__init__(venv, groups, seed)
        self.asked: list[bool] = []

    def act(self, batch, *, explore: bool = True):
        self.asked.append(explore)
        return super().act(batch, explore=explore)


@pytest.mark.parametrize("explore", [False, True])
def test_games_against_an_opponent_explore_only_where_asked(explore: bool) -> None:
    """``eval_explore``'s path: the learner acts exploring where asked, the reference
    opponent greedily either way."""
    from corral.training.selfplay_eval import play_against

    venv = corral.make_vec("corral/rps4", 2, seed=0, group_map="agent")
    learner = _Asked(venv, list(venv.groups), seed=1)
    other = _Asked(venv, ["player_1", "player_3"], seed=2)
    play_against(learner, venv, 3, "player_0", other, seed=5, explore=explore)
    assert learner.asked and set(learner.asked) == {explore}
    assert other.asked and set(other.asked) == {False}
    venv.close()
