"""The run's trackers beside ``metrics.csv``: wandb (``logger=wandb``), with a fake ``wandb``
module for the exact config and rows it gets, and one real offline run."""

from __future__ import annotations

import sys
import types
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("yaml")

import yaml
from support.cli import train
from support.runs import config
from support.tabular import TINY, TabularQ

from corral.training import ConfigError, Runner
from corral.training.metrics import read_metrics
from corral.training.trackers import WANDB_ID, wandb_mode


class FakeRun:
    def __init__(self, **kwargs: Any) -> None:
        self.init = kwargs
        self.config: dict[str, Any] = {}
        self.logged: list[dict[str, float]] = []
        self.step_metrics: dict[str, str | None] = {}
        self.finished = False
        outer = self

        class Config:
            def update(self, values: dict[str, Any], allow_val_change: bool = False) -> None:
                assert allow_val_change
                outer.config.update(values)

        self.config_proxy = Config()

    def define_metric(self, name: str, step_metric: str | None = None) -> None:
        self.step_metrics[name] = step_metric

    def log(self, row: dict[str, float]) -> None:
        assert not self.finished
        self.logged.append(dict(row))

    def finish(self) -> None:
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch) -> list[FakeRun]:
    """A ``wandb`` module that records the runs started with it."""
    runs: list[FakeRun] = []
    module = types.ModuleType("wandb")

    def init(**kwargs: Any) -> Any:
        run = FakeRun(**kwargs)
        runs.append(run)
        proxy = types.SimpleNamespace(
            config=run.config_proxy,
            define_metric=run.define_metric,
            log=run.log,
            finish=run.finish,
        )
        return proxy

    module.init = init  # type: ignore[attr-defined]
    module.Settings = lambda **kwargs: kwargs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return runs


def test_wandb_gets_the_config_once_and_every_row_of_metrics_csv(
    tmp_path: Path, fake_wandb: list[FakeRun]
) -> None:
    cfg = config(tmp_path, logger="wandb", tensorboard=False)
    with Runner(cfg, progress=False) as runner:
        runner.train()
    run_dir = tmp_path / "run"
    (run,) = fake_wandb
    assert run.finished
    assert run.init["dir"] == str(run_dir) and run.init["mode"] == "offline"
    assert run.init["id"] == (run_dir / WANDB_ID).read_text().strip()
    assert run.init["project"] == "corral" and run.init["resume"] == "allow"
    assert (run_dir / "wandb").is_dir()
    assert run.config == yaml.safe_load((run_dir / "config.yaml").read_text())
    assert run.logged == read_metrics(run_dir)  # the same keys and values, row by row
    assert any("eval_return" in row for row in run.logged)
    assert run.step_metrics["*"] == "env_steps"


def test_a_resumed_run_continues_the_same_wandb_run(
    tmp_path: Path, fake_wandb: list[FakeRun]
) -> None:
    cfg = config(tmp_path, logger="wandb", tensorboard=False, total_steps=160, wandb_mode="online")
    with Runner(cfg, progress=False) as runner:
        runner.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # online: nothing to warn about
        with Runner.resume(
            tmp_path / "run", progress=False, allow_imports=[TINY], total_steps=320
        ) as runner:
            runner.train()
    first, second = fake_wandb
    assert second.init["id"] == first.init["id"] and second.init["resume"] == "allow"
    assert first.finished and second.finished
    assert second.config["run"]["total_steps"] == 320
    rows = read_metrics(tmp_path / "run")
    assert first.logged + second.logged == rows  # each row once, the new ones after resuming
    assert min(r["env_steps"] for r in second.logged) > 160


def test_resuming_an_offline_wandb_run_warns_that_wandb_cannot(
    tmp_path: Path, fake_wandb: list[FakeRun]
) -> None:
    cfg = config(tmp_path, logger="wandb", tensorboard=False, total_steps=160)  # offline
    with Runner(cfg, progress=False) as runner:
        runner.train()
    with (
        pytest.warns(UserWarning, match="wandb cannot resume an offline run"),
        Runner.resume(
            tmp_path / "run", progress=False, allow_imports=[TINY], total_steps=320
        ) as runner,
    ):
        runner.train()
    assert fake_wandb[1].init["id"] == fake_wandb[0].init["id"]


def test_wandb_runs_offline_unless_asked_otherwise(
    tmp_path: Path, fake_wandb: list[FakeRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert wandb_mode(None) == "offline"
    monkeypatch.setenv("WANDB_MODE", "online")
    assert wandb_mode(None) == "online" and wandb_mode("offline") == "offline"
    cfg = config(tmp_path, logger="wandb", wandb_mode="disabled", wandb_project="mine")
    with Runner(cfg, progress=False) as runner:
        runner.train()
    assert fake_wandb[0].init["mode"] == "disabled" and fake_wandb[0].init["project"] == "mine"


def test_the_logger_setting_takes_known_trackers_only(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"logger.*'mlflow'.*\['wandb'\]"):
        config(tmp_path, logger="mlflow")
    assert config(tmp_path, logger="wandb").run.logger == ("wandb",)
    assert config(tmp_path).run.logger == ()


def test_without_wandb_logger_wandb_is_one_line_naming_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    code, _, err = train(capsys, tmp_path / "run", "logger=wandb")
    assert code == 2
    assert "needs wandb" in err and "pip install 'corral[track]'" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_run_directorys_wandb_id_must_be_an_id(tmp_path: Path, fake_wandb: list[FakeRun]) -> None:
    cfg = config(tmp_path, logger="wandb", tensorboard=False, total_steps=80)
    with Runner(cfg, progress=False) as runner:
        runner.train()
    (tmp_path / "run" / WANDB_ID).write_text("../../elsewhere\n")
    with pytest.raises(ConfigError, match="not a wandb run id"):
        Runner.resume(tmp_path / "run", progress=False, allow_imports=[TINY], total_steps=160)


def test_a_real_offline_wandb_run_writes_inside_the_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.chdir(tmp_path)
    code, _, err = train(capsys, Path("run"), "logger=wandb")
    assert code == 0, err
    wandb.teardown()  # wandb's service writes the run's file out as it stops
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    run_id = (tmp_path / "run" / WANDB_ID).read_text().strip()
    (offline,) = (tmp_path / "run" / "wandb").glob(f"offline-run-*-{run_id}")
    (history,) = offline.glob("*.wandb")
    data = history.read_bytes()
    for column in read_metrics(tmp_path / "run")[-1]:
        assert column.encode() in data


def test_tabular_runs_take_no_wandb_by_default(tmp_path: Path) -> None:
    with Runner(config(tmp_path, algo=TabularQ), progress=False) as runner:
        runner.train()
    assert not (tmp_path / "run" / "wandb").exists()
    assert not (tmp_path / "run" / WANDB_ID).exists()
