"""Searching a run's settings with Optuna: ``corral sweep ALGO --env ID --space sweep.yaml``.

The space is a YAML mapping of settings (run or algorithm settings, as ``--set`` names
them) to the values each trial may take::

    lr: {low: 1.0e-4, high: 1.0e-2, log: true}   # a number between low and high (log scale)
    hidden_size: {low: 32, high: 256, step: 32}  # an int setting: 32, 64, ..., 256
    clip: {choices: [0.1, 0.2]}                  # one of these values

A setting declared ``int`` draws integers (``step``: their spacing), a ``float`` setting
numbers (``step`` optional), any setting may draw from ``choices`` (a list value, such as
``[64, 64]`` for ``hidden``, is one choice); each bound and choice is checked as ``--set``
would check it before anything is written. Each trial is a normal run directory
``SWEEP_DIR/trial-0003`` that :class:`~corral.training.runner.Runner` trains as ``corral
train`` does, with the sweep's fixed settings and the trial's drawn ones. Each evaluation's
value of the run's selection column (``eval_return``, or ``eval_vs_opponent`` in two-player
zero-sum games and self-play, unless ``select_by`` is set) is reported to Optuna,
whose pruner (median by default: a trial whose best evaluation so far is below the median
of the finished trials' at the same env step is stopped there; never at step 0) ends trials
that fall behind. A trial's value is its best evaluation: the one its ``best.pt`` keeps.

The study is ``SWEEP_DIR/study.db`` (SQLite): ``parallel`` processes (or Ray tasks) run
trials against it at once, and a sweep started again on the same directory adds its trials
to the same study. ``SWEEP_DIR/best.yaml`` holds the best trial so far.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import logging
import math
import multiprocessing
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np

from corral.errors import ConfigError, MissingDependencyError
from corral.training import run_files
from corral.training.config import (
    RunConfig,
    algorithm_spec,
    load_config,
    read_yaml_file,
    write_yaml,
)
from corral.training.trackers import TRACK_EXTRA

log = logging.getLogger("corral.sweep")

STUDY = "study.db"
"""The sweep directory's Optuna storage (SQLite)."""
BEST = "best.yaml"
"""The sweep directory's record of its best trial."""
STUDY_NAME = "corral-sweep"
NOT_SWEPT = frozenset({"env", "run_dir", "imports"})
"""Settings that are the sweep's own, not a trial's."""
BACKENDS = ("process", "ray")
"""Where the trials of ``parallel`` run: worker processes, or Ray tasks."""
PRUNERS = ("median", "none")
TRIAL_DIR = "trial-{:04d}"
_RANGE_KEYS = frozenset({"low", "high", "log", "step"})
_PRIMITIVE = (str, int, float, bool, type(None))


def import_optuna() -> types.ModuleType:
    """The ``optuna`` module; a :class:`MissingDependencyError` naming the extra without it."""
    try:
        import optuna
    except ModuleNotFoundError as err:
        raise MissingDependencyError(
            f"corral sweep needs optuna, which is not installed: {TRACK_EXTRA}"
        ) from err
    return optuna


@dataclass(frozen=True)
class Param:
    """One setting of a sweep's space and the values a trial draws it from."""

    name: str
    kind: Literal["int", "float", "choice"]
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def suggest(self, trial: Any) -> Any:
        """The value ``trial`` draws (as ``--set`` would read it)."""
        if self.kind == "choice":
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.kind == "int":
            step = int(self.step or 1)
            return trial.suggest_int(
                self.name, int(self.low), int(self.high), step=step, log=self.log
            )
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def edges(self) -> list[Any]:
        """The values that bound what the trials draw: both ends, or every choice."""
        if self.kind == "choice":
            return list(self.choices)
        if self.kind == "int":
            return [int(self.low), int(self.high)]
        return [self.low, self.high]


def read_space(
    space: str | Path | Mapping[str, Any],
    algo: str | type,
    env: str,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Param]:
    """The parameters of a space (a YAML file, or its mapping), checked against the settings
    of training ``algo`` on ``env`` with the fixed ``settings``: an unknown name, a
    distribution of the wrong form or type, or a bound or choice that ``--set`` would refuse
    is a :class:`ConfigError` naming the file and the setting."""
    source = str(space) if not isinstance(space, Mapping) else "the space"
    data = read_yaml_file(space) if not isinstance(space, Mapping) else dict(space)
    if not data:
        raise ConfigError(
            f"{source}: the space names no setting (lines 'NAME: {{low: .., high: ..}}')"
        )
    settings = dict(settings or {})
    hints = _setting_types(algo)
    params = {}
    for name, spec in data.items():
        where = f"{source}: {name}"
        if not isinstance(name, str) or name not in hints:
            close = difflib.get_close_matches(str(name), sorted(hints), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: not a setting of {_algo_name(algo)} runs{hint}")
        if name in NOT_SWEPT:
            raise ConfigError(f"{where}: the sweep's own setting, the same for every trial")
        if name in settings:
            raise ConfigError(f"{where}: both swept and set (--set {name}=...): choose one")
        params[name] = _param(name, spec, hints[name], where)
    for param in params.values():
        for value in param.edges():
            try:
                load_config(algo, env, {**settings, param.name: value})
            except ConfigError as err:
                raise ConfigError(f"{source}: {param.name}: {value!r}: {err}") from None
    return params


def _setting_types(algo: str | type) -> dict[str, Any]:
    """Each run and algorithm setting's type (its annotation without ranges)."""
    config_cls = algorithm_spec(algo)[1].Config
    found = {}
    for cls in (RunConfig, config_cls):
        hints = typing.get_type_hints(cls)
        found.update({f.name: hints[f.name] for f in fields(cls)})
    return found


def _algo_name(algo: str | type) -> str:
    return algorithm_spec(algo)[0]


def _param(name: str, spec: Any, annotation: Any, where: str) -> Param:
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"{where}: expected {{low: L, high: H}} (with log: true or step: S) or "
            f"{{choices: [...]}}, got {spec!r}"
        )
    keys = set(spec)
    if "choices" in keys:
        if keys != {"choices"}:
            raise ConfigError(f"{where}: choices takes no other key, got {sorted(keys)}")
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}: choices must be a non-empty list, got {choices!r}")
        return Param(name, "choice", choices=tuple(_choice(c, where) for c in choices))
    unknown = keys - _RANGE_KEYS
    if unknown or not {"low", "high"} <= keys:
        raise ConfigError(
            f"{where}: expected the keys low and high (and log or step) or choices, "
            f"got {sorted(map(str, keys))}"
        )
    kind = _numeric_kind(annotation)
    if kind is None:
        raise ConfigError(
            f"{where}: a setting of type {_type_name(annotation)} draws from choices only "
            "(low and high are for int and float settings)"
        )
    low, high = (_number(spec[k], kind, f"{where}: {k}") for k in ("low", "high"))
    log_scale = spec.get("log", False)
    if not isinstance(log_scale, bool):
        raise ConfigError(f"{where}: log must be true or false, got {log_scale!r}")
    step = None if spec.get("step") is None else _number(spec["step"], kind, f"{where}: step")
    if low > high:
        raise ConfigError(f"{where}: low {low} is above high {high}")
    if log_scale and step is not None:
        raise ConfigError(f"{where}: log and step cannot go together (Optuna draws one or other)")
    if log_scale and low <= 0:
        raise ConfigError(f"{where}: a log scale needs low above 0, got {low}")
    if step is not None and step <= 0:
        raise ConfigError(f"{where}: step must be above 0, got {step}")
    return Param(name, kind, low=low, high=high, step=step, log=log_scale)


def _numeric_kind(annotation: Any) -> Literal["int", "float"] | None:
    """``int`` or ``float`` for a setting of that type (or that or ``None``)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if annotation is int:
        return "int"
    if annotation is float:
        return "float"
    return None


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _number(value: Any, kind: str, where: str) -> float:
    """A bound or step from the file: a number (YAML reads ``1e-4`` as text: read it here)."""
    text = value.replace("_", "").strip() if isinstance(value, str) else ""
    if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?", text, re.IGNORECASE):
        value = float(text)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if kind == "int":
        if not float(value).is_integer():
            raise ConfigError(f"{where}: the setting is an int, got {value!r}")
        return int(value)
    return float(value)


def _choice(value: Any, where: str) -> Any:
    """A choice as Optuna stores it: a scalar, or a list as the text ``--set`` reads."""
    if isinstance(value, _PRIMITIVE):
        return value
    if isinstance(value, list) and all(isinstance(v, (int, float, str)) for v in value):
        return ",".join(str(v) for v in value)
    raise ConfigError(
        f"{where}: a choice must be a number, text, true/false or a list, got {value!r}"
    )


# -- the sweep -----------------------------------------------------------------------------------


@dataclass
class Job:
    """What one worker of a sweep needs (sent to worker processes and Ray tasks)."""

    algo: str
    env: str
    space: dict[str, Param]
    settings: dict[str, Any]
    sweep_dir: str
    trials: int
    pruner: Any
    sampler: Any
    allow_imports: tuple[str, ...] = ()
    echo: bool = False


@dataclass
class SweepResult:
    """The best trial of a sweep's study (all its trials, earlier sweeps' included)."""

    sweep_dir: Path
    trial: int
    value: float
    settings: dict[str, Any]
    """The best trial's drawn settings, as its ``config.yaml`` holds them."""
    run_dir: Path
    states: dict[str, int] = field(default_factory=dict)
    """How many of the study's trials ended how (``COMPLETE``, ``PRUNED``, ``FAIL``...)."""


class PruningTracker:
    """Reports each evaluation's ``metric`` to an Optuna trial and stops the run (raising
    ``optuna.TrialPruned`` from the metrics row) where the study's pruner says so."""

    def __init__(self, trial: Any, metric: str) -> None:
        self.trial, self.metric = trial, metric

    def add(self, row: Mapping[str, float]) -> None:
        if self.metric not in row:
            return
        steps = int(row["env_steps"])
        self.trial.report(float(row[self.metric]), step=steps)
        if self.trial.should_prune():
            optuna = import_optuna()
            raise optuna.TrialPruned(
                f"pruned at {steps} env steps ({self.metric} {row[self.metric]:.4g})"
            )

    def close(self) -> None:
        """Nothing to write out."""


def sweep(
    algo: str | type,
    env: str,
    space: str | Path | Mapping[str, Any],
    trials: int,
    *,
    settings: Mapping[str, Any] | None = None,
    sweep_dir: str | Path | None = None,
    parallel: int = 1,
    backend: str = "process",
    pruner: Any = "median",
    sampler: Any = None,
    allow_imports: Sequence[str] = (),
    echo: bool = False,
) -> SweepResult:
    """Run ``trials`` trials of ``algo`` on ``env`` drawing the settings of ``space``, with
    the fixed ``settings`` (``--set``), ``parallel`` at a time (``backend``: worker processes
    or Ray tasks); returns the best trial of the study in ``sweep_dir`` (default
    ``runs/sweep-<algo>-<env>-<time>``), which a later call on the same directory continues.

    ``pruner``: ``median``, ``none`` or an Optuna pruner; ``sampler``: an Optuna sampler
    (default TPE, seeded from the run's ``seed``). ``echo``: log a line per trial to stderr
    (also in worker processes).
    """
    optuna = import_optuna()
    if trials < 1 or parallel < 1:
        raise ConfigError(f"trials and parallel must be at least 1, got {trials} and {parallel}")
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    name = algorithm_spec(algo)[0]
    fixed = dict(settings or {})
    params = read_space(space, name, env, fixed)
    base = load_config(name, env, fixed)  # the fixed settings, checked
    directory = Path(sweep_dir) if sweep_dir is not None else default_sweep_dir(name, env)
    record = _record(name, env, params, {key: _typed(base, key, v) for key, v in fixed.items()})
    pruner = _pruner(optuna, pruner)
    run_files.check_entries(directory, files=(BEST, STUDY))
    study = _study(optuna, directory, pruner, sampler)
    defaults = load_config(name, env, {})
    _check_same_sweep(study, record, directory, lambda key: _json(_typed(defaults, key, None)))
    seed = int(np.random.SeedSequence([base.run.seed, len(study.trials)]).generate_state(1)[0])
    jobs = [
        Job(
            name,
            env,
            params,
            fixed,
            str(directory),
            count,
            pruner,
            sampler or optuna.samplers.TPESampler(seed=seed + worker),
            tuple(allow_imports),
            echo,
        )
        for worker, count in enumerate(_split(trials, parallel))
    ]
    if len(jobs) == 1:
        run_trials(jobs[0])
    elif backend == "ray":
        _on_ray(jobs)
    else:
        _in_processes(jobs)
    return write_best(directory, optuna)


def default_sweep_dir(algo: str, env: str) -> Path:
    """``runs/sweep-<algo>-<env>-<time>``: where a sweep goes unless told."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    name = re.sub(r"[^\w.-]+", "_", f"sweep-{algo.rpartition(':')[2].lower()}-{env}")
    return Path("runs") / f"{name}-{stamp}"


def _split(trials: int, parallel: int) -> list[int]:
    """``trials`` shared by at most ``parallel`` workers, none idle."""
    workers = min(trials, parallel)
    return [trials // workers + (i < trials % workers) for i in range(workers)]


def _pruner(optuna: types.ModuleType, pruner: Any) -> Any:
    if pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)
    if pruner in ("none", None):
        return optuna.pruners.NopPruner()
    if isinstance(pruner, str):
        raise ConfigError(
            f"pruner must be one of {list(PRUNERS)} or an Optuna pruner, got {pruner!r}"
        )
    return pruner


def _storage(directory: Path) -> str:
    return f"sqlite:///{(directory / STUDY).resolve()}"


def _study(optuna: types.ModuleType, directory: Path, pruner: Any, sampler: Any) -> Any:
    """The study of ``directory`` (made with the directory where there is none)."""
    run_files.make_run_dir(directory)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        study_name=STUDY_NAME,
        storage=_storage(directory),
        load_if_exists=True,
        direction="maximize",
        pruner=pruner,
        sampler=sampler,
    )


def _record(algo: str, env: str, params: Mapping[str, Param], settings: Mapping[str, Any]) -> Any:
    """What a sweep is, as the study keeps it (JSON), so that a continued sweep is the same."""
    space = {
        name: {
            "kind": p.kind,
            "low": p.low,
            "high": p.high,
            "step": p.step,
            "log": p.log,
            "choices": list(p.choices),
        }
        for name, p in params.items()
    }
    data = {"algo": algo, "env": env, "space": space, "settings": dict(settings)}
    return _json(data)


def _json(value: Any) -> Any:
    """``value`` as the study keeps it (through JSON)."""
    return json.loads(json.dumps(value, default=str))


def _typed(config: Any, key: str, given: Any) -> Any:
    """The value of the fixed setting ``key`` as the trials' config holds it (``--set
    total_steps=2e5`` and ``total_steps=200000`` are one sweep)."""
    name, _, sub = key.partition(".")
    for part in (config.run, config.algo_config):
        if hasattr(part, name):
            value = getattr(part, name)
            return value.get(sub, given) if sub and isinstance(value, Mapping) else value
    return given


def _check_same_sweep(
    study: Any, record: Any, directory: Path, default: Callable[[str], Any]
) -> None:
    """Refuse to continue the study of another sweep; a fixed setting given in one call and
    left out in the other is the same where it was given its default (``default(key)``)."""
    saved = study.user_attrs.get("sweep")
    if saved is None:
        study.set_user_attr("sweep", record)
        return
    said = [f"{k} {saved.get(k)!r} (now {record[k]!r})" for k in sorted(record)
            if k != "settings" and saved.get(k) != record[k]]  # fmt: skip
    before, now = saved.get("settings", {}), record["settings"]
    for key in sorted({*before, *now}):
        was, is_ = before.get(key, default(key)), now.get(key, default(key))
        if was != is_:
            said.append(f"setting {key} {was!r} (now {is_!r})")
    if said:
        raise ConfigError(
            f"{directory} holds another sweep: {', '.join(said)}; continue it as it was, or "
            "choose another --sweep-dir"
        )


def run_trials(job: Job) -> None:
    """Run ``job.trials`` trials of the study in ``job.sweep_dir`` (in a worker or in-process)."""
    optuna = import_optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(
        study_name=STUDY_NAME,
        storage=_storage(Path(job.sweep_dir)),
        pruner=job.pruner,
        sampler=job.sampler,
    )
    with _echoed(job.echo) as relay:
        for _ in range(job.trials):
            trial = study.ask()
            relay.number = trial.number
            try:
                value = _train_trial(job, trial)
            except optuna.TrialPruned as pruned:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                log.info("trial %d: %s: %s", trial.number, _said(trial.params), pruned)
                continue
            except BaseException:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                raise
            study.tell(trial, value)
            log.info("trial %d: %s: best %.4g", trial.number, _said(trial.params), value)


@contextlib.contextmanager
def _echoed(echo: bool) -> Iterator[_WarningEcho]:
    """While trials run: where ``echo``, the sweep's lines go to stderr, with the trials'
    warnings (see :class:`_WarningEcho`)."""
    training, relay = logging.getLogger("corral.training"), _WarningEcho()
    if not echo:
        yield relay
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    training.addHandler(relay)
    try:
        yield relay
    finally:
        training.removeHandler(relay)
        log.removeHandler(handler)
        log.setLevel(level)


class _WarningEcho(logging.Handler):
    """Passes the warnings of the trial :attr:`number` (a run too short for any update...)
    to the sweep's log, each text once: each trial's ``train.log`` has them all."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.number = 0
        self.seen: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text not in self.seen:
            self.seen.add(text)
            log.warning("trial %d: %s", self.number, text)


def _train_trial(job: Job, trial: Any) -> float:
    from corral.training.runner import Runner

    drawn = {name: param.suggest(trial) for name, param in job.space.items()}
    run_dir = Path(job.sweep_dir) / TRIAL_DIR.format(trial.number)
    trial.set_user_attr("run_dir", str(run_dir))
    config = load_config(job.algo, job.env, {**job.settings, **drawn, "run_dir": str(run_dir)})
    with Runner(config, progress=False, allow_imports=job.allow_imports) as runner:
        runner.metrics.add_tracker(PruningTracker(trial, runner.selection.metric))
        results = runner.train()
    return math.nan if results.best_eval is None else float(results.best_eval)


def _said(params: Mapping[str, Any]) -> str:
    return " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )


def _in_processes(jobs: Sequence[Job]) -> None:
    """Each job in a worker process of its own (spawned: a fresh interpreter, no fork of
    torch's threads); the first failure is raised once all have ended."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(len(jobs)) as pool:
        results = [pool.apply_async(run_trials, (job,)) for job in jobs]
        errors = []
        for result in results:
            try:
                result.get()
            except Exception as err:  # a trial's error in a worker: the others finish first
                errors.append(err)
    if errors:
        raise errors[0]


def _on_ray(jobs: Sequence[Job]) -> None:
    """Each job as a Ray task (one CPU each) on the running Ray, or a local one; the study's
    SQLite file must be reachable from every node (one machine, or a shared disk)."""
    try:
        import ray
    except ModuleNotFoundError as err:
        raise MissingDependencyError(
            "a sweep on Ray needs ray, which is not installed: pip install 'corral[ray]'"
        ) from err
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=True)
    task = ray.remote(num_cpus=1)(run_trials)
    ray.get([task.remote(job) for job in jobs])


def _as_run(drawn: Mapping[str, Any], run_dir: Path) -> dict[str, Any]:
    """The drawn settings as the trial's ``config.yaml`` holds them (a choice ``64,64`` of
    ``hidden`` as the list ``[64, 64]``)."""
    saved = read_yaml_file(run_dir / "config.yaml")
    parts = [saved.get("run") or {}, saved.get("algo_config") or {}]
    return {
        name: next((part[name] for part in parts if name in part), value)
        for name, value in drawn.items()
    }


def write_best(directory: str | Path, optuna: types.ModuleType | None = None) -> SweepResult:
    """The best trial of the study in ``directory``, also written to ``directory/best.yaml``."""
    optuna = optuna or import_optuna()
    directory = Path(directory)
    study = optuna.load_study(study_name=STUDY_NAME, storage=_storage(directory))
    states: dict[str, int] = {}
    for trial in study.trials:
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        raise ConfigError(f"{directory}: no trial of the sweep has finished ({states})")
    best = max(complete, key=lambda t: t.value)
    run_dir = directory / TRIAL_DIR.format(best.number)  # wherever the sweep was run from
    result = SweepResult(
        directory, best.number, float(best.value), _as_run(best.params, run_dir), run_dir, states
    )
    text = write_yaml(
        {
            "trial": result.trial,
            "value": result.value,
            "run_dir": str(result.run_dir),
            "settings": result.settings,
            "trials": states,
        }
    )
    run_files.write_text(directory, BEST, text)
    return result
