"""``corral ...`` run through ``corral.cli.main``, with its exit code and output."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import cli

from .tabular import TINY

FAST = ["num_envs=2", "eval_episodes=4", "log_every=20", "device=cpu", "tensorboard=false"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def train(
    capsys: pytest.CaptureFixture[str],
    run_dir: Path,
    *extra: str,
    algo: str = TINY,
    env: str = "mdp/climbing",
) -> tuple[int, str, str]:
    return run(
        capsys,
        "train",
        algo,
        "--env",
        env,
        "--total-steps",
        "80",
        "--run-dir",
        str(run_dir),
        "--no-progress",
        "--set",
        *FAST,
        "eval_every=40",
        *extra,
    )
