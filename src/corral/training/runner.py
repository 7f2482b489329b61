"""The training runner: train, evaluate periodically, log metrics, checkpoint, resume.

A run lives in one directory::

    runs/mappo-mpe2_simple_spread_v3-s0-20250101-120000/
        config.yaml      the effective config (what `--resume` and `corral eval` read)
        metrics.csv      one row per `log_every` env steps (see corral.training.metrics)
        checkpoint.pt    the latest checkpoint: everything needed to resume
        best.pt          the checkpoint of the best evaluation so far
        train.log        what the run logged
        tb/              TensorBoard events, when tensorboard is installed
        wandb/           the wandb run's files (logger=wandb; its id in wandb_id.txt)

A checkpoint holds the algorithm's ``state_dict``, the env steps done, the
metrics so far, the best evaluation, and every random generator's state, and
is written between rollouts only (one due inside a rollout waits for its end,
the run's last excepted), so it loses no env step collected. A
resumed run continues from the checkpoint's step with the same metrics and
generators; the envs restart their episodes (episodes in flight at the
checkpoint are not part of it), from seeds derived from the run's seed and
the step. Where no episode is in flight at checkpoints and the env draws no
chance (deterministic one-step games), a resumed run on the ``sync`` backend
equals an uninterrupted one exactly, given an algorithm whose ``state_dict`` is
complete (the envs' own generators are not saved: they are seeded again).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import re
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from corral.algos.base import Algorithm, resolve_device
from corral.algos.policy import Policy
from corral.arrays import Place
from corral.arrays.tree import first_leaf
from corral.errors import CheckpointError, UnsupportedEnvError
from corral.groups import checked_group_map
from corral.registry import EnvSpec, import_modules, resolve, spec
from corral.training import checkpoint, run_files
from corral.training.collector import Collector, Progress, evaluate
from corral.training.config import (
    BACKEND_OPTIONS,
    ConfigError,
    RunConfig,
    TrainConfig,
    algorithm_spec,
    load_config,
    read_yaml_file,
    replace_run,
    write_yaml,
)
from corral.training.metrics import (
    METRICS,
    MetricsLog,
    Row,
    checked_rows,
    is_column,
)
from corral.training.policy_map import (
    FIXED,
    MAIN,
    FixedPlayer,
    PolicyMap,
    Seating,
    check_value,
    fixed_target,
    is_fixed,
    is_run_policy,
    policy_map,
)
from corral.training.progress import progress as make_progress
from corral.training.scoring import (
    RETURN,
    ConstantWatch,
    Evaluation,
    Selection,
    choose_selection,
    episode_columns,
    versus_columns,
)
from corral.training.self_play import (
    OPPONENT,
    SELF_PLAY_RETURN,
    opponent_player,
    self_play_map,
)
from corral.training.threads import set_torch_threads, torch_threads
from corral.training.trackers import (
    TENSORBOARD,
    WANDB_DIR,
    WANDB_ID,
    Tracker,
    WandbTracker,
    import_wandb,
    read_wandb_id,
)
from corral.training.whole_episodes import CutEpisodes
from corral.vector import VectorEnv, make_vec
from corral.vector.sampling import sample_array

if TYPE_CHECKING:
    from corral.vector.protocols import Batch
    from corral.workers.worker_set import WorkerSet

log = logging.getLogger("corral.training")

LATEST = "checkpoint.pt"
BEST = "best.pt"
CONFIG = "config.yaml"
LOG = "train.log"
RESUMABLE = frozenset(
    {"total_steps", "eval_every", "eval_episodes", "checkpoint_every", "log_every", "device"}
    | {"backend", "tensorboard", "checkpoint_replay", "torch_threads", *BACKEND_OPTIONS}
    | {"on_env_error", "check_finite"}
    | {"checkpoint_every_s", "logger", "wandb_mode"}
    | {"runners", "envs_per_runner", "runner_backend", "sample_timeout", "runner_restarts"}
    | {"max_staleness"}
)
"""Run settings that may change when a run is resumed (the schedule, not what is learned)."""
EVAL_WORKERS = {"num_workers": 1}
"""Evaluations of a run whose envs run in workers play in one worker of their own, on the
run's backend with its ``timeout``, so an env that hangs cannot block the run; on Ray it
reserves no CPU, so evaluations never wait for CPUs the training envs hold. A ``sync``
run's evaluations play in the runner's process, as its training does."""


class AlreadyTrainedError(ConfigError):
    """A run resumed to ``total_steps`` that it has already reached: there is nothing to
    train, and its directory is left as it is."""

    def __init__(self, run_dir: Path, env_steps: int, total_steps: int) -> None:
        self.run_dir, self.env_steps, self.total_steps = run_dir, env_steps, total_steps
        super().__init__(
            f"{run_dir} already has {env_steps} env steps (total_steps {total_steps}): nothing "
            f"to train; resume it with total_steps above {env_steps} to train on"
        )


@dataclass
class Results:
    """What a run produced."""

    run_dir: Path
    env_steps: int
    final_eval: float | None
    """The selection metric (``select_by``) at the last evaluation."""
    best_eval: float | None
    """The selection metric at the best evaluation (the one saved in ``best.pt``)."""
    best_steps: int | None
    """Env steps at the best evaluation."""
    metrics: list[Row]
    """The rows of ``metrics.csv``."""
    config: TrainConfig
    select_by: str = RETURN
    """The column that selected ``best.pt`` (see :mod:`corral.training.scoring`)."""


class Runner:
    """Trains one algorithm on one env according to a :class:`TrainConfig`.

    ``progress``: show a tqdm bar (when tqdm is installed) rather than log lines.
    ``restore``: this run's ``checkpoint.pt`` to continue from (a
    :class:`~corral.errors.CheckpointError` if it does not fit the run); :meth:`resume`
    continues a run from its directory. ``allow_imports``: the ``module:attr``
    values that the config of an ``eval_opponent`` run may import (see
    :func:`read_run_config`).
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        progress: bool = True,
        restore: Mapping[str, Any] | None = None,
        allow_imports: Collection[str] = (),
    ) -> None:
        run = config.run
        run.check_workers()
        env_spec(run)  # an unknown env id makes no run directory
        if "wandb" in run.logger:
            import_wandb()  # nor does a missing wandb
        self.config = config
        self.allow_imports = tuple(allow_imports)
        self.show_bar = progress
        self.resumed = restore is not None
        self.run_dir = _choose_run_dir(config, resuming=self.resumed)
        check_run_files(self.run_dir)  # before any env or worker starts (and again below)
        algorithm_spec(config.algo)  # imports the algorithm's modules (torch) before seeding
        if restore is None:
            checkpoint.seed_everything(run.seed)
        self.eval_venv: VectorEnv | None = None
        self.saved_at = time.monotonic()
        """When ``checkpoint.pt`` was last written, or training started (``checkpoint_every_s``)."""
        self.save_due = False
        """A checkpoint came due while a rollout was partly collected: it is written at the
        end of that rollout (a checkpoint holds no partial rollout)."""
        self.torch_threads: int | None = None
        """torch's CPU threads while the run is open (``None``: the algorithm uses no torch)."""
        self._threads_before: int | None = None
        self.workers: WorkerSet | None = None
        """The rollout workers that collect for the learners (``runners > 0``), else ``None``:
        the collector collects in this process."""
        # with rollout workers, this process's envs only describe the env to the learners
        if run.runners:
            self.venv = build_venv(
                run, num_envs=1, backend="sync", array="numpy", state=uses_state(config)
            )
        else:
            self.venv = build_venv(run, state=uses_state(config))
        try:
            threads = torch_threads(run.torch_threads)
            self._threads_before = set_torch_threads(threads)
            self.torch_threads = None if self._threads_before is None else threads
            self.learners, self.fixed = build_players(config, self.venv, self.allow_imports)
            self.selection = run_selection(
                config, self.venv, self.learners, allow_imports=self.allow_imports
            )
            saved = {} if restore is None else restored(restore, self.run_dir / LATEST)
            if run.runners:
                self.workers = start_workers(
                    config,
                    self.learners,
                    seed=run.seed + int(saved.get("env_steps", 0)),
                    players=self.fixed,
                    allow_imports=self.allow_imports,
                )
            self.constant = ConstantWatch(self.selection)
            self.nan_metrics: set[str] = set()
            """The learners' metrics that have been NaN (each is warned of once)."""
            self.env_steps = int(saved.get("env_steps", 0))
            self.runner_counts = {**dict.fromkeys(RUNNER_COUNTS, 0), **saved.get(RUNNER_KEY, {})}
            """The run's rollout worker faults so far (cumulative, restored on resume)."""
            self.elapsed = float(saved.get("elapsed", 0.0))
            """Seconds of training so far (``wall_time``): real time since :meth:`train`
            started, evaluations and checkpoints included, plus what the run had before a
            resume."""
            self._clock = time.perf_counter() - self.elapsed
            """``time.perf_counter()`` at which :attr:`elapsed` was 0."""
            self._collecting_since: float | None = None
            """While a chunk collects: when it started (a checkpoint then saves its part)."""
            self._carried = _carried(saved.get("partial"), self.run_dir / LATEST)
            """A resumed run's part of a chunk collected before its checkpoint (and its
            seconds), for the next metrics row; ``None`` when there is none."""
            self.best_eval: float | None = None
            self.best_steps: int | None = None
            if saved.get("select_by") == self.selection.metric:  # a fresh run has none
                self.best_eval, self.best_steps = saved.get("best_eval"), saved.get("best_steps")
            if restore is not None:
                self._adopt_later_best()
            # A resumed run's envs start new episodes, from seeds that follow the step.
            seed = run.seed + self.env_steps
            seats = seating(config, self.venv, learning=True)
            self.collector = Collector(
                self.venv, self.learners, self.fixed, seed=seed, seating=seats
            )
            if restore is not None:
                with _fitting(self.run_dir / LATEST, restore, config):
                    load_learners(self.learners, restore)
                    load_players(self.collector, restore)
                    warn_other_runs_changed(self.collector, restore)
                    self.collector.rng.bit_generator.state = restore["collector_rng"]
                    checkpoint.set_rng_state(restore["rng"])
            # the run is usable as configured (and its checkpoint fits it): only now is its
            # directory made or rewritten
            check_run_files(self.run_dir)
            run_files.make_run_dir(self.run_dir)
            run_files.write_text(self.run_dir, CONFIG, write_yaml(config.to_dict()))
            self.metrics = MetricsLog(
                self.run_dir, saved.get("metrics", []), tensorboard=run.tensorboard
            )
            for tracker in run_trackers(config, self.run_dir):
                self.metrics.add_tracker(tracker)
        except BaseException:
            self.close()
            raise

    def _adopt_later_best(self) -> None:
        """Keep the record of a ``best.pt`` written after the checkpoint this run resumes
        from (it was killed between the two writes of an evaluation): that evaluation is
        the best so far, though the restored ``metrics.csv`` does not show it, and a later
        one must beat it to replace the file, as in the run that wrote it."""
        path = self.run_dir / BEST
        if not path.is_file():
            return
        best = restored(checkpoint.load(path), path)
        later = best["env_steps"] > self.env_steps and best["best_eval"] is not None
        if not later or best.get("select_by") != self.selection.metric:
            return
        self.best_eval, self.best_steps = best["best_eval"], best["best_steps"]
        log.warning(
            "%s was written at %d env steps, after %s (%d): its %s %.4g is kept as the best "
            "so far, though metrics.csv, restored from %s, does not show that evaluation",
            BEST, best["env_steps"], LATEST, self.env_steps, self.selection.metric,
            self.best_eval, LATEST,
        )  # fmt: skip

    @property
    def algo(self) -> Algorithm:
        """The run's own algorithm (the policy ``main``), or its only learner."""
        if MAIN in self.learners:
            return self.learners[MAIN]
        if len(self.learners) == 1:
            return next(iter(self.learners.values()))
        raise ValueError(f"this run has several learners: {sorted(self.learners)}")

    @property
    def num_envs(self) -> int:
        """The training envs: those of this process, or of every rollout worker."""
        return self.venv.num_envs if self.workers is None else self.workers.num_envs

    @property
    def device(self) -> str:
        """Where the learners act and learn."""
        return next(iter(self.learners.values())).device

    @classmethod
    def resume(
        cls,
        run_dir: str | Path,
        *,
        progress: bool = True,
        allow_imports: Collection[str] = (),
        imports: Sequence[str] = (),
        algo: str | type[Algorithm] | None = None,
        env: str | None = None,
        **schedule: Any,
    ) -> Runner:
        """The run in ``run_dir``, restored from its latest checkpoint.

        ``schedule`` may change settings of :data:`RESUMABLE` (e.g. a larger
        ``total_steps`` to train on). ``allow_imports``: the ``module:attr``
        values and modules its config may import (see :func:`read_run_config`).
        ``imports``: modules to import before its env is looked up, added to the
        run's ``imports`` (and allowed there). ``algo`` and ``env``, where given, are
        what the caller expects the run to be: a :class:`ConfigError` where its
        ``config.yaml`` says otherwise. A run that already has ``total_steps`` env
        steps raises :class:`AlreadyTrainedError`, its directory untouched.
        """
        run_dir = Path(run_dir)
        allow_imports = [*allow_imports, *imports]
        config = read_run_config(run_dir, allow_imports)
        if algo is not None and algorithm_spec(algo)[1] is not algorithm_spec(config.algo)[1]:
            raise ConfigError(
                f"{run_dir} is a run of {config.algo!r} (its config.yaml), not of "
                f"{algorithm_spec(algo)[0]!r}: a resume goes on with the run's algorithm"
            )
        if env is not None and env != config.run.env:
            raise ConfigError(
                f"{run_dir} is a run on {config.run.env!r} (its config.yaml), not on {env!r}: "
                "a resume goes on with the run's env"
            )
        fixed = sorted(set(schedule) - RESUMABLE)
        if fixed:
            raise ConfigError(
                f"cannot change {fixed} of a run being resumed; only {sorted(RESUMABLE)}"
            )
        check_cluster(
            config, run_dir, "ray_address" in schedule, "a resumed run", "--set ray_address="
        )
        check_run_files(run_dir)
        added = [m for m in imports if m not in config.run.imports]
        config.run = replace_run(config.run, **schedule, imports=[*config.run.imports, *added])
        if not (run_dir / LATEST).is_file():
            raise ConfigError(f"{run_dir} has no {LATEST} to resume from")
        config.run.run_dir = str(run_dir)
        restore = checkpoint.load(run_dir / LATEST)
        done = int(restore.get("env_steps", 0))
        if done >= config.run.total_steps:  # before the runner rewrites anything
            raise AlreadyTrainedError(run_dir, done, config.run.total_steps)
        return cls(config, progress=progress, restore=restore, allow_imports=allow_imports)

    # -- the training loop -------------------------------------------------------------

    def train(self) -> Results:
        """Train to ``total_steps``, evaluating every ``eval_every`` steps and at the end.

        Writes a metrics row every ``log_every`` steps, ``checkpoint.pt`` at
        every evaluation, every ``checkpoint_every`` steps and (after the vector
        step that passes it) every ``checkpoint_every_s`` seconds, each at the end
        of the rollout it falls in (with a row), and ``best.pt`` whenever an
        evaluation beats the best so far.
        """
        run = self.config.run
        self._clock = time.perf_counter() - self.elapsed  # wall_time counts from here
        with self._run_logging():
            if run.tensorboard and not self.metrics.tensorboard:
                log.info("TensorBoard is not installed: metrics go to metrics.csv only")
            if self.resumed:
                log.info("resumed at %d env steps; the envs start new episodes", self.env_steps)
            self._warn_if_too_short()
            self._log_selection()
            bar = make_progress(
                run.total_steps, self.env_steps, bar=self.show_bar, metric=self.selection.metric
            )
            try:
                with bar.redirect_logging():
                    if self.env_steps == 0 and not self.metrics.rows and run.eval_every > 0:
                        bar.update(self._log_row(Progress(), 0.0, evaluate=True))
                    self.saved_at = time.monotonic()
                    while self.env_steps < run.total_steps:
                        bar.update(self._train_chunk(on_step=bar.advance))
                    log.info("%s", self._summary())
            finally:
                bar.close()
        return self.results()

    def _train_chunk(self, on_step: Callable[[int], None] | None = None) -> Row:
        run = self.config.run
        before = self.env_steps
        stop = self._next_stop()
        started = self._collecting_since = time.perf_counter()

        def stepped(env_steps: int) -> None:
            # after a whole vector step (and the update it made): a checkpoint due by the
            # wall clock is written here, not only at the next metrics row (the chunk's last
            # step writes it below, with its row)
            self.env_steps += env_steps
            if on_step is not None:
                on_step(env_steps)
            due = 0 < run.checkpoint_every_s <= time.monotonic() - self.saved_at
            if due and self.env_steps < stop and not self.collector.rollout_open:
                self._save_latest()

        collecting = self.workers if self.workers is not None else self.collector
        try:
            part = collecting.run(stop - before, on_step=stepped)
        finally:
            self._collecting_since = None
        self.env_steps = before + part.env_steps
        seconds = time.perf_counter() - started
        self.elapsed = time.perf_counter() - self._clock
        finished = self.env_steps >= run.total_steps
        evaluate = finished or _crossed(run.eval_every, before, self.env_steps)
        if self._carried is not None:  # what the chunk collected before the run was resumed
            (earlier, earlier_s), self._carried = self._carried, None
            part, seconds = earlier.joined(part), earlier_s + seconds
        row = self._log_row(part, seconds, evaluate=evaluate)
        overdue = 0 < run.checkpoint_every_s <= time.monotonic() - self.saved_at
        crossed = _crossed(run.checkpoint_every, before, self.env_steps)
        if self.save_due or evaluate or overdue or crossed:
            # mid-rollout, only at the run's end; else at the rollout's end (_next_stop)
            self.save_due = self.collector.rollout_open and not finished
            if not self.save_due:
                self._save_latest()
        return row

    def _save_latest(self) -> None:
        self.elapsed = time.perf_counter() - self._clock
        self.save_checkpoint(self.run_dir / LATEST, replay=self.config.run.checkpoint_replay)
        self.saved_at = time.monotonic()

    def _warn_if_too_short(self) -> None:
        """Warn when the run ends before a learner's first update, and when rollout workers'
        whole rounds take it a tenth or more past ``total_steps``."""
        run = self.config.run
        left = run.total_steps - self.env_steps
        if left <= 0:
            return
        # The collector steps every env at once, rollout workers sample whole rollouts.
        unit = self.num_envs if self.workers is None else self.workers.round_steps
        collected = -(-left // unit) * unit
        for pid, learner in self.learners.items():
            self._warn_learner(pid, learner, left, collected)
        if self.workers is not None and collected - left > left // 10:
            each = (
                "a rollout of one worker's envs"
                if self.workers.asynchronous
                else f"a rollout of each of the workers' {self.num_envs} envs"
            )
            log.warning(
                "the rollout workers collect whole rounds of %d env steps (%s): the run takes "
                "%d env steps, %d past the %d it has to go; fewer envs_per_runner or a shorter "
                "rollout (rollout_steps, train_freq) make rounds shorter",
                unit,
                each,
                collected,
                collected - left,
                left,
            )

    def _warn_learner(self, pid: str, learner: Algorithm, left: int, collected: int) -> None:
        wait = learner.first_update()
        if wait is None or collected >= wait.env_steps:
            return
        log.warning(
            "no update will happen: the run has %d env steps to go, and %s's next update needs "
            "at least %d (%s); set total_steps to at least %d, or lower those settings",
            left,
            self.config.algo if pid == MAIN else f"the policy {pid!r}",
            wait.env_steps,
            wait.because,
            self.env_steps + wait.env_steps,
        )

    def _warn_nan(self, learned: Mapping[str, float]) -> None:
        """Warn of the learners' metrics that are NaN for the first time (metrics.csv leaves
        a NaN cell empty, as where no update happened)."""
        new = sorted(k for k, v in learned.items() if math.isnan(v) and k not in self.nan_metrics)
        if new:
            self.nan_metrics.update(new)
            log.warning(
                "%s NaN at %d env steps (empty in metrics.csv): the learner diverged; a lower "
                "lr or max_grad_norm may help, or the env gave NaN or huge rewards",
                " and ".join(new),
                self.env_steps,
            )

    def _next_stop(self) -> int:
        """The next env step at which a row, evaluation or checkpoint is due."""
        run = self.config.run
        periods = [p for p in (run.log_every, run.eval_every, run.checkpoint_every) if p > 0]
        stops = [(self.env_steps // p + 1) * p for p in periods]
        if self.save_due:  # the end of the rollout that a due checkpoint waits for
            stops.append(self.env_steps + self.collector.rollout_left())
        return min([*stops, run.total_steps])

    def _log_row(self, part: Progress, seconds: float, *, evaluate: bool) -> Row:
        row: Row = {"env_steps": self.env_steps, "wall_time": self.elapsed}
        if seconds > 0:
            row["steps_per_s"] = part.env_steps / seconds
        train: dict[str, list[float]] = {}
        if part.episode_returns:
            train = {"train_return": list(part.episode_returns)}
            train.update(episode_columns("train_return", part.agent_returns, self.venv.groups))
            row.update({name: float(np.mean(values)) for name, values in train.items()})
            row["train_episodes"] = len(part.episode_returns)
            if self.config.run.self_play:  # the learner's returns, each in its own seat
                row[SELF_PLAY_RETURN] = row["train_return"]
        result = self.evaluate() if evaluate else None
        if result is not None:
            row.update(result.columns())
        learned = _mean_metrics(part.updates)
        self._warn_nan(learned)
        row.update(learned)
        if part.rollouts_dropped:
            row["rollouts_dropped"] = part.rollouts_dropped
        for key in RUNNER_COUNTS:
            self.runner_counts[key] += getattr(part, key)
        if self.workers is not None:
            row["runner_restarts"] = self.runner_counts["runner_restarts"]
        if part.rollouts_lost:
            row["rollouts_lost"] = part.rollouts_lost
        if part.runner_restarts or part.rollouts_lost:
            log.warning("%s", _runner_faults_text(part, self.runner_counts))
        if part.env_restarts:
            row["env_restarts"] = part.env_restarts
            log.warning("%s", _restarts_text(part, self.config.run.on_env_error))
        self.metrics.add(row)
        self._watch_constant(train, result)
        metric = self.selection.metric
        if result is not None and math.isnan(row[metric]):
            log.warning("the evaluation at %d env steps gave %s NaN", self.env_steps, metric)
        elif result is not None and (self.best_eval is None or row[metric] > self.best_eval):
            self.best_eval, self.best_steps = row[metric], self.env_steps
            score = row[metric]
            log.info("new best %s %.4g at %d env steps: %s", metric, score, self.env_steps, BEST)
            self.save_checkpoint(self.run_dir / BEST)
        return row

    def _log_selection(self) -> None:
        selection = self.selection
        log.info("best.pt is selected on %s (%s)", selection.metric, selection.reason)
        if selection.versus:
            log.info(
                "evaluations play against %s from the seats %s",
                self.config.run.eval_opponent,
                list(selection.seats),
            )
        if selection.constant is not None:
            self._warn_constant(selection.constant)

    def _watch_constant(self, train: Mapping[str, list[float]], result: Evaluation | None) -> None:
        episodes = {} if result is None else result.episodes
        if self.constant.see(train, episodes):
            self._warn_constant(
                f"{self.selection.metric} has been {next(iter(self.constant.values)):.4g} in "
                f"every episode of {self.constant.evaluations} evaluations and of training: "
                "it may be constant by construction (the mean over both seats of a zero-sum "
                "game, which can declare metadata zero_sum=True); set select_by to another column"
            )

    def _warn_constant(self, why: str) -> None:
        if not self.constant.warned:
            self.constant.warned = True
            log.warning("warning: best.pt cannot be chosen well: %s", why)

    # -- evaluation and checkpoints ---------------------------------------------------------

    def evaluate(self, episodes: int | None = None) -> Evaluation:
        """Greedy episodes of the current policy (``eval_episodes`` by default; exploring
        ones with ``eval_explore``)."""
        run = self.config.run
        if self.eval_venv is None:
            self.eval_venv = build_eval_venv(self.config)
        return evaluate_policy(
            self.config,
            self.learners,
            episodes or run.eval_episodes,
            venv=self.eval_venv,
            allow_imports=self.allow_imports,
        )

    def save_checkpoint(self, path: str | Path, *, replay: bool = False) -> None:
        """Write everything needed to resume at the current step to ``path``; ``replay``
        adds the algorithm's replay memory (when it keeps one)."""
        state = {
            "algo": self.config.algo,
            "env": self.config.run.env,
            "learners": {pid: learner.state_dict() for pid, learner in self.learners.items()},
            "players": player_states(self.collector),
            "other_runs": other_runs(self.collector),
            "seating": seating_state(self.collector),
            "env_steps": self.env_steps,
            "elapsed": self.elapsed,
            "best_eval": self.best_eval,
            "best_steps": self.best_steps,
            "select_by": self.selection.metric,
            RUNNER_KEY: dict(self.runner_counts),
            "metrics": list(self.metrics.rows),
            "rng": checkpoint.rng_state(),
            "collector_rng": self.collector.rng.bit_generator.state,
            "partial": self._partial(),
        }
        memory = {pid: learner.replay_state_dict() for pid, learner in self.learners.items()}
        memory = {pid: m for pid, m in memory.items() if m is not None}
        if replay and memory:
            state["replay"] = memory
        checkpoint.save(path, state)

    def _partial(self) -> dict[str, Any] | None:
        """The part of the next metrics row collected so far, where a checkpoint is written
        between rows (``checkpoint_every_s``): its progress and seconds; else ``None``."""
        if self._collecting_since is None:
            return None
        collecting = self.workers if self.workers is not None else self.collector
        so_far = collecting.current_progress
        if so_far is None:
            return None
        seconds = time.perf_counter() - self._collecting_since
        if self._carried is not None:
            so_far, seconds = self._carried[0].joined(so_far), self._carried[1] + seconds
        return {"progress": so_far.state(), "seconds": seconds}

    def results(self) -> Results:
        metric = self.selection.metric
        evals = [r[metric] for r in self.metrics.rows if metric in r]
        return Results(
            run_dir=self.run_dir,
            env_steps=self.env_steps,
            final_eval=evals[-1] if evals else None,
            best_eval=self.best_eval,
            best_steps=self.best_steps,
            metrics=list(self.metrics.rows),
            config=self.config,
            select_by=metric,
        )

    def close(self) -> None:
        """Close the envs and the metrics log, give torch its thread count back; the run
        directory stays as it is."""
        try:  # the training envs last: they may raise an invalid action (deferred_checks)
            workers = getattr(self, "workers", None)
            if workers is not None:
                workers.close()
            for venv in (getattr(self, "eval_venv", None), getattr(self, "venv", None)):
                if venv is not None:
                    venv.close()
        finally:
            if getattr(self, "metrics", None) is not None:
                self.metrics.close()
            threads = getattr(self, "_threads_before", None)
            if threads is not None:
                set_torch_threads(threads)
                self._threads_before = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _summary(self) -> str:
        best = "none" if self.best_eval is None else f"{self.best_eval:.4g} at {self.best_steps}"
        metric = self.selection.metric
        done = f"done: {self.env_steps} env steps in {self.elapsed:.1f}s; best {metric} {best}"
        counts = self.runner_counts
        if any(counts.values()):
            done += (
                f"; {counts['runner_restarts']} rollout worker restart(s), "
                f"{counts['rollouts_lost']} rollout(s) lost with their worker, "
                f"{counts['rollouts_dropped']} dropped as stale"
            )
        return done

    def _header(self) -> str:
        run = self.config.run
        threads = "" if self.torch_threads is None else f", torch threads {self.torch_threads}"
        runners = f" in {run.runners} rollout workers ({run.runner_backend})" if run.runners else ""
        return (
            f"run {self.run_dir}: {self.config.algo} on {run.env}; backend {run.backend}, "
            f"{self.num_envs} envs{runners}, device {self.device}{threads}"
        )

    @contextlib.contextmanager
    def _run_logging(self) -> Iterator[None]:
        """Log records of corral also go to ``train.log`` while the run trains."""
        logger = logging.getLogger("corral")
        stream = run_files.open_file(self.run_dir, LOG, "a")
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        level = logger.level
        logger.addHandler(handler)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
        log.info("%s", self._header())
        try:
            yield
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
            handler.close()
            stream.close()


def train(
    algo: str | type[Algorithm],
    env: str | None = None,
    *,
    progress: bool = True,
    resume: str | Path | None = None,
    allow_imports: Collection[str] = (),
    **overrides: Any,
) -> Results:
    """Train ``algo`` on ``env`` (settings: :class:`RunConfig` and the algorithm's Config).

    ``resume`` continues the run in that directory instead (``overrides`` may
    then change only its schedule, see :data:`RESUMABLE`); an ``algo`` given
    as a class or ``module:attr`` may then be imported from the run's config.
    ``allow_imports``: further ``module:attr`` values that configs read from
    run directories may import (see :func:`read_run_config`).

    Examples:
        >>> import corral, tempfile
        >>> results = corral.train(
        ...     "mappo", env="corral/rps", total_steps=2_000, num_envs=8, eval_every=1_000,
        ...     eval_episodes=4, run_dir=tempfile.mkdtemp(), progress=False, lr=1e-3
        ... )
        >>> results.env_steps, results.best_eval is not None
        (2000, True)
    """
    allowed = list(allow_imports)
    if resume is not None:
        if isinstance(algo, type) or ":" in algo:
            allowed.append(algorithm_spec(algo)[0])  # the caller's own algorithm
        imports = overrides.pop("imports", ())
        imports = [imports] if isinstance(imports, str) else list(imports)
        runner = Runner.resume(
            resume,
            progress=progress,
            allow_imports=allowed,
            imports=imports,
            algo=algo,
            env=env,
            **overrides,
        )
    else:
        config = load_config(algo, env, overrides)
        runner = Runner(config, progress=progress, allow_imports=allowed)
    with runner:
        return runner.train()


# -- building blocks, shared with `corral eval` ---------------------------------------------------


def build_venv(
    run: RunConfig,
    *,
    num_envs: int | None = None,
    backend: str | None = None,
    state: bool = False,
    native: bool | None = None,
    array: str | None = None,
    options: Mapping[str, Any] | None = None,
    **env_kwargs: Any,
) -> VectorEnv:
    """The vector env of ``run`` (``env_kwargs`` are added to the run's). ``options``: the
    backend's options, by default the run's for its own backend (none for another).
    ``native`` and ``array``: as ``make_vec``'s, else the run's (torch on the run's device)."""
    env_spec(run)  # imports the modules that register the env
    backend = backend or run.backend
    array = array or training_array(run)
    native = run.native if native is None else native
    if options is None:
        options = run.backend_options() if backend == run.backend else {}
    device = _device(run.device) if array == "torch" else "cpu"
    kwargs = {**run.env_kwargs, **env_kwargs}
    try:
        return make_vec(
            run.env,
            num_envs or run.num_envs,
            backend,
            native=native,
            array=array,
            device=device,
            dtype=None if native is False else run.dtype,
            seed=run.seed,
            group_map=run.group_map,
            state=state,
            on_env_error=run.on_env_error,
            check_finite=run.check_finite,
            # on a device, actions are checked there; the collector raises a bad one per rollout
            deferred_checks=not Place(array, device).computes_on_host,
            env_kwargs=kwargs,
            **options,
        )
    except TypeError as err:  # a constructor's own words: an env_kwargs it does not take
        raise ConfigError(f"cannot build {run.env} with env_kwargs {kwargs}: {err}") from err


def training_array(run: RunConfig) -> str:
    """The ``array`` of the run's training envs: its setting, else torch where they are one
    natively batched env on ``sync`` on a GPU (without ``self_play``), else numpy."""
    if run.array is not None:
        return run.array
    on_gpu = _device(run.device) != "cpu"
    if not on_gpu or run.backend != "sync" or run.self_play:
        return "numpy"
    native = run.native
    if native is None:
        native = env_spec(run).batched is not None and checked_group_map(run.group_map) is None
    return "torch" if native else "numpy"


def env_spec(run: RunConfig) -> EnvSpec:
    """The spec of the run's env, looked up after importing the run's ``imports``."""
    import_modules(run.imports)
    return spec(run.env)


def build_eval_venv(config: TrainConfig) -> VectorEnv:
    """The vector env that evaluations of ``config`` play in (see :data:`EVAL_WORKERS`)."""
    run = config.run
    if run.backend == "sync":
        return build_venv(run, array="numpy", state=uses_state(config))
    options = {k: v for k, v in run.backend_options().items() if k != "envs_per_worker"}
    options |= EVAL_WORKERS
    if run.backend == "ray":
        options["num_cpus_per_worker"] = 0
    return build_venv(run, array="numpy", options=options, state=uses_state(config))


def uses_state(config: TrainConfig) -> bool:
    """Whether an algorithm of ``config`` (its own or one in ``policies``) reads the global
    state (see ``Algorithm.uses_state``)."""
    names = [config.algo, *(v for v in config.run.policies.values() if not is_fixed(v))]
    return any(getattr(_algorithm_class(name), "uses_state", False) for name in names)


def _algorithm_class(name: str) -> type:
    try:
        return algorithm_spec(name)[1]
    except ValueError as err:  # an unknown algorithm in policies
        raise ConfigError(f"policies: {err}") from err


def start_workers(
    config: TrainConfig,
    learners: Mapping[str, Algorithm],
    *,
    seed: int,
    players: Mapping[str, FixedPlayer] | None = None,
    allow_imports: Collection[str] = (),
) -> WorkerSet:
    """The run's rollout workers (``runners``) collecting for ``learners``, their envs seeded
    from ``seed`` (see :mod:`corral.workers`); the learners' ``num_envs`` become theirs.
    ``players``: the run's fixed players (self-play's pool is told of the learners' updates
    and sent to the workers); ``allow_imports``: as :class:`Runner`'s."""
    from corral.workers.worker_set import WorkerSet  # Ray, only for runs with runners

    workers = WorkerSet(config, learners, seed=seed, players=players, allow_imports=allow_imports)
    for learner in learners.values():
        learner.num_envs = workers.num_envs  # what first_update counts in
    return workers


def build_algorithm(
    config: TrainConfig,
    venv: VectorEnv,
    pid: str = MAIN,
    groups: Sequence[str] | None = None,
) -> Algorithm:
    """The learner of the policy id ``pid`` (default: the run's own algorithm) for ``groups``
    of ``venv`` (default: the run's ``learn_groups``, else all), on the run's device."""
    name = config.algo if pid == MAIN else config.run.policies[pid]
    _, algo_cls = algorithm_spec(name)
    run = config.run
    if run.self_play and not getattr(config.algo_config, "self_play", False):
        raise ConfigError(f"algorithm {config.algo!r} does not support self_play")
    if groups is None:
        groups = list(run.learn_groups) or list(venv.groups)
        unknown = sorted(set(groups) - set(venv.groups))
        if unknown:
            raise ConfigError(
                f"learn_groups {unknown} are not groups of {run.env}: {list(venv.groups)}"
            )
    algo_config = config.policy_configs.get(pid, config.algo_config)
    try:
        return algo_cls(venv, algo_config, learn_groups=list(groups), device=_device(run.device))
    except UnsupportedEnvError as err:
        if run.env in str(err):
            raise
        raise UnsupportedEnvError(f"{err} (env {run.env})") from err  # by the id it was given


def run_policies(config: TrainConfig, venv: VectorEnv) -> dict[str, Any]:
    """The run's ``policies``, with the groups that ``learn_groups`` leaves out played by
    ``opponent`` (as ``fixed:...``), in the env's order of groups."""
    run = config.run
    policies = dict(run.policies)
    unknown = sorted(set(run.learn_groups) - set(venv.groups))
    if unknown:
        raise ConfigError(
            f"learn_groups {unknown} are not groups of {run.env}: {list(venv.groups)}"
        )
    if run.learn_groups:
        opponent = FIXED + run.opponent
        for g in venv.groups:
            if g not in run.learn_groups and g not in policies:
                policies[g] = opponent
    return policies


def build_players(
    config: TrainConfig, venv: VectorEnv, allow_imports: Collection[str] = ()
) -> tuple[dict[str, Algorithm], dict[str, FixedPlayer]]:
    """The learners and the fixed policies of ``config``'s policy map on ``venv``, by policy
    id (see :mod:`corral.training.policy_map`)."""
    pmap, policies = _plan(config, venv)
    learners: dict[str, Algorithm] = {}
    for pid in pmap.ids:
        if pid != MAIN and pid not in policies:  # self-play's opponent, made of the learner
            continue
        value = config.algo if pid == MAIN else policies[pid]
        if is_fixed(value):
            continue
        if not pmap.whole_groups(pid):
            group = next(iter(pmap.groups_of(pid)))
            raise ConfigError(
                f"policies: {pid!r} would learn part of the group {group!r}; a learned policy "
                "plays whole groups: name the group, or give each agent a group of its own "
                "(group_map=agent)"
            )
        try:
            learners[pid] = build_algorithm(config, venv, pid, list(pmap.groups_of(pid)))
        except ValueError as err:  # an unknown algorithm
            if pid == MAIN:
                raise
            raise ConfigError(f"policies: {pid}={value}: {err}") from err
    if config.run.self_play:
        return learners, {OPPONENT: opponent_player(venv, learners[MAIN], pmap)}
    if not learners:
        raise ConfigError(
            f"policies: no policy learns (every agent is played by {sorted(policies)}); "
            "leave a group to the run's algorithm or name an algorithm for one"
        )
    return learners, fixed_players(config, venv, allow_imports)


def fixed_players(
    config: TrainConfig, venv: VectorEnv, allow_imports: Collection[str] = ()
) -> dict[str, FixedPlayer]:
    """The policies of ``config``'s policy map on ``venv`` that are not learned, by id.
    ``allow_imports``: what the configs of runs whose policies play here may import.

    Self-play's opponent plays only while the learner learns (see :func:`build_players`):
    evaluations and renders of a self-play run play every seat with the learner itself."""
    if config.run.self_play:
        return {}
    pmap, policies = _plan(config, venv)
    fixed = {}
    for pid in pmap.ids:
        value = config.algo if pid == MAIN else policies[pid]
        if is_fixed(value):
            policy = {
                g: fixed_policy(value, venv, g, pid, config, allow_imports)
                for g in pmap.groups_of(pid)  # one group, but by a policy_map function
            }
            if len(policy) == 1:
                (policy,) = policy.values()
            fixed[pid] = FixedPlayer(policy, pmap.slots(pid))
    return fixed


def run_policy(
    value: str,
    venv: VectorEnv,
    group: str,
    pid: str,
    config: TrainConfig,
    allow_imports: Collection[str] = (),
) -> RunPolicy:
    """The policy of another run that ``RUN_DIR:POLICY`` names (a policy id of that run, or
    a group its policy plays), from its ``best.pt`` (else its latest checkpoint), to play
    ``group`` of ``venv``, which that run must have with the same agents."""
    run_dir, _, name = value.rpartition(":")
    saved = Path(run_dir) / (BEST if (Path(run_dir) / BEST).is_file() else LATEST)
    stamp = saved.stat().st_mtime_ns if saved.is_file() else 0
    allowed = tuple(sorted(allow_imports))
    try:
        other, loaded, env_steps = _load_reference(
            run_dir, "best", stamp, config.run.device, allowed
        )
    except (ConfigError, CheckpointError) as err:
        raise ConfigError(f"policies: {pid}={value}: {err}") from err
    learners = as_learners(loaded)
    learner = learners.get(name) or next((a for a in learners.values() if name in a.groups), None)
    if learner is None:
        groups = sorted(g for a in learners.values() for g in a.groups)
        raise ConfigError(
            f"policies: {pid}={value}: the run {run_dir} has no policy or group {name!r}; its "
            f"policies: {sorted(learners)}, its groups: {groups}"
        )
    if other.run.env != config.run.env or learner.groups.get(group) != venv.groups[group]:
        raise ConfigError(
            f"policies: {pid}={value}: that policy plays {dict(learner.groups)} on "
            f"{other.run.env}, not the group {group!r} {list(venv.groups[group])} of "
            f"{config.run.env}"
        )
    other_spaces = _other_spaces(learner, venv, [group])
    if other_spaces:
        raise ConfigError(
            f"policies: {pid}={value}: that run's env_kwargs {other.run.env_kwargs} make "
            f"another env: {other_spaces}"
        )
    return RunPolicy(learner, f"{pid}={value}", f"{saved.name} of {env_steps} env steps")


def _plan(config: TrainConfig, venv: VectorEnv) -> tuple[PolicyMap, dict[str, Any]]:
    policies = run_policies(config, venv)
    for key, value in policies.items():
        check_value(key, value)
    if config.run.self_play:
        run = config.run
        given = [
            f"{name} {value!r}"
            for name, value in (
                ("policies", dict(run.policies)),
                ("learn_groups", list(run.learn_groups)),
                ("policy_map", run.policy_map),
            )
            if value
        ]
        if given:
            raise ConfigError(
                "self_play plays every seat by the learner and its past copies: it takes no "
                f"policies, learn_groups or policy_map (got {', '.join(given)})"
            )
        return self_play_map(venv.groups), policies
    by = config.run.policy_map
    if by is None:
        return policy_map(venv.groups, list(policies)), policies
    check_value("policy_map", by)
    if isinstance(by, str):
        try:
            by = resolve(by)
        except (ImportError, AttributeError, ValueError) as err:
            raise ConfigError(f"policy_map {by!r} is no function: {err}") from err
    if not callable(by) or not policies:
        raise ConfigError(
            "policy_map is a function (agent, episode) -> policy id, the policy ids being the "
            f"keys of policies; got policy_map={config.run.policy_map!r}, policies={policies}"
        )
    for pid, value in policies.items():
        if not is_fixed(value) and getattr(_algorithm_class(value), "needs_lockstep", False):
            raise ConfigError(
                f"policies: {pid}={value} learns whole groups at every step; a policy_map "
                "function seats its policies by episode: use mappo, ippo or dqn"
            )
    if training_array(config.run) == "torch":
        raise ConfigError("a policy_map function plays numpy batches only: set array=numpy")
    groups = {g: tuple(a) for g, a in venv.groups.items()}
    return PolicyMap(groups, {}, by=by, named=tuple(policies)), policies


def seating(
    config: TrainConfig, venv: VectorEnv, *, learning: bool = False, first: int = 0
) -> Seating | None:
    """Who plays which agents when, for a run whose ``policy_map`` is a function, and for a
    self-play run while ``learning`` (its evaluations play the learner in every seat);
    ``first``: the index of ``venv``'s first env among the run's (a rollout worker's shard)."""
    if config.run.self_play and not learning:
        return None
    pmap, _ = _plan(config, venv)
    if pmap.by is None:
        return None
    return Seating(venv.groups, pmap.by, pmap.ids, venv.num_envs, first=first)


def fixed_policy(
    value: Any,
    venv: VectorEnv,
    group: str,
    pid: str,
    config: TrainConfig,
    allow_imports: Collection[str] = (),
) -> Any:
    """What plays the policy id ``pid`` (in ``group``) that ``value`` names: a
    :class:`RandomGroupPolicy` for ``fixed:random``, the object ``fixed:MODULE:ATTR`` names, the
    policy of another run ``RUN_DIR:POLICY`` names (:class:`RunPolicy`), or ``value`` itself
    (a :class:`~corral.algos.policy.Policy` or a :data:`FixedPolicy`)."""
    if not isinstance(value, str):
        return value
    if is_run_policy(value):
        return run_policy(value, venv, group, pid, config, allow_imports)
    target = fixed_target(value)
    if target == "random":
        return RandomGroupPolicy(venv.action_space(group))
    try:
        return resolve(target)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigError(
            f"policies: {pid}={value}: a fixed policy is fixed:random or fixed:MODULE:ATTR ({err})"
        ) from err


def as_learners(algo: Algorithm | Mapping[str, Algorithm]) -> dict[str, Algorithm]:
    """The learners by policy id: a single learner is the policy :data:`MAIN`."""
    return dict(algo) if isinstance(algo, Mapping) else {MAIN: algo}


def _only(learners: Mapping[str, Algorithm], doing: str) -> Algorithm:
    """The one learner of a run, for what only one learner can do (``doing``)."""
    if len(learners) != 1:
        raise ConfigError(f"{doing} needs a run of one learner; this one has {sorted(learners)}")
    return next(iter(learners.values()))


def load_learners(learners: Mapping[str, Algorithm], saved: Mapping[str, Any]) -> None:
    """Restore each learner's state (and replay memory, where kept) from a checkpoint."""
    states = saved["learners"]
    if sorted(states) != sorted(learners):
        raise CheckpointError(
            f"the checkpoint holds the policies {sorted(states)}, "
            f"this run learns {sorted(learners)}"
        )
    for pid, learner in learners.items():
        learner.load_state_dict(states[pid])
        if pid in saved.get("replay", {}):
            learner.load_replay_state_dict(saved["replay"][pid])


def player_states(collector: Collector) -> dict[str, Any]:
    """The state of each fixed player that keeps some (self-play's pool), by policy id."""
    states = {pid: player.state_dict() for pid, player in collector.fixed.items()}
    return {pid: state for pid, state in states.items() if state is not None}


def other_runs(collector: Collector) -> dict[str, str]:
    """Which checkpoint each policy of another run was loaded from (by policy id)."""
    players = collector.fixed.items()
    return {pid: p.policy.loaded for pid, p in players if isinstance(p.policy, RunPolicy)}


def warn_other_runs_changed(collector: Collector, saved: Mapping[str, Any]) -> None:
    """Warn, resuming, of each policy of another run loaded from another checkpoint than
    before: the other run saved a new ``best.pt`` meanwhile (older checkpoints say nothing)."""
    now = other_runs(collector)
    for pid, before in saved.get("other_runs", {}).items():
        if pid in now and now[pid] != before:
            policy = collector.fixed[pid].policy
            log.warning(
                "policies: %s: that run saved another checkpoint meanwhile: this run played "
                "its %s, and plays its %s from here",
                policy.name,
                before,
                now[pid],
            )


def seating_state(collector: Collector) -> dict[str, list[int]] | None:
    """Where the collector's seating numbers episodes (``None``: it has none)."""
    return None if collector.seating is None else collector.seating.state_dict()


def load_players(collector: Collector, saved: Mapping[str, Any]) -> None:
    """Restore the fixed players' states and the seating (who plays which agents when) of
    a checkpoint into ``collector``."""
    states = saved["players"]
    keeping = sorted(player_states(collector))
    if sorted(states) != keeping:
        raise CheckpointError(
            f"the checkpoint holds the states of the players {sorted(states)}, this run's "
            f"players keep {keeping}"
        )
    for pid, state in states.items():
        collector.fixed[pid].load_state_dict(state)
    if collector.seating is not None:
        collector.seating.load_state_dict(saved["seating"])


class RunPolicy(Policy):
    """A learner of another run as a fixed policy: it plays greedily, and learns nothing.

    ``name``: the ``policies`` entry that chose it (``agent=RUN_DIR:agent``); ``loaded``: the
    checkpoint it was loaded from, in words (``best.pt of 80000 env steps``), kept in this
    run's checkpoints (see :func:`other_runs`)."""

    def __init__(self, learner: Algorithm, name: str, loaded: str) -> None:
        super().__init__(learner.groups)
        self.learner = learner
        self.name, self.loaded = name, loaded

    def act(self, batch: Batch, *, explore: bool = True, decisions: Any = None) -> Any:
        return self.learner.policy.act(batch, explore=False)


class RandomGroupPolicy:
    """A :data:`FixedPolicy` (``fixed:random``): uniformly random legal actions for a whole
    group of a vector env, ``[E, n, *action_shape]`` from the group's batched ``obs``, its
    ``action_mask`` and the caller's generator. (:class:`corral.checks.RandomPolicy` acts
    for a dict env instead: a dict of actions from its own seeded copies of the spaces.)"""

    def __init__(self, space: Any) -> None:
        self.space = space

    def __call__(self, obs: Any, mask: np.ndarray | None, rng: np.random.Generator) -> Any:
        return sample_array(self.space, _lead(obs), rng, mask)


def evaluate_policy(
    config: TrainConfig,
    algo: Algorithm | Mapping[str, Algorithm],
    episodes: int,
    *,
    venv: VectorEnv | None = None,
    seed: int | None = None,
    opponent: str | None = None,
    allow_imports: Collection[str] = (),
) -> Evaluation:
    """``episodes`` whole greedy episodes of ``algo`` (a learner, or the learners by policy
    id; exploring where the run's ``eval_explore`` says), the other agents played as in
    training.

    Measures the columns of :mod:`corral.training.scoring`: the learned
    agents' mean return and each group's and agent's; in two-player zero-sum
    games and self-play runs, or when ``opponent`` is given, also ``episodes``
    games against the reference opponent (``opponent``, by default the run's
    ``eval_opponent``) shared by the learner's seats. ``venv`` defaults to a
    fresh :func:`build_eval_venv`; every evaluation of a run plays the same
    seeds unless ``seed`` is given. ``allow_imports``: what the opponent run's
    config may import (see :func:`read_run_config`). Episodes that faults cut are
    left out, replaced and counted (``eval_cut``); past ``episodes`` of them (in each
    part) it raises :class:`~corral.errors.EvaluationError`.
    """
    seed = _eval_seed(config.run) if seed is None else seed
    own = venv is None
    venv = build_eval_venv(config) if venv is None else venv
    learners = as_learners(algo)
    # the learners' policies act here as in training: what they draw and remember is undone
    acting = [(learner.policy, learner.policy.acting_state()) for learner in learners.values()]
    try:
        selection = _selection(config, venv, learners, versus=opponent is not None)
        _check_episodes(selection, episodes)
        fixed = fixed_players(config, venv, allow_imports)
        explore = config.run.eval_explore
        done = evaluate(
            venv,
            learners,
            episodes,
            fixed,
            seed=seed,
            seating=seating(config, venv),
            explore=explore,
        )
        returns = [float(r) for r in done.episode_returns]
        result = Evaluation({RETURN: returns}, metric=selection.metric, cut=done.episodes_cut)
        result.episodes.update(episode_columns(RETURN, done.agent_returns, venv.groups))
        if selection.versus:
            spec = opponent or config.run.eval_opponent
            reference = reference_opponent(spec, config, venv, allow_imports=allow_imports)
            cut = CutEpisodes(episodes)
            player = _only(learners, "playing against eval_opponent (select_by eval_vs_opponent)")
            opponent_policy = None if reference is None else reference.policy
            found = versus_columns(
                player.policy, venv, selection.seats, episodes, opponent_policy, seed, cut, explore
            )
            result.episodes.update(found)
            result.cut += cut.count
    finally:
        for policy, state in acting:
            policy.restore_acting_state(state)
        if own:
            venv.close()
    return result


def run_selection(
    config: TrainConfig,
    venv: VectorEnv,
    algo: Algorithm | Mapping[str, Algorithm],
    *,
    versus: bool = False,
    allow_imports: Collection[str] = (),
) -> Selection:
    """The :class:`~corral.training.scoring.Selection` of ``config``'s ``select_by`` for
    ``algo`` on ``venv``; checks ``eval_opponent`` when evaluations play it."""
    selection = _selection(config, venv, as_learners(algo), versus=versus)
    _check_episodes(selection, config.run.eval_episodes)
    if selection.versus:
        _only(as_learners(algo), "playing against eval_opponent (select_by eval_vs_opponent)")
        reference_opponent(config.run.eval_opponent, config, venv, allow_imports=allow_imports)
    return selection


def _check_episodes(selection: Selection, episodes: int) -> None:
    try:
        selection.check_episodes(episodes)
    except ValueError as err:
        raise ConfigError(str(err)) from err


def _selection(
    config: TrainConfig, venv: VectorEnv, learners: Mapping[str, Algorithm], *, versus: bool
) -> Selection:
    run = config.run
    groups = {g: a for learner in learners.values() for g, a in learner.groups.items()}
    try:
        return choose_selection(
            run.select_by,
            venv,
            groups,
            self_play=run.self_play,
            versus=versus,
            learners=len(learners),
        )
    except ValueError as err:
        raise ConfigError(str(err)) from err


def reference_opponent(
    spec: str, config: TrainConfig, venv: VectorEnv, *, allow_imports: Collection[str] = ()
) -> Algorithm | None:
    """The reference opponent that ``spec`` names: ``None`` for ``random`` (uniformly random
    legal play), else the algorithm saved in a run directory (its ``best.pt``, or the latest
    checkpoint before any evaluation) or in a checkpoint file of a run.

    The run must be on ``config``'s env with the same groups as ``venv`` (it acts for its
    groups of a batch of ``venv``). A checkpoint is loaded once while its file is unchanged.
    Its run's config may import only the ``module:attr`` values in ``allow_imports``.
    """
    if spec == "random":
        return None
    path = Path(spec)
    if path.is_dir():
        run_dir, which = path, "best"
    elif path.name in (BEST, LATEST) and path.is_file():
        run_dir, which = path.parent, "best" if path.name == BEST else "latest"
    else:
        raise ConfigError(
            f"eval_opponent must be 'random', a run directory or its {BEST} or {LATEST}; "
            f"{spec!r} is none of these"
        )
    saved = run_dir / (BEST if which == "best" and (run_dir / BEST).is_file() else LATEST)
    stamp = saved.stat().st_mtime_ns if saved.is_file() else 0
    allowed = tuple(sorted(allow_imports))
    other, loaded, _ = _load_reference(str(run_dir), which, stamp, config.run.device, allowed)
    algo = _only(as_learners(loaded), f"eval_opponent {spec!r}")
    if other.run.env != config.run.env:
        raise ConfigError(
            f"eval_opponent {spec!r} was trained on {other.run.env}, not on {config.run.env}"
        )
    clash = {g: list(agents) for g, agents in algo.groups.items() if venv.groups.get(g) != agents}
    if clash:
        ours = {g: list(agents) for g, agents in venv.groups.items()}
        raise ConfigError(
            f"eval_opponent {spec!r} acts for the groups {clash}, which are not groups of this "
            f"run ({ours}); train it with the same group_map"
        )
    other_spaces = _other_spaces(algo, venv, algo.groups)
    if other_spaces:
        raise ConfigError(
            f"eval_opponent {spec!r} was trained on {other.run.env} with env_kwargs "
            f"{other.run.env_kwargs}, where {other_spaces}: not the env of this run (env_kwargs "
            f"{config.run.env_kwargs})"
        )
    return algo


def _other_spaces(algo: Algorithm, venv: VectorEnv, groups: Collection[str]) -> str:
    """What differs between the spaces ``algo`` was built for and ``venv``'s, in ``groups``
    (``""``: nothing)."""
    found = []
    for g in groups:
        for kind, theirs, ours in (
            ("observation", algo.observation_space.get(g), venv.observation_space(g)),
            ("action", algo.action_space.get(g), venv.action_space(g)),
        ):
            if theirs is not None and theirs != ours:
                found.append(f"group {g!r} has the {kind} space {theirs} (this run's: {ours})")
    return "; ".join(found)


@functools.lru_cache(maxsize=4)
def _load_reference(
    run_dir: str, which: str, stamp: int, device: str, allow_imports: tuple[str, ...]
) -> tuple[TrainConfig, Algorithm | dict[str, Algorithm], int]:
    """``load_run`` of a reference opponent, cached on the checkpoint file's modification time:
    its config, learners and env steps."""
    config, algo, saved = load_run(run_dir, which, device=device, allow_imports=allow_imports)
    return config, algo, int(saved["env_steps"])


def read_run_config(run_dir: str | Path, allow_imports: Collection[str] = ()) -> TrainConfig:
    """The config a run wrote to ``run_dir/config.yaml``.

    A file may come from anyone, so its ``algo``, ``opponent`` and ``env`` may
    name registered algorithms and envs and ``random`` only: a ``module:attr``
    there (code to import) raises :class:`ConfigError` unless ``allow_imports``
    names it (``corral eval --allow-import MODULE:ATTR``), and so does a module
    in its ``imports`` (``--allow-import MODULE`` or ``--import MODULE``).
    """
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (it has no config.yaml)")
    data = read_yaml_file(path)
    return TrainConfig.from_dict(data, source=str(path), allow_imports=allow_imports)


def load_run(
    run_dir: str | Path,
    which: str = "best",
    *,
    device: str | None = None,
    allow_imports: Collection[str] = (),
) -> tuple[TrainConfig, Algorithm | dict[str, Algorithm], dict]:
    """The config, the learner restored from ``best.pt`` (or ``latest``), and that checkpoint;
    a run of several learners gives them all, by policy id.

    ``which="best"`` falls back to the latest checkpoint when no evaluation
    has been saved yet. ``device`` replaces the run's (a GPU run on a CPU machine).
    ``allow_imports``: the ``module:attr`` values its config may import (see
    :func:`read_run_config`).
    """
    run_dir = Path(run_dir)
    config = read_run_config(run_dir, allow_imports)
    if device is not None:
        config.run = replace_run(config.run, device=device)
    names = {"best": [BEST, LATEST], "latest": [LATEST]}
    if which not in names:
        raise ConfigError(f"checkpoint must be 'best' or 'latest', got {which!r}")
    path = next((run_dir / n for n in names[which] if (run_dir / n).is_file()), None)
    if path is None:
        raise ConfigError(f"{run_dir} has no checkpoint yet")
    venv = build_venv(config.run, backend="sync", array="numpy", state=uses_state(config))
    try:
        learners, _ = build_players(config, venv)
    finally:
        venv.close()
    saved = checkpoint.load(path)
    with _fitting(path, saved, config):
        load_learners(learners, saved)
    return config, learners if len(learners) > 1 else next(iter(learners.values())), saved


UNFIT = (KeyError, IndexError, TypeError, ValueError, RuntimeError, AttributeError)
"""What restoring a checkpoint of another algorithm, env or spaces raises (missing entries,
networks of other sizes, generator states of another kind)."""


@contextlib.contextmanager
def _fitting(path: Path, saved: Mapping[str, Any], config: TrainConfig) -> Iterator[None]:
    """Restore ``saved`` (read from ``path``) into a run of ``config`` in the block: a checkpoint
    of another algorithm, or whose state does not fit, is one :class:`CheckpointError`."""
    run = f"its run ({config.algo} on {config.run.env}, as its config.yaml says)"
    if saved.get("algo") != config.algo:
        raise CheckpointError(
            f"{path} is not a checkpoint of {run}: it was written by a run of "
            f"{saved.get('algo')!r}; it is another run's checkpoint"
        )
    if "env" not in saved:
        raise CheckpointError(
            f"{path} is not a checkpoint of {run}: it lacks the entry 'env' (the env it was "
            "trained on), which every checkpoint of this corral holds"
        )
    if saved["env"] != config.run.env:
        raise CheckpointError(
            f"{path} is not a checkpoint of {run}: it was written by a run on "
            f"{saved['env']!r}; it is another run's checkpoint"
        )
    try:
        yield
    except UNFIT as err:
        if isinstance(err, KeyError):
            reason = f"it lacks the entry {err.args[0]!r}" if err.args else "an entry is missing"
        else:
            reason = " ".join(str(err).split()) or type(err).__name__
        raise CheckpointError(
            f"{path} does not fit {run}: another env, spaces or settings? {reason}"
        ) from err


def check_cluster(config: TrainConfig, run_dir: Path, named: bool, who: str, flag: str) -> None:
    """Refuse to join the Ray cluster that ``run_dir/config.yaml`` names unless the command
    line names one too (``named``): a run directory may come from anyone, so it does not
    choose where ``who`` (a resumed run, an evaluation) connects; ``flag`` is how to name it."""
    address = config.run.ray_address
    if address is not None and not named:
        raise ConfigError(
            f"{run_dir}/{CONFIG} names the Ray cluster {address!r}; {who} joins a cluster "
            f"only when the command line names it again: {flag}{address}"
        )


def check_run_files(run_dir: Path) -> None:
    """Refuse a run directory holding, where the run writes, anything but what it writes
    there: a symbolic link, a FIFO, a file of other hard links (see
    :mod:`~corral.training.run_files`)."""
    run_files.check_entries(
        run_dir,
        files=(CONFIG, METRICS, LOG, WANDB_ID),
        replaced=(LATEST, BEST),
        dirs=(TENSORBOARD, WANDB_DIR),
    )
    read_wandb_id(run_dir)


def run_trackers(config: TrainConfig, run_dir: Path) -> list[Tracker]:
    """The trackers of the run's ``logger`` setting besides TensorBoard (see
    :mod:`corral.training.trackers`), writing in ``run_dir``."""
    run = config.run
    trackers: list[Tracker] = []
    if "wandb" in run.logger:
        trackers.append(
            WandbTracker(run_dir, config.to_dict(), project=run.wandb_project, mode=run.wandb_mode)
        )
    return trackers


def restored(saved: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """The checkpoint ``saved`` read from ``path``, its counters and metrics rows checked: a
    crafted file passes its seal (anyone can compute a sha256), so each value is refused with
    a :class:`CheckpointError` unless it is of the kind the run writes; a checkpoint that
    lacks one (or its ``metrics``) is refused naming the entry."""
    for key, (fits, kind) in RESTORED.items():
        if key not in saved:
            raise CheckpointError(f"{path}: it lacks the entry {key!r}, which every run writes")
        if not fits(saved[key]):
            raise CheckpointError(f"{path}: its {key} is {repr(saved[key])[:60]}, not {kind}")
    if "metrics" not in saved:
        raise CheckpointError(f"{path}: it lacks the entry 'metrics', which every run writes")
    counts = saved.get(RUNNER_KEY, {})  # older runs' checkpoints have none
    if not (
        isinstance(counts, dict)
        and set(counts) <= set(RUNNER_COUNTS)
        and all(_count(v) for v in counts.values())
    ):
        raise CheckpointError(
            f"{path}: its {RUNNER_KEY} is {repr(counts)[:60]}, not counts (ints at least 0) "
            f"of {list(RUNNER_COUNTS)}"
        )
    return {**saved, "metrics": checked_rows(saved["metrics"], str(path))}


def _carried(partial: Any, path: Path) -> tuple[Progress, float] | None:
    """A checkpoint's ``partial`` entry (see :meth:`Runner._partial`), checked; ``None`` where
    it has none (written at a row, or by an older corral)."""
    if partial is None:
        return None
    try:
        if not isinstance(partial, dict) or set(partial) != {"progress", "seconds"}:
            raise ValueError("it holds other entries than progress and seconds")
        if not (_number(partial["seconds"]) and partial["seconds"] >= 0):
            raise ValueError("its seconds are not a number of seconds")
        return Progress.from_state(partial["progress"]), float(partial["seconds"])
    except ValueError as err:
        raise CheckpointError(f"{path}: its partial is not the part of a row ({err})") from err


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def _number(value: Any) -> bool:
    return type(value) in (int, float) and not math.isnan(value)


RESTORED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "env_steps": (_count, "a count (an int at least 0)"),
    "elapsed": (lambda v: _number(v) and v >= 0, "a number of seconds"),
    "best_eval": (lambda v: v is None or _number(v), "a number or None"),
    "best_steps": (lambda v: v is None or _count(v), "a count or None"),
    "select_by": (is_column, "a column name"),
}
"""The counters a checkpoint restores into a run, and what each must be."""

RUNNER_KEY = "runner_counts"
"""The checkpoint's entry of the run's rollout worker faults so far (by count name)."""

RUNNER_COUNTS = ("runner_restarts", "rollouts_lost", "rollouts_dropped")
"""The counts of rollout worker faults that a run keeps across resumes."""


# -- helpers ---------------------------------------------------------------------------------


def _choose_run_dir(config: TrainConfig, *, resuming: bool) -> Path:
    """The run's directory, not made yet: ``run_dir``, which may hold another run only when
    resuming it, else a new one under ``runs/`` (then set as ``run_dir``)."""
    run = config.run
    if run.run_dir:
        path = Path(run.run_dir)
        if not resuming and (path / LATEST).exists():
            raise ConfigError(f"{path} already holds a run; resume it or choose another run_dir")
    else:
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        name = config.algo.rpartition(":")[2].lower()
        env = re.sub(r"[^\w.-]+", "_", run.env)  # no '/' or ':' (module:attr) in the name
        base = Path("runs") / f"{name}-{env}-s{run.seed}-{stamp}"
        path, n = base, 1
        while path.exists():
            n += 1
            path = base.with_name(f"{base.name}-{n}")
        run.run_dir = str(path)
    return path


def _device(device: str) -> str:
    """``auto`` without PyTorch loaded is the CPU (an algorithm without torch has no GPU)."""
    if device == "auto" and "torch" not in sys.modules:
        return "cpu"
    return resolve_device(device)


def _eval_seed(run: RunConfig) -> int:
    """Every evaluation of a run plays the same seeds, apart from the training envs' seeds."""
    return run.seed + 1_000_003


def _runner_faults_text(part: Progress, totals: Mapping[str, int]) -> str:
    """What the rollout worker faults of ``part`` were, with the run's ``totals``."""
    return (
        f"{part.runner_restarts} rollout worker restart(s) and {part.rollouts_lost} rollout(s) "
        f"lost in the last {part.env_steps} env steps ({totals['runner_restarts']} and "
        f"{totals['rollouts_lost']} in all): a worker died, lost its node or missed "
        "sample_timeout; its partial rollout was dropped and a new worker took its place"
    )


def _restarts_text(part: Progress, on_env_error: str) -> str:
    """What the env restarts of ``part`` were, under the run's ``on_env_error``."""
    head = f"{part.env_restarts} env restart(s) in the last {part.env_steps} env steps"
    if on_env_error == "restart":
        return f"{head} after faults, their episodes cut (on_env_error=restart)"
    # under raise an env's fault stops the run: what the run survived were workers that died
    return (
        f"{head}: a worker died and was replaced, its envs' episodes cut (on_env_error=raise "
        "stops a run at an env's own fault or a worker's timeout, not at a worker's death)"
    )


def _crossed(period: int, before: int, after: int) -> bool:
    return period > 0 and after // period > before // period


def _mean_metrics(updates: list[dict[str, float]]) -> dict[str, float]:
    keys = dict.fromkeys(k for u in updates for k in u)
    return {k: float(np.mean([u[k] for u in updates if k in u])) for k in keys}


def _lead(obs: Any) -> tuple[int, ...]:
    """``(E, n)`` of a group's observations (nested for Dict/Tuple spaces)."""
    return tuple(np.shape(first_leaf(obs))[:2])
