"""The training runner end to end, with a tiny tabular learner (no PyTorch): run directory,
metrics, evaluation, best checkpoint, resume, configs, plots and GIFs."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("yaml")

from support.runs import Killed, config, kill_after_checkpoint, train, without_time
from support.tabular import TINY, TabularQ

import corral
from corral.training import ConfigError, Runner, load_config, load_run
from corral.training import checkpoint as ckpt
from corral.training import runner as runner_module
from corral.training.metrics import COLUMNS, MetricsLog, read_metrics
from corral.training.progress import BarProgress, LineProgress
from corral.training.runner import BEST, LATEST, build_venv, evaluate_policy
from corral.training.threads import torch_threads

# -- configs ------------------------------------------------------------------------------


def test_settings_are_typed_by_their_fields() -> None:
    cfg = load_config(
        TabularQ,
        "mdp/climbing",
        ["total_steps=2e6", "hidden=32,32", "tensorboard=no", "lr=1e-2", "env_kwargs.x=3"],
    )
    assert cfg.run.total_steps == 2_000_000 and isinstance(cfg.run.total_steps, int)
    assert cfg.algo_config.hidden == (32, 32)
    assert cfg.run.tensorboard is False
    assert cfg.algo_config.lr == pytest.approx(0.01)
    assert cfg.run.env_kwargs == {"x": 3}


def test_a_name_of_both_configs_sets_both() -> None:
    cfg = load_config(TabularQ, "mdp/climbing", {"seed": 7})
    assert cfg.run.seed == 7 and cfg.algo_config.seed == 7


def test_env_sections_apply_globs_then_the_exact_id() -> None:
    defaults = {
        "num_envs": 2,
        "lr": 0.5,
        "envs": {
            "mdp/climbing": {"num_envs": 6},
            "mdp/*": {"num_envs": 3, "eval_episodes": 5},
            "mpe2/*": {"eval_episodes": 99},
        },
    }
    cfg = load_config(TabularQ, "mdp/climbing", {"lr": 0.1}, defaults=defaults)
    assert cfg.run.num_envs == 6  # exact id beats the glob listed after it
    assert cfg.run.eval_episodes == 5
    assert cfg.algo_config.lr == pytest.approx(0.1)  # overrides beat the file
    other = load_config(TabularQ, "mdp/penalty", defaults=defaults)
    assert other.run.num_envs == 3 and other.algo_config.lr == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"totl_steps": 5}, "did you mean 'total_steps'"),
        # what other libraries call a setting: its name here (TabularQ's learning rate is lr)
        ({"learning_rate": 0.1}, "'learning_rate' \\(did you mean 'lr'\\?\\)"),
        ({"discount": 0.9}, "'discount' \\(did you mean 'gamma'\\?\\)"),
        ({"lr": None}, "setting lr=None: expected a number, got None"),
        ({"lr": "fast"}, "setting lr='fast': expected a number, got 'fast'"),
        # corral.train's ways to run: where they go, for a caller who passed them along
        ({"progress": False}, r"'progress' \(a way to run, .*Runner\(config, progress=False\)"),
        ({"resume": "runs/x"}, r"'resume' \(a way to run, .*Runner.resume\(run_dir\)"),
        ({"num_envs": "many"}, "num_envs"),
        ({"num_envs": 0}, r"num_envs must be in \[1, 16777216\], got 0"),
        ({"device": "tpu"}, "device"),
        ({"tensorboard": "maybe"}, "true or false"),
    ],
)
def test_bad_settings_raise_config_errors(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(TabularQ, "mdp/climbing", overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_workers": 2}, "num_workers is an option of the subproc and ray backends, not"),
        # a resume that changes the backend: the setting comes from config.yaml, say how to unset
        ({"backend": "sync", "timeout": 30.0}, r"leave timeout unset \(--set timeout=null"),
        (
            {"backend": "subproc", "ray_address": "auto"},
            "ray_address is an option of the ray backend, not of",
        ),
        ({"backend": "subproc", "num_cpus_per_worker": 0.5}, "not of backend 'subproc'"),
        ({"backend": "threads"}, "backend must be one of"),
        ({"backend": "ray", "num_workers": 0}, "num_workers must be at least 1"),
        ({"backend": "ray", "start_timeout": -1}, r"start_timeout must be in \[0, 10+\], got -1"),
        ({"torch_threads": 0}, "torch_threads must be at least 1"),
        ({"torch_threads": "many"}, "torch_threads"),
    ],
)
def test_backend_settings_must_fit_the_backend(overrides: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(TabularQ, "mdp/climbing", overrides)


def test_backend_settings_are_typed_and_given_by_the_backend_s_names() -> None:
    settings = ["backend=ray", "num_workers=3", "timeout=30", "ray_address=auto"]
    settings += ["num_cpus_per_worker=0.5", "start_timeout=1e3", "torch_threads=2"]
    cfg = load_config(TabularQ, "mdp/climbing", settings)
    assert cfg.run.backend_options() == {
        "num_workers": 3,
        "timeout": 30.0,
        "ray_address": "auto",
        "num_cpus_per_worker": 0.5,
        "start_timeout": 1000.0,
    }
    assert cfg.run.torch_threads == 2
    assert load_config(TabularQ, "mdp/climbing").run.backend_options() == {}


def test_import_corral_loads_no_training_module() -> None:
    code = (
        "import sys, corral; "
        "assert not {'torch', 'yaml', 'corral.training'} & set(sys.modules), sys.modules.keys()"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_packaged_defaults_exist_for_every_algorithm() -> None:
    from corral.algos import ALGORITHMS
    from corral.training.config import packaged_defaults

    for name in ALGORITHMS:
        settings = packaged_defaults(name)
        assert settings["total_steps"] > 0, name
        assert "envs" in settings, name


# -- a run ---------------------------------------------------------------------------------


def test_a_run_writes_config_metrics_checkpoints_and_log(tmp_path: Path) -> None:
    results = train(config(tmp_path))
    run = tmp_path / "run"
    assert results.run_dir == run and results.env_steps == 400
    for name in ("config.yaml", "metrics.csv", LATEST, BEST, "train.log"):
        assert (run / name).is_file(), name
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[: len(COLUMNS)] == list(COLUMNS) and "loss" in header
    rows = read_metrics(run)
    assert [int(r["env_steps"]) for r in rows] == list(range(0, 401, 40))
    assert [int(r["env_steps"]) for r in rows if "eval_return" in r] == list(range(0, 401, 80))
    assert all("train_return" in r and "loss" in r for r in rows[1:])
    assert results.final_eval == rows[-1]["eval_return"]
    assert results.metrics == rows
    assert load_config(TabularQ, "mdp/climbing").run.total_steps != 400
    assert (
        load_run(run, allow_imports=[TINY])[0].run.total_steps == 400
    )  # config.yaml holds the effective config


def test_best_checkpoint_holds_the_best_evaluation(tmp_path: Path) -> None:
    results = train(config(tmp_path, eval_every=40, prefer=2))
    rows = [r for r in results.metrics if "eval_return" in r]
    best = max(rows, key=lambda r: r["eval_return"])  # the first of equal bests
    assert best["env_steps"] > 0 and best["eval_return"] > rows[0]["eval_return"]
    assert results.best_eval == best["eval_return"]
    assert (
        results.best_steps == best["env_steps"] == ckpt.load(tmp_path / "run" / BEST)["env_steps"]
    )
    cfg, algo, _ = load_run(tmp_path / "run", "best", allow_imports=[TINY])
    assert evaluate_policy(cfg, algo, 8).mean == pytest.approx(results.best_eval)
    assert load_run(tmp_path / "run", "latest", allow_imports=[TINY])[2]["env_steps"] == 400


def test_the_dtype_setting_reaches_a_native_env_only(tmp_path: Path) -> None:
    pytest.importorskip("mpe2")
    from corral.training.runner import build_venv

    run = config(tmp_path, env="mpe2/simple_spread_v3", algo="mappo", dtype="float32").run
    with build_venv(run) as venv:
        assert venv.native and venv._backend.shard.dtype == np.float32
    with build_venv(run, native=False) as venv:  # frames for a GIF: mpe2's own envs
        assert not venv.native
    with pytest.raises(ValueError, match="dtype='float32' sets what a natively batched env"):
        build_venv(config(tmp_path, env="corral/rps", algo="mappo", dtype="float32").run)


@pytest.mark.slow
def test_packaged_mappo_learns_simple_spread_on_the_native_mpe(tmp_path: Path) -> None:
    """The packaged MAPPO settings on mpe2's simple_spread, now natively batched by default,
    still learn: a short run beats random play by a clear margin."""
    pytest.importorskip("mpe2")
    settings = {"total_steps": 60_000, "eval_every": 30_000, "eval_episodes": 48}
    cfg = load_config("mappo", "mpe2/simple_spread_v3", {**settings, "run_dir": str(tmp_path)})
    with Runner(cfg, progress=False) as runner:
        assert runner.venv.native
        results = runner.train()
    with corral.make_vec("mpe2/simple_spread_v3", 48, env_kwargs={"N": 3}) as venv:
        batch, rng = venv.reset(seed=1000), np.random.default_rng(0)
        for _ in range(25):
            batch = venv.step(venv.sample_actions(batch, rng))
        random = batch.episode_return["agent"][batch.done].mean()
    assert results.best_eval > random + 4.0, (results.best_eval, random)


def test_evaluation_is_deterministic_and_greedy(tmp_path: Path) -> None:
    train(config(tmp_path))
    cfg, algo, _ = load_run(tmp_path / "run", allow_imports=[TINY])
    first = evaluate_policy(cfg, algo, 6)
    assert evaluate_policy(cfg, algo, 6).returns == first.returns
    assert len(first.returns) == 6
    assert first.std == pytest.approx(np.std(first.returns))


def test_eval_explore_evaluates_the_policies_as_they_act_in_training(tmp_path: Path) -> None:
    """The climbing game is one deterministic step: greedy episodes all return the same; with
    ``eval_explore`` the epsilon-greedy tables play (epsilon 0.3) and the returns spread, in
    the run's evaluations and in ``evaluate_policy``."""
    train(config(tmp_path, eval_episodes=40))
    train(config(tmp_path, "exploring", eval_episodes=40, eval_explore=True))
    cfg, algo, _ = load_run(tmp_path / "run", allow_imports=[TINY])
    greedy = evaluate_policy(cfg, algo, 40)
    assert len(set(greedy.returns)) == 1
    exploring_cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, eval_explore=True))
    exploring = evaluate_policy(exploring_cfg, algo, 40)
    assert len(set(exploring.returns)) > 1
    evaluations = [r for r in read_metrics(tmp_path / "run") if "eval_return_std" in r]
    assert evaluations and {r["eval_return_std"] for r in evaluations} == {0.0}
    explored = [r for r in read_metrics(tmp_path / "exploring") if "eval_return_std" in r]
    assert max(r["eval_return_std"] for r in explored) > 0


def test_progress_lines_are_logged_without_a_bar(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="corral"):
        train(config(tmp_path))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("steps ")]
    assert len(lines) == 11 and lines[-1].startswith("steps 400/400")
    assert "steps/s" in lines[-1] and "eval" in lines[-1]
    assert "steps 400/400" in (tmp_path / "run" / "train.log").read_text()


def test_line_progress_of_a_resumed_run_starts_where_it_stands(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="corral"):
        for initial in (0, 400, 1_200):  # a new run, a resumed one, one resumed at its end
            LineProgress(1_000, initial).close()
    assert [r.getMessage() for r in caplog.records] == ["steps 400/1,000", "steps 1,000/1,000"]


def test_a_progress_bar_counts_env_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("tqdm")
    with Runner(config(tmp_path), progress=True) as runner:
        runner.train()
    err = capsys.readouterr().err
    assert "400/400" in err and "eval" in err


def test_the_bar_stops_at_its_total() -> None:
    pytest.importorskip("tqdm")
    bar = BarProgress(100)
    try:
        bar.advance(48)
        assert bar.bar.n == 48
        bar.advance(64)  # a vector step past the total
        assert bar.bar.n == 100
        bar.update({"env_steps": 112})
        assert bar.bar.n == 100
    finally:
        bar.close()


def test_the_bar_moves_at_every_vector_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tqdm")
    seen: list[tuple[str, int]] = []

    class Spy(BarProgress):
        def advance(self, env_steps: int) -> None:
            super().advance(env_steps)
            seen.append(("step", self.bar.n))

        def update(self, row: Mapping[str, float]) -> None:
            super().update(row)
            seen.append(("row", self.bar.n))

    monkeypatch.setattr(
        runner_module, "make_progress", lambda total, initial, bar, metric: Spy(total)
    )
    # rows at 200, 400 and the end; 4 envs, so the run ends at 404 env steps
    cfg = config(tmp_path, total_steps=402, eval_every=0, log_every=200, eval_episodes=2)
    assert train(cfg).env_steps == 404
    assert seen[:51] == [("step", 4 * (i + 1)) for i in range(50)] + [("row", 200)]
    assert seen[-3:] == [("row", 400), ("step", 402), ("row", 402)]


def test_tensorboard_events_are_written_when_installed(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    train(config(tmp_path, tensorboard=True))
    assert list((tmp_path / "run" / "tb").glob("events.out.tfevents.*"))


def test_training_envs_get_the_backend_settings_and_evaluation_one_worker_of_its_own(
    tmp_path: Path,
) -> None:
    cfg = config(tmp_path, backend="subproc", num_workers=2, total_steps=40, timeout=7)
    with Runner(cfg, progress=False) as runner:
        assert len(runner.venv._backend.worker_pids) == 2
        runner.train()
        evaluation = runner.eval_venv._backend
        assert runner.eval_venv.backend_name == "subproc" and len(evaluation.worker_pids) == 1
        assert evaluation.timeout == 7


def test_a_sync_run_evaluates_in_process(tmp_path: Path) -> None:
    with Runner(config(tmp_path, total_steps=40), progress=False) as runner:
        runner.train()
        assert runner.eval_venv.backend_name == "sync"


def test_torch_threads_are_set_for_the_run_logged_and_given_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for setting, threads in (("auto", 1), (3, 3)):
        cfg = config(tmp_path, f"run{setting}", total_steps=40, torch_threads=setting)
        with caplog.at_level(logging.INFO, logger="corral"), Runner(cfg, progress=False) as run:
            assert torch.get_num_threads() == threads
            run.train()
        assert torch.get_num_threads() == before
        header = f"mdp/climbing; backend sync, 4 envs, device cpu, torch threads {threads}"
        assert header in caplog.text
        assert header in (tmp_path / f"run{setting}" / "train.log").read_text()


def test_auto_torch_threads_follow_omp_num_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert torch_threads("auto") == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert torch_threads("auto") == 3
    assert torch_threads(2) == 2


def test_a_run_directory_is_not_overwritten(tmp_path: Path) -> None:
    train(config(tmp_path))
    with pytest.raises(ConfigError, match="already holds a run"):
        Runner(config(tmp_path), progress=False)


def test_default_run_dir_names_algorithm_env_and_seed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = config(tmp_path, run_dir="", total_steps=40, seed=3)
    with Runner(cfg, progress=False) as runner:
        first = runner.run_dir
    with Runner(config(tmp_path, run_dir="", total_steps=40, seed=3), progress=False) as runner:
        second = runner.run_dir
    assert first.parent == Path("runs") and first.name.startswith("tabularq-mdp_climbing-s3-")
    assert second != first


# -- resume --------------------------------------------------------------------------------


def test_resume_of_a_killed_run_equals_an_uninterrupted_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One-step games have no episode in flight at a checkpoint: resuming changes nothing."""
    whole = train(config(tmp_path, "whole"))
    with monkeypatch.context() as patch:
        kill_after_checkpoint(patch, 160)
        with pytest.raises(Killed):
            train(config(tmp_path, "killed"))
    assert ckpt.load(tmp_path / "killed" / LATEST)["env_steps"] == 160
    with Runner.resume(tmp_path / "killed", progress=False, allow_imports=[TINY]) as runner:
        assert runner.env_steps == 160
        resumed = runner.train()
        assert "resumed at 160 env steps" in (tmp_path / "killed" / "train.log").read_text()
        q = runner.algo.policy.q
    assert resumed.env_steps == 400
    assert without_time(resumed.metrics) == without_time(whole.metrics)
    assert without_time(read_metrics(tmp_path / "killed")) == without_time(whole.metrics)
    _, algo, _ = load_run(tmp_path / "whole", "latest", allow_imports=[TINY])
    assert all(np.array_equal(q[g], algo.policy.q[g]) for g in q)
    assert resumed.best_eval == whole.best_eval and resumed.best_steps == whole.best_steps


def dqn_config(tmp_path: Path, name: str, **settings: Any) -> Any:
    small = {"learning_starts": 40, "batch_size": 16, "train_freq": 4, "epsilon_decay_steps": 300}
    return config(tmp_path, name, algo="dqn", **{**small, **settings})


def test_dqn_resumes_with_its_replay_buffers_as_if_never_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    whole = train(dqn_config(tmp_path, "whole"))
    for name, keep in (("killed", True), ("forgetful", False)):
        with monkeypatch.context() as patch:
            kill_after_checkpoint(patch, 160)
            with pytest.raises(Killed):
                train(dqn_config(tmp_path, name, checkpoint_replay=keep))
        saved = ckpt.load(tmp_path / name / LATEST)
        assert ("replay" in saved) is keep
        assert "replay" not in ckpt.load(tmp_path / name / BEST)
    replay = ckpt.load(tmp_path / "killed" / LATEST)["replay"]["main"]["player"]
    assert len(replay["data"]["reward"]) == 320  # 160 one-step games of two players
    with Runner.resume(tmp_path / "killed", progress=False) as runner:
        resumed = runner.train()
        weights = runner.algo.policy.q["player"].state_dict()
    assert without_time(resumed.metrics) == without_time(whole.metrics)
    _, algo, _ = load_run(tmp_path / "whole", "latest")
    for key, value in algo.policy.q["player"].state_dict().items():
        assert value.equal(weights[key]), key
    # Without the buffers the resumed run learns from fewer, other transitions.
    with Runner.resume(tmp_path / "forgetful", progress=False) as runner:
        runner.train()
        forgetful = runner.algo.policy.q["player"].state_dict()
    assert not all(value.equal(forgetful[key]) for key, value in weights.items())


def test_resume_continues_from_the_checkpoint_in_multi_step_games(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(
        tmp_path,
        env="corral/rps",
        group_map="agent",
        learn_groups=["player_0"],
        eval_every=0,
        checkpoint_every=80,
    )
    with monkeypatch.context() as patch:
        kill_after_checkpoint(patch, 160)
        with pytest.raises(Killed), Runner(cfg, progress=False) as runner:
            # rows written after the checkpoint are lost with the kill
            runner.train()
    rows_at_kill = read_metrics(tmp_path / "run")
    assert rows_at_kill[-1]["env_steps"] == 160
    resumed = Runner.resume(tmp_path / "run", progress=False, allow_imports=[TINY])
    with resumed:
        results = resumed.train()
    steps = [int(r["env_steps"]) for r in results.metrics]
    assert steps == list(range(40, 401, 40))
    assert results.metrics[: len(rows_at_kill)] == rows_at_kill
    assert results.metrics[-1]["wall_time"] >= rows_at_kill[-1]["wall_time"]


@pytest.mark.parametrize(
    "settings",
    [{}, {"algo": "dqn", "array": "torch", "learning_starts": 40, "batch_size": 8}],
    ids=["numpy", "torch-dqn"],  # torch: the episodes wait on the device until read
)
def test_a_run_killed_after_a_checkpoint_between_rows_resumes_to_the_same_rows(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, settings: dict
) -> None:
    """A checkpoint due by the wall clock is written between two metrics rows: it saved none
    of the next row's episodes and updates, so after a kill the resumed run's next row
    counted only those after the checkpoint. In a one-step game (no episode in flight)
    the resumed rows equal the uninterrupted run's."""
    if settings:
        pytest.importorskip("torch")
    whole = train(config(tmp_path, "whole", total_steps=240, **settings))
    every_step = config(tmp_path, total_steps=240, checkpoint_every_s=1e-9, **settings)
    with monkeypatch.context() as patch:
        kill_after_checkpoint(patch, 100)  # between the rows at 80 and 120
        with pytest.raises(Killed), Runner(every_step, progress=False) as runner:
            runner.train()
    assert ckpt.load(tmp_path / "run" / LATEST)["env_steps"] == 100
    resumed = Runner.resume(tmp_path / "run", progress=False, allow_imports=[TINY])
    with resumed:
        results = resumed.train()
    assert without_time(results.metrics) == without_time(whole.metrics)


def test_wall_time_counts_the_evaluations(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``wall_time`` added up only collecting and learning: a run whose evaluations took
    most of its time said it had trained in a fraction of it."""
    evaluate = Runner.evaluate

    def slow(self: Runner, episodes: int | None = None) -> Any:
        time.sleep(0.3)
        return evaluate(self, episodes)

    monkeypatch.setattr(Runner, "evaluate", slow)
    results = train(config(tmp_path, total_steps=80, eval_every=40, log_every=40))
    rows = {int(r["env_steps"]): r["wall_time"] for r in results.metrics}
    assert rows[0] == 0.0
    assert rows[80] >= 0.6  # the evaluations at 0 and 40 came before the row at 80


def test_a_nan_evaluation_is_never_the_best(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A first evaluation of NaN (an env that pays NaN, unchecked) became the best, which no
    later evaluation could beat (NaN compares false), and its checkpoint could not be
    resumed (a best_eval must be a number)."""
    from corral.training.scoring import Evaluation

    evaluate = Runner.evaluate
    calls = []

    def nan_first(self: Runner, episodes: int | None = None) -> Any:
        calls.append(self.env_steps)
        if len(calls) == 1:
            return Evaluation({"eval_return": [float("nan")] * 8})
        return evaluate(self, episodes)

    monkeypatch.setattr(Runner, "evaluate", nan_first)
    with caplog.at_level(logging.WARNING, logger="corral"):
        first = train(config(tmp_path, total_steps=160, eval_every=80))
    assert "the evaluation at 0 env steps gave eval_return NaN" in caplog.text
    assert first.best_eval is not None and first.best_steps in (80, 160)
    assert ckpt.load(tmp_path / "run" / BEST)["env_steps"] == first.best_steps
    monkeypatch.undo()
    resumed = corral.train(TabularQ, resume=tmp_path / "run", total_steps=240, progress=False)
    assert resumed.env_steps == 240


def test_a_nan_loss_is_warned_of_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """metrics.csv leaves a NaN cell empty, as where no update happened: the run says that
    the learner's loss went NaN, and when (once: it stays NaN)."""
    learn = TabularQ.learn

    def diverged(self: TabularQ, rollouts: Any) -> dict[str, float]:
        metrics = learn(self, rollouts)
        return {**metrics, "td_error": float("nan")} if metrics else metrics

    monkeypatch.setattr(TabularQ, "learn", diverged)
    with caplog.at_level(logging.WARNING, logger="corral"):
        results = train(config(tmp_path, total_steps=160, log_every=40))
    first = min(r["env_steps"] for r in results.metrics if "loss" in r)
    assert caplog.text.count("NaN at") == 1, caplog.text
    assert f"td_error NaN at {int(first)} env steps (empty in metrics.csv)" in caplog.text
    assert all("td_error" not in r for r in read_metrics(tmp_path / "run"))


def test_a_best_pt_written_after_the_checkpoint_keeps_its_record_on_resume(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run killed between the two writes of an evaluation (best.pt first) left a best.pt
    from a step its resume redoes; the resumed run kept the checkpoint's older best, so a
    worse evaluation later left best.pt in place while the run reported another best."""
    first = train(config(tmp_path, total_steps=160, eval_every=80))
    run_dir = tmp_path / "run"
    later = ckpt.load(run_dir / LATEST)  # as best.pt at 240 would hold it: written, then killed
    later.update(env_steps=240, best_eval=999.0, best_steps=240)
    ckpt.save(run_dir / BEST, later)
    with caplog.at_level(logging.WARNING, logger="corral"):
        resumed = corral.train(TabularQ, resume=run_dir, total_steps=320, progress=False)
    assert resumed.best_eval == 999.0 and ckpt.load(run_dir / BEST)["env_steps"] == 240
    assert "best.pt was written at 240 env steps, after checkpoint.pt (160)" in caplog.text
    assert resumed.metrics[: len(first.metrics)] == first.metrics


def test_resume_may_extend_the_schedule_but_not_what_is_learned(tmp_path: Path) -> None:
    first = train(config(tmp_path, total_steps=200, eval_every=100))
    with pytest.raises(ConfigError, match="cannot change"):
        Runner.resume(tmp_path / "run", progress=False, allow_imports=[TINY], lr=0.9)
    # the algorithm and env named to corral.train must be the run's (they were ignored)
    with pytest.raises(ConfigError, match=r"is a run of .*TabularQ.*not of 'dqn'"):
        corral.train("dqn", resume=tmp_path / "run", progress=False, allow_imports=[TINY])
    with pytest.raises(ConfigError, match=r"is a run on 'mdp/climbing'.*not on 'corral/rps'"):
        corral.train(TabularQ, "corral/rps", resume=tmp_path / "run", progress=False)
    assert read_metrics(tmp_path / "run") == first.metrics  # both refused before any change
    results = corral.train(TabularQ, resume=tmp_path / "run", total_steps=320, progress=False)
    assert results.env_steps == 320
    assert results.metrics[: len(first.metrics)] == first.metrics
    assert [int(r["env_steps"]) for r in results.metrics[len(first.metrics) :]] == [
        240,
        280,
        300,
        320,
    ]


def test_resume_needs_a_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a run directory"):
        Runner.resume(tmp_path, progress=False)


# -- groups, opponents, the Python entry point ------------------------------------------------


def test_groups_not_learned_are_played_by_the_opponent(tmp_path: Path) -> None:
    cfg = config(tmp_path, env="corral/rps", group_map="agent", learn_groups=["player_1"])
    with Runner(cfg, progress=False) as runner:
        assert list(runner.algo.groups) == ["player_1"]
        assert list(runner.fixed) == ["player_0"]
        results = runner.train()
    assert results.env_steps == 400


def test_unknown_learn_groups_and_self_play_without_support_fail(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not groups of"):
        Runner(config(tmp_path, learn_groups=["nobody"]), progress=False)
    with pytest.raises(ConfigError, match="does not support self_play"):
        Runner(config(tmp_path, "b", self_play=True), progress=False)


def test_corral_train_returns_the_results(tmp_path: Path) -> None:
    results = corral.train(
        TabularQ,
        env="mdp/climbing",
        total_steps=120,
        eval_every=60,
        log_every=60,
        num_envs=2,
        run_dir=str(tmp_path / "api"),
        progress=False,
    )
    assert results.env_steps == 120 and results.run_dir == tmp_path / "api"
    assert results.best_eval is not None and results.final_eval is not None
    assert results.config.run.num_envs == 2


# -- metrics, plots and GIFs ------------------------------------------------------------------


def test_a_new_metric_rewrites_the_header(tmp_path: Path) -> None:
    metrics = MetricsLog(tmp_path, tensorboard=False)
    metrics.add({"env_steps": 10, "loss": 1.0})
    metrics.add({"env_steps": 20, "loss": 0.5, "entropy": 2.0, "eval_return": float("nan")})
    rows = read_metrics(tmp_path / "metrics.csv")
    assert rows == [{"env_steps": 10, "loss": 1.0}, {"env_steps": 20, "loss": 0.5, "entropy": 2.0}]
    assert (tmp_path / "metrics.csv").read_text().splitlines()[0].endswith("loss,entropy")


def test_plot_draws_mean_and_band_over_seeds(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from corral.training.plot import curves, plot_runs

    runs = [train(config(tmp_path, f"s{seed}", seed=seed)).run_dir for seed in (0, 1)]
    (found,) = curves(runs)
    assert found.returns.shape == (2, 6) and found.env == "mdp/climbing"
    out = plot_runs(runs, tmp_path / "curves.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000


def test_plot_keeps_runs_of_other_env_kwargs_apart(tmp_path: Path) -> None:
    """Runs of one algorithm on one env id with other env_kwargs are other tasks, not seeds."""
    pytest.importorskip("matplotlib")
    from corral.training.plot import curves

    runs = [
        train(config(tmp_path, name, "mdp/penalty", seed=seed, env_kwargs=kwargs)).run_dir
        for name, seed, kwargs in [("a0", 0, {}), ("a1", 1, {}), ("k", 0, {"k": -20})]
    ]
    same, other = curves(runs)
    assert same.returns.shape[0] == 2 and same.label == "TabularQ (2 runs)"
    assert other.returns.shape[0] == 1 and other.label == "TabularQ k=-20 (1 run)"


def test_plot_keeps_runs_of_other_settings_apart_and_names_what_differs(tmp_path: Path) -> None:
    """Runs were grouped by algorithm, env and env_kwargs only: runs with another learning
    rate (or other learned groups) were averaged as if they were seeds of one setup."""
    pytest.importorskip("matplotlib")
    from corral.training.plot import curves

    runs = [
        train(config(tmp_path, name, seed=seed, **settings)).run_dir
        for name, seed, settings in [
            ("a0", 0, {}),
            ("a1", 1, {"total_steps": 480, "log_every": 40}),  # a schedule of its own: a seed
            ("lr", 0, {"lr": 0.1}),
        ]
    ]
    seeds, other = curves(runs)
    assert seeds.returns.shape[0] == 2 and other.returns.shape[0] == 1
    assert seeds.label == "TabularQ lr=0.3 (2 runs)" and other.label == "TabularQ lr=0.1 (1 run)"


def test_gif_of_an_env_that_renders(tmp_path: Path) -> None:
    pytest.importorskip("mpe2")
    iio = pytest.importorskip("imageio.v3")
    from corral.training.render import record_episode

    cfg = config(tmp_path, env="mpe2/simple_spread_v3", env_kwargs={"N": 2, "max_cycles": 5})
    venv = corral.make_vec(cfg.run.env, 1, env_kwargs=cfg.run.env_kwargs)
    algo = TabularQ(venv, cfg.algo_config.replace(prefer=1))  # keeps moving: distinct frames
    venv.close()
    frames = record_episode(cfg, algo, tmp_path / "spread.gif")
    data = (tmp_path / "spread.gif").read_bytes()
    assert data[:6] == b"GIF89a" and frames == 6  # the reset's, then one per step
    # GIF writers merge identical consecutive frames (mpe2's first step may not move)
    assert 1 < iio.imread(tmp_path / "spread.gif", index=None).shape[0] <= frames


def test_the_frames_of_an_episode_end_with_how_it_ended(tmp_path: Path) -> None:
    """The last frame is the env's after its last step (the vector layer resets it in that
    step): the same as a dict env played by hand with the same actions."""
    pytest.importorskip("mpe2")
    from corral.training.render import episode_frames

    kwargs = {"N": 2, "max_cycles": 5}
    cfg = config(tmp_path, env="mpe2/simple_spread_v3", env_kwargs=kwargs)
    venv = corral.make_vec(cfg.run.env, 1, env_kwargs=kwargs)
    algo = TabularQ(venv, cfg.algo_config.replace(prefer=1))  # an untrained table: always 1
    venv.close()
    frames = episode_frames(cfg, algo, seed=3)
    env = corral.make("mpe2/simple_spread_v3", render_mode="rgb_array", **kwargs)
    env.reset(seed=3)
    expected = [env.render()[..., :3]]
    while env.agents:
        env.step(dict.fromkeys(env.agents, 1))
        expected.append(env.render()[..., :3])
    env.close()
    assert len(frames) == len(expected) == 6
    for got, want in zip(frames, expected, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("env", ["corral/tag", "corral/rps", "corral/rps4"])
def test_gif_of_corrals_own_envs(tmp_path: Path, env: str) -> None:
    iio = pytest.importorskip("imageio.v3")
    from corral.training.render import record_episode

    cfg = config(tmp_path, env=env)
    venv = corral.make_vec(env, 1)
    algo = TabularQ(venv, cfg.algo_config.replace(prefer=1))  # moves: distinct frames
    venv.close()
    frames = record_episode(cfg, algo, tmp_path / "episode.gif")
    gif = iio.imread(tmp_path / "episode.gif", index=None)
    assert (tmp_path / "episode.gif").read_bytes()[:6] == b"GIF89a"
    assert frames > 1 and gif.ndim == 4 and gif.shape[-1] == 3
    assert 1 < gif.shape[0] <= frames  # identical consecutive frames may be merged


def test_envs_that_cannot_render_say_so(tmp_path: Path) -> None:
    from corral.training.render import RenderError, record_episode

    cfg = config(tmp_path, env="mdp/climbing")
    venv = corral.make_vec("mdp/climbing", 1)
    algo = TabularQ(venv, cfg.algo_config)
    venv.close()
    with pytest.raises(RenderError, match="cannot render"):
        record_episode(cfg, algo, tmp_path / "climbing.gif")
    assert not (tmp_path / "climbing.gif").exists()


def test_algorithms_that_read_the_state_get_vector_envs_with_state(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    for algo, centralised in (("mappo", True), ("ippo", False)):
        cfg = load_config(algo, "corral/rps", {"run_dir": str(tmp_path / algo), "num_envs": 2})
        with Runner(cfg, progress=False) as runner:
            assert (runner.venv.state_space is not None) is centralised
            assert runner.algo.policy.uses_state is centralised


def same_state(a: Any, b: Any) -> bool:
    """Whether two state dicts hold equal values (tensors, arrays, numbers, nested)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    if hasattr(a, "equal"):  # a tensor
        return bool(a.equal(b))
    return bool(np.array_equal(a, b))


# rollouts of 3 vector steps of 4 envs: 12 env steps, so the evaluations at 80 and 160 fall
# inside one, and their checkpoints wait for its end (84, 168)
MID_ROLLOUT = {
    "mappo": {"rollout_steps": 3, "epochs": 1},
    "dqn": {"train_freq": 12, "learning_starts": 40, "batch_size": 16},
    "maddpg": {"train_freq": 12, "learning_starts": 40, "batch_size": 16},
}


@pytest.mark.parametrize("algo", sorted(MID_ROLLOUT))
def test_a_checkpoint_due_mid_rollout_waits_for_its_end_so_resume_loses_no_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algo: str
) -> None:
    """A checkpoint holds no partly collected rollout: resumed from it, a one-step game's
    run equals the uninterrupted one (its rows, env steps and learner)."""
    pytest.importorskip("torch")
    settings = {"algo": algo, **MID_ROLLOUT[algo]}
    with Runner(config(tmp_path, "whole", **settings), progress=False) as runner:
        whole = runner.train()
        state = runner.algo.state_dict()
    with monkeypatch.context() as patch:
        kill_after_checkpoint(patch, 160)
        with pytest.raises(Killed):
            train(config(tmp_path, "killed", **settings))
    assert ckpt.load(tmp_path / "killed" / LATEST)["env_steps"] == 168  # 14 whole rollouts
    with Runner.resume(tmp_path / "killed", progress=False) as runner:
        resumed = runner.train()
        assert same_state(runner.algo.state_dict(), state)
    assert resumed.env_steps == whole.env_steps == 400
    assert without_time(resumed.metrics) == without_time(whole.metrics)
    evaluated = [r["env_steps"] for r in whole.metrics if "eval_return" in r]
    assert evaluated == [0, 80, 160, 240, 320, 400]


def test_fixed_random_plays_legal_random_actions_for_a_whole_group() -> None:
    from gymnasium import spaces

    from corral.training.runner import RandomGroupPolicy

    policy = RandomGroupPolicy(spaces.Discrete(4))
    mask = np.zeros((3, 2, 4), dtype=bool)
    mask[..., 1] = mask[..., 3] = True
    actions = policy(np.zeros((3, 2, 5)), mask, np.random.default_rng(0))
    assert actions.shape == (3, 2)
    assert set(np.unique(actions)) <= {1, 3}
    nested = policy({"a": (np.zeros((3, 2, 5)),)}, None, np.random.default_rng(0))
    assert nested.shape == (3, 2)


@pytest.mark.parametrize(
    ("algo", "env", "settings"),
    [
        # DQN's greedy acting drew epsilon's coin from the policy's generator
        ("dqn", "corral/memory", {"learning_starts": 100, "train_freq": 4}),
        # exploring evaluations of a recurrent policy: its samples and the agents' memories
        ("mappo", "corral/memory", {"recurrent": True, "rollout_steps": 25, "eval_explore": True}),
    ],
)
def test_evaluations_leave_training_as_a_run_without_them(
    tmp_path: Path, algo: str, env: str, settings: dict
) -> None:
    pytest.importorskip("torch")

    def training_rows(eval_every: int) -> list[dict[str, float]]:
        run = corral.train(
            algo, env=env, num_envs=4, total_steps=1200, eval_every=eval_every,
            eval_episodes=20, log_every=100, progress=False, tensorboard=False, device="cpu",
            run_dir=str(tmp_path / f"every-{eval_every}"), **settings,
        )  # fmt: skip
        rows = read_metrics(run.run_dir / "metrics.csv")
        return without_time(
            [{k: v for k, v in r.items() if not k.startswith("eval")} for r in rows]
        )

    with_more = training_rows(300)  # evaluations at 300, 600, 900 and the end
    fewer = training_rows(1200)
    assert with_more == fewer and any("train_return" in r for r in fewer)


def test_an_evaluation_on_torch_batches_leaves_every_generator_of_the_policy(
    tmp_path: Path,
) -> None:
    """DQN acts on torch batches with a torch generator of its own (``torch_rng``), which the
    saved acting state left out: an evaluation in a venv of torch arrays advanced it."""
    torch = pytest.importorskip("torch")
    settings = {"num_envs": 2, "device": "cpu", "run_dir": str(tmp_path / "run")}
    config = load_config("dqn", "corral/memory", {**settings, "tensorboard": False})
    with Runner(config, progress=False) as runner:
        policy = runner.algo.policy
        venv = build_venv(config.run, array="torch")
        try:
            before = policy.torch_rng.get_state(), policy.rng.bit_generator.state
            assert evaluate_policy(config, runner.algo, 4, venv=venv).returns
            after = policy.torch_rng.get_state(), policy.rng.bit_generator.state
        finally:
            venv.close()
    assert torch.equal(before[0], after[0]) and before[1] == after[1]


def test_a_group_map_that_is_none_is_refused_with_the_run_s_settings() -> None:
    with pytest.raises(ConfigError, match=r"group_map must be 'prefix' .* got 1"):
        load_config(TabularQ, "mdp/climbing", {"group_map": 1})
