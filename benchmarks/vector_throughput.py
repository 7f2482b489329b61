"""Env-steps/s of corral's vector backends against a raw PettingZoo loop.

Everything is measured in one run on one machine, on mpe2 ``simple_spread_v3``
(N=3, discrete actions, max_cycles=25) with actions generated beforehand, and
printed as ratios to the raw loop. corral steps mpe2's own envs, one per copy
(``native=False`` where ``make_vec`` takes it): this measures vectorising dict
envs; corral's natively batched MPE is ``batched_mpe.py``'s. When installed, AgileRL's
``AsyncPettingZooVecEnv`` and SuperSuit's ``concat_vec_envs_v1`` run on the
same env in the same run.

    python benchmarks/vector_throughput.py [--seconds 2] [--num-envs 1 2 4 8 16 32 64]

``--check-finite`` measures instead what ``check_finite=True`` costs: the
``sync`` backend on ``simple_spread_v3`` and ``corral/tag``, with it off and on,
in alternating rounds (the median of each is printed):

    python benchmarks/vector_throughput.py --check-finite [--rounds 5] [--num-envs 1 16]

``--ceiling`` compares ``subproc`` with 2 workers to the 2-core ceiling of
corral's own env path: two independent processes, each running ``sync`` on
half the envs, started together (the sum of their env-steps/s), in
alternating rounds (the median of each and their ratio are printed):

    python benchmarks/vector_throughput.py --ceiling [--rounds 3] [--num-envs 16 64]

``--before-src PATH`` (another checkout's ``src``; ``--compare`` says the same and
needs it) measures two source trees in one run: "before" and "after" (``--after-src``,
by default the ``src`` of the tree this script lives in). The script runs itself in a
subprocess with ``PYTHONPATH`` set to each tree, alternating (before, after, before,
after, ...) for ``--rounds`` rounds, each subprocess timing every backend and
num_envs and the raw loop (the same code in both trees: its ratio shows the noise),
and prints each tree's median env-steps/s and ``after / before`` with each round's:

    python benchmarks/vector_throughput.py --before-src PATH [--rounds 3] [--backends sync]
        [--num-envs 1 2 4] [--after-src PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import multiprocessing
import os
import platform
import queue
import resource
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from source_trees import add_tree_options, chosen_trees, describe_tree, print_result, run_child

ENV_KWARGS = {"N": 3, "max_cycles": 25, "continuous_actions": False}
NUM_ACTIONS = 5
CHECK_FINITE_ENVS = {"mpe2/simple_spread_v3": ENV_KWARGS, "corral/tag": {}}
CEILING_TARGET = 0.85
# How long the parent waits for the ceiling's processes to build their envs.
CEILING_START_TIMEOUT = 120.0
HERE = Path(__file__).resolve()


def raw_env():
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(**ENV_KWARGS)


def timed(
    step: Callable[[int], None],
    steps_per_call: int,
    seconds: float,
    ready: Callable[[], Any] | None = None,
) -> float:
    """Env-steps/s of ``step(k)`` called for ``seconds`` after a short warm-up.

    ``ready()``, when given, is called between the warm-up and the timing.
    """
    for k in range(3):
        step(k)
    if ready is not None:
        ready()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(calls)
        calls += 1
    return calls * steps_per_call / (time.perf_counter() - start)


def bench_raw(seconds: float) -> float:
    env = raw_env()
    env.reset(seed=0)
    acts = np.random.default_rng(0).integers(0, NUM_ACTIONS, size=(4096, 3))
    agents = list(env.possible_agents)

    def step(k: int) -> None:
        if not env.agents:
            env.reset()
        row = acts[k % len(acts)]
        env.step({a: int(row[j]) for j, a in enumerate(agents)})

    return timed(step, 1, seconds)


def bench_corral(
    backend: str, num_envs: int, seconds: float, ready: Callable[[], Any] | None = None
) -> float:
    import corral

    options = {} if backend == "sync" else {"num_workers": 2}
    venv = corral.make_vec(
        "mpe2/simple_spread_v3",
        num_envs,
        backend,
        seed=0,
        env_kwargs=ENV_KWARGS,
        copy=False,
        **dict_envs(corral),
        **options,
    )
    venv.reset()
    acts = np.random.default_rng(0).integers(0, NUM_ACTIONS, size=(256, num_envs, 3))
    try:
        return timed(lambda k: venv.step({"agent": acts[k % len(acts)]}), num_envs, seconds, ready)
    finally:
        venv.close()


def _ceiling_half(num_envs: int, seconds: float, barrier: Any, results: Any) -> None:
    """One process of the ceiling: ``sync`` on ``num_envs`` envs, timed from ``barrier``."""
    try:
        rate = bench_corral("sync", num_envs, seconds, ready=barrier.wait)
    except BaseException:
        barrier.abort()  # the parent and the other process stop waiting for this one
        results.put(traceback.format_exc())  # the parent raises it
        return
    results.put(rate)


def bench_ceiling(num_envs: int, seconds: float) -> float:
    """Env-steps/s of two processes each running ``sync`` on half the envs at once."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(3)  # the two processes and this one
    results = context.Queue()
    halves = (num_envs // 2, num_envs - num_envs // 2)
    procs = [
        context.Process(target=_ceiling_half, args=(n, seconds, barrier, results), daemon=True)
        for n in halves
    ]
    for proc in procs:
        proc.start()
    try:
        # Broken when a process failed (its traceback is in results) or hung.
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(CEILING_START_TIMEOUT)
        try:
            rates = [results.get(timeout=CEILING_START_TIMEOUT + seconds) for _ in procs]
        except queue.Empty:
            raise RuntimeError(
                f"a ceiling process gave no result within {CEILING_START_TIMEOUT + seconds:g} s"
            ) from None
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
    # The process that failed first, not the one whose barrier it broke.
    errors = sorted((r for r in rates if isinstance(r, str)), key=lambda e: "BrokenBarrier" in e)
    if errors:
        raise RuntimeError(f"a ceiling process failed:\n{errors[0]}")
    return sum(rates)


def compare_ceiling(num_envs: list[int], seconds: float, rounds: int) -> None:
    """Print subproc's env-steps/s (2 workers), the 2-core ceiling's and their ratio."""
    print(
        f"mpe2 simple_spread_v3, copy=False, median of {rounds} alternating rounds of "
        f"{seconds:g} s each\nceiling: two processes, each running sync on half the envs, "
        "started together (the sum of their env-steps/s)\n"
    )
    print(f"{'num_envs':>8}{'subproc':>12}{'ceiling':>12}{'subproc/ceiling':>17}")
    ratios = []
    for n in num_envs:
        bench = {
            "subproc": lambda n=n: bench_corral("subproc", n, seconds),
            "ceiling": lambda n=n: bench_ceiling(n, seconds),
        }
        runs: dict[str, list[float]] = {name: [] for name in bench}
        for r in range(rounds):
            for name in ("subproc", "ceiling") if r % 2 == 0 else ("ceiling", "subproc"):
                runs[name].append(bench[name]())
        subproc, ceiling = (float(np.median(runs[k])) for k in ("subproc", "ceiling"))
        ratios.append(subproc / ceiling)
        per_round = " ".join(
            f"{s / c:.2f}" for s, c in zip(runs["subproc"], runs["ceiling"], strict=True)
        )
        print(
            f"{n:>8}{subproc:>12,.0f}{ceiling:>12,.0f}{subproc / ceiling:>17.3f}"
            f"  (rounds: {per_round})"
        )
    worst = min(ratios)
    print(
        f"\ntarget: subproc >= {CEILING_TARGET} x the ceiling: worst {worst:.3f} "
        f"-> {'met' if worst >= CEILING_TARGET else 'NOT met'}"
    )


def dict_envs(corral: Any) -> dict[str, bool]:
    """``native=False`` where ``make_vec`` takes it (trees before issue 11 do not)."""
    return {"native": False} if "native" in inspect.signature(corral.make_vec).parameters else {}


def bench_check_finite(id: str, num_envs: int, seconds: float, check_finite: bool) -> float:
    """Env-steps/s of ``id`` on ``sync`` with random legal actions (masks honoured)."""
    import corral

    venv = corral.make_vec(
        id,
        num_envs,
        "sync",
        seed=0,
        env_kwargs=CHECK_FINITE_ENVS[id],
        copy=False,
        **dict_envs(corral),
        check_finite=check_finite,
    )
    batch = venv.reset()
    rng = np.random.default_rng(0)
    keys = {g: rng.random((64, *mask.shape)) for g, mask in batch.action_mask.items()}

    def step(k: int) -> None:
        masks = batch.action_mask  # views: the latest step's masks
        venv.step({g: np.argmax(np.where(masks[g], keys[g][k % 64], -1.0), -1) for g in keys})

    try:
        return timed(step, num_envs, seconds)
    finally:
        venv.close()


def compare_check_finite(num_envs: list[int], seconds: float, rounds: int) -> None:
    """Print env-steps/s with check_finite off and on, and their ratio."""
    print(f"sync backend, median of {rounds} alternating rounds of {seconds:g} s each\n")
    print(f"{'env':<24}{'num_envs':>9}{'off':>12}{'on':>12}{'on/off':>9}")
    for id in CHECK_FINITE_ENVS:
        for n in num_envs:
            runs: dict[bool, list[float]] = {False: [], True: []}
            for r in range(rounds):
                for on in (False, True) if r % 2 == 0 else (True, False):
                    runs[on].append(bench_check_finite(id, n, seconds, on))
            off, on = (float(np.median(runs[k])) for k in (False, True))
            print(f"{id:<24}{n:>9}{off:>12,.0f}{on:>12,.0f}{on / off:>9.3f}")


def bench_agilerl(num_envs: int, seconds: float) -> float:
    from agilerl.vector.pz_async_vec_env import AsyncPettingZooVecEnv

    venv = AsyncPettingZooVecEnv([raw_env] * num_envs)
    venv.reset(seed=0)
    agents = list(venv.possible_agents)
    acts = np.random.default_rng(0).integers(0, NUM_ACTIONS, size=(256, 3, num_envs))
    try:
        return timed(
            lambda k: venv.step({a: acts[k % 256, j] for j, a in enumerate(agents)}),
            num_envs,
            seconds,
        )
    finally:
        venv.close()


def bench_supersuit(num_envs: int, seconds: float) -> float:
    import supersuit as ss

    vec = ss.pettingzoo_env_to_vec_env_v1(raw_env())
    venv = ss.concat_vec_envs_v1(vec, num_envs, num_cpus=2, base_class="gymnasium")
    venv.reset(seed=0)
    acts = np.random.default_rng(0).integers(0, NUM_ACTIONS, size=(256, num_envs * 3))
    try:
        return timed(lambda k: venv.step(acts[k % 256]), num_envs, seconds)
    finally:
        venv.close()


def compare_child(backends: list[str], num_envs: list[int], seconds: float) -> None:
    """Time the tree on ``PYTHONPATH`` (the raw loop, then each backend at each num_envs)
    and print one ``RESULT`` JSON line."""
    rates: dict[str, dict[str, float]] = {"raw": {"1": bench_raw(seconds)}}
    ray = "ray" in backends and importlib.util.find_spec("ray") is not None
    if ray:
        import ray as ray_module

        ray_module.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    for backend in backends:
        if backend != "ray" or ray:
            rates[backend] = {str(n): bench_corral(backend, n, seconds) for n in num_envs}
    if ray:
        ray_module.shutdown()
    print_result({"rates": rates})


def run_tree(src: str, backends: list[str], num_envs: list[int], seconds: float) -> dict:
    """One round of the tree ``src``, in a fresh interpreter: backend -> num_envs -> rate."""
    command = ["--compare-child", "--seconds", str(seconds), "--backends", *backends]
    return run_child(src, HERE, [*command, "--num-envs", *map(str, num_envs)])["rates"]


def compare_trees(
    trees: dict[str, str], backends: list[str], num_envs: list[int], seconds: float, rounds: int
) -> None:
    """Print each tree's median env-steps/s per backend and num_envs, and after / before
    with each round's ratio."""
    for name, src in trees.items():
        print(f"{name}: {describe_tree(src)}")
    print(
        f"mpe2 simple_spread_v3, copy=False, median of {rounds} alternating rounds of "
        f"{seconds:g} s per measurement; env-steps/s"
    )
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(rounds):
        for name, src in trees.items():
            runs[name].append(run_tree(src, backends, num_envs, seconds))
    print(f"\n{'backend':<10}{'num_envs':>9}{'before':>10}{'after':>10}{'after/before':>14}")
    columns = {"raw": ["1"], **{b: [str(n) for n in num_envs] for b in backends}}
    for backend, ns in columns.items():
        if backend not in runs["after"][0] or backend not in runs["before"][0]:
            print(f"{backend:<10}  (not measured: not installed)")
            continue
        for n in ns:
            before, after = ([r[backend][n] for r in runs[t]] for t in ("before", "after"))
            ratio = float(np.median(after)) / float(np.median(before))
            per_round = " ".join(f"{a / b:.2f}" for b, a in zip(before, after, strict=True))
            label = "raw loop" if backend == "raw" else backend
            print(
                f"{label:<10}{n:>9}{np.median(before):>10,.0f}{np.median(after):>10,.0f}"
                f"{ratio:>14.3f}  (rounds: {per_round})"
            )


def peak_memory_mib() -> tuple[float, float]:
    """Peak resident memory of this process and of its largest finished child, in MiB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, children


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument(
        "--num-envs", type=int, nargs="+", help="default: 1 2 4 8 16 32 64 (--ceiling: 16 64)"
    )
    parser.add_argument("--backends", nargs="+", default=["sync", "subproc", "ray"])
    parser.add_argument(
        "--check-finite", action="store_true", help="measure what check_finite=True costs"
    )
    parser.add_argument(
        "--ceiling", action="store_true", help="compare subproc to the 2-core ceiling"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="compare two source trees, alternating (what --before-src asks for)",
    )
    add_tree_options(parser)
    parser.add_argument("--compare-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--rounds",
        type=int,
        help="rounds of --check-finite (default 5), --ceiling (3) or --compare (3)",
    )
    args = parser.parse_args()
    if args.compare and args.before_src is None:
        parser.error("--compare needs --before-src PATH: the src of the tree to compare with")
    args.compare = args.before_src is not None
    if args.check_finite + args.ceiling + args.compare > 1:
        parser.error("--check-finite, --ceiling and --before-src (--compare) are separate runs")
    if args.num_envs is None:
        args.num_envs = [16, 64] if args.ceiling else [1, 2, 4, 8, 16, 32, 64]
    if args.ceiling and min(args.num_envs) < 2:
        parser.error("--ceiling splits the envs between two processes: --num-envs must be >= 2")
    if args.compare_child:
        compare_child(args.backends, args.num_envs, args.seconds)
        return
    if args.compare:
        trees = chosen_trees(parser, args)
    if args.check_finite or args.ceiling or args.compare:
        print(
            f"machine: {platform.machine()}, {platform.processor() or '?'}, "
            f"python {platform.python_version()}, {_cpus()} cores, load average "
            + " ".join(f"{x:.2f}" for x in os.getloadavg())
        )
        if args.check_finite:
            compare_check_finite(args.num_envs, args.seconds, args.rounds or 5)
        elif args.compare:
            compare_trees(trees, args.backends, args.num_envs, args.seconds, args.rounds or 3)
        else:
            compare_ceiling(args.num_envs, args.seconds, args.rounds or 3)
        print("load average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
        return

    runners: dict[str, Callable[[int], float]] = {
        name: (lambda n, b=name: bench_corral(b, n, args.seconds))
        for name in args.backends
        if name != "ray"
    }
    if importlib.util.find_spec("agilerl") is not None:
        runners["agilerl-async"] = lambda n: bench_agilerl(n, args.seconds)
    if importlib.util.find_spec("supersuit") is not None:
        runners["supersuit-concat"] = lambda n: bench_supersuit(n, args.seconds)

    print(
        f"machine: {platform.machine()}, {platform.processor() or '?'}, "
        f"python {platform.python_version()}, {_cpus()} cores"
    )
    raw = bench_raw(args.seconds)
    results: dict[str, dict[int, float]] = {name: {} for name in runners}
    for n in args.num_envs:
        for name, run in runners.items():
            results[name][n] = run(n)
    if "ray" in args.backends and importlib.util.find_spec("ray") is not None:
        # Ray's daemons use CPU while Ray runs, so its column is measured alone, last.
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        results["ray"] = {n: bench_corral("ray", n, args.seconds) for n in args.num_envs}
        ray.shutdown()
    raw_after = bench_raw(args.seconds)
    print(
        f"raw PettingZoo loop: {raw:,.0f} env-steps/s before, {raw_after:,.0f} after; "
        f"ratios below are to their mean"
    )
    raw = (raw + raw_after) / 2
    print("\nnum_envs " + "".join(f"{name:>22}" for name in results))
    for n in args.num_envs:
        cells = [f"{r[n]:>12,.0f} ({r[n] / raw:4.2f}x)" for r in results.values()]
        print(f"{n:>8} " + "".join(f"{c:>22}" for c in cells))
    own, child = peak_memory_mib()
    print(f"\npeak memory: parent {own:.0f} MiB, largest child {child:.0f} MiB")
    _print_targets(raw, results)


def _print_targets(raw: float, results: dict[str, dict[int, float]]) -> None:
    print("\ntargets:")
    sync = results.get("sync", {}).get(1)
    if sync:
        print(
            f"  sync at num_envs 1 within 15% of raw: {sync / raw:.2f}x "
            f"-> {'met' if sync >= 0.85 * raw else 'NOT met'}"
        )
    subproc = results.get("subproc", {})
    big = [n for n in subproc if n >= 16]
    if big:
        worst = min(subproc[n] for n in big) / raw
        print(
            f"  subproc >= 1.7x raw from num_envs 16: worst {worst:.2f}x "
            f"-> {'met' if worst >= 1.7 else 'NOT met'}"
        )
    for other in ("agilerl-async", "supersuit-concat"):
        if other in results and subproc:
            ns = [n for n in subproc if n >= 4 and n in results[other]]
            ahead = all(subproc[n] > results[other][n] for n in ns)
            ratios = ", ".join(f"{n}: {subproc[n] / results[other][n]:.2f}x" for n in ns)
            print(
                f"  subproc ahead of {other} from num_envs 4: {ratios} "
                f"-> {'met' if ahead else 'NOT met'}"
            )


def _cpus() -> int:
    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    main()
