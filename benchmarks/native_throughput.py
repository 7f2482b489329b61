"""Env-steps/s of the natively batched ``corral/tag`` against its dict version, in one run.

The dict version runs as ``make_vec("corral/tag", N, "sync", native=False)`` (N=256 by
default: its rate per env barely changes with N); the native one at 4,096 copies on
numpy, torch on the CPU and, where torch sees one, a CUDA GPU. Every path steps with
random legal actions: random priorities are drawn beforehand and each step takes the
legal action of highest priority from the latest masks, outside the timed region, so
the rates are those of the vector env alone (a vector step of E envs counts E).

    python benchmarks/native_throughput.py [--seconds 2] [--rounds 5] [--num-envs 4096]
        [--dict-envs 256]

Each native path is also timed alone: ``BatchedTag`` stepped directly, ``step`` then
``reset(where=done)`` (what the vector layer calls), writing into arrays of its own as the
vector layer has it write into the batch's (``write_into``), without the vector layer's
own bookkeeping; the difference to ``make_vec`` is the vector layer's time.

Every path is built first, then timed in ``--rounds`` rounds that take the paths in turn
(``--seconds`` per path in all): each rate is the median of its rounds, so that a burst of
other work on the machine slows one round of every path rather than one path.

Given ``--before-src PATH`` (another checkout's ``src``), the script instead measures two
trees: it runs itself in a subprocess with ``PYTHONPATH`` set to each tree, alternating
(before, after, before, after, ...) for ``--rounds`` rounds (each subprocess times every
path once), and prints each path's median in both and ``after / before``:

    python benchmarks/native_throughput.py --before-src PATH [--after-src PATH] [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from source_trees import add_tree_options, chosen_trees, describe_tree, print_result, run_child

HERE = Path(__file__).resolve()

ID = "corral/tag"
PRIORITIES = 16  # steps of random priorities drawn beforehand, reused in turn


def timed(step: Callable[[], float], steps_per_call: int, seconds: float) -> float:
    """Env-steps/s over the seconds that ``step()`` reports having spent in the env."""
    inside, calls, start = 0.0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        inside += step()
        calls += 1
    return calls * steps_per_call / inside


class Chooser:
    """Random legal actions from masks, with priorities drawn beforehand (numpy or torch)."""

    def __init__(self, masks: dict[str, Any], array: str, device: str) -> None:
        self.k, self.array = 0, array
        rng = np.random.default_rng(0)
        priorities = {g: rng.random((PRIORITIES, *m.shape), np.float32) for g, m in masks.items()}
        if array == "torch":
            import torch

            priorities = {g: torch.as_tensor(p, device=device) for g, p in priorities.items()}
        self.priorities = priorities

    def __call__(self, masks: dict[str, Any]) -> dict[str, Any]:
        self.k = (self.k + 1) % PRIORITIES
        return {g: (p[self.k] * masks[g]).argmax(-1) for g, p in self.priorities.items()}


def vector_stepper(num_envs: int, **options: Any) -> tuple[Callable[[], float], Any]:
    """A step of ``corral.make_vec(ID, num_envs, "sync", **options)`` (returning the seconds
    inside it), and the vector env to close."""
    import corral

    venv = corral.make_vec(ID, num_envs, "sync", seed=0, copy=False, **options)
    batch = venv.reset()
    choose = Chooser(batch.action_mask, options.get("array", "numpy"), venv_device(options))

    def step() -> float:
        nonlocal batch
        actions = choose(batch.action_mask)
        start = time.perf_counter()
        batch = venv.step(actions)
        sync(options)
        return time.perf_counter() - start

    return step, venv


def stand_in_stepper(num_envs: int, array: str, device: str) -> Callable[[], float]:
    """A step of ``BatchedTag`` stepped directly: ``step``, then ``reset(where=done)``,
    writing into arrays of its own as the vector layer has it write into the batch's."""
    from corral.envs.tag_batched import BatchedTag
    from corral.vector.layout import Layout

    env = BatchedTag(num_envs, array=array, device=device)
    arrays = Layout(
        env.groups, env.observation_space, env.action_space, None, num_envs, place=env.place
    ).allocate()
    assert env.write_into(arrays)
    masks = env.reset(seed=0).action_mask  # the arrays that every later call writes into
    choose = Chooser(masks, array, device)
    options = {"array": array, "device": device}

    def step() -> float:
        actions = choose(masks)
        start = time.perf_counter()
        result = env.step(actions)
        alive = [a[:, j] for a in result.alive.values() for j in range(a.shape[1])]
        live = alive[0].clone() if array == "torch" else alive[0].copy()
        for more in alive[1:]:
            live |= more
        if (~live).any():
            env.reset(where=~live)  # writes the new episodes' rows into the same arrays
        sync(options)
        return time.perf_counter() - start

    return step


def venv_device(options: dict[str, Any]) -> str:
    return options.get("device", "cpu")


def sync(options: dict[str, Any]) -> None:
    """Wait for the GPU, so that a CUDA step is timed to its end."""
    if venv_device(options).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


Paths = dict[str, tuple[int, list[float]]]
"""Path name -> (its envs, its rates over the rounds), the dict path first."""


def measure(args: argparse.Namespace) -> Paths:
    """Build every path of the corral imported here, then time them in turn for
    ``args.rounds`` rounds."""
    places = [("numpy", "cpu")]
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(args.torch_threads)
        places.append(("torch", "cpu"))
        if torch.cuda.is_available():
            places.append(("torch", "cuda"))
    paths: list[tuple[str, int, Callable[[], float]]] = []
    closing = []
    step, venv = vector_stepper(args.dict_envs, native=False)
    paths.append(("make_vec sync, dict envs (native=False)", args.dict_envs, step))
    closing.append(venv)
    e = args.num_envs
    for array, device in places:
        step, venv = vector_stepper(e, native=True, array=array, device=device)
        paths.append((f"make_vec sync, native, {array} {device}", e, step))
        closing.append(venv)
        paths.append((f"BatchedTag alone, {array} {device}", e, stand_in_stepper(e, array, device)))
    for _, _, step in paths:  # warm up
        for _ in range(3):
            step()
    rates: Paths = {name: (num_envs, []) for name, num_envs, _ in paths}
    for _ in range(args.rounds):
        for name, num_envs, step in paths:
            rates[name][1].append(timed(step, num_envs, args.seconds / args.rounds))
    for venv in closing:
        venv.close()
    return rates


def report(rates: Paths) -> None:
    """Print each path's median rate, its ratio to the dict path and its rounds' spread."""
    print(f"\n{'path':<48}{'num_envs':>9}{'env-steps/s':>14}{'ratio':>9}{'rounds (min-max)':>24}")
    base_name = next(iter(rates))
    base = float(np.median(rates[base_name][1]))
    for name, (num_envs, runs) in rates.items():
        rate = float(np.median(runs))
        ratio = "" if name == base_name else f"{rate / base:>8.0f}x"
        spread = f"{min(runs):,.0f}-{max(runs):,.0f}"
        print(f"{name:<48}{num_envs:>9}{rate:>14,.0f}{ratio:>9}{spread:>24}")
    print(
        "\nBatchedTag alone: step, then reset(where=done), without the vector layer's "
        "bookkeeping; its gap to make_vec is the layer's time"
    )


def compare_trees(args: argparse.Namespace, trees: dict[str, str]) -> None:
    """Time every path of each tree in its own interpreter, the trees alternating, and
    print each path's medians and ``after / before`` with each round's ratio."""
    command = ["--child", "--rounds", "1", "--seconds", str(args.seconds / args.rounds)]
    command += ["--num-envs", str(args.num_envs), "--dict-envs", str(args.dict_envs)]
    command += ["--torch-threads", str(args.torch_threads)]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, src in trees.items():
            runs[name].append(run_child(src, HERE, command)["rates"])
    print(f"\n{'path':<48}{'before':>14}{'after':>14}{'after/before':>14}")
    for name in runs["after"][0]:
        if name not in runs["before"][0]:
            print(f"{name:<48}  (not in the before-tree)")
            continue
        before, after = ([r[name] for r in runs[t]] for t in ("before", "after"))
        ratio = float(np.median(after)) / float(np.median(before))
        per_round = " ".join(f"{a / b:.2f}" for b, a in zip(before, after, strict=True))
        print(
            f"{name:<48}{np.median(before):>14,.0f}{np.median(after):>14,.0f}"
            f"{ratio:>14.3f}  (rounds: {per_round})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per path, in all rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-envs", type=int, default=4096, help="native copies")
    parser.add_argument("--dict-envs", type=int, default=256, help="dict envs (native=False)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch's CPU threads (default 1: on cores shared with other work, torch's "
        "OpenMP threads wait on each other and measure the contention, not the env)",
    )
    add_tree_options(parser)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        rates = measure(args)
        print_result({"rates": {name: runs[0] for name, (_, runs) in rates.items()}})
        return
    print(
        f"machine: {platform.machine()}, python {platform.python_version()}, numpy "
        f"{np.__version__}, torch threads {args.torch_threads}"
    )
    trees = chosen_trees(parser, args)
    if "before" in trees:
        for name, src in trees.items():
            print(f"{name}: {describe_tree(src)}")
        compare_trees(args, trees)
    else:
        report(measure(args))


if __name__ == "__main__":
    main()
