"""Training throughput: env steps/s including updates, per algorithm, in one run.

Each algorithm trains with its default config (the packaged YAML for the env
included) for a fixed number of env steps on mpe2 ``simple_spread_v3`` (N=3,
max_cycles=25; continuous actions for MADDPG, discrete for the others), and
the rate of the last part is printed beside a random policy on the same
vector env.

    python benchmarks/train_throughput.py [--steps 40000] [--num-envs 16]
        [--backend sync] [--device cpu] [--algos mappo ippo maddpg dqn]
"""

from __future__ import annotations

import argparse
import platform
import time

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


def algo_rate(name: str, args: argparse.Namespace) -> float:
    from corral.algos.collector import Collector
    from corral.training import load_config
    from corral.training.runner import build_algorithm, build_venv, uses_state

    continuous = name == "maddpg"
    config = load_config(
        name,
        ENV,
        {
            "num_envs": args.num_envs,
            "backend": args.backend,
            "device": args.device,
            "env_kwargs": {"N": 3, "max_cycles": 25, "continuous_actions": continuous},
        },
    )
    venv = build_venv(config.run, state=uses_state(config))
    try:
        algo = build_algorithm(config, venv)
        collector = Collector(venv, algo, seed=0)
        return rate_of(lambda n: collector.run(n), args.steps)
    finally:
        venv.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40_000)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--backend", default="sync")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--algos", nargs="+", default=["mappo", "ippo", "maddpg", "dqn"])
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    print(
        f"machine: {platform.machine()}, python {platform.python_version()}, torch "
        f"{torch.__version__}, {torch.get_num_threads()} torch thread(s), GPU {gpu}"
    )
    print(
        f"env {ENV} (N=3, max_cycles=25), num_envs {args.num_envs}, backend {args.backend}, "
        f"device {args.device}, {args.steps:,} env steps each\n"
    )
    base = random_rate(args)
    print(f"{'random policy':>14}: {base:8,.0f} env steps/s")
    for name in args.algos:
        rate = algo_rate(name, args)
        print(
            f"{name:>14}: {rate:8,.0f} env steps/s ({rate / base:.2f}x the random policy)",
            flush=True,
        )


if __name__ == "__main__":
    main()
