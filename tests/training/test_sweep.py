"""``corral sweep``: the space file, trials as run directories, pruning, parallel trials
sharing one SQLite study, and a sweep continued on its directory."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("yaml")

import yaml
from support.cli import run
from support.tabular import TINY

from corral.training import ConfigError
from corral.training.metrics import read_metrics
from corral.training.sweep import BEST, STUDY, STUDY_NAME, Param, read_space, sweep

FAST = {
    "num_envs": 2,
    "eval_episodes": 4,
    "log_every": 20,
    "eval_every": 40,
    "device": "cpu",
    "tensorboard": False,
    "total_steps": 80,
}
"""Settings of every trial: a few dozen env steps of the tabular learner."""
FAST_ARGS = ["--total-steps", "80", "--set", *(f"{k}={v}" for k, v in FAST.items())]
ENV = "mdp/climbing"


def space_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    return path


# -- the space -------------------------------------------------------------------------------


def test_the_space_reads_ranges_steps_logs_and_choices(tmp_path: Path) -> None:
    path = space_file(
        tmp_path,
        "lr: {low: 1e-4, high: 1.0e-2, log: true}\n"
        "states: {low: 4, high: 16, step: 4}\n"
        "epsilon: {low: 0.1, high: 0.5, step: 0.1}\n"
        "hidden: {choices: [[32, 32], [64]]}\n"
        "self_play: {choices: [false]}\n",
    )
    params = read_space(path, TINY, ENV)
    assert params == {
        "lr": Param("lr", "float", low=1e-4, high=1e-2, log=True),
        "states": Param("states", "int", low=4, high=16, step=4),
        "epsilon": Param("epsilon", "float", low=0.1, high=0.5, step=0.1),
        "hidden": Param("hidden", "choice", choices=("32,32", "64")),
        "self_play": Param("self_play", "choice", choices=(False,)),
    }


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "names no setting"),
        ("- lr\n", "must hold a mapping"),
        ("lrr: {low: 0.1, high: 0.2}\n", "lrr: not a setting of .* \\(did you mean 'lr'\\?\\)"),
        ("lr: 0.1\n", "lr: expected \\{low: L, high: H\\}"),
        ("lr: {low: 0.1}\n", "expected the keys low and high"),
        ("lr: {low: 0.1, high: 0.2, scale: log}\n", "expected the keys low and high"),
        ("lr: {low: 0.3, high: 0.2}\n", "low 0.3 is above high 0.2"),
        ("lr: {low: 0.1, high: 0.2, log: true, step: 0.05}\n", "log and step cannot go"),
        ("lr: {low: 0, high: 0.2, log: true}\n", "log scale needs low above 0"),
        ("lr: {low: a, high: 0.2}\n", "low: expected a finite number, got 'a'"),
        ("states: {low: 2.5, high: 8}\n", "states: low: the setting is an int, got 2.5"),
        ("hidden: {low: 32, high: 64}\n", "draws from choices only"),
        ("lr: {choices: []}\n", "choices must be a non-empty list"),
        ("lr: {choices: [0.1], low: 1}\n", "choices takes no other key"),
        ("eval_episodes: {low: 0, high: 4}\n", "eval_episodes: 0: .*eval_episodes"),
        ("backend: {choices: [sync, warp]}\n", "backend: 'warp'"),
        ("env: {choices: [mdp/penalty]}\n", "the sweep's own setting"),
        ("seed: {choices: [{a: 1}]}\n", "a choice must be"),
    ],
)
def test_a_space_that_cannot_be_searched_is_one_error_naming_the_setting(
    tmp_path: Path, text: str, said: str
) -> None:
    path = space_file(tmp_path, text)
    with pytest.raises(ConfigError, match=said) as caught:
        read_space(path, TINY, ENV)
    assert str(caught.value).startswith(str(path)) and "\n" not in str(caught.value)


def test_a_setting_both_swept_and_set_is_refused(tmp_path: Path) -> None:
    path = space_file(tmp_path, "lr: {low: 0.1, high: 0.2}\n")
    with pytest.raises(ConfigError, match="both swept and set"):
        read_space(path, TINY, ENV, {"lr": 0.1})


def test_a_bad_space_on_the_command_line_is_rc_2_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = space_file(tmp_path, "lr: {low: 0.1, high: 0.2}\nclip: {choices: [0.1]}\n")
    sweep_dir = tmp_path / "sweep"
    code, out, err = run(
        capsys, "sweep", TINY, "--env", ENV, "--space", str(path), "--trials", "2",
        "--sweep-dir", str(sweep_dir), *FAST_ARGS,
    )  # fmt: skip
    assert code == 2 and out == ""
    assert err.startswith("corral: error: ") and "clip: not a setting" in err
    assert len(err.strip().splitlines()) == 1
    assert not sweep_dir.exists()


def test_without_optuna_a_sweep_is_one_line_naming_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)  # as if not installed
    path = space_file(tmp_path, "lr: {low: 0.1, high: 0.2}\n")
    code, _, err = run(
        capsys, "sweep", TINY, "--env", ENV, "--space", str(path), "--trials", "1",
        "--sweep-dir", str(tmp_path / "sweep"),
    )  # fmt: skip
    assert code == 2 and "pip install 'corral[track]'" in err
    assert not (tmp_path / "sweep").exists()


# -- sweeps ----------------------------------------------------------------------------------


def trial_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(sweep_dir.glob("trial-*"))


def test_a_sweep_trains_each_trial_as_a_run_directory_and_writes_the_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("optuna")
    path = space_file(
        tmp_path,
        "lr: {low: 1e-3, high: 0.5, log: true}\nprefer: {choices: [0, 2]}\n"
        "hidden: {choices: [[8, 8], [16]]}\n",
    )
    sweep_dir = tmp_path / "sweep"
    code, out, err = run(
        capsys, "sweep", TINY, "--env", ENV, "--space", str(path), "--trials", "3",
        "--sweep-dir", str(sweep_dir), "--seed", "3", *FAST_ARGS,
    )  # fmt: skip
    assert code == 0, err
    runs = trial_dirs(sweep_dir)
    assert [r.name for r in runs] == ["trial-0000", "trial-0001", "trial-0002"]
    best_value, best_dir = -float("inf"), None
    for run_dir in runs:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert saved["run"]["seed"] == 3 and saved["run"]["total_steps"] == 80
        assert saved["algo_config"]["prefer"] in (0, 2) and saved["algo_config"]["lr"] >= 1e-3
        value = max(r["eval_return"] for r in read_metrics(run_dir) if "eval_return" in r)
        if value > best_value:
            best_value, best_dir = value, run_dir
    best = yaml.safe_load((sweep_dir / BEST).read_text())
    assert best["value"] == best_value and Path(best["run_dir"]) == best_dir
    saved = yaml.safe_load((best_dir / "config.yaml").read_text())  # type: ignore[operator]
    assert best["settings"] == {k: saved["algo_config"][k] for k in ("lr", "prefer", "hidden")}
    assert best["settings"]["hidden"] in ([8, 8], [16])  # as the run holds it, not as drawn
    assert f"  hidden={','.join(map(str, best['settings']['hidden']))}\n" in out
    assert f"best trial {best['trial']}: {best_value:.4g} in {best_dir}" in out
    assert f"  prefer={best['settings']['prefer']}" in out
    assert (sweep_dir / STUDY).is_file()


def test_a_trial_s_warnings_reach_the_sweep_s_output_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each trial of 8 env steps where MAPPO's first update needs a rollout of 64: the
    sweep says so (once, not per trial), not only each trial's train.log."""
    pytest.importorskip("optuna")
    pytest.importorskip("torch")
    path = space_file(tmp_path, "lr: {choices: [0.001, 0.01]}\n")
    sweep_dir = tmp_path / "sweep"
    settings = [f"{k}={v}" for k, v in {**FAST, "total_steps": 8, "eval_every": 0}.items()]
    code, _, err = run(
        capsys, "sweep", "mappo", "--env", ENV, "--space", str(path), "--trials", "2",
        "--sweep-dir", str(sweep_dir), "--set", *settings, "rollout_steps=32",
    )  # fmt: skip
    assert code == 0, err
    assert err.count("no update will happen") == 1, err
    assert "trial 0: no update will happen" in err
    for run_dir in trial_dirs(sweep_dir):
        assert "no update will happen" in (run_dir / "train.log").read_text()


def enqueued_study(sweep_dir: Path, *params: dict[str, Any]) -> None:
    """The study of ``sweep_dir`` with ``params`` as its next trials."""
    optuna = pytest.importorskip("optuna")
    sweep_dir.mkdir()
    study = optuna.create_study(
        study_name=STUDY_NAME, storage=f"sqlite:///{sweep_dir / STUDY}", direction="maximize"
    )
    for values in params:
        study.enqueue_trial(values)


def test_a_trial_below_the_median_at_an_evaluation_is_pruned_there(tmp_path: Path) -> None:
    optuna = pytest.importorskip("optuna")
    # lr=0: the tables never change, so each trial's evaluations are those of its greedy
    # action: prefer=0 scores 11 in the climbing game, prefer=2 scores 5
    path = space_file(tmp_path, "prefer: {choices: [0, 2]}\n")
    sweep_dir = tmp_path / "sweep"
    enqueued_study(sweep_dir, {"prefer": 0}, {"prefer": 2}, {"prefer": 0})
    result = sweep(
        TINY, ENV, path, 3, settings={**FAST, "lr": 0.0}, sweep_dir=sweep_dir,
        pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=1),
    )  # fmt: skip
    assert result.states == {"COMPLETE": 2, "PRUNED": 1}
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{sweep_dir / STUDY}")
    pruned = study.trials[1]
    assert pruned.state == optuna.trial.TrialState.PRUNED
    assert pruned.intermediate_values == {0: 5.0, 40: 5.0}  # step 0 is never pruned
    rows = read_metrics(sweep_dir / "trial-0001")
    assert rows[-1]["env_steps"] == 40  # its run directory stops at the evaluation that pruned it
    assert read_metrics(sweep_dir / "trial-0002")[-1]["env_steps"] == 80
    assert (result.trial, result.value, result.settings) == (0, 11.0, {"prefer": 0})


def test_without_a_pruner_every_trial_runs_to_the_end(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    path = space_file(tmp_path, "prefer: {choices: [0, 2]}\n")
    sweep_dir = tmp_path / "sweep"
    enqueued_study(sweep_dir, {"prefer": 0}, {"prefer": 2})
    result = sweep(
        TINY, ENV, path, 2, settings={**FAST, "lr": 0.0}, sweep_dir=sweep_dir, pruner="none"
    )
    assert result.states == {"COMPLETE": 2}


def test_parallel_trials_share_one_sqlite_study(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    path = space_file(tmp_path, "lr: {low: 0.01, high: 0.5}\n")
    result = sweep(TINY, ENV, path, 3, settings=FAST, sweep_dir=tmp_path / "sweep", parallel=2)
    assert result.states == {"COMPLETE": 3}
    assert [r.name for r in trial_dirs(tmp_path / "sweep")] == [
        "trial-0000",
        "trial-0001",
        "trial-0002",
    ]
    assert all(read_metrics(r)[-1]["env_steps"] == 80 for r in trial_dirs(tmp_path / "sweep"))


def test_a_sweep_on_its_directory_again_adds_trials_to_the_same_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("optuna")
    path = space_file(tmp_path, "lr: {low: 0.01, high: 0.5}\n")
    sweep_dir = tmp_path / "sweep"
    argv = ["sweep", TINY, "--env", ENV, "--space", str(path), "--sweep-dir", str(sweep_dir)]
    assert run(capsys, *argv, "--trials", "1", *FAST_ARGS)[0] == 0
    code, out, err = run(capsys, *argv, "--trials", "1", *FAST_ARGS)
    assert code == 0, err
    assert "2 complete" in out
    # the same settings from Python (numbers, not the command line's text): the same sweep
    result = sweep(TINY, ENV, path, 1, settings=FAST, sweep_dir=sweep_dir)
    assert result.states == {"COMPLETE": 3}
    assert len(trial_dirs(sweep_dir)) == 3
    # another sweep (other fixed settings) is not mixed into it
    code, _, err = run(capsys, *argv, "--trials", "1", "--total-steps", "160")
    assert code == 2 and "holds another sweep: " in err
    assert "setting total_steps 80 (now 160)" in err
    assert len(trial_dirs(sweep_dir)) == 3
    # a setting given its default where it was left out is the same sweep (seed 0)
    code, out, err = run(capsys, *argv, "--trials", "1", *FAST_ARGS, "--seed", "0")
    assert code == 0, err
    assert "4 complete" in out


def test_a_sweep_continued_from_another_directory_finds_its_trials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trial directories are the sweep directory's, wherever the command runs from."""
    pytest.importorskip("optuna")
    path = space_file(tmp_path, "lr: {low: 0.01, high: 0.5}\n")
    (tmp_path / "elsewhere").mkdir()
    argv = ["sweep", TINY, "--env", ENV, "--space", str(path), "--trials", "1", *FAST_ARGS]
    monkeypatch.chdir(tmp_path)
    assert run(capsys, *argv, "--sweep-dir", "sweep")[0] == 0
    monkeypatch.chdir(tmp_path / "elsewhere")
    code, out, err = run(capsys, *argv, "--sweep-dir", "../sweep")
    assert code == 0, err
    assert "2 complete" in out
    best = yaml.safe_load((tmp_path / "sweep" / "best.yaml").read_text())
    assert best["run_dir"] in {f"../sweep/trial-000{i}" for i in (0, 1)}


def test_a_sweep_directory_whose_study_is_a_link_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("optuna")
    path = space_file(tmp_path, "lr: {low: 0.01, high: 0.5}\n")
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    (sweep_dir / STUDY).symlink_to(tmp_path / "elsewhere.db")
    code, _, err = run(
        capsys, "sweep", TINY, "--env", ENV, "--space", str(path), "--trials", "1",
        "--sweep-dir", str(sweep_dir), *FAST_ARGS,
    )  # fmt: skip
    assert code == 2 and "study.db is a symbolic link" in err
    assert not (tmp_path / "elsewhere.db").exists()


@pytest.mark.slow  # Ray's start and its workers' imports: half a minute; the process test is fast
def test_parallel_trials_run_as_ray_tasks(tmp_path: Path, ray_session: Any) -> None:
    pytest.importorskip("optuna")
    pytest.importorskip("ray")
    pytest.importorskip("torch")
    ray_session()  # two CPUs: one per task
    space = {"lr": {"low": 1e-4, "high": 1e-2, "log": True}}
    settings = {**FAST, "total_steps": 256, "eval_every": 128}
    result = sweep(
        "mappo", ENV, space, 2, settings=settings, sweep_dir=tmp_path / "sweep", parallel=2,
        backend="ray",
    )  # fmt: skip
    assert result.states == {"COMPLETE": 2}
    assert len(trial_dirs(tmp_path / "sweep")) == 2


def test_an_interrupted_sweep_says_how_to_continue_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    optuna = pytest.importorskip("optuna")
    from corral.training.runner import Runner

    def interrupted(self: Runner) -> Any:
        raise KeyboardInterrupt

    path = space_file(tmp_path, "lr: {low: 0.01, high: 0.5}\n")
    sweep_dir = tmp_path / "sweep"
    argv = ["sweep", TINY, "--env", ENV, "--space", str(path), "--sweep-dir", str(sweep_dir)]
    with monkeypatch.context() as patch:
        patch.setattr(Runner, "train", interrupted)
        code, _, err = run(capsys, *argv, "--trials", "2", *FAST_ARGS)
    assert code == 130
    assert f"the same command with --sweep-dir {sweep_dir} continues the sweep" in err
    code, out, err = run(capsys, *argv, "--trials", "1", *FAST_ARGS)
    assert code == 0, err
    assert "1 fail, 1 complete" in out  # the interrupted trial is kept as failed
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{sweep_dir / STUDY}")
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]
