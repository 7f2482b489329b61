"""Env-steps/s of the natively batched ``corral/tag`` against its dict version, in one run.

The dict version runs as ``make_vec("corral/tag", N, "sync", native=False)`` (N=256 by
default: its rate per env barely changes with N); the native one at 4,096 copies on
numpy, torch on the CPU and, where torch sees one, a CUDA GPU. Every path steps with
random legal actions: random priorities are drawn beforehand and each step takes the
legal action of highest priority from the latest masks, outside the timed region, so
the rates are those of the vector env alone (a vector step of E envs counts E).

    python benchmarks/native_throughput.py [--seconds 2] [--num-envs 4096] [--dict-envs 256]

Each native path is also timed alone: ``BatchedTag`` stepped directly, ``step`` then
``reset(where=done)`` (what the vector layer calls), without the vector layer's own
bookkeeping; the difference to ``make_vec`` is the vector layer's time.
"""

from __future__ import annotations

import argparse
import importlib.util
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np

ID = "corral/tag"
PRIORITIES = 16  # steps of random priorities drawn beforehand, reused in turn


def timed(step: Callable[[], float], steps_per_call: int, seconds: float) -> float:
    """Env-steps/s over the seconds that ``step()`` reports having spent in the env."""
    for _ in range(3):
        step()
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


def bench_vector(num_envs: int, seconds: float, **options: Any) -> float:
    """Env-steps/s of ``corral.make_vec(ID, num_envs, "sync", **options)``."""
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

    try:
        return timed(step, num_envs, seconds)
    finally:
        venv.close()


def bench_stand_in(num_envs: int, seconds: float, array: str, device: str) -> float:
    """Env-steps/s of ``BatchedTag`` stepped directly: ``step``, then ``reset(where=done)``."""
    from corral.envs.tag_batched import BatchedTag

    env = BatchedTag(num_envs, array=array, device=device)
    first = env.reset(seed=0)
    masks = first.action_mask
    choose = Chooser(masks, array, device)
    options = {"array": array, "device": device}

    def step() -> float:
        nonlocal masks
        actions = choose(masks)
        start = time.perf_counter()
        result = env.step(actions)
        done = ~(result.alive["predator"].any(1) | result.alive["prey"].any(1))
        fresh = env.reset(where=done) if done.any() else None
        sync(options)
        inside = time.perf_counter() - start
        masks = result.action_mask
        if fresh is not None:  # the vector layer's merge, here only to keep actions legal
            for g in masks:
                masks[g][done] = fresh.action_mask[g][done]
        return inside

    return timed(step, num_envs, seconds)


def venv_device(options: dict[str, Any]) -> str:
    return options.get("device", "cpu")


def sync(options: dict[str, Any]) -> None:
    """Wait for the GPU, so that a CUDA step is timed to its end."""
    if venv_device(options).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--num-envs", type=int, default=4096, help="native copies")
    parser.add_argument("--dict-envs", type=int, default=256, help="dict envs (native=False)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch's CPU threads (default 1: on cores shared with other work, torch's "
        "OpenMP threads wait on each other and measure the contention, not the env)",
    )
    args = parser.parse_args()

    places = [("numpy", "cpu")]
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(args.torch_threads)
        places.append(("torch", "cpu"))
        if torch.cuda.is_available():
            places.append(("torch", "cuda"))
    print(
        f"machine: {platform.machine()}, python {platform.python_version()}, numpy "
        f"{np.__version__}, torch threads {args.torch_threads}"
    )
    print(f"\n{'path':<48}{'num_envs':>9}{'env-steps/s':>14}{'ratio':>9}")
    base = bench_vector(args.dict_envs, args.seconds, native=False)
    print(f"{'make_vec sync, dict envs (native=False)':<48}{args.dict_envs:>9}{base:>14,.0f}")
    e, seconds = args.num_envs, args.seconds
    for array, device in places:
        for name, rate in (
            (
                f"make_vec sync, native, {array} {device}",
                bench_vector(e, seconds, native=True, array=array, device=device),
            ),
            (f"BatchedTag alone, {array} {device}", bench_stand_in(e, seconds, array, device)),
        ):
            print(f"{name:<48}{e:>9}{rate:>14,.0f}{rate / base:>8.0f}x")
    print(
        "\nBatchedTag alone: step, then reset(where=done), without the vector layer's "
        "bookkeeping; its gap to make_vec is the layer's time"
    )


if __name__ == "__main__":
    main()
