"""Short training runs of the tabular learner, and killing one after a checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral.training import Runner, load_config
from corral.training.runner import LATEST

from .tabular import TINY, TabularQ


class Killed(Exception):
    """Stands for a kill of the training process right after a checkpoint."""


def config(
    tmp_path: Path,
    name: str = "run",
    env: str = "mdp/climbing",
    algo: str | type = TabularQ,
    **settings: Any,
) -> Any:
    base = {
        "num_envs": 4,
        "total_steps": 400,
        "eval_every": 80,
        "eval_episodes": 8,
        "checkpoint_every": 0,
        "log_every": 40,
        "device": "cpu",
        "run_dir": str(tmp_path / name),
    }
    return load_config(algo, env, {**base, **settings})


def train(cfg: Any) -> Any:
    with Runner(cfg, progress=False, allow_imports=[TINY]) as runner:
        return runner.train()


def without_time(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: v for k, v in r.items() if k not in ("wall_time", "steps_per_s")} for r in rows]


def kill_after_checkpoint(monkeypatch: pytest.MonkeyPatch, at_step: int) -> None:
    save = Runner.save_checkpoint

    def save_then_die(self: Runner, path: str | Path, **kwargs: Any) -> None:
        save(self, path, **kwargs)
        if Path(path).name == LATEST and self.env_steps >= at_step:
            raise Killed

    monkeypatch.setattr(Runner, "save_checkpoint", save_then_die)


def run_settings(tmp_path, name, **settings):
    base = {
        "num_envs": 4,
        "total_steps": 240,
        "eval_every": 0,
        "eval_episodes": 4,
        "log_every": 120,
        "dtype": "float64",
        "tensorboard": False,
        "run_dir": str(tmp_path / name),
    }
    return {**base, **settings}
