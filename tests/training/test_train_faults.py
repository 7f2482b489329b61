"""A training run and an env that fails: stop with one clear error, or restart it and go on."""

from __future__ import annotations

import itertools
import re
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import corral
import corral.training.checkpoint
from corral import cli
from corral.errors import EnvError
from corral.registry import spec
from corral.training import ConfigError, Runner, load_config
from corral.training.metrics import read_metrics
from corral.training.runner import LATEST

pytest.importorskip("torch")

FAULTS = {"steps": 0, "every": 0}
"""Steps taken by every Flaky env of this process, and every how many steps one raises."""


class Flaky:
    """The climbing game, whose ``every``-th step (counted over all copies) raises."""

    def __new__(cls) -> Any:
        env = corral.make("mdp/climbing")
        step = env.step

        def flaky_step(actions: dict) -> Any:
            FAULTS["steps"] += 1
            if FAULTS["every"] and FAULTS["steps"] % FAULTS["every"] == 0:
                raise RuntimeError("the simulator lost its connection")
            return step(actions)

        env.step = flaky_step
        return env


class FlakyNative(corral.BatchedEnv):
    """The natively batched climbing game, whose ``every``-th step (counted with the dict
    envs' ones) raises: it cannot say which copy failed, so every copy restarts."""

    def __init__(self, num_envs: int, array: str = "numpy", device: str = "cpu") -> None:
        self.env = spec("mdp/climbing").make_batched(num_envs, array, device)
        self.num_envs, self.place = num_envs, self.env.place
        self.possible_agents = self.env.possible_agents
        self.max_episode_steps = self.env.max_episode_steps
        self.metadata = self.env.metadata

    @property
    def groups(self) -> dict:
        return self.env.groups

    def observation_space(self, agent: str) -> Any:
        return self.env.observation_space(agent)

    def action_space(self, agent: str) -> Any:
        return self.env.action_space(agent)

    def reset(self, seed: Any = None, where: Any = None, options: Any = None) -> Any:
        return self.env.reset(seed=seed, where=where, options=options)

    def step(self, actions: dict) -> Any:
        FAULTS["steps"] += 1
        if FAULTS["every"] and FAULTS["steps"] % FAULTS["every"] == 0:
            raise RuntimeError("the simulator lost its connection")
        return self.env.step(actions)


SETTINGS = {
    "num_envs": 2, "total_steps": 200, "eval_every": 0, "checkpoint_every": 40,
    "log_every": 40, "device": "cpu", "tensorboard": False, "eval_episodes": 2,
}  # fmt: skip


@pytest.fixture(autouse=True)
def faults_every_37_steps(isolated_registry: None) -> Any:
    corral.register("test/flaky_climbing", Flaky)
    corral.register("test/flaky_native_climbing", Flaky, batched=FlakyNative)
    FAULTS.update(steps=0, every=37)
    yield
    FAULTS.update(steps=0, every=0)


def test_restart_trains_on_and_counts_the_restarts(tmp_path: Path) -> None:
    config = load_config(
        "dqn", "test/flaky_climbing",
        {**SETTINGS, "on_env_error": "restart", "run_dir": str(tmp_path / "r")},
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Runner(config, progress=False) as runner:
            results = runner.train()
    assert results.env_steps == 200
    rows = read_metrics(tmp_path / "r")
    restarts = sum(r.get("env_restarts", 0) for r in rows)
    assert restarts == FAULTS["steps"] // 37 >= 5
    assert any("the simulator lost its connection" in str(w.message) for w in caught)


def test_restart_trains_on_when_a_natively_batched_env_raises(tmp_path: Path) -> None:
    config = load_config(
        "dqn", "test/flaky_native_climbing",
        {**SETTINGS, "on_env_error": "restart", "run_dir": str(tmp_path / "r")},
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Runner(config, progress=False) as runner:
            assert runner.venv.native
            results = runner.train()
    assert results.env_steps == 200
    restarts = sum(r.get("env_restarts", 0) for r in read_metrics(tmp_path / "r"))
    assert restarts == SETTINGS["num_envs"] * (FAULTS["steps"] // 37) >= 2  # every copy
    assert any("the simulator lost its connection" in str(w.message) for w in caught)


def test_raise_stops_the_run_with_one_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    FAULTS["every"] = 97  # after the checkpoints at 40 and 80 env steps
    run = tmp_path / "r"
    settings = [f"{k}={v}" for k, v in SETTINGS.items()]
    code = cli.main(
        ["train", "dqn", "--env", "test/flaky_climbing", "--run-dir", str(run),
         "--no-progress", "--set", *settings]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert "training stopped: env " in err and "the simulator lost its connection" in err
    assert "on_env_error=restart" in err and f"--resume {run}" in err
    assert corral.training.checkpoint.load(run / LATEST)["env_steps"] == 80


def test_a_worker_timeout_stops_the_run_with_one_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # defined here, workers unpickle it by value: they need not import this module (and torch)
    def hanging_climbing(hang_at: int) -> Any:
        """The climbing game, whose ``hang_at``-th step (counted in each worker) never returns."""
        env = corral.make("mdp/climbing")
        step, steps = env.step, itertools.count(1)

        def hanging_step(actions: dict) -> Any:
            if next(steps) == hang_at:
                time.sleep(600)  # the worker is killed at the timeout
            return step(actions)

        env.step = hanging_step
        return env

    corral.register("test/hanging_climbing", hanging_climbing, hang_at=30)
    settings = {**SETTINGS, "backend": "subproc", "num_workers": 2, "timeout": 1}
    start = time.monotonic()
    code = cli.main(
        ["train", "dqn", "--env", "test/hanging_climbing", "--run-dir", str(tmp_path / "r"),
         "--no-progress", "--set", *(f"{k}={v}" for k, v in settings.items())]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and time.monotonic() - start < 60
    assert "Traceback" not in err
    [error] = [line for line in err.splitlines() if line.startswith("corral: error:")]
    assert error.startswith("corral: error: training stopped: worker")
    assert "did not answer step() within 1.0 s" in error


def test_the_error_names_the_env_and_carries_the_batch(tmp_path: Path) -> None:
    config = load_config("dqn", "test/flaky_climbing", {**SETTINGS, "run_dir": str(tmp_path)})
    with Runner(config, progress=False) as runner, pytest.raises(EnvError) as err:
        runner.train()
    assert err.value.env_index in (0, 1) and err.value.batch is not None


def test_a_resumed_run_does_not_join_the_cluster_its_config_names(tmp_path: Path) -> None:
    FAULTS["every"] = 0
    config = load_config("dqn", "test/flaky_climbing", {**SETTINGS, "run_dir": str(tmp_path)})
    with Runner(config, progress=False) as runner:
        runner.train()
    text = (tmp_path / "config.yaml").read_text()
    (tmp_path / "config.yaml").write_text(
        text.replace("ray_address: null", "ray_address: ray://attacker:10001").replace(
            " backend: sync", " backend: ray"
        )
    )
    with pytest.raises(ConfigError, match="--set ray_address=ray://attacker:10001"):
        Runner.resume(tmp_path, progress=False)


def test_resume_refuses_an_algorithm_or_env_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["train", "mappo", "--resume", str(tmp_path)]) == 2
    assert "leave out 'mappo'" in capsys.readouterr().err
    # nor an env: the run would go on training the env its config.yaml names
    assert cli.main(["train", "--resume", str(tmp_path), "--env", "mpe2/simple_spread_v3"]) == 2
    assert "leave out --env mpe2/simple_spread_v3" in capsys.readouterr().err


def test_an_env_hanging_in_an_evaluation_stops_the_run_at_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # defined here, workers unpickle it by value: they need not import this module (and torch)
    def climbing_hanging_in_evaluations() -> Any:
        """The climbing game, whose steps hang in episodes seeded as evaluations are."""
        env = corral.make("mdp/climbing")
        reset, step, seeds = env.reset, env.step, [0]

        def seeded_reset(seed: int | None = None, options: dict | None = None) -> Any:
            seeds[0] = seeds[0] if seed is None else seed
            return reset(seed=seed, options=options)

        def hanging_step(actions: dict) -> Any:
            if seeds[0] >= 1_000_000:  # the runner's evaluation seeds
                time.sleep(20)  # the worker is killed at the timeout
            return step(actions)

        env.reset, env.step = seeded_reset, hanging_step
        return env

    corral.register("test/climbing_hanging_in_evaluations", climbing_hanging_in_evaluations)
    settings = {**SETTINGS, "backend": "subproc", "num_workers": 1, "timeout": 1, "eval_every": 100}
    start = time.monotonic()
    code = cli.main(
        ["train", "dqn", "--env", "test/climbing_hanging_in_evaluations", "--run-dir",
         str(tmp_path / "r"), "--no-progress", "--set", *(f"{k}={v}" for k, v in settings.items())]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert time.monotonic() - start < 15 and code == 1, err
    [error] = [line for line in err.splitlines() if line.startswith("corral: error:")]
    assert "did not answer step() within 1.0 s" in error


# -- evaluations average whole episodes only --------------------------------------------------

CHAIN = {"steps": 0, "at": set()}
"""Steps taken by every chain env of this process (dict copies: each copy's step; natively
batched: each batched step), and the counts at which a step raises."""
CHAIN_LENGTH = 4  # whole episodes: 4 steps of reward 1, whatever the action


def chain_mdp() -> Any:
    from corral.envs.mdp import TabularMDP

    outcomes = {(s, a): [(1.0, s + 1, 1.0)] for s in range(CHAIN_LENGTH) for a in (0, 1)}
    return TabularMDP.from_outcomes(outcomes, CHAIN_LENGTH + 1, 2, [CHAIN_LENGTH])


def chain_fault() -> None:
    CHAIN["steps"] += 1
    if CHAIN["steps"] in CHAIN["at"]:
        raise RuntimeError("the simulator lost its connection")


class FaultyChain:
    """The chain, whose steps raise at the counts of ``CHAIN["at"]``."""

    def __new__(cls) -> Any:
        env = chain_mdp()
        step = env.step

        def faulty_step(actions: dict) -> Any:
            chain_fault()
            return step(actions)

        env.step = faulty_step
        return env


class FaultyChainNative(FlakyNative):
    """The natively batched chain, whose batched steps raise at the counts of ``CHAIN["at"]``
    (every copy's episode is cut)."""

    def __init__(self, num_envs: int, array: str = "numpy", device: str = "cpu") -> None:
        from corral.envs.mdp_batched import batch

        self.env = batch(chain_mdp(), num_envs, array, device)
        self.num_envs, self.place = num_envs, self.env.place
        self.possible_agents = self.env.possible_agents
        self.max_episode_steps = self.env.max_episode_steps
        self.metadata = self.env.metadata

    def step(self, actions: dict) -> Any:
        chain_fault()
        return self.env.step(actions)


@pytest.fixture
def chain_run(tmp_path: Path) -> Any:
    """A DQN run's config on the faulty chain (3 envs, on_env_error=restart), and its
    evaluation venv and algorithm, for ``native`` or dict envs."""
    from corral.training.runner import build_algorithm, build_eval_venv

    corral.register("test/faulty_chain", FaultyChain, batched=FaultyChainNative)
    made = []

    def build(native: bool) -> tuple:
        settings = {**SETTINGS, "num_envs": 3, "on_env_error": "restart", "native": native}
        config = load_config("dqn", "test/faulty_chain", {**settings, "run_dir": str(tmp_path)})
        venv = build_eval_venv(config)
        made.append(venv)
        assert venv.native is native
        return config, venv, build_algorithm(config, venv)

    CHAIN.update(steps=0, at=set())
    yield build
    CHAIN.update(steps=0, at=set())
    for venv in made:
        venv.close()


@pytest.mark.parametrize(("native", "cut"), [(False, 2), (True, 6)])
def test_an_evaluation_averages_whole_episodes_only_and_counts_the_cut(
    chain_run: Any, native: bool, cut: int
) -> None:
    """Two faults in an evaluation: a dict env's cuts its own episode, a natively batched
    env's every copy's (3); each is played again, and eval_cut counts them."""
    from corral.training.runner import evaluate_policy

    config, venv, algo = chain_run(native)
    CHAIN["at"] = {3, 7}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the EnvRestartWarnings of the faults
        result = evaluate_policy(config, algo, 6, venv=venv)
    assert CHAIN["steps"] >= 7  # both faults struck
    assert result.returns == [float(CHAIN_LENGTH)] * 6  # whole episodes only, 6 of them
    assert result.cut == cut
    row = result.columns()
    assert row["eval_return"] == CHAIN_LENGTH and row["eval_cut"] == cut


def test_an_evaluation_whose_env_keeps_failing_gives_up_naming_the_envs(chain_run: Any) -> None:
    from corral.errors import EvaluationError
    from corral.training.runner import evaluate_policy

    config, venv, algo = chain_run(False)
    CHAIN["at"] = set(range(2, 1000, 2))  # every other step of any copy raises
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(EvaluationError) as info:
            evaluate_policy(config, algo, 4, venv=venv)
    message = str(info.value)
    # a step cuts up to one episode per env: the count passes 4 by 1 to 3
    said = r"the evaluation gave up: faults cut [5-7] episodes \(of envs 0, 1, 2\)"
    assert re.match(said, message)
    assert "of the 4 whole episodes it averages; it replaces at most 4 cut ones" in message


def test_games_against_an_opponent_count_only_whole_games(chain_run: Any) -> None:
    from corral.training.selfplay_eval import play_against
    from corral.training.whole_episodes import CutEpisodes

    _, venv, algo = chain_run(False)
    CHAIN["at"] = {2, 9}
    cut = CutEpisodes(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        returns = play_against(algo.policy, venv, 4, "agent_0", seed=5, cut=cut)
    assert returns == [float(CHAIN_LENGTH)] * 4 and cut.count == 2


def test_restarts_under_raise_are_logged_as_what_happened(tmp_path: Path) -> None:
    """Under on_env_error=raise a run survives a worker that dies (replaced, its envs
    restarted): the log says so, not that on_env_error=restart restarted a faulty env."""
    flag = tmp_path / "died"

    # defined here, workers unpickle it by value: they need not import this module (and torch)
    def climbing_dying_once(die_at: int) -> Any:
        """The climbing game, whose worker dies at its ``die_at``-th step, once per test."""
        import os

        env = corral.make("mdp/climbing")
        step, steps = env.step, itertools.count(1)

        def dying_step(actions: dict) -> Any:
            if next(steps) == die_at:
                try:  # the first env to create the flag dies: both reach die_at in one step
                    os.close(os.open(flag, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    return step(actions)
                os._exit(3)
            return step(actions)

        env.step = dying_step
        return env

    corral.register("test/climbing_dying_once", climbing_dying_once, die_at=30)
    settings = {**SETTINGS, "backend": "subproc", "num_workers": 2, "run_dir": str(tmp_path / "r")}
    small = {"learning_starts": 20, "batch_size": 16, "train_freq": 8}
    config = load_config("maddpg", "test/climbing_dying_once", {**settings, **small})
    assert config.run.on_env_error == "raise"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the WorkerRestartWarning
        with Runner(config, progress=False) as runner:
            results = runner.train()
    assert results.env_steps == 200 and flag.exists()
    assert sum(r.get("env_restarts", 0) for r in read_metrics(tmp_path / "r")) == 1
    logged = (tmp_path / "r" / "train.log").read_text()
    assert "1 env restart(s) in the last 40 env steps: a worker died and was replaced" in logged
    assert "on_env_error=restart" not in logged
