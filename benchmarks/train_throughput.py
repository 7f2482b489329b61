"""Training throughput: env steps/s including updates, per algorithm, in one run.

Each algorithm trains through the command line users run (``corral train``,
in a subprocess) with its default config (the packaged YAML for the env
included) for a fixed number of env steps on mpe2 ``simple_spread_v3``
(N=3, max_cycles=25; continuous actions for MADDPG, discrete for the
others). The rate of the last three quarters, from the run's
``metrics.csv`` (time spent acting and learning; evaluation and checkpoints
excluded), is printed beside a random policy on the same vector env.
``--threads`` takes several ``torch_threads`` settings to compare them in
one run.

    python benchmarks/train_throughput.py [--steps 40000] [--num-envs 16]
        [--backend sync] [--device cpu] [--threads auto] [--algos mappo ippo maddpg dqn]
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ENV = "mpe2/simple_spread_v3"


def rate_of(run, steps: int) -> float:
    """Env steps/s of ``run(n)`` over the last three quarters of ``steps`` (after warm-up)."""
    warm = steps // 4
    run(warm)
    start = time.perf_counter()
    run(steps - warm)
    return (steps - warm) / (time.perf_counter() - start)


def random_rate(args: argparse.Namespace) -> float:
    import corral

    venv = corral.make_vec(
        ENV, args.num_envs, args.backend, seed=0, env_kwargs={"N": 3, "max_cycles": 25}
    )
    batch = [venv.reset()]
    rng = np.random.default_rng(0)

    def run(n: int) -> None:
        for _ in range(0, n, args.num_envs):
            batch[0] = venv.step(venv.sample_actions(batch[0], rng))

    try:
        return rate_of(run, args.steps)
    finally:
        venv.close()


def algo_rate(name: str, threads: str, args: argparse.Namespace) -> float:
    """Env steps/s of ``corral train name`` over the last three quarters of its steps."""
    from corral.training.metrics import read_metrics

    continuous = "true" if name == "maddpg" else "false"
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = [sys.executable, "-m", "corral", "train", name, "--env", ENV]
        command += ["--num-envs", str(args.num_envs), "--backend", args.backend]
        command += ["--device", args.device, "--total-steps", str(args.steps)]
        command += ["--run-dir", str(run_dir), "--no-progress", "--set"]
        command += [f"log_every={args.steps // 4}", f"torch_threads={threads}"]
        command += ["eval_every=0", "eval_episodes=1", "checkpoint_every=0", "tensorboard=false"]
        command += ["env_kwargs.N=3", "env_kwargs.max_cycles=25"]
        command += [f"env_kwargs.continuous_actions={continuous}"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr}")
        rows = read_metrics(run_dir)
    steps = seconds = 0.0
    for before, row in itertools.pairwise(rows):
        if before["env_steps"] >= args.steps // 4:
            part = row["env_steps"] - before["env_steps"]
            steps += part
            seconds += part / row["steps_per_s"]
    return steps / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--backend", default="sync")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads", nargs="+", default=["auto"], help="torch_threads settings to compare"
    )
    parser.add_argument("--algos", nargs="+", default=["mappo", "ippo", "maddpg", "dqn"])
    args = parser.parse_args()

    import torch

    from corral.training.threads import torch_threads

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    threads = ", ".join(f"{t} ({torch_threads(t)})" for t in args.threads)
    print(
        f"machine: {platform.machine()}, python {platform.python_version()}, torch "
        f"{torch.__version__}, {os.cpu_count()} cores, torch_threads {threads}, GPU {gpu}"
    )
    print(
        f"env {ENV} (N=3, max_cycles=25), num_envs {args.num_envs}, backend {args.backend}, "
        f"device {args.device}, {args.steps:,} env steps each, through `corral train`\n"
    )
    base = random_rate(args)
    print(f"{'random policy':>14}: {base:8,.0f} env steps/s")
    for name in args.algos:
        for setting in args.threads:
            rate = algo_rate(name, setting, args)
            label = name if len(args.threads) == 1 else f"{name} {setting}"
            print(
                f"{label:>14}: {rate:8,.0f} env steps/s ({rate / base:.2f}x the random policy)",
                flush=True,
            )


if __name__ == "__main__":
    main()
