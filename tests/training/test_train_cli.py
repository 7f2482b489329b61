"""``corral train``, ``corral eval`` and ``corral plot`` through ``corral.cli.main``."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import subprocess
import sys
import typing
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("yaml")

import yaml
from support.cli import FAST, run, train
from support.paths import TESTS
from support.tabular import TINY, TabularQ

import corral
from corral import registry
from corral.algos import ALGORITHMS
from corral.envs.mdp import climbing_game
from corral.settings import declared_ranges, field_docs, parse_value
from corral.training import RunConfig, load_config
from corral.training.config import coerce
from corral.training.metrics import COLUMNS, read_metrics
from corral.training.runner import (
    RESUMABLE,
    AlreadyTrainedError,
    evaluate_policy,
    load_run,
    read_run_config,
)

ALLOW = ["--allow-import", TINY]  # a run's config.yaml imports TabularQ only when allowed
SRC = Path(corral.__file__).parent.parent


# -- corral train ALGO --help lists every setting -----------------------------------------------


def listed(out: str, heading: str) -> dict[str, tuple[list[str], str]]:
    """The settings listed under the line of ``out`` that starts with ``heading``: each
    name -> (the cells of its first line, its docstring as one line)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading)) + 1
    entries: dict[str, tuple[list[str], list[str]]] = {}
    name = ""
    for line in lines[start:]:
        if not line.strip():
            break
        if line.startswith("      "):
            entries[name][1].append(line.strip())
        else:
            cells = re.split(r"\s{2,}", line.strip())
            name = cells[0]
            entries[name] = (cells, [])
    return {name: (cells, " ".join(doc)) for name, (cells, doc) in entries.items()}


def assert_lists_every_field(
    entries: dict[str, tuple[list[str], str]], config: Any, skip: tuple[str, ...] = ()
) -> None:
    """``entries`` are the fields of the dataclass ``config`` in order, each with the first
    line of its docstring, its range where declared, and a default that ``--set`` reads back
    as ``config``'s value."""
    cls = type(config)
    hints = typing.get_type_hints(cls)
    ranges, docs = declared_ranges(cls), field_docs(cls)
    assert list(entries) == [f.name for f in dataclasses.fields(cls)]
    for name, (cells, doc) in entries.items():
        assert " ".join(docs[name].splitlines()[0].split()) in doc, name
        if name in ranges:
            assert str(ranges[name]) in cells[3:], (name, cells)
        if name not in skip:
            assert coerce(parse_value(cells[2]), hints[name]) == getattr(config, name), cells


@pytest.mark.parametrize("env", [None, "mpe2/simple_spread_v3"])
@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_train_help_lists_every_setting_with_its_effective_default(
    capsys: pytest.CaptureFixture[str], algo: str, env: str | None
) -> None:
    pytest.importorskip("torch")
    code, out, err = run(capsys, "train", algo, "--help", *(["--env", env] if env else []))
    assert code == 0, err
    assert out.startswith("usage: corral train") and "--total-steps N" in out  # argparse's
    # the effective defaults are load_config's without overrides; an env that no envs:
    # section matches stands for none
    expected = load_config(algo, env or "corral/rps")
    skip = () if env else ("env",)
    run_settings = listed(out, "run settings (corral.training.RunConfig)")
    assert_lists_every_field(run_settings, expected.run, skip)
    algo_settings = listed(out, f"{algo} settings (corral.algos.")
    assert_lists_every_field(algo_settings, expected.algo_config)
    assert "(also --total-steps)" in run_settings["total_steps"][0]
    assert "(also --seed; sets the run's too)" in algo_settings["seed"][0]
    assert run_settings["total_steps"][0][2] != "100000"  # the YAML's, not RunConfig's
    said = " ".join(out.split())
    if env is None:
        assert f"corral train {algo} --env ID --help shows the defaults for ID" in said
    elif algo == "dqn":
        assert f"none of its envs: sections matches --env {env}" in said
    else:
        assert f"envs: sections 'mpe2/*', 'mpe2/simple_spread_v3' (for --env {env})" in said


def test_train_help_shows_an_env_s_settings_where_it_names_the_env(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("torch")
    plain = listed(run(capsys, "train", "mappo", "--help")[1], "mappo settings")
    spread = run(capsys, "train", "mappo", "--help", "--env", "mpe2/simple_spread_v3")[1]
    lr = listed(spread, "mappo settings")["lr"]
    assert plain["lr"][0][:4] == ["lr", "float", "0.0007", "greater than 0"]  # mappo's Config
    assert lr[0][:4] == ["lr", "float", "0.001", "greater than 0"]  # mappo.yaml's for the env
    assert lr[1] == "Adam learning rate of actor and critic."


def test_train_help_lists_a_user_algorithm_s_own_settings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "train", TINY, "--help")
    assert code == 0, err
    assert_lists_every_field(listed(out, "run settings"), RunConfig())
    entries = listed(out, f"{TINY} settings (support.tabular.TabularConfig)")
    assert_lists_every_field(entries, TabularQ.Config())
    assert entries["epsilon"] == (["epsilon", "float", "0.3"], "Exploration rate.")


def test_train_help_without_algo_lists_the_run_settings_and_says_how_to_see_an_algorithm_s(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "train", "--help")
    assert code == 0, err
    assert_lists_every_field(listed(out, "run settings:"), RunConfig())
    assert "corral train ALGO --help lists them, and ALGO's settings" in " ".join(out.split())


def test_resume_help_lists_the_run_s_settings_and_which_a_resume_may_change(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert train(capsys, tmp_path / "r", "--seed", "5", "--set", "lr=0.5")[0] == 0
    code, out, err = run(capsys, "train", "--resume", str(tmp_path / "r"), "--help", *ALLOW)
    assert code == 0, err
    config = read_run_config(tmp_path / "r", [TINY])
    entries = listed(out, "run settings")
    assert_lists_every_field(entries, config.run)
    for name, (cells, _) in entries.items():
        expected = "may change on resume" if name in RESUMABLE else "fixed by the run"
        assert expected in cells[-1], (name, cells)
    algo = listed(out, f"{TINY} settings")
    assert_lists_every_field(algo, config.algo_config)
    assert algo["lr"][0][2] == "0.5" and entries["seed"][0][2] == "5"


def test_resume_help_of_a_directory_without_a_run_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "train", "--resume", str(tmp_path), "--help")
    assert code == 2 and "config.yaml" in err


def test_train_help_of_an_unknown_algorithm_says_which_there_are(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "train", "nosuch", "--help")
    assert code == 2 and "unknown algorithm 'nosuch'; choose one of" in err


def test_train_help_of_a_misspelt_env_is_train_s_error_not_another_env_s_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It exited 0 listing the namespace's defaults (mpe2/*: num_envs 16), not those of the
    env meant (simple_spread: 64)."""
    code, out, err = run(capsys, "train", "mappo", "--env", "mpe2/simple_sprad_v3", "--help")
    assert code == 2 and out == ""
    assert "unknown env id 'mpe2/simple_sprad_v3'. Did you mean mpe2/simple_spread_v3" in err


def test_train_writes_a_run_and_reports_it(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    code, out, err = train(capsys, tmp_path / "r", "--seed", "5", "--set", "lr=0.5")
    assert code == 0, err
    assert f"run {tmp_path / 'r'}: 80 env steps, best eval_return" in out
    assert "steps 80/80" in err  # progress lines go to stderr
    config = (tmp_path / "r" / "config.yaml").read_text()
    assert "seed: 5" in config and "lr: 0.5" in config
    assert [r["env_steps"] for r in read_metrics(tmp_path / "r")] == [0, 20, 40, 60, 80]


def test_resume_continues_a_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert train(capsys, tmp_path / "r")[0] == 0
    code, out, err = run(
        capsys,
        "train",
        "--resume",
        str(tmp_path / "r"),
        "--total-steps",
        "120",
        "--no-progress",
        *ALLOW,
    )
    assert code == 0, err
    assert "120 env steps" in out
    lines = [line for line in err.splitlines() if line.startswith("steps ")]
    assert lines[0] == "steps 80/120"  # the progress lines start where the run stood
    steps = [r["env_steps"] for r in read_metrics(tmp_path / "r")]
    assert steps == [0, 20, 40, 60, 80, 100, 120]


def test_resume_to_steps_already_done_says_so_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "r"
    assert train(capsys, run_dir)[0] == 0  # 80 env steps

    def files() -> dict[str, tuple[bytes, int]]:
        found = sorted(p for p in run_dir.rglob("*") if p.is_file())
        return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in found}

    before = files()
    for total in (["--total-steps", "40"], ["--total-steps", "80"], []):  # [] : config's 80
        code, out, err = run(capsys, "train", "--resume", str(run_dir), *total, *ALLOW)
        assert code == 0, err
        steps = total[1] if total else "80"
        assert out == (
            f"run {run_dir} already has 80 env steps (total_steps {steps}): nothing to do, "
            "nothing changed; --total-steps above 80 trains it on\n"
        )
        assert files() == before
    with pytest.raises(AlreadyTrainedError, match="already has 80 env steps"):
        corral.train(TabularQ, resume=run_dir, total_steps=50, progress=False)
    assert files() == before


def test_eval_prints_each_measure_with_its_standard_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert train(capsys, tmp_path / "r")[0] == 0
    config, algo, saved = load_run(tmp_path / "r", allow_imports=[TINY])
    returns = np.array(evaluate_policy(config, algo, 6).returns)  # the episodes eval plays
    sem = np.std(returns, ddof=1) / np.sqrt(6)
    code, out, err = run(
        capsys, "eval", str(tmp_path / "r"), "--episodes", "6", "--device", "cpu", *ALLOW
    )
    assert code == 0, err
    lines = out.splitlines()
    steps = saved["env_steps"]
    assert lines[0] == f"{tmp_path / 'r'} (best checkpoint, {steps} env steps, greedy): " + (
        "mean +- standard error over 6 episodes"
    )
    assert lines[1].startswith(f"  eval_return {returns.mean():.2f} +- {sem:.2f} (selects best.pt)")
    code, out, err = run(capsys, "eval", str(tmp_path / "r"), "--episodes", "1", *ALLOW)
    assert code == 0, err
    assert " +- n/a (selects best.pt)" in out  # one episode has no standard error
    (tmp_path / "r" / "best.pt").unlink()  # no evaluation saved one: the latest is played
    code, out, err = run(capsys, "eval", str(tmp_path / "r"), "--episodes", "1", *ALLOW)
    assert code == 0, err
    assert out.startswith(f"{tmp_path / 'r'} (latest checkpoint, ")


def test_eval_explore_plays_the_policies_as_in_training_and_no_explore_greedily(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The climbing game is one deterministic step: greedy episodes have no spread; with
    ``--explore`` (epsilon-greedy tables) they do; ``--no-explore`` overrides a run whose
    config says ``eval_explore``."""
    spread = re.compile(r"eval_return \S+ \+- (\S+)")
    assert train(capsys, tmp_path / "g")[0] == 0
    assert train(capsys, tmp_path / "e", "eval_explore=true")[0] == 0
    for run_dir, flags, spreads in (
        ("g", [], False),
        ("g", ["--explore"], True),
        ("e", [], True),
        ("e", ["--no-explore"], False),
    ):
        code, out, err = run(
            capsys, "eval", str(tmp_path / run_dir), "--episodes", "30", *flags, *ALLOW
        )
        assert code == 0, err
        found = spread.search(out)
        assert found is not None, out
        assert (float(found.group(1)) > 0) == spreads, (run_dir, flags, out)
        assert f"env steps, {'exploring' if spreads else 'greedy'}): mean" in out


def test_eval_plays_with_the_run_s_torch_threads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    assert train(capsys, tmp_path / "r", "torch_threads=3")[0] == 0
    assert torch.get_num_threads() == before  # the run gave its threads back
    try:
        assert run(capsys, "eval", str(tmp_path / "r"), "--episodes", "2", *ALLOW)[0] == 0
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_eval_gif_of_an_env_that_cannot_render_is_skipped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert train(capsys, tmp_path / "r")[0] == 0
    gif = tmp_path / "x.gif"
    code, out, err = run(
        capsys, "eval", str(tmp_path / "r"), "--episodes", "2", "--gif", str(gif), *ALLOW
    )
    assert code == 0
    assert "eval_return " in out
    assert "no GIF written" in err and "cannot render" in err
    assert not gif.exists()


def test_plot_writes_a_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    for seed in ("0", "1"):
        assert train(capsys, tmp_path / seed, "--seed", seed)[0] == 0
    out_png = tmp_path / "curves.png"
    code, out, err = run(
        capsys, "plot", str(tmp_path / "0"), str(tmp_path / "1"), "-o", str(out_png)
    )
    assert code == 0, err
    assert f"wrote {out_png}" in out
    assert out_png.read_bytes()[:4] == b"\x89PNG" and out_png.stat().st_size > 5_000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "mappo"], "give ALGO and --env"),
        (["train", "nope", "--env", "mdp/climbing"], "unknown algorithm"),
        (["train", TINY, "--env", "mdp/climbing", "--set", "totl_steps=3"], "total_steps"),
        (["train", TINY, "--env", "no/such_env", "--run-dir", "{tmp}/x"], "no/such_env"),
        (["train", "--resume", "{tmp}"], "not a run directory"),
        (["train", TINY, "--env", "mdp/climbing", "--set", "novalue"], "'novalue' has no value"),
        (["train", TINY, "--env", "mdp/climbing", "--set", "=3"], "name is missing"),
        (
            [
                "train",
                TINY,
                "--env",
                "mdp/climbing",
                "--total-steps",
                "8",
                "--set",
                "total_steps=9",
            ],
            "--total-steps 8 and --set total_steps=9 disagree",
        ),
        (["eval", "{tmp}"], "not a run directory"),
        (["plot", "{tmp}", "-o", "{tmp}/c.png"], "not a run directory"),
    ],
)
def test_unusable_commands_exit_2_with_a_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], message: str
) -> None:
    code, _, err = run(capsys, *(a.format(tmp=tmp_path) for a in argv))
    assert code == 2
    assert message in err and "Traceback" not in err


def test_an_env_kwarg_a_natively_batched_env_does_not_take_names_the_env(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A native env's constructor refusing a keyword (on sync it raises in this process):
    the message was the constructor's alone, naming neither the env nor the kwargs."""
    code, _, err = train(capsys, tmp_path / "r", "env_kwargs.bogus=1", env="corral/tag")
    assert code == 2
    assert "cannot build corral/tag with env_kwargs {'bogus': 1}: " in err
    assert "'bogus'" in err.partition(": ")[2] and not (tmp_path / "r").exists()


def test_an_option_and_the_same_setting_may_agree(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = train(capsys, tmp_path / "r", "--set", "total_steps=80")
    assert code == 0, err
    assert "total_steps: 80" in (tmp_path / "r" / "config.yaml").read_text()


def test_set_values_reach_the_env_typed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, isolated_registry: None
) -> None:
    seen: list[dict[str, Any]] = []

    def recorded(**kwargs: Any) -> Any:
        seen.append(kwargs)
        return climbing_game()

    corral.register("test/recorded", recorded)
    settings = ["env_kwargs.flag=false", "env_kwargs.x=None", "env_kwargs.name='3'"]
    code, _, err = train(capsys, tmp_path / "r", *settings, env="test/recorded")
    assert code == 0, err
    assert seen and all(kw == {"flag": False, "x": None, "name": "3"} for kw in seen), seen


def test_resume_cannot_change_what_is_learned(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert train(capsys, tmp_path / "r")[0] == 0
    code, _, err = run(capsys, "train", "--resume", str(tmp_path / "r"), "--seed", "3", *ALLOW)
    assert code == 2 and "cannot change ['seed']" in err


# -- the real algorithms, with tiny budgets ---------------------------------------------------

REAL = {  # algorithm: env, settings, whether the env renders rgb_array frames
    "mappo": ("mpe2/simple_spread_v3", ["rollout_steps=8", "epochs=1"], True),
    "ippo": ("mdp/climbing", ["rollout_steps=8", "epochs=1"], False),
    "maddpg": (
        "mpe2/simple_spread_v3",
        ["learning_starts=20", "train_freq=8", "batch_size=16"],
        True,
    ),
    "dqn": ("pettingzoo/classic/tictactoe_v3", ["learning_starts=20", "batch_size=16"], True),
}


@pytest.mark.parametrize("algo", sorted(REAL))
def test_every_algorithm_trains_resumes_evaluates_and_plots(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, algo: str
) -> None:
    pytest.importorskip("torch")
    env, settings, renders = REAL[algo]
    if env.startswith(("mpe2", "pettingzoo")):
        pytest.importorskip("pettingzoo")
    extra = ["--self-play"] if algo == "dqn" else []
    kwargs = ["env_kwargs={N: 2, max_cycles: 5}"] if env.startswith("mpe2") else []
    base = ["train", algo, "--env", env, "--run-dir", str(tmp_path / "r"), "--no-progress"]
    code, _, err = run(
        capsys,
        *base,
        "--total-steps",
        "40",
        *extra,
        "--set",
        *FAST,
        "eval_every=20",
        "eval_episodes=2",
        "log_every=20",
        *settings,
        *kwargs,
    )
    assert code == 0, err
    code, out, err = run(
        capsys, "train", "--resume", str(tmp_path / "r"), "--total-steps", "60", "--no-progress"
    )
    assert code == 0, err
    assert "60 env steps" in out
    steps = [r["env_steps"] for r in read_metrics(tmp_path / "r")]
    # a row every log_every steps, and one where a checkpoint due inside a rollout (the
    # evaluation's at 20) was written at the rollout's end
    assert [s for s in steps if s % 20 == 0] == [0, 20, 40, 60]
    assert steps == sorted(set(steps)) and len(steps) <= 5
    gif = tmp_path / "episode.gif"
    code, out, err = run(capsys, "eval", str(tmp_path / "r"), "--episodes", "2", "--gif", str(gif))
    assert code == 0, err
    assert "(selects best.pt)" in out
    if renders:
        assert gif.read_bytes()[:6] == b"GIF89a"
    else:
        assert "no GIF written" in err and not gif.exists()
    if importlib.util.find_spec("matplotlib") is not None:
        png = tmp_path / "curves.png"
        assert run(capsys, "plot", str(tmp_path / "r"), "-o", str(png))[0] == 0
        assert png.read_bytes()[:4] == b"\x89PNG"


# algorithm: its settings on mdp/climbing with 4 envs, and the env steps they need before
# the first update (one-step episodes: every env step completes every agent's transition)
FIRST_UPDATE = {
    "mappo": (["rollout_steps=8", "epochs=1"], 32),  # one rollout: 8 vector steps of 4 envs
    # rollouts of 2 vector steps: the first to end after learning_starts ends at 24
    "maddpg": (["learning_starts=20", "batch_size=16", "train_freq=8"], 24),
    "dqn": (["learning_starts=20", "batch_size=8", "train_freq=4"], 16),  # 24 stored, then 4
}


@pytest.mark.parametrize("algo", sorted(FIRST_UPDATE))
def test_a_run_too_short_for_any_update_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, algo: str
) -> None:
    pytest.importorskip("torch")
    settings, needed = FIRST_UPDATE[algo]
    base = ["num_envs=4", "eval_every=0", "eval_episodes=2", "device=cpu", "tensorboard=false"]
    updated = {}
    for total in (needed - 4, needed):  # one vector step short, and just enough
        run_dir = tmp_path / str(total)
        argv = ["train", algo, "--env", "mdp/climbing", "--total-steps", str(total)]
        argv += ["--run-dir", str(run_dir), "--no-progress", "--set", *base, *settings]
        code, _, err = run(capsys, *argv)
        assert code == 0, err
        warned = "no update will happen" in err
        assert warned == (total < needed), err
        if warned:
            assert f"set total_steps to at least {needed}" in err
        keys = {key for row in read_metrics(run_dir) for key in row}
        returns = {k for k in keys if k.split("/")[0] in ("train_return", "eval_return")}
        updated[total] = bool(keys - set(COLUMNS) - returns)  # the algorithm's losses
    assert updated == {needed - 4: False, needed: True}


@pytest.mark.parametrize(
    "env", ["corral/rps", "corral/rps4", "corral/tag", "pettingzoo/classic/tictactoe_v3"]
)
def test_maddpg_on_an_env_that_is_not_lockstep_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, env: str
) -> None:
    pytest.importorskip("torch")
    if env.startswith("pettingzoo"):
        pytest.importorskip("pettingzoo")
    code, out, err = run(capsys, "train", "maddpg", "--env", env, "--run-dir", str(tmp_path / "r"))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("corral: error: MADDPG needs every agent to act at every step")
    assert not (tmp_path / "r").exists()  # a run refused when it is built leaves no directory


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_cuda_device_where_torch_sees_none_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    """Only the torch arrays of a natively batched env checked it: on a dict env the
    algorithm's networks failed in torch, a traceback ending in an AssertionError (exit 1)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("torch sees a CUDA GPU here")
    run_dir = tmp_path / "r"
    if command == "eval":
        assert train(capsys, run_dir, algo="mappo", env="corral/rps")[0] == 0
        args = ["eval", str(run_dir), "--device", "cuda", "--episodes", "2"]
    else:
        args = ["train", "mappo", "--env", "corral/rps", "--device", "cuda"]
        args += ["--run-dir", str(run_dir)]
    code, _, err = run(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "device='cuda', but torch sees no CUDA GPU here: use device=cpu" in err


def test_maddpg_on_an_env_found_turn_based_while_training_is_one_clear_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, isolated_registry: None
) -> None:
    pytest.importorskip("torch")
    from support.games import UndeclaredRPS

    import corral

    corral.register("test/undeclared_rps", UndeclaredRPS)
    argv = ["train", "maddpg", "--env", "test/undeclared_rps", "--no-progress", "--set", *FAST]
    code, _, err = run(capsys, *argv, "--run-dir", str(tmp_path / "r"))
    assert code == 2 and "Traceback" not in err
    assert err.splitlines()[-1].startswith("corral: error: MADDPG needs every agent")
    assert "agent 'player_1' of group 'player' is not acting" in err


def test_mappo_trains_with_self_play(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code, out, err = run(
        capsys,
        *["train", "mappo", "--env", "corral/rps", "--self-play", "--total-steps", "64"],
        *["--run-dir", str(tmp_path / "r"), "--no-progress", "--set", *FAST, "eval_every=32"],
        *["rollout_steps=4", "epochs=1", "snapshot_interval=1"],
    )
    assert code == 0, err
    assert "64 env steps, best eval_vs_opponent" in out
    assert re.search(r"steps 64/64 \|.*\| eval_vs_opponent -?[0-9.]+", err)  # the selecting column
    assert "evaluations play against random from the seats ['player_0', 'player_1']" in err
    rows = read_metrics(tmp_path / "r")
    assert rows[-1]["selfplay/pool"] >= 1 and "eval_vs_opponent/player_1" in rows[-1]
    code, out, err = run(capsys, "eval", str(tmp_path / "r"), "--episodes", "4")
    assert code == 0, err
    assert out.splitlines()[1].startswith("  eval_vs_opponent ")  # what self-play selects on


def test_eval_and_plot_headline_the_column_that_selects_best_pt(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # corral/rps is two-player zero-sum: eval_return (both seats' mean) is 0 in every game
    assert train(capsys, tmp_path / "r", env="corral/rps")[0] == 0
    code, out, err = run(capsys, "eval", str(tmp_path / "r"), "--episodes", "4", *ALLOW)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].startswith("  eval_vs_opponent ") and "(selects best.pt) against random" in out
    assert lines[2].startswith("  eval_return 0.00 +- 0.00; by group and agent: player ")
    pytest.importorskip("matplotlib")
    from corral.training.plot import curves, draw_runs

    (curve,) = curves([tmp_path / "r"])
    rows = [r for r in read_metrics(tmp_path / "r") if "eval_vs_opponent" in r]
    assert curve.metric == "eval_vs_opponent"
    np.testing.assert_allclose(curve.returns[0], [r["eval_vs_opponent"] for r in rows])
    assert draw_runs([tmp_path / "r"]).axes[0].get_ylabel() == "eval vs opponent"
    png = tmp_path / "c.png"
    assert run(capsys, "plot", str(tmp_path / "r"), "-o", str(png))[0] == 0
    code, _, err = run(capsys, "plot", str(tmp_path / "r"), "-o", str(png), "--baselines")
    assert code == 2 and "not 'eval_vs_opponent': draw them on eval_return" in err


@pytest.mark.parametrize(
    ("algo", "env", "said"),
    [
        ("mappo", "mpe2/simple_spread_v3", "the env 'simple_spread_v3' does not declare it"),
        ("dqn", "corral/tag", "the env 'tag' does not declare it"),
        ("dqn", "pettingzoo/classic/hanabi_v5", "the env 'hanabi_v5' declares zero_sum=False"),
    ],
)
def test_self_play_on_an_env_whose_agents_do_not_compete_is_refused_before_any_run_dir(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    algo: str,
    env: str,
    said: str,
) -> None:
    pytest.importorskip("torch")
    if env.startswith(("mpe2", "pettingzoo")):
        pytest.importorskip("pettingzoo")
    monkeypatch.chdir(tmp_path)
    argv = ["train", algo, "--env", env, "--self-play", "--total-steps", "8", "--no-progress"]
    argv += ["--set", *FAST, "eval_episodes=2"]
    argv += ["rollout_steps=2", "epochs=1"] if algo == "mappo" else ["learning_starts=4"]
    for where in ([], ["--run-dir", str(tmp_path / "r")]):  # runs/<name>, and one given
        code, out, err = run(capsys, *argv, *where)
        assert code == 2 and out == "" and "Traceback" not in err
        assert err.count("\n") == 1 and err.startswith(
            "corral: error: self_play needs a game whose agents play against each other, "
            "declared by its env as metadata zero_sum=True"
        )
        assert said in err and "eval_vs_opponent would score no contest" in err
        assert list(tmp_path.iterdir()) == []


def test_plot_draws_the_column_asked_for(capsys: pytest.CaptureFixture[str], tmp_path: Path):
    pytest.importorskip("matplotlib")
    assert train(capsys, tmp_path / "r")[0] == 0
    png = tmp_path / "c.png"
    argv = ["plot", str(tmp_path / "r"), "-o", str(png), "--metric"]
    code, _, err = run(capsys, *argv, "eval_return/player_1")
    assert code == 0, err
    assert png.read_bytes()[:4] == b"\x89PNG"
    code, _, err = run(capsys, *argv, "eval_return/nobody")
    assert code == 2 and "no column 'eval_return/nobody'" in err


BOTH = ("random", "heuristic")


def test_eval_scores_the_reference_baselines_on_the_same_measure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("mpe2")
    from corral.training.baselines import evaluate_baseline

    kwargs = ("--set", "env_kwargs.N=2", "num_envs=4", "rollout_steps=5")
    assert train(capsys, tmp_path / "r", *kwargs, algo="mappo", env="mpe2/simple_spread_v3")[0] == 0
    code, out, err = run(capsys, "eval", str(tmp_path / "r"), "--episodes", "4", "--baselines")
    assert code == 0, err
    env_kwargs = {"N": 2, "max_cycles": 25}
    random, heuristic = (evaluate_baseline(b, episodes=4, env_kwargs=env_kwargs) for b in BOTH)
    config, algo, _ = load_run(tmp_path / "r")
    returns = np.array(evaluate_policy(config, algo, 4).returns)
    sem = np.std(returns, ddof=1) / np.sqrt(4)  # the run's +- is what the baselines' is
    lines = out.splitlines()
    assert lines[0].endswith("mean +- standard error over 4 episodes")
    assert lines[1].startswith(f"  eval_return {returns.mean():.2f} +- {sem:.2f} ")
    baselines = f"random {random}, heuristic {heuristic}"
    assert lines[2] == f"  reference baselines on eval_return: {baselines}"
    code, out, err = run(capsys, "eval", str(tmp_path / "r"), "--episodes", "1", "--baselines")
    assert code == 0, err
    assert "reference baselines on eval_return (over 2 episodes: a standard error needs two)" in out


def test_eval_baselines_of_an_env_without_any_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert train(capsys, tmp_path / "r")[0] == 0
    code, out, err = run(capsys, "eval", str(tmp_path / "r"), "--baselines", *ALLOW)
    assert code == 2 and out == ""  # refused before it evaluates
    assert err.count("\n") == 1 and "no reference baselines for 'mdp/climbing'" in err


# -- the user's own env; ids that do not exist -------------------------------------------------


@pytest.mark.parametrize(
    ("env_id", "suggestion"),
    [
        ("gym/CartPol-v1", "gym/CartPole-v1"),
        ("openspiel/kuhn_pokr", "openspiel/kuhn_poker"),
        ("mpe2/simple_spred_v3", "mpe2/simple_spread_v3"),
    ],
)
def test_a_misspelt_env_id_is_one_line_and_makes_no_run_directory(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    env_id: str,
    suggestion: str,
) -> None:
    pytest.importorskip("torch")
    if env_id.startswith("openspiel/"):
        pytest.importorskip("pyspiel")
    monkeypatch.chdir(tmp_path)  # where runs/ would be made
    code, out, err = run(capsys, "train", "dqn", "--env", env_id, "--total-steps", "80")
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"corral: error: unknown env id '{env_id}'")
    assert f"Did you mean {suggestion}" in err
    assert list(tmp_path.iterdir()) == []


class Unbuildable:
    """An env whose constructor fails as a simulator that is not running would."""

    def __init__(self) -> None:
        raise RuntimeError("the simulator is not running")


def test_an_env_that_cannot_be_built_is_one_line_naming_where_it_raised(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, isolated_registry: None
) -> None:
    corral.register("test/unbuildable", Unbuildable)
    code, _, err = train(capsys, tmp_path / "r", env="test/unbuildable")
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith(
        "corral: error: env 0: building the env raised RuntimeError: the simulator is not running"
    )
    line = Unbuildable.__init__.__code__.co_firstlineno + 1
    assert f"(raised at {__file__}:{line})" in err
    assert "Traceback" not in err and "--resume" not in err
    assert not (tmp_path / "r").exists()  # no training began: no run directory


def test_an_env_fault_before_any_checkpoint_gives_no_resume_advice(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, isolated_registry: None
) -> None:
    corral.register("test/breaks_at_step_3", breaks_at_step, at=3)
    code, _, err = train(capsys, tmp_path / "r", env="test/breaks_at_step_3")
    assert code == 1
    assert "training stopped: env 0: step() raised RuntimeError" in err
    assert not (tmp_path / "r" / "checkpoint.pt").exists()
    assert "holds the last checkpoint" not in err and "--resume" not in err
    assert f"no checkpoint was written in {tmp_path / 'r'}: there is nothing to resume" in err


def breaks_at_step(at: int) -> Any:
    """The climbing game, whose step raises at its ``at``-th step."""
    env = climbing_game()
    step, steps = env.step, iter(range(1, 10**9))

    def breaking_step(actions: dict) -> Any:
        if next(steps) == at:
            raise RuntimeError("the env broke")
        return step(actions)

    env.step = breaking_step
    return env


def user_module(directory: Path) -> str:
    """A module of the user's in ``directory``, of a new name ``NAME``, that registers the
    id ``NAME/climbing`` when imported."""
    name = f"mine_{uuid.uuid4().hex[:10]}"
    (directory / f"{name}.py").write_text(
        f"import corral\n\ncorral.register('{name}/climbing', 'corral.envs.mdp:climbing_game')\n"
    )
    return name


def forget(module: str) -> None:
    """As if this process had never imported ``module`` (nor registered its id)."""
    sys.modules.pop(module, None)
    registry._specs.pop(f"{module}/climbing", None)


@pytest.fixture
def in_tmp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` as the current directory, not on ``sys.path`` (as for ``corral``)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    return tmp_path


def test_a_user_env_trains_evaluates_and_resumes_with_import(
    capsys: pytest.CaptureFixture[str], in_tmp_dir: Path, isolated_registry: None
) -> None:
    module = user_module(in_tmp_dir)
    env, run_dir = f"{module}/climbing", in_tmp_dir / "r"
    try:
        code, _, err = train(capsys, run_dir, env=env)
        assert code == 2 and "--import MODULE" in err and "Traceback" not in err
        assert not run_dir.exists()
        code, _, err = train(capsys, run_dir, "--import", module, env=env)
        assert code == 0, err
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["run"]["imports"] == [module]

        forget(module)  # a new process: the run directory says what to import
        code, _, err = run(capsys, "eval", str(run_dir), *ALLOW)
        assert code == 2 and len(err.splitlines()) == 1
        assert f"imports '{module}' would import the module '{module}'" in err
        assert f"--allow-import {module}" in err
        assert module not in sys.modules
        for allowed in (["--allow-import", module], ["--import", module]):
            forget(module)
            code, out, err = run(capsys, "eval", str(run_dir), "--episodes", "2", *ALLOW, *allowed)
            assert code == 0 and "mean +- standard error" in out, err
        forget(module)
        resume = ["train", "--resume", str(run_dir), "--total-steps", "120", "--no-progress"]
        code, out, err = run(capsys, *resume, *ALLOW, "--import", module)
        assert code == 0 and "120 env steps" in out, err
    finally:
        forget(module)


def test_a_run_that_did_not_record_its_import_says_which_flag_to_pass(
    capsys: pytest.CaptureFixture[str], in_tmp_dir: Path, isolated_registry: None
) -> None:
    module = user_module(in_tmp_dir)
    env, run_dir = f"{module}/climbing", in_tmp_dir / "r"
    try:
        assert train(capsys, run_dir, "--import", module, env=env)[0] == 0
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        del config["run"]["imports"]  # as an older corral wrote it
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
        forget(module)
        code, _, err = run(capsys, "eval", str(run_dir), *ALLOW)
        assert code == 2 and len(err.splitlines()) == 1
        assert f"unknown env id '{env}'" in err and "--import MODULE" in err
        resume = ["train", "--resume", str(run_dir), "--total-steps", "120", "--no-progress"]
        code, _, err = run(capsys, *resume, *ALLOW, "--import", module)
        assert code == 0, err
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config["run"]["imports"] == [module]  # recorded from now on
        forget(module)
        code, _, err = run(capsys, "eval", str(run_dir), *ALLOW, "--allow-import", module)
        assert code == 0, err
    finally:
        forget(module)


def test_python_trains_and_resumes_a_user_env_with_imports(
    in_tmp_dir: Path, isolated_registry: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = user_module(in_tmp_dir)
    monkeypatch.syspath_prepend(str(in_tmp_dir))  # as for a script in that directory
    settings = {k: v for k, _, v in (s.partition("=") for s in FAST)}
    try:
        results = corral.train(
            TINY, env=f"{module}/climbing", imports=[module], total_steps=40, progress=False,
            run_dir="r", **settings,
        )  # fmt: skip
        assert results.config.run.imports == (module,)
        forget(module)
        with pytest.raises(corral.training.ConfigError, match=f"--allow-import {module}"):
            corral.train(TINY, resume="r", total_steps=60, progress=False)
        forget(module)
        results = corral.train(TINY, resume="r", total_steps=60, progress=False, imports=[module])
        assert results.env_steps == 60 and results.config.run.imports == (module,)
    finally:
        forget(module)


def test_train_and_eval_take_an_env_module_attr(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    env = "corral.envs.mdp:climbing_game"
    code, _, err = train(capsys, tmp_path / "r", env=env)
    assert code == 0, err
    code, _, err = run(capsys, "eval", str(tmp_path / "r"), *ALLOW)
    assert code == 2 and f"--allow-import {env}" in err
    code, out, err = run(capsys, "eval", str(tmp_path / "r"), *ALLOW, "--allow-import", env)
    assert code == 0 and "mean +- standard error" in out, err


def test_a_fresh_process_trains_and_evaluates_a_user_env(tmp_path: Path) -> None:
    module = user_module(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS)])}
    corral_cli = [sys.executable, "-m", "corral"]
    argv = ["train", TINY, "--env", f"{module}/climbing", "--import", module, "--total-steps"]
    argv += ["40", "--run-dir", "r", "--no-progress", "--set", *FAST]
    done = subprocess.run(
        [*corral_cli, *argv], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    argv = ["eval", "r", "--episodes", "2", "--import", module, *ALLOW]
    done = subprocess.run(
        [*corral_cli, *argv], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    said = r"r \(best checkpoint, \d+ env steps, greedy\): mean \+- standard error"
    assert re.match(said, done.stdout)


# -- run directories and settings that cannot be used: one line, exit 2 ----------------------


def test_a_seed_torch_cannot_take_is_one_line_naming_the_setting(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = train(capsys, tmp_path / "r", "--seed", str(2**64))
    assert code == 2
    assert err == (f"corral: error: seed must be in [0, {2**64 - 1}], got {2**64}\n"), err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("where", ["file", "under a file", "proc"])
def test_a_run_dir_that_cannot_be_a_directory_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str
) -> None:
    (tmp_path / "f").write_text("a file\n")
    run_dir, said = {
        "file": (tmp_path / "f", f"run_dir {tmp_path / 'f'} is not a directory"),
        "under a file": (tmp_path / "f" / "r", f"run_dir {tmp_path / 'f' / 'r'} cannot be made"),
        "proc": (Path("/proc/corral-run"), "run_dir /proc/corral-run cannot be made"),
    }[where]
    if where == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc on this system")
    code, _, err = train(capsys, run_dir)
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith(f"corral: error: {said}"), err
    assert (tmp_path / "f").read_text() == "a file\n"


def test_a_run_dir_that_cannot_be_written_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mkdir = os.mkdir

    def refused(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path).parent == tmp_path:  # as in a directory of another user (root may write)
            raise PermissionError(13, "Permission denied", str(path))
        mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", refused)
    code, _, err = train(capsys, tmp_path / "r")
    assert code == 2
    assert err == f"corral: error: run_dir {tmp_path / 'r'} cannot be made: Permission denied\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a directory without write access")
def test_resuming_a_run_in_a_directory_without_write_access_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "r"
    assert train(capsys, run_dir)[0] == 0
    run_dir.chmod(0o555)
    (run_dir / "config.yaml").chmod(0o444)
    try:
        code, _, err = run(
            capsys, "train", "--resume", str(run_dir), "--total-steps", "120", *ALLOW
        )
    finally:
        run_dir.chmod(0o755)
    assert code == 2
    assert err.startswith(f"corral: error: cannot write {run_dir / 'config.yaml'}: "), err


@pytest.mark.parametrize("checkpointed", [False, True])
def test_an_interrupted_run_offers_to_resume_only_from_a_checkpoint(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    checkpointed: bool,
) -> None:
    from corral.training import Runner

    run_dir = tmp_path / "r"
    if checkpointed:
        assert train(capsys, run_dir)[0] == 0

    def interrupted(self: Runner) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Runner, "train", interrupted)
    if checkpointed:
        command = ["train", "--resume", str(run_dir), "--total-steps", "120", *ALLOW]
        code, _, err = run(capsys, *command)
        said = f"interrupted: resume from the last checkpoint with corral train --resume {run_dir}"
    else:
        code, _, err = train(capsys, run_dir)
        said = "interrupted before the first checkpoint: nothing to resume"
    assert code == 130
    assert err.splitlines()[-1] == said, err
    assert (run_dir / "checkpoint.pt").exists() == checkpointed


def test_qmix_trains_on_an_env_without_state(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("rware")
    env = "rware/rware-tiny-2ag-v2"  # declares no global state: QMIX mixes on the observations
    code, _, err = train(
        capsys, tmp_path / "run", "--set", "learning_starts=8", algo="qmix", env=env
    )
    assert code == 0, err
    assert [r["env_steps"] for r in read_metrics(tmp_path / "run")][-1] == 80
