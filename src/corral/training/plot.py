"""Learning curves: an evaluation column against env steps, mean and spread over seeds."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from corral.errors import MissingDependencyError
from corral.training.config import ConfigError, read_yaml_file
from corral.training.metrics import read_metrics
from corral.training.scoring import AUTO, RETURN, selected_column

if TYPE_CHECKING:
    from matplotlib.figure import Figure


LINE_STYLES = ("--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))
"""Dash patterns of the horizontal lines (baselines and references), in turn."""


@dataclass
class Curve:
    """The runs of one algorithm on one env (with the same ``env_kwargs``), on a common grid of
    env steps."""

    algo: str
    env: str
    steps: np.ndarray
    """``[T]`` env steps."""
    returns: np.ndarray
    """``[runs, T]`` values of the column, interpolated between each run's evaluations."""
    metric: str = "eval_return"
    """The column plotted."""
    env_kwargs: str = ""
    """The runs' ``env_kwargs`` as ``key=value`` text (runs with others are another curve)."""
    settings: str = ""
    """The runs' settings that other curves of the algorithm on the env do not share, as
    ``key=value`` text."""

    @property
    def label(self) -> str:
        name = " ".join(part for part in (self.algo, self.env_kwargs, self.settings) if part)
        return f"{name} ({len(self.returns)} run{'s' if len(self.returns) > 1 else ''})"


NOT_THE_SETUP = frozenset({"seed", "run_dir", "imports", "wandb_project", "select_by"})
"""Settings that runs of one setup (seeds of one experiment) may differ in, beside the
schedule a resume may change (``RESUMABLE``): ``select_by`` only chooses ``best.pt``."""


def _setup(config: Mapping) -> dict[str, str]:
    """What a run learns with, beside its algorithm and env: its run and algorithm settings
    other than the seed, the schedule and where it writes, as text by name."""
    from corral.training.runner import RESUMABLE

    ignored = NOT_THE_SETUP | RESUMABLE | {"env", "env_kwargs"}
    out = {k: _text(v) for k, v in (config.get("run") or {}).items() if k not in ignored}
    out |= {k: _text(v) for k, v in (config.get("algo_config") or {}).items() if k not in ignored}
    for pid, settings in sorted((config.get("policy_configs") or {}).items()):
        out |= {f"{pid}.{k}": _text(v) for k, v in settings.items() if k not in ignored}
    return out


def _text(value: object) -> str:
    """A setting's value as a label shows it: lists joined by commas, mappings as k:v."""
    if isinstance(value, (list, tuple)):
        return ",".join(_text(v) for v in value)
    if isinstance(value, Mapping):
        return ",".join(f"{k}:{_text(v)}" for k, v in sorted(value.items()))
    return str(value)


def curves(run_dirs: Sequence[str | Path], metric: str | None = None) -> list[Curve]:
    """One :class:`Curve` of the column ``metric`` per (algorithm, env, env_kwargs, other
    settings) among ``run_dirs``, in order of appearance: runs that differ only in their
    seed and schedule are seeds of one curve; a curve's label names the settings it does
    not share with the other curves of its algorithm on its env.

    ``metric`` is any column of ``metrics.csv``: ``eval_return``,
    ``eval_return/<group or agent>``, ``eval_vs_opponent``...; by default each
    run's own selection column, the one its ``best.pt`` was chosen on
    (:func:`~corral.training.scoring.selected_column`: ``eval_vs_opponent`` in
    self-play and two-player zero-sum games). Each curve's grid runs up to the
    shortest of its runs, so the mean is taken where every run has data.
    """
    runs: dict[tuple[str, str, str, str], list[tuple[str, np.ndarray, np.ndarray]]] = {}
    setups: dict[str, dict[str, str]] = {}
    for run_dir in run_dirs:
        config = _run_config(run_dir)
        metrics = read_metrics(run_dir)
        if not any(RETURN in r for r in metrics):
            raise ConfigError(f"{run_dir} has no evaluation yet")
        columns = {k for r in metrics for k in r}
        column = metric or selected_column(str(config["run"].get("select_by", AUTO)), columns)
        rows = [r for r in metrics if column in r]
        if not rows:
            known = sorted(k for k in columns if k.startswith("eval_"))
            raise ConfigError(f"{run_dir} has no column {column!r}; its eval columns: {known}")
        steps = np.array([r["env_steps"] for r in rows])
        values = np.array([r[column] for r in rows])
        name = str(config["algo"]).rpartition(":")[2]
        kwargs = config["run"].get("env_kwargs") or {}
        task = " ".join(f"{k}={kwargs[k]}" for k in sorted(kwargs))
        setup = _setup(config)
        key = repr(sorted(setup.items()))
        setups[key] = setup
        runs.setdefault((name, str(config["run"]["env"]), task, key), []).append(
            (column, steps, values)
        )
    out = []
    for (algo, env, task, key), members in runs.items():
        others = [setups[k] for (a, e, t, k) in runs if (a, e, t) == (algo, env, task)]
        apart = sorted(
            {n for o in others for n in {*o, *setups[key]} if o.get(n) != setups[key].get(n)}
        )
        settings = " ".join(f"{n}={setups[key][n]}" for n in apart if n in setups[key])
        chosen = list(dict.fromkeys(c for c, _, _ in members))
        if len(chosen) > 1:
            raise ConfigError(
                f"the {algo} runs on {env} selected best.pt on different columns {chosen}: "
                "choose the one to draw (--metric)"
            )
        end = min(s[-1] for _, s, _ in members)
        grid = np.unique(np.concatenate([s[s <= end] for _, s, _ in members]))
        returns = np.stack([np.interp(grid, s, v) for _, s, v in members])
        out.append(Curve(algo, env, grid, returns, chosen[0], task, settings))
    return out


def plot_runs(
    run_dirs: Sequence[str | Path],
    out: str | Path,
    *,
    band: str = "minmax",
    metric: str | None = None,
    references: Mapping[str, float] | None = None,
    baselines: bool = False,
) -> Path:
    """Plot the learning curves of ``run_dirs`` to the image ``out`` (one panel per env).

    ``metric`` is the column drawn, by default each run's selection column (see
    :func:`curves`). Runs of the same
    algorithm, env, ``env_kwargs`` and settings (seeds) are drawn as their mean with a shaded
    ``band``: ``"minmax"`` (the range over runs) or ``"std"`` (one standard
    deviation). ``references`` (name -> value) are drawn as labelled
    horizontal lines in every panel; ``baselines`` adds each env's reference
    baselines (:mod:`corral.training.baselines`), measured on ``eval_return``.
    """
    figure = draw_runs(
        run_dirs, band=band, metric=metric, references=references, baselines=baselines
    )
    figure.savefig(out, dpi=100)
    return Path(out)


def draw_runs(
    run_dirs: Sequence[str | Path],
    *,
    band: str = "minmax",
    metric: str | None = None,
    references: Mapping[str, float] | None = None,
    baselines: bool = False,
) -> Figure:
    """The matplotlib figure that :func:`plot_runs` saves."""
    if band not in ("minmax", "std"):
        raise ConfigError(f"band must be 'minmax' or 'std', got {band!r}")
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError as err:
        raise MissingDependencyError(
            "plotting needs matplotlib, which is not installed: pip install 'corral[train]'"
        ) from err
    found = curves(run_dirs, metric)
    envs = list(dict.fromkeys(c.env for c in found))
    lines = _baseline_lines(run_dirs, found) if baselines else {}
    lines = {env: {**lines.get(env, {}), **(references or {})} for env in envs}
    styles = _line_styles(lines, max(sum(c.env == env for c in found) for env in envs))
    figure = Figure(figsize=(6 * len(envs), 4), layout="constrained")
    axes = figure.subplots(1, len(envs), squeeze=False)[0]
    for ax, env in zip(axes, envs, strict=True):
        drawn = [c for c in found if c.env == env]
        metrics = list(dict.fromkeys(c.metric for c in drawn))
        for curve in drawn:
            mean = curve.returns.mean(axis=0)
            if band == "minmax":
                low, high = curve.returns.min(axis=0), curve.returns.max(axis=0)
            else:
                std = curve.returns.std(axis=0)
                low, high = mean - std, mean + std
            label = curve.label if len(metrics) == 1 else f"{curve.label}: {curve.metric}"
            (line,) = ax.plot(curve.steps, mean, label=label)
            if len(curve.returns) > 1:
                ax.fill_between(curve.steps, low, high, color=line.get_color(), alpha=0.25)
        for name, value in lines[env].items():
            color, style = styles[name]
            ax.axhline(
                value, color=color, linestyle=style, linewidth=1, label=f"{name} ({value:.2f})"
            )
        ax.set_title(env)
        ax.set_xlabel("env steps")
        ax.set_ylabel(", ".join(m.replace("_", " ") for m in metrics))
        ax.grid(alpha=0.3)
        ax.legend()
    return figure


def _line_styles(lines: Mapping[str, Mapping[str, float]], curves: int) -> dict[str, tuple]:
    """The colour and dash pattern of each horizontal line, by name: the same in every panel,
    each its own, in colours of the cycle after the ``curves`` that a panel may hold."""
    names = list(dict.fromkeys(name for per_env in lines.values() for name in per_env))
    return {
        name: (f"C{(curves + k) % 10}", LINE_STYLES[k % len(LINE_STYLES)])
        for k, name in enumerate(names)
    }


def _baseline_lines(
    run_dirs: Sequence[str | Path], found: Sequence[Curve]
) -> dict[str, dict[str, float]]:
    """Each env's reference baselines among ``run_dirs`` (drawn as ``found``):
    env -> {label: mean return}."""
    from corral.training.baselines import reference_scores

    other = next((c.metric for c in found if c.metric != RETURN), None)
    if other is not None:
        raise ConfigError(
            f"the reference baselines are measured on {RETURN} (the mean over all agents), "
            f"not {other!r}: draw them on {RETURN} (--metric {RETURN})"
        )
    env_kwargs: dict[str, dict] = {}
    for run_dir in run_dirs:
        run = _run_config(run_dir)["run"]
        kwargs = dict(run.get("env_kwargs") or {})
        if env_kwargs.setdefault(str(run["env"]), kwargs) != kwargs:
            raise ConfigError(
                f"the runs on {run['env']} have different env_kwargs ({env_kwargs[run['env']]} "
                f"and {kwargs} in {run_dir}), so they have no common baselines"
            )
    lines = {}
    for env, kwargs in env_kwargs.items():
        try:
            scores = reference_scores(env, kwargs)
        except ValueError as err:
            raise ConfigError(f"no baselines to draw: {err}") from err
        lines[env] = {name: score.mean for name, score in scores.items()}
    return lines


def _run_config(run_dir: str | Path) -> dict:
    """A run's ``config.yaml`` as data (without importing its algorithm)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (it has no config.yaml)")
    return read_yaml_file(path)
