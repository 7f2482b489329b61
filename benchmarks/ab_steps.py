"""The fastest vector step of a few paths in two source trees: a before/after check that
other work on the machine cannot make look slower.

The scripts that compare trees by median rates (``layer_overhead.py``,
``native_throughput.py``, ``vector_throughput.py``, ``batched_mpe.py``) spread widely on a
shared 2-core machine: their single rounds differ by 2x even when it is idle. This one
times each vector step alone (random legal actions drawn outside the timed call) in CPU
time of the stepping thread (time the process waits for a core, as other jobs run, is not
counted), in blocks of ``--block`` steps, and keeps the fastest block: interference only
ever adds time, so the fastest block of many is what the code costs. Trees alternate in fresh
processes (``--rounds`` each); a path's result is its fastest block over all rounds.

    python benchmarks/ab_steps.py --before-src PATH [--after-src PATH] [--rounds 5]
        [--seconds 1.5] [--block 20] [--paths NAME ...]

Prints, per path, the fastest step in microseconds in each tree and ``after / before``
(above 1: slower).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
from source_trees import add_tree_options, chosen_trees, describe_tree, print_result, run_child

HERE = Path(__file__).resolve()

PATHS: dict[str, tuple[str, int, dict[str, Any]]] = {
    "climbing dict copy=False": ("mdp/climbing", 256, {"native": False, "copy": False}),
    "climbing dict copy=True": ("mdp/climbing", 256, {"native": False, "copy": True}),
    "rps dict copy=False": ("corral/rps", 256, {"copy": False}),
    "rps dict copy=True": ("corral/rps", 256, {"copy": True}),
    "tag dict": ("corral/tag", 64, {"native": False}),
    "spread dict 1 env": ("mpe2/simple_spread_v3", 1, {"native": False, "copy": False}),
    "spread dict 32 envs": ("mpe2/simple_spread_v3", 32, {"native": False, "copy": False}),
    "tag native numpy": ("corral/tag", 4096, {"native": True}),
    "tag native torch": ("corral/tag", 4096, {"native": True, "array": "torch"}),
    "spread native numpy": ("mpe2/simple_spread_v3", 1024, {"native": True}),
    "spread native torch": ("mpe2/simple_spread_v3", 1024, {"native": True, "array": "torch"}),
    "climbing native": ("mdp/climbing", 4096, {"native": True}),
}
"""Name -> (env id, envs, make_vec keywords)."""


def fastest_step(name: str, seconds: float, block: int) -> float:
    """The fastest mean step CPU time (s) over blocks of ``block`` steps of path ``name``."""
    import corral

    env_id, num_envs, kwargs = PATHS[name]
    venv = corral.make_vec(env_id, num_envs, seed=0, **kwargs)
    rng = np.random.default_rng(0)
    batch = venv.reset(seed=0)
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        spent = 0.0
        for _ in range(block):
            actions = venv.sample_actions(batch, rng)
            began = time.thread_time()
            batch = venv.step(actions)
            spent += time.thread_time() - began
        best = min(best, spent / block)
    venv.close()
    return best


def child(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    print_result({name: fastest_step(name, args.seconds, args.block) for name in args.paths})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="processes per tree")
    parser.add_argument("--seconds", type=float, default=1.5, help="per path and process")
    parser.add_argument("--block", type=int, default=20, help="steps per timed block")
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_tree_options(parser)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    trees = chosen_trees(parser, args)
    for name, src in trees.items():
        print(f"{name}: {describe_tree(src)}")
    forwarded = ["--child", "--seconds", str(args.seconds), "--block", str(args.block)]
    forwarded += ["--paths", *args.paths]
    best: dict[str, dict[str, float]] = {tree: {} for tree in trees}
    for _ in range(args.rounds):
        for tree, src in trees.items():
            result = run_child(src, HERE, forwarded)
            for name in args.paths:
                best[tree][name] = min(best[tree].get(name, float("inf")), result[name])
    print(f"fastest block of {args.block} steps over {args.rounds} processes per tree (us)")
    header = f"{'path':<28}" + "".join(f"{tree:>12}" for tree in trees)
    print(header + ("  after/before" if "before" in trees else ""))
    for name in args.paths:
        cells = "".join(f"{best[tree][name] * 1e6:>12,.1f}" for tree in trees)
        ratio = f"  {best['after'][name] / best['before'][name]:.3f}" if "before" in trees else ""
        print(f"{name:<28}{cells}{ratio}")


if __name__ == "__main__":
    main()
