"""MAPPO's training throughput with rollout workers on Ray against the single-process path.

MAPPO with its packaged settings for mpe2 ``simple_spread_v3`` (N=3, 25 steps, one
episode per rollout, 6 epochs x 4 minibatches) trains through the runner, either in
one process on ``--envs-per-runner`` envs, or on ``--runners 1 2 ...`` rollout workers
of ``--envs-per-runner`` envs each (``runners=N``, synchronous mode: every worker
samples with the same weights, the learner learns from their joined rollouts once).
The envs are mpe2's own dict envs (``native=False``), or with ``--native`` corral's
natively batched MPE. Each path makes one warm-up update, then ``--updates`` timed
ones; the paths alternate for ``--rounds`` rounds on one Ray started beforehand, and
each one's median is printed:

- env steps/s including the updates, and its ratio to one worker and to one process;
- where an update's milliseconds go: ``sample`` (the slowest worker inside its
  ``sample()``; one process: collecting), ``transfer`` (the rest of what the learner
  waited: putting the weights, scheduling, moving and unpickling the rollouts),
  ``join`` (joining the workers' rollouts), ``learn`` (the learner's update);
- ``wait``: the share of the wall clock the learner waited for the workers
  (``learner_wait_share``), ``learned``: the share it learned (the serial part), and
  ``ceiling``: the ratio N workers would reach against one if sampling spread over
  them at no cost (one worker's wall clock but its update, plus the N workers'
  measured update: Amdahl's bound with the learner as the serial part);
- the pickled bytes of one worker's rollout (``rollout_bytes``) and of a weights update.

    python benchmarks/ray_scaling.py [--runners 1 2] [--envs-per-runner 16] [--updates 5]
        [--rounds 3] [--native]
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

ENV = "mpe2/simple_spread_v3"
ROLLOUT_STEPS = 25  # the packaged setting for simple_spread: one episode per rollout
PARTS = ("sample", "transfer", "join", "learn")


def settings(runners: int, envs: int, native: bool, run_dir: str) -> dict[str, Any]:
    """The run's settings: the packaged MAPPO ones, nothing but the training loop."""
    shape = {"runners": runners, "envs_per_runner": envs} if runners else {"num_envs": envs}
    return {
        **shape,
        "native": native,
        "rollout_steps": ROLLOUT_STEPS,
        "total_steps": 10**9,
        "eval_every": 0,
        "eval_episodes": 1,
        "checkpoint_every": 0,
        "log_every": 10**9,
        "tensorboard": False,
        "device": "cpu",
        "run_dir": run_dir,
    }


def timed(call: Callable[..., Any], seconds: dict[str, float], part: str) -> Callable[..., Any]:
    """``call``, its seconds added to ``seconds[part]``."""

    def wrapper(*args: Any) -> Any:
        start = time.perf_counter()
        try:
            return call(*args)
        finally:
            seconds[part] += time.perf_counter() - start

    return wrapper


def measure(runners: int, envs: int, updates: int, native: bool) -> dict[str, float]:
    """One path's env steps/s over ``updates`` updates after a warm-up one, its
    milliseconds per update by part (:data:`PARTS`), shares and bytes."""
    from corral.training import Runner, load_config
    from corral.training.collector import Progress
    from corral.workers import worker_set

    seconds = dict.fromkeys(PARTS, 0.0)
    with tempfile.TemporaryDirectory() as run_dir:
        config = load_config("mappo", ENV, settings(runners, envs, native, run_dir))
        with Runner(config, progress=False) as runner:
            learners = list(runner.learners.values())
            learner = learners[0]
            concat = worker_set.concat_envs
            learner.learn = timed(learner.learn, seconds, "learn")  # type: ignore[method-assign]
            weights = sum(len(pickle.dumps(a.policy.weights(), 5)) for a in learners)
            workers = runner.workers
            progress = Progress()
            if workers is None:
                steps = envs * ROLLOUT_STEPS

                def update() -> None:
                    runner.collector.run(steps)

            else:
                steps = runners * envs * ROLLOUT_STEPS
                sample_all = workers._sample_all

                def timed_sample_all(refs: Any, progress: Any) -> Any:
                    got = sample_all(refs, progress)
                    seconds["sample"] += max(sample.seconds for sample in got)
                    return got

                workers._sample_all = timed_sample_all  # type: ignore[method-assign]
                worker_set.concat_envs = timed(concat, seconds, "join")

                def update() -> None:
                    workers.update(progress)

            try:
                update()  # warm-up
                seconds.update(dict.fromkeys(PARTS, 0.0))
                progress.updates.clear()
                start = time.perf_counter()
                for _ in range(updates):
                    update()
                wall = time.perf_counter() - start
            finally:
                worker_set.concat_envs = concat
    rows = progress.updates
    result = {
        "rate": steps * updates / wall,
        "wait share": statistics.mean(r["learner_wait_share"] for r in rows) if rows else 0.0,
        "learn share": seconds["learn"] / wall,
        "rollout bytes": statistics.mean(r["rollout_bytes"] for r in rows) if rows else 0.0,
        "weights bytes": float(weights),
    }
    waited = sum(r["learner_wait_s"] for r in rows)
    if workers is None:
        seconds["sample"] = wall - seconds["learn"]
    else:
        seconds["transfer"] = waited - seconds["sample"]
    result.update({part: seconds[part] / updates * 1e3 for part in PARTS})
    result["wall"] = wall / updates * 1e3
    return result


def paths(runners: list[int]) -> list[int]:
    """The paths measured: one process (0), then each count of workers."""
    return [0, *sorted(set(runners))]


def run(
    runners: list[int], envs: int, updates: int, rounds: int, native: bool
) -> dict[int, list[dict[str, float]]]:
    """Each path's results of every round, the paths alternating, on one local Ray of at
    least as many CPUs as the machine has cores or the most workers ask for."""
    import ray

    started = not ray.is_initialized()
    if started:
        cpus = max(os.cpu_count() or 1, *runners)
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    results: dict[int, list[dict[str, float]]] = {n: [] for n in paths(runners)}
    try:
        for _ in range(rounds):
            for n in results:
                results[n].append(measure(n, envs, updates, native))
    finally:
        if started:
            ray.shutdown()
    return results


def medians(results: dict[int, list[dict[str, float]]]) -> dict[int, dict[str, float]]:
    return {
        n: {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
        for n, rounds in results.items()
    }


def ceiling(n: int, one: dict[str, float], many: dict[str, float]) -> float:
    """The ratio of ``n`` workers (``many``) to one (``one``) if everything but the update
    took one worker's time: the learner's update is the serial part."""
    return n * one["wall"] / (one["wall"] - one["learn"] + many["learn"])


def report(results: dict[int, list[dict[str, float]]], envs: int) -> str:
    """The medians of each path as a table, with the ratios to one worker and one process."""
    table = medians(results)
    single = table[0]["rate"]
    one = table.get(1)
    head = (
        f"{'path':<10} {'envs':>5} {'env steps/s':>11} {'x 1 worker':>10} {'x 1 process':>11}"
        f" {'sample':>7} {'transfer':>8} {'join':>5} {'learn':>6} {'wait':>5} {'learned':>7}"
        f" {'ceiling':>7} {'rollout KB':>10}"
    )
    lines = [head + "   (ms per update; wait, learned: shares of the wall clock)"]
    for n, row in table.items():
        name = "1 process" if n == 0 else f"{n} worker" + "s" * (n > 1)
        versus_one = f"{row['rate'] / one['rate']:.2f}" if n and one else "-"
        bound = f"{ceiling(n, one, row):.2f}" if n and one else "-"
        rollout = f"{row['rollout bytes'] / 1e3:.0f}" if n else "-"
        wait = f"{row['wait share']:.2f}" if n else "-"
        lines.append(
            f"{name:<10} {envs * max(n, 1):>5} {row['rate']:>11,.0f} {versus_one:>10}"
            f" {row['rate'] / single:>11.2f} {row['sample']:>7.0f} {row['transfer']:>8.1f}"
            f" {row['join']:>5.1f} {row['learn']:>6.0f} {wait:>5}"
            f" {row['learn share']:>7.2f} {bound:>7} {rollout:>10}"
        )
    lines.append(f"weights update: {table[0]['weights bytes'] / 1e3:.0f} KB per put")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runners", type=int, nargs="+", default=[1, 2], help="worker counts")
    parser.add_argument("--envs-per-runner", type=int, default=16, help="envs of each worker")
    parser.add_argument("--updates", type=int, default=5, help="timed updates per path")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all the paths")
    parser.add_argument("--native", action="store_true", help="corral's natively batched MPE")
    args = parser.parse_args(argv)
    if min(args.runners) < 1 or args.envs_per_runner < 1 or args.updates < 1 or args.rounds < 1:
        parser.error("--runners, --envs-per-runner, --updates and --rounds must be 1 or more")
    results = run(args.runners, args.envs_per_runner, args.updates, args.rounds, args.native)
    kind = "native MPE" if args.native else "dict envs (native=False)"
    print(
        f"MAPPO on {ENV}, {kind}, {ROLLOUT_STEPS} steps per rollout, median of "
        f"{args.rounds} rounds of {args.updates} updates, {os.cpu_count()} cores"
    )
    print(report(results, args.envs_per_runner))


if __name__ == "__main__":
    main()
