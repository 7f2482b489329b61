"""A run directory's ``config.yaml`` runs no code: its ``algo``, ``opponent`` and ``env`` may
name registered things only, and its ``imports`` no module, unless the command line allows
a ``module:attr`` or module (``--allow-import``); and a config file that cannot be read is
one error naming the file."""

from __future__ import annotations

import importlib.resources
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("yaml")

import yaml
from support.tabular import TINY

import corral
from corral import cli
from corral.training import ConfigError, Runner, load_config, load_run
from corral.training import runner as runner_module
from corral.training.config import packaged_defaults
from corral.training.runner import read_run_config

SRC = Path(corral.__file__).parent.parent
FAST = ["num_envs=2", "eval_episodes=2", "log_every=20", "device=cpu", "tensorboard=false"]


def marker_module(directory: Path) -> tuple[str, Path]:
    """A module (new name, in ``directory``) that creates a marker file when imported; it
    re-exports the tabular learner as ``TabularQ`` and has a fixed policy ``rock``."""
    name = f"marker_{uuid.uuid4().hex[:10]}"
    marker = directory / f"{name}.imported"
    (directory / f"{name}.py").write_text(
        "import pathlib\n\n"
        "import numpy as np\n\n"
        f"pathlib.Path({str(marker)!r}).touch()\n\n"
        "try:\n"
        "    from support.tabular import TabularQ\n"
        "except ImportError:  # a subprocess without the tests on its path\n"
        "    TabularQ = None\n\n\n"
        "def rock(obs, mask, rng):\n"
        "    return np.zeros(np.shape(obs)[:2], dtype=np.int64)\n"
    )
    return name, marker


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory on ``sys.path`` for marker modules."""
    directory = tmp_path / "modules"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    return directory


def crafted_run(directory: Path, algo: str = "mappo", **run: Any) -> Path:
    """A run directory holding only a ``config.yaml`` (as someone else could hand it over)."""
    directory.mkdir()
    data = {"algo": algo, "run": {"env": "corral/rps", **run}, "algo_config": {}}
    (directory / "config.yaml").write_text(yaml.safe_dump(data))
    return directory


def forget(name: str, marker: Path) -> None:
    """As if ``name`` had never been imported in this process."""
    sys.modules.pop(name, None)
    marker.unlink(missing_ok=True)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = cli.main(list(argv))
    return code, capsys.readouterr().err


# -- no code from a run directory ----------------------------------------------------------


@pytest.mark.parametrize("command", [["eval"], ["train", "--resume"]])
@pytest.mark.parametrize("setting", ["algo", "opponent", "env"])
def test_corral_refuses_a_run_config_that_would_import_a_module(
    tmp_path: Path, modules: Path, command: list[str], setting: str
) -> None:
    name, marker = marker_module(modules)
    names = {"algo": f"{name}:TabularQ", "opponent": f"{name}:rock", "env": f"gym/{name}:X-v0"}
    value = names[setting]
    run = crafted_run(tmp_path / "run", **{setting: value})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(modules), str(SRC)])}
    argv = [sys.executable, "-m", "corral", *command, str(run)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert not marker.exists()
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("corral: error: "), done.stderr
    for part in (str(run / "config.yaml"), f"{setting} {value!r}", f"--allow-import {value}"):
        assert part in lines[0]


def test_allow_import_lets_a_run_import_exactly_what_it_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, modules: Path
) -> None:
    name, marker = marker_module(modules)
    algo, opponent = f"{name}:TabularQ", f"{name}:rock"
    run = str(tmp_path / "r")
    settings = ["group_map=agent", "learn_groups=player_1", f"opponent={opponent}", *FAST]
    # on the command line itself, module:attr is the user's own choice
    train = ["train", algo, "--env", "corral/rps", "--total-steps", "40", "--run-dir", run]
    code, err = run_cli(capsys, *train, "--no-progress", "--set", *settings)
    assert code == 0, err
    assert marker.exists()
    resume = ["train", "--resume", run, "--total-steps", "60", "--no-progress"]
    for command in (["eval", run], resume):
        forget(name, marker)
        code, err = run_cli(capsys, *command)
        assert code == 2 and f"algo {algo!r}" in err and "Traceback" not in err
        code, err = run_cli(capsys, *command, "--allow-import", algo)
        assert code == 2 and f"opponent {opponent!r}" in err
        assert not marker.exists()  # nothing is imported until every import is allowed
        code, err = run_cli(capsys, *command, "--allow-import", algo, "--allow-import", opponent)
        assert code == 0, err
        assert marker.exists()


def test_python_apis_that_read_a_run_directory_refuse_imports_unless_allowed(
    tmp_path: Path, modules: Path
) -> None:
    name, marker = marker_module(modules)
    value = f"{name}:TabularQ"
    run = crafted_run(tmp_path / "run", algo=value)
    for read in (
        lambda **kw: read_run_config(run, **kw),
        lambda **kw: load_run(run, **kw),
        lambda **kw: Runner.resume(run, progress=False, **kw),
    ):
        with pytest.raises(ConfigError, match=f"algo '{value}' would import the module '{name}'"):
            read()
        assert not marker.exists()
    assert read_run_config(run, allow_imports=[value]).algo == value
    assert marker.exists()


def test_a_run_section_cannot_hide_the_algorithm_from_the_check(
    tmp_path: Path, modules: Path
) -> None:
    name, marker = marker_module(modules)
    data = {"algo": f"{name}:TabularQ", "run": {"env": "corral/rps", "algo": "mappo"}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=f"algo '{name}:TabularQ' would import"):
        read_run_config(tmp_path)
    assert not marker.exists()


def test_an_eval_opponent_run_imports_nothing_unless_allowed(tmp_path: Path, modules: Path) -> None:
    name, marker = marker_module(modules)
    other = crafted_run(tmp_path / "other", algo=f"{name}:TabularQ")
    settings = {"eval_opponent": str(other), "run_dir": str(tmp_path / "r"), "device": "cpu"}
    config = load_config(TINY, "corral/rps", settings)
    with pytest.raises(ConfigError, match=f"{other / 'config.yaml'}: algo"):
        Runner(config, progress=False)
    assert not marker.exists()


def test_an_env_id_that_would_import_a_module_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, modules: Path
) -> None:
    pytest.importorskip("gymnasium")
    name, marker = marker_module(modules)
    env = f"gym/{name}:Nothing-v0"
    run = crafted_run(tmp_path / "run", env=env)
    code, err = run_cli(capsys, "eval", str(run))
    assert code == 2 and f"env {env!r}" in err and f"--allow-import {env}" in err
    assert not marker.exists()
    assert read_run_config(run, allow_imports=[env]).run.env == env
    # what the refusal prevents: Gymnasium imports the module named in the id
    with pytest.raises(Exception, match="Nothing"):
        corral.make(env)
    assert marker.exists()


@pytest.mark.parametrize("command", [["eval"], ["train", "--resume"]])
def test_a_run_config_s_imports_are_refused_unless_allowed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, modules: Path, command: list[str]
) -> None:
    name, marker = marker_module(modules)
    run = crafted_run(tmp_path / "run", imports=[name])
    code, err = run_cli(capsys, *command, str(run))
    assert code == 2 and len(err.splitlines()) == 1, err
    for part in (str(run / "config.yaml"), f"imports {name!r}", f"--allow-import {name}"):
        assert part in err
    for read in (
        lambda **kw: read_run_config(run, **kw),
        lambda **kw: load_run(run, **kw),
        lambda **kw: Runner.resume(run, progress=False, **kw),
    ):
        with pytest.raises(ConfigError, match=f"imports '{name}' would import the module"):
            read()
    assert not marker.exists()
    assert read_run_config(run, allow_imports=[name]).run.imports == (name,)


def test_registered_names_need_no_allowance(tmp_path: Path) -> None:
    run = crafted_run(tmp_path / "run", algo="dqn", opponent="random", env="gym/CartPole-v1")
    config = read_run_config(run)
    assert (config.algo, config.run.opponent, config.run.env) == (
        "dqn",
        "random",
        "gym/CartPole-v1",
    )


# -- no absurd use of the machine -------------------------------------------------------------


class Built(Exception):
    """Stands for building the training envs: the run's settings passed every check."""


def test_a_run_starts_no_more_worker_processes_than_the_machine_takes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    train = ["train", "mappo", "--env", "corral/rps", "--total-steps", "20", "--run-dir", str(run)]
    code, err = run_cli(capsys, *train, "--no-progress", "--set", *FAST)
    assert code == 0, err

    def built(*args: Any, **kwargs: Any) -> None:
        raise Built

    monkeypatch.setattr(runner_module, "build_venv", built)  # no worker is started here
    path = run / "config.yaml"
    data = yaml.safe_load(path.read_text())
    data["run"].update(backend="subproc", num_envs=100_000, num_workers=100_000)
    path.write_text(yaml.safe_dump(data))
    limit = max(64, 4 * (os.cpu_count() or 1))
    resume = ["train", "--resume", str(run), "--total-steps", "40"]  # 20 more to train
    code, err = run_cli(capsys, *resume, "--no-progress")
    assert code == 2 and "Traceback" not in err, err
    assert "num_envs=100000 with num_workers=100000 would start 100000 subproc worker" in err
    assert f"more than its limit of {limit}" in err
    with pytest.raises(Built):  # the command line may choose the workers of a resumed run
        run_cli(capsys, *resume, "--set", "num_workers=2")
    settings = {"backend": "ray", "num_envs": 10_000, "envs_per_worker": 1, "device": "cpu"}
    with pytest.raises(ConfigError, match="envs_per_worker=1 would start 10000 ray worker"):
        Runner(load_config("mappo", "corral/rps", settings), progress=False)
    with pytest.raises(Built):  # a cluster places the actors itself
        Runner(load_config("mappo", "corral/rps", {**settings, "ray_address": "auto"}))
    # rollout workers are processes of a local Ray too
    runners = {"runners": limit + 1, "num_envs": limit + 1, "device": "cpu"}
    with pytest.raises(ConfigError, match=f"runners={limit + 1} would start {limit + 1} rollout"):
        Runner(load_config("mappo", "corral/rps", runners), progress=False)


# -- config files that cannot be read -------------------------------------------------------


UNREADABLE = [  # config.yaml, the error after its path, and whether `corral plot` sees it
    ("algo: mappo\nrun: {env: corral/rps\n", ", line 3, column 1: invalid YAML: ", True),
    ("algo: mappo\n  run: x: y\n", ", line 2, column 6: invalid YAML: mapping values", True),
    ("- algo\n- mappo\n", ": a config file must hold a mapping .*got a list", True),
    ("run: {env: corral/rps}\n", ": no algorithm: expected a line 'algo: NAME'", False),
    ("algo: mappo\nrun: [1, 2]\n", ": run must be a mapping of settings", False),
    ("algo: mappo\nrun: {gamma: 0.9}\n", r": RunConfig has no setting\(s\) \['gamma'\]", False),
    ("algo: mappo\nrun: {num_envs: 0}\n", r": num_envs must be in \[1, 16777216\], got 0", False),
    ("algo: mappo\nrun: {num_envs: 2e7}\n", r": num_envs must be in \[1, 16777216\], got 2", False),
]


@pytest.mark.parametrize(("text", "message", "plot"), UNREADABLE)
def test_a_run_config_that_cannot_be_used_is_one_error_naming_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str, plot: bool
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"^{path}{message}"):
        read_run_config(tmp_path)
    commands = [["eval", str(tmp_path)], ["train", "--resume", str(tmp_path)]]
    commands += [["plot", str(tmp_path), "-o", str(tmp_path / "c.png")]] if plot else []
    for command in commands:
        code, err = run_cli(capsys, *command)
        assert code == 2 and str(path) in err and "Traceback" not in err, command


def test_an_invalid_packaged_config_names_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "mappo.yaml").write_text("num_envs: [16\n")
    monkeypatch.setattr(importlib.resources, "files", lambda package: tmp_path)
    with pytest.raises(ConfigError, match=r"configs/mappo.yaml, line 2, column 1: invalid YAML"):
        packaged_defaults("mappo")


# -- the Ray cluster a run directory names ----------------------------------------------------


class Joined(Exception):
    """Raised in place of joining a Ray cluster."""


def test_corral_eval_joins_the_cluster_a_config_names_only_where_the_command_line_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = {"num_envs": 2, "total_steps": 20, "eval_every": 0, "device": "cpu"}
    config = load_config(TINY, "mdp/climbing", {**settings, "run_dir": str(tmp_path / "r")})
    with Runner(config, progress=False) as runner:
        runner.train()
    path = tmp_path / "r" / "config.yaml"
    text = path.read_text()
    assert "backend: sync" in text and "ray_address: null" in text
    path.write_text(
        text.replace(" backend: sync", " backend: ray").replace(
            "ray_address: null", "ray_address: 127.0.0.1:1"
        )
    )
    make_vec, joins = runner_module.make_vec, []

    def spy(env: str, num_envs: int, backend: str, **options: Any) -> Any:
        if backend == "ray":
            joins.append(options.get("ray_address"))
            raise Joined
        return make_vec(env, num_envs, backend, **options)

    monkeypatch.setattr(runner_module, "make_vec", spy)
    evaluate = ["eval", str(tmp_path / "r"), "--episodes", "2", "--allow-import", TINY]
    code, err = run_cli(capsys, *evaluate)
    assert code == 2 and joins == [], err
    assert err == (
        f"corral: error: {path} names the Ray cluster '127.0.0.1:1'; corral eval joins a "
        "cluster only when the command line names it again: --ray-address 127.0.0.1:1\n"
    )
    with pytest.raises(Joined):
        run_cli(capsys, *evaluate, "--ray-address", "127.0.0.1:1")
    assert joins == ["127.0.0.1:1"]


def test_config_error_is_corrals_public_name_where_the_docs_name_it() -> None:
    """docs/training.md tells users to catch ``corral.ConfigError``."""
    assert corral.ConfigError is ConfigError
    assert "ConfigError" in corral.__all__
