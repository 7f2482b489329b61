"""A run writes only regular files of its own directory (corral.training.run_files), and what
it restores from a checkpoint is checked: a run directory may come from anyone."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("yaml")
pytest.importorskip("torch")

from support.checkpoints import members, rewrite
from support.tabular import TINY

from corral import cli
from corral.training.metrics import read_metrics
from corral.training.runner import BEST, LATEST

ALLOW = ["--allow-import", TINY]
SETTINGS = ["num_envs=2", "eval_episodes=4", "log_every=20", "device=cpu", "eval_every=40"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of 80 env steps, with TensorBoard events."""
    run_dir = tmp_path_factory.mktemp("runs") / "r"
    argv = ["train", TINY, "--env", "mdp/climbing", "--total-steps", "80", "--no-progress"]
    assert cli.main([*argv, "--run-dir", str(run_dir), "--set", *SETTINGS]) == 0
    return run_dir


@pytest.fixture
def run_dir(trained: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "run"))


def resume(capsys: pytest.CaptureFixture[str], run_dir: Path, *extra: str) -> tuple[int, str]:
    argv = ["train", "--resume", str(run_dir), "--total-steps", "120", "--no-progress", *ALLOW]
    code = cli.main([*argv, *extra])
    return code, capsys.readouterr().err


def contents(directory: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("corral: error: "), err
    return lines[0]


@pytest.mark.parametrize(
    "name",
    ["metrics.csv", "config.yaml", "train.log", f"{LATEST}.partial", f"{BEST}.partial", BEST],
)
def test_resume_refuses_a_file_of_the_run_that_links_outside_it(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    victim = tmp_path / "victim"
    if name == "config.yaml":  # a config that reads as the run's own
        shutil.copy(run_dir / name, victim)
    else:
        victim.write_text("the victim's own text\n")
    before = victim.read_bytes()
    (run_dir / name).unlink(missing_ok=True)
    (run_dir / name).symlink_to(victim)
    run_before = contents(run_dir)
    code, err = resume(capsys, run_dir)
    assert code == 2
    line = one_error(err)
    assert f"{run_dir / name} is a symbolic link" in line and "regular files" in line
    assert victim.read_bytes() == before
    assert contents(run_dir) == run_before  # refused before anything was written


def test_resume_refuses_a_tensorboard_directory_that_links_outside_the_run(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(run_dir / "tb")
    (run_dir / "tb").symlink_to(elsewhere, target_is_directory=True)
    code, err = resume(capsys, run_dir, "--set", "tensorboard=true")
    assert code == 2
    assert f"{run_dir / 'tb'} is a symbolic link" in one_error(err)
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("planted", ["link", "file"])
def test_resume_refuses_an_entry_where_its_tensorboard_event_file_goes(
    run_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    planted: str,
) -> None:
    pytest.importorskip("tensorboard")
    from corral.training import event_file

    name = "events.out.tfevents.0000000001.host.1.0"
    monkeypatch.setattr(event_file, "event_file_name", lambda: name)
    victim = tmp_path / "victim"
    victim.write_text("the victim's own text\n")
    if planted == "link":
        (run_dir / "tb" / name).symlink_to(victim)
    else:
        shutil.copy(victim, run_dir / "tb" / name)
    code, err = resume(capsys, run_dir, "--set", "tensorboard=true")
    assert code == 2
    line = one_error(err)
    why = "is a symbolic link" if planted == "link" else "File exists"
    assert f"{run_dir / 'tb' / name}" in line and why in line
    assert victim.read_text() == "the victim's own text\n"
    assert (run_dir / "tb" / name).read_text() == "the victim's own text\n"


def test_resume_refuses_a_file_with_another_hard_link(
    run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("the victim's own text\n")
    (run_dir / "metrics.csv").unlink()
    os.link(victim, run_dir / "metrics.csv")
    code, err = resume(capsys, run_dir)
    assert code == 2
    assert f"{run_dir / 'metrics.csv'} has other hard links (1)" in one_error(err)
    assert victim.read_text() == "the victim's own text\n"


def test_resume_refuses_a_directory_where_a_file_of_the_run_belongs(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run_dir / "train.log").unlink()
    (run_dir / "train.log").mkdir()
    code, err = resume(capsys, run_dir)
    assert code == 2
    assert f"{run_dir / 'train.log'} is not a regular file" in one_error(err)


def test_a_run_resumed_from_a_leftover_partial_checkpoint_replaces_it(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run_dir / f"{LATEST}.partial").write_bytes(b"cut short by a kill")
    code, err = resume(capsys, run_dir)
    assert code == 0, err
    assert not (run_dir / f"{LATEST}.partial").exists()
    assert [r["env_steps"] for r in read_metrics(run_dir)][-1] == 120


def crafted(path: Path, **changes: Any) -> None:
    """Change the plain data of the checkpoint ``path`` and seal it again, as anyone can."""
    parts = members(path)
    meta = json.loads(parts["meta.json"])
    meta["data"].update(changes)
    rewrite(path, {**parts, "meta.json": json.dumps(meta).encode()})


def metrics_with(run_dir: Path, **row: Any) -> list[dict[str, Any]]:
    meta = json.loads(members(run_dir / LATEST)["meta.json"])
    rows = meta["data"]["metrics"]
    return [*rows[:-1], {**rows[-1], **row}]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("key", "metrics row 4 has the key 'x\\n$(touch /tmp/pwned)', which is no column name"),
        ("formula", "metrics row 4 has the key \"=cmd|' /C calc'!A0\", which is no column name"),
        ("text", "metrics row 4 has train_return = 'rm -rf ~', not a number"),
        ("bool", "metrics row 4 has train_return = True, not a number"),
        ("rows", "its metrics are a dict, not a list"),
        ("env_steps", "its env_steps is '80', not a count (an int at least 0)"),
        ("best_eval", "its best_eval is [1], not a number or None"),
        ("select_by", "its select_by is 'a\\nb', not a column name"),
        (
            "runner_counts",
            "its runner_counts is {'rollouts_lost': -1}, not counts (ints at least 0) of "
            "['runner_restarts', 'rollouts_lost', 'rollouts_dropped']",
        ),
    ],
)
def test_resume_refuses_a_crafted_checkpoint_s_counters_and_rows(
    run_dir: Path, capsys: pytest.CaptureFixture[str], change: str, said: str
) -> None:
    changes: dict[str, Any] = {
        "key": {"metrics": metrics_with(run_dir, **{"x\n$(touch /tmp/pwned)": 1.0})},
        "formula": {"metrics": metrics_with(run_dir, **{"=cmd|' /C calc'!A0": 1.0})},
        "text": {"metrics": metrics_with(run_dir, train_return="rm -rf ~")},
        "bool": {"metrics": metrics_with(run_dir, train_return=True)},
        "rows": {"metrics": {"env_steps": 1}},
        "env_steps": {"env_steps": "80"},
        "best_eval": {"best_eval": [1]},
        "select_by": {"select_by": "a\nb"},
        "runner_counts": {"runner_counts": {"rollouts_lost": -1}},
    }[change]
    crafted(run_dir / LATEST, **changes)
    metrics = (run_dir / "metrics.csv").read_bytes()
    code, err = resume(capsys, run_dir)
    assert code == 2
    line = one_error(err)
    assert line.startswith(f"corral: error: {run_dir / LATEST}: ") and said in line, line
    assert (run_dir / "metrics.csv").read_bytes() == metrics


def test_a_genuine_checkpoint_s_rows_pass_the_checks(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The rows a run writes, an infinite loss among them, are what the checks let through."""
    crafted(run_dir / LATEST, metrics=metrics_with(run_dir, loss=float("inf")))
    code, err = resume(capsys, run_dir)
    assert code == 0, err
    assert read_metrics(run_dir)[4]["loss"] == float("inf")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
def test_resume_refuses_a_fifo_where_the_log_belongs_without_waiting_for_a_reader(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (run_dir / "train.log").unlink()
    os.mkfifo(run_dir / "train.log")
    code, err = resume(capsys, run_dir)
    assert code == 2
    assert f"{run_dir / 'train.log'} is not a regular file" in one_error(err)


def test_a_run_directory_is_refused_before_any_env_or_worker_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.training import ConfigError, Runner, load_config
    from corral.training import runner as runner_module

    def started(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("envs or workers started before the run directory was checked")

    monkeypatch.setattr(runner_module, "build_venv", started)
    monkeypatch.setattr(runner_module, "start_workers", started)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.csv").symlink_to(tmp_path / "victim")
    settings = {"runners": 2, "num_envs": 2, "run_dir": str(run_dir), "device": "cpu"}
    with pytest.raises(ConfigError, match=r"metrics\.csv is a symbolic link"):
        Runner(load_config("mappo", "corral/rps", settings), progress=False)
