"""A learner on mpe2 simple_spread_v3 against the wall clock: when does it reach a target?

Runs ``corral train ALGO`` (MAPPO unless ``--algo`` or the config says) once
per seed, one seed at a time (each alone on the machine), and notes when each
evaluation line reaches the process's output, counted from the moment the
process was started: the clock includes importing corral and torch, building
the envs and the evaluations. Then it
prints, per seed and averaged over seeds, each evaluation's return against
env steps and seconds, the first time the mean over seeds reaches the target,
and draws both curves with the random and scripted-heuristic baselines. The
curves are also written as a table, ``<out>/curve.csv`` (one row per seed and
evaluation, and the mean's rows with seed ``mean``).

``--config FILE`` names a YAML mapping of settings (``algo`` and ``target``
among them, if it likes; any other key is a ``--set`` setting, a nested
mapping such as ``env_kwargs`` dotted), applied before ``--set``'s:
``benchmarks/spread_10min.yaml`` holds the settings of issue 27's target.

The measure is the issue's: greedy evaluation, per-agent episode return
averaged over agents, N=3, max_cycles=25, local_ratio=0.5.

    python benchmarks/learn_wallclock.py [--seeds 0 1 2] [--seconds 90] [--target -13]
        [--algo mappo] [--config FILE] [--out runs/wallclock] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from corral.training.baselines import reference_scores
from corral.training.metrics import read_metrics

ENV = "mpe2/simple_spread_v3"
ENV_SETTINGS = ["env_kwargs.N=3", "env_kwargs.max_cycles=25", "env_kwargs.local_ratio=0.5"]
EVAL_LINE = re.compile(r"steps ([\d,]+)/[\d,]+ .*\| eval (-?[\d.]+)")


def command(args: argparse.Namespace, seed: int) -> list[str]:
    """The ``corral train`` command line of one seed, its run directory ``<out>/s<seed>``."""
    return [
        sys.executable,
        "-m",
        "corral",
        "train",
        args.algo,
        "--env",
        ENV,
        "--seed",
        str(seed),
        "--run-dir",
        str(args.out / f"s{seed}"),
        "--total-steps",
        str(int(args.total_steps)),
        "--no-progress",
        "--set",
        *ENV_SETTINGS,
        f"eval_every={args.eval_every}",
        f"eval_episodes={args.eval_episodes}",
        f"log_every={args.eval_every}",
        *args.set,
    ]


def train(args: argparse.Namespace, seed: int) -> list[tuple[int, float, float]]:
    """``(env steps, seconds since the process started, eval return)`` of each evaluation
    of one seed's run (its log goes to ``<out>/s<seed>.log``)."""
    run_dir = args.out / f"s{seed}"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    evaluations = []
    start = time.perf_counter()
    with (
        open(args.out / f"s{seed}.log", "w") as log,
        subprocess.Popen(
            command(args, seed),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        ) as proc,
    ):
        for line in proc.stdout:
            now = time.perf_counter() - start
            log.write(f"[{now:7.2f} s] {line}")
            hit = EVAL_LINE.search(line)
            if hit:
                steps, value = int(hit[1].replace(",", "")), float(hit[2])
                evaluations.append((steps, now, value))
                if now > args.seconds:
                    proc.terminate()
    if proc.returncode not in (0, -15):
        sys.exit(f"seed {seed} failed ({proc.returncode}): see {args.out / f's{seed}.log'}")
    # the log line rounds the return: take it from metrics.csv, the time from the line
    exact = {r["env_steps"]: r["eval_return"] for r in read_metrics(run_dir) if "eval_return" in r}
    return [(steps, seconds, exact.get(steps, value)) for steps, seconds, value in evaluations]


def config_settings(path: Path) -> tuple[dict[str, object], list[str]]:
    """``algo`` and ``target`` of a ``--config`` file (those it names), and its other keys as
    ``--set`` items (nested mappings dotted: ``env_kwargs.N=3``)."""
    import yaml

    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        sys.exit(f"--config {path}: expected a mapping of settings, got {type(data).__name__}")
    chosen = {key: data.pop(key) for key in ("algo", "target") if key in data}

    def items(prefix: str, mapping: dict) -> list[str]:
        out = []
        for key, value in mapping.items():
            if isinstance(value, dict):
                out += items(f"{prefix}{key}.", value)
            else:
                out.append(f"{prefix}{key}={json.dumps(value)}")
        return out

    return chosen, items("", data)


def write_curve(path: Path, runs: dict[int, list[tuple[int, float, float]]], shared: int) -> None:
    """Every seed's evaluations, then the mean over seeds (the slowest seed's seconds) at
    the evaluations all seeds reached, as ``seed,env_steps,seconds,eval_return`` rows."""
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["seed", "env_steps", "seconds", "eval_return"])
        for seed, evals in runs.items():
            writer.writerows([seed, s, f"{t:.2f}", v] for s, t, v in evals)
        for i in range(shared):
            steps = next(iter(runs.values()))[i][0]
            seconds = max(e[i][1] for e in runs.values())
            mean = float(np.mean([e[i][2] for e in runs.values()]))
            writer.writerow(["mean", steps, f"{seconds:.2f}", mean])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", default=None, help="mappo (default), ippo, maddpg, ...")
    parser.add_argument("--config", type=Path, help="a YAML file of settings (see above)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seconds", type=float, default=90.0, help="stop a seed after this")
    parser.add_argument("--total-steps", type=float, default=5e6)
    parser.add_argument("--target", type=float, default=None, help="default -13")
    parser.add_argument("--eval-every", type=int, default=50_000)
    parser.add_argument("--eval-episodes", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("runs/wallclock"))
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    chosen, settings = config_settings(args.config) if args.config else ({}, [])
    args.algo = args.algo or str(chosen.get("algo", "mappo"))
    args.target = args.target if args.target is not None else float(chosen.get("target", -13))
    args.set = [*settings, *args.set]
    args.out.mkdir(parents=True, exist_ok=True)

    runs = {seed: train(args, seed) for seed in args.seeds}
    for seed, evals in runs.items():
        first = next(((s, t) for s, t, v in evals if v >= args.target), None)
        best = max(evals, key=lambda e: e[2])
        reach = "not reached" if first is None else f"at {first[0]:,} steps, {first[1]:.1f} s"
        print(
            f"seed {seed}: {args.target} {reach}; best {best[2]:.2f} at {best[0]:,} steps, "
            f"{best[1]:.1f} s"
        )
    shared = min(len(e) for e in runs.values())
    write_curve(args.out / "curve.csv", runs, shared)
    print(f"curve: {args.out / 'curve.csv'}")
    steps = np.array([s for s, _, _ in runs[args.seeds[0]][:shared]])
    seconds = np.array([[t for _, t, _ in e[:shared]] for e in runs.values()])
    returns = np.array([[v for _, _, v in e[:shared]] for e in runs.values()])
    mean, slowest = returns.mean(0), seconds.max(0)
    print(f"\nmean over seeds {args.seeds} (seconds: the slowest seed's):")
    for i in range(shared):
        print(f"  {steps[i]:>10,} env steps {slowest[i]:6.1f} s: {mean[i]:7.2f}")
    first = next((i for i in range(shared) if mean[i] >= args.target), None)
    if first is None:
        print(f"\nthe mean over seeds does not reach {args.target}")
    else:
        print(
            f"\nthe mean over seeds reaches {args.target} at {steps[first]:,} env steps, "
            f"{slowest[first]:.1f} s after the processes started (slowest seed)"
        )
    plot(args, steps, seconds, returns)


def plot(args: argparse.Namespace, steps: np.ndarray, seconds: np.ndarray, returns: np.ndarray):
    """Both curves (per seed, and the mean) with the baselines, to ``<out>/curves.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kwargs = {"N": 3, "max_cycles": 25, "local_ratio": 0.5}
    baselines = reference_scores(ENV, kwargs, episodes=1000)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, xs, label in ((axes[0], seconds, "seconds since start"), (axes[1], None, "env steps")):
        for k, seed in enumerate(args.seeds):
            x = steps if xs is None else xs[k]
            ax.plot(x, returns[k], alpha=0.4, label=f"seed {seed}")
        x = steps if xs is None else xs.max(0)
        ax.plot(x, returns.mean(0), color="black", label="mean")
        for name, score in baselines.items():
            ax.axhline(score.mean, linestyle="--", color="grey")
            ax.annotate(f"{name} {score.mean:.1f}", (x[0], score.mean), va="bottom")
        ax.axhline(args.target, linestyle=":", color="red")
        ax.set_xlabel(label)
    axes[0].set_ylabel("eval return (per agent)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(args.out / "curves.png")
    print(f"curves: {args.out / 'curves.png'}")


if __name__ == "__main__":
    main()
