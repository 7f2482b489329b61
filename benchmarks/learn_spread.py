"""Learning targets on mpe2 simple_spread_v3: MAPPO (discrete) and MADDPG (continuous).

Trains one run per seed with ``corral train`` (each in its own process, one
torch thread each, ``--jobs`` at a time), then prints every seed's
evaluations and checks the target against the mean over seeds of the
evaluation curve, and draws the curves with ``corral plot``.

The env is the issue's: N=3, max_cycles=25, local_ratio=0.5 (mpe2's
default). An evaluation is ``eval_episodes`` greedy episodes; an episode's
return is each agent's reward summed over its 25 steps, averaged over the 3
agents. Targets: MAPPO >= -13 within 5M env steps, MADDPG >= -14 within 2M
env steps, on the mean of 3 seeds.

A run directory that already exists is resumed (``corral train --resume``,
up to ``--total-steps``), so a killed benchmark goes on where it stopped; ``--report`` only reads
finished runs.

    python benchmarks/learn_spread.py mappo [--seeds 0 1 2] [--total-steps 5e6]
        [--jobs 2] [--out runs/bench] [--set KEY=VALUE ...] [--report]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import numpy as np

from corral.training.metrics import read_metrics

ENV = "mpe2/simple_spread_v3"
TARGETS = {"mappo": (-13.0, 5_000_000), "maddpg": (-14.0, 2_000_000)}
ENV_SETTINGS = ["env_kwargs.N=3", "env_kwargs.max_cycles=25", "env_kwargs.local_ratio=0.5"]
CONTINUOUS = {"mappo": False, "maddpg": True}


def command(args: argparse.Namespace, seed: int) -> list[str]:
    """The ``corral train`` command line of one seed (a resume if its run exists)."""
    run_dir = args.out / f"{args.algo}-s{seed}"
    common = ["--total-steps", str(int(args.total_steps)), "--no-progress"]
    corral = [sys.executable, "-m", "corral", "train"]
    if (run_dir / "checkpoint.pt").exists():
        return [*corral, "--resume", str(run_dir), *common]
    continuous = f"env_kwargs.continuous_actions={str(CONTINUOUS[args.algo]).lower()}"
    return [
        *corral,
        args.algo,
        "--env",
        ENV,
        "--seed",
        str(seed),
        "--run-dir",
        str(run_dir),
        *common,
        "--set",
        *ENV_SETTINGS,
        continuous,
        *args.set,
    ]


def train(args: argparse.Namespace) -> None:
    """Run every seed, ``args.jobs`` at a time; each writes ``<out>/<algo>-s<seed>.log``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    pending = list(args.seeds)
    running: list[tuple[int, subprocess.Popen, IO[str]]] = []
    start = time.perf_counter()
    while pending or running:
        while pending and len(running) < args.jobs:
            seed = pending.pop(0)
            log = open(args.out / f"{args.algo}-s{seed}.log", "a")  # noqa: SIM115
            proc = subprocess.Popen(command(args, seed), stdout=log, stderr=log, env=env)
            running.append((seed, proc, log))
        time.sleep(5)
        for seed, proc, log in list(running):
            if proc.poll() is not None:
                running.remove((seed, proc, log))
                log.close()
                took = time.perf_counter() - start
                print(f"seed {seed}: exit {proc.returncode} after {took / 60:.1f} min", flush=True)
                if proc.returncode != 0:
                    sys.exit(f"seed {seed} failed: see {args.out / f'{args.algo}-s{seed}.log'}")


def evaluations(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(env steps, evaluation return) of every evaluation of a run."""
    rows = [r for r in read_metrics(run_dir / "metrics.csv") if "eval_return" in r]
    return np.array([r["env_steps"] for r in rows]), np.array([r["eval_return"] for r in rows])


def report(args: argparse.Namespace) -> bool:
    """Print every seed's evaluations and the target check; ``True`` if it is met."""
    target, budget = TARGETS[args.algo]
    runs = [args.out / f"{args.algo}-s{seed}" for seed in args.seeds]
    curves = [evaluations(run) for run in runs]
    for seed, (steps, returns) in zip(args.seeds, curves, strict=True):
        best = int(np.argmax(returns))
        print(
            f"seed {seed}: {len(steps)} evaluations up to {steps[-1]:,.0f} steps; "
            f"best {returns[best]:.2f} at {steps[best]:,.0f}; final {returns[-1]:.2f}"
        )
    # runs still going may be an evaluation apart: average where every seed has one
    shared = min(len(steps) for steps, _ in curves)
    grid = curves[0][0][:shared]
    if not all(np.array_equal(steps[:shared], grid) for steps, _ in curves):
        sys.exit("the seeds were evaluated at different env steps: cannot average them")
    mean = np.mean([returns[:shared] for _, returns in curves], axis=0)
    spread = np.std([returns[:shared] for _, returns in curves], axis=0)
    every = max(1, len(grid) // 10)
    print(f"\nmean over {len(runs)} seeds (std across seeds), every {every}th evaluation:")
    for i in range(0, len(grid), every):
        print(f"  {grid[i]:>10,.0f} env steps: {mean[i]:7.2f} ({spread[i]:.2f})")
    within = grid <= budget
    best = int(np.argmax(np.where(within, mean, -np.inf)))
    met = bool(mean[best] >= target)
    first = next((s for s, m in zip(grid, mean, strict=True) if m >= target), None)
    print(
        f"\nbest mean within {budget:,} env steps: {mean[best]:.2f} at {grid[best]:,.0f} "
        f"(target >= {target}): {'met' if met else 'NOT met'}"
        + (f"; first reached at {first:,.0f} env steps" if first is not None else "")
    )
    print(f"final mean: {mean[-1]:.2f} ({spread[-1]:.2f}) at {grid[-1]:,.0f} env steps")
    png = args.out / f"{args.algo}_simple_spread.png"
    subprocess.run(
        [sys.executable, "-m", "corral", "plot", *map(str, runs), "-o", str(png)], check=True
    )
    print(f"curves: {png}")
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("algo", choices=sorted(TARGETS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--total-steps", type=float, default=None)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("runs/bench"))
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE")
    parser.add_argument("--report", action="store_true", help="only report finished runs")
    args = parser.parse_args()
    if args.total_steps is None:
        args.total_steps = TARGETS[args.algo][1]
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        train(args)
    sys.exit(0 if report(args) else 1)


if __name__ == "__main__":
    main()
