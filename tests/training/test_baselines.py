"""Reference baselines (random, the simple_spread heuristic), their score, and the reference
lines of ``corral plot``."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.paths import BENCHMARKS

pytest.importorskip("mpe2")

import corral
from corral.algos.policy import Policy
from corral.training.baselines import (
    SPREAD,
    Score,
    episode_returns,
    evaluate_baseline,
    greedy_assignment,
    random_controller,
    reference_scores,
    spread_controller,
    spread_heuristic,
)
from corral.training.collector import evaluate
from corral.training.policy_map import FixedPlayer

TARGET_ENV = {"N": 3, "max_cycles": 25, "local_ratio": 0.5}  # issue 13's learning targets


def spread_obs(vel: list[float], to_landmarks: list[list[float]]) -> np.ndarray:
    """The observation ``[1, 1, ...]`` of one agent with ``vel`` and landmarks at
    ``to_landmarks`` (relative), as simple_spread lays it out (position and others zero)."""
    n = len(to_landmarks)
    obs = np.zeros((1, 1, 6 * n), np.float32)
    obs[0, 0, 0:2] = vel
    obs[0, 0, 4 : 4 + 2 * n] = np.ravel(to_landmarks)
    return obs


# -- the heuristic ----------------------------------------------------------------------------


def test_greedy_assignment_takes_the_closest_pair_first_in_every_copy() -> None:
    distances = np.array(
        [
            [[1.0, 2.0], [1.5, 10.0]],  # agent 1 is nearer landmark 0 than 1, but agent 0 nearer
            [[3.0, 2.0], [1.0, 4.0]],  # each agent's nearest differs: no conflict
        ]
    )
    np.testing.assert_array_equal(greedy_assignment(distances), [[0, 1], [1, 0]])


@pytest.mark.parametrize(
    ("vel", "landmark", "action"),
    [
        ([0, 0], [0.8, 0.1], 2),  # far along +x
        ([0, 0], [0.1, -0.8], 3),  # far along -y
        ([1, 0], [0.0, 0.0], 1),  # on the landmark, moving +x: brake
        ([0, 0], [0.01, 0.0], 0),  # close enough: a move would overshoot
    ],
)
def test_the_discrete_heuristic_takes_the_move_that_ends_nearest(
    vel: list[float], landmark: list[float], action: int
) -> None:
    assert spread_heuristic(spread_obs(vel, [landmark]))[0, 0] == action


def test_the_continuous_heuristic_is_proportional_and_in_its_box() -> None:
    near = spread_heuristic(spread_obs([0, 0], [[0.01, -0.02]]), continuous=True)
    np.testing.assert_allclose(near[0, 0], [0, 0, 0.2, 0.4, 0], atol=1e-6)  # 0.01 / 0.05
    far = spread_heuristic(spread_obs([0, 0], [[3.0, -0.02]]), continuous=True)
    np.testing.assert_allclose(far[0, 0], [0, 0, 1, 0.4, 0], atol=1e-6)  # clipped to 1
    assert near.dtype == np.float32


@pytest.mark.parametrize("continuous", [False, True])
def test_the_heuristic_acts_on_each_copy_of_a_batch_alone(continuous: bool) -> None:
    venv = corral.make_vec(SPREAD, 16, env_kwargs={"continuous_actions": continuous})
    batch = venv.reset(seed=3)
    for _ in range(5):  # copies in different states, moving
        batch = venv.step(venv.sample_actions(batch, np.random.default_rng(0)))
    obs = batch.obs["agent"]
    together = spread_heuristic(obs, continuous=continuous)
    alone = [spread_heuristic(obs[e : e + 1], continuous=continuous)[0] for e in range(16)]
    np.testing.assert_array_equal(together, np.stack(alone))
    venv.close()


def test_the_heuristic_refuses_observations_that_hide_landmarks() -> None:
    venv = corral.make_vec(SPREAD, 2, env_kwargs={"num_landmark_neighbors": 2})
    with pytest.raises(ValueError, match="num_landmark_neighbors=2"):
        spread_controller(venv, {"num_landmark_neighbors": 2})
    venv.close()
    with pytest.raises(ValueError, match="at least 10 values"):
        spread_heuristic(np.zeros((4, 3, 8)))


# -- scores -----------------------------------------------------------------------------------


@pytest.mark.parametrize("continuous", [False, True])
def test_the_heuristic_clearly_beats_random_on_the_learning_targets_env(continuous: bool) -> None:
    env_kwargs = {**TARGET_ENV, "continuous_actions": continuous}
    scores = reference_scores(SPREAD, env_kwargs, episodes=300, seed=1)
    random, heuristic = scores["random"], scores["heuristic"]
    assert random.episodes == heuristic.episodes == 300
    gap = heuristic.mean - random.mean
    assert gap > 10 * (heuristic.sem + random.sem), scores
    assert heuristic.mean > -12, scores  # a regression check (about -9 discrete, -7 continuous)


class _Scripted(Policy):
    """A controller as a policy, which the runner's evaluation plays as a fixed player."""

    def __init__(self, venv: Any) -> None:
        super().__init__(venv.groups)
        self.controller = spread_controller(venv, {})

    def act(self, batch: Any, *, explore: bool = True, decisions: Any = None) -> tuple[dict, dict]:
        return self.controller(batch, np.random.default_rng()), {}


def test_a_score_measures_what_a_runs_evaluation_does() -> None:
    env_kwargs = {"N": 2, "max_cycles": 7}
    venv = corral.make_vec(SPREAD, 3, env_kwargs=env_kwargs)
    every = {g: np.ones(len(agents), dtype=bool) for g, agents in venv.groups.items()}
    scripted = {"scripted": FixedPlayer(_Scripted(venv), every)}
    runner = evaluate(venv, {}, 10, scripted, seed=5).episode_returns
    ours = episode_returns(venv, spread_controller(venv, env_kwargs), 10, seed=5)
    venv.close()
    np.testing.assert_array_equal(ours, runner)
    score = Score.of(ours)
    assert score.mean == pytest.approx(np.mean(runner))
    assert score.sem == pytest.approx(np.std(runner, ddof=1) / np.sqrt(10))
    assert str(score) == f"{score.mean:.2f} +- {score.sem:.2f}"


def test_random_play_is_seeded() -> None:
    venv = corral.make_vec(SPREAD, 4, env_kwargs={"max_cycles": 5})
    first, again, other = (
        episode_returns(venv, random_controller(venv, {}), 8, seed=s) for s in (2, 2, 3)
    )
    venv.close()
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_unknown_envs_and_baselines_are_named() -> None:
    with pytest.raises(ValueError, match=r"no reference baselines for 'mdp/climbing'.*simple_spr"):
        evaluate_baseline("random", "mdp/climbing")
    with pytest.raises(ValueError, match=r"no baseline 'expert'.*\['random', 'heuristic'\]"):
        evaluate_baseline("expert")
    with pytest.raises(ValueError, match="at least 2 episodes"):
        evaluate_baseline("random", episodes=1)


def test_the_benchmark_script_prints_both_baselines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    lines = importlib.import_module("spread_baselines").measure(2, 4, 0)
    assert [line.split()[0] for line in lines] == ["discrete", "continuous"]
    assert all("random -" in line and "heuristic -" in line and "+-" in line for line in lines)


# -- reference lines in plots ---------------------------------------------------------------


def spread_run(capsys: pytest.CaptureFixture[str], run_dir: Path, *settings: str) -> Path:
    """A tiny run on simple_spread (a tabular learner, through ``corral train``)."""
    pytest.importorskip("yaml")
    from support.cli import train

    code, _, err = train(capsys, run_dir, "--set", *settings, env=SPREAD)
    assert code == 0, err
    return run_dir


def drawn(figure: Any) -> dict[str, dict[str, float]]:
    """Each panel's horizontal lines: title -> {label: value}."""
    return {
        ax.get_title(): {
            line.get_label(): float(line.get_ydata()[0])
            for line in ax.get_lines()
            if len(set(line.get_ydata())) == 1 and len(line.get_xdata()) == 2
        }
        for ax in figure.axes
    }


def test_plots_draw_reference_lines_and_the_envs_baselines(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    from corral.training.plot import draw_runs

    run = spread_run(capsys, tmp_path / "r", "env_kwargs.N=2", "env_kwargs.max_cycles=10")
    figure = draw_runs([run], references={"MAPPO (XuanCe)": -11.5})
    assert drawn(figure) == {SPREAD: {"MAPPO (XuanCe) (-11.50)": -11.5}}
    assert figure.axes[0].get_legend() is not None

    figure = draw_runs([run], references={"target": -13}, baselines=True)
    scores = reference_scores(SPREAD, {"N": 2, "max_cycles": 10})
    lines = drawn(figure)[SPREAD]
    expected = {f"{name} ({s.mean:.2f})": s.mean for name, s in scores.items()}
    assert lines == {**expected, "target (-13.00)": -13.0}
    legend = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert set(lines) <= set(legend)


def test_each_horizontal_line_has_its_own_colour_and_dashes_apart_from_the_curves(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_rgba

    from corral.training.plot import draw_runs

    run = spread_run(capsys, tmp_path / "r", "env_kwargs.N=2", "env_kwargs.max_cycles=10")
    figure = draw_runs([run], references={"target": -13}, baselines=True)
    ax = figure.axes[0]
    flat = [line for line in ax.get_lines() if len(line.get_xdata()) == 2]
    curves = [line for line in ax.get_lines() if line not in flat]
    assert len(flat) == 3 and len(curves) == 1  # random, heuristic, target; one curve
    colours = [to_rgba(line.get_color()) for line in flat]
    assert len(set(colours)) == 3 and to_rgba(curves[0].get_color()) not in colours
    assert len({line.get_linestyle() for line in flat}) == 3
    legend = {t.get_text(): h.get_color() for t, h in zip(
        ax.get_legend().get_texts(), ax.get_legend().legend_handles, strict=True
    )}  # fmt: skip
    assert {to_rgba(legend[line.get_label()]) for line in flat} == set(colours)


def test_plot_command_draws_references_and_refuses_what_it_cannot(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    from support.cli import run, train

    spread = spread_run(capsys, tmp_path / "s", "env_kwargs.N=2", "env_kwargs.max_cycles=10")
    png = tmp_path / "c.png"
    code, out, err = run(
        capsys, "plot", str(spread), "-o", str(png), "--reference", "a=-3", "--baselines"
    )
    assert code == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG" and f"wrote {png}" in out

    assert train(capsys, tmp_path / "m")[0] == 0  # mdp/climbing: no baselines
    code, _, err = run(capsys, "plot", str(tmp_path / "m"), "-o", str(png), "--baselines")
    assert code == 2 and "Traceback" not in err
    assert "no reference baselines for 'mdp/climbing'" in err and SPREAD in err

    for bad in ("-3", "a=", "a=low", "a=nan"):
        with pytest.raises(SystemExit) as exited:  # argparse's usage error
            run(capsys, "plot", str(spread), "-o", str(png), "--reference", bad)
        err = capsys.readouterr().err
        assert exited.value.code == 2 and "expected NAME=VALUE with a finite number" in err, bad

    argv = ["plot", str(spread), "-o", str(png), "--baselines", "--metric", "eval_return/agent_0"]
    code, _, err = run(capsys, *argv)
    assert code == 2 and "baselines are measured on eval_return" in err


def test_baselines_need_one_env_setting_per_env(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    from corral.training import ConfigError
    from corral.training.plot import draw_runs

    two = spread_run(capsys, tmp_path / "two", "env_kwargs.N=2", "env_kwargs.max_cycles=10")
    three = spread_run(capsys, tmp_path / "three", "env_kwargs.N=3", "env_kwargs.max_cycles=10")
    assert draw_runs([two, three])  # curves alone: fine
    with pytest.raises(ConfigError, match="different env_kwargs"):
        draw_runs([two, three], baselines=True)
