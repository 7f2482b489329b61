"""The vector layer's own time per step, before and after a change, in one run.

The layer's time is the time of a ``venv.step`` less the time spent inside
the envs' own ``step``, ``reset`` and ``state`` calls. The envs' time is
measured by wrapping each env in a timing proxy (:func:`timed_env_class`),
the step's time on the same envs unwrapped, right before, so that the
proxy's own cost is not counted as the layer's. The ``sync`` backend
steps ``--num-envs`` envs of each id with random legal actions (drawn from
keys generated beforehand and the batch's action masks), with ``copy=False``
and with the default ``copy=True``.

The tree measured is ``--after-src`` (by default the ``src`` of the tree this
script lives in); given ``--before-src PATH`` (another checkout's ``src``), the
two are compared. The script runs itself in a subprocess with ``PYTHONPATH``
set to each tree, alternating (before, after, before, after, ...) for
``--rounds`` rounds, and prints the medians and ``layer after / layer
before``. Where the after-tree's ``make_vec`` takes ``native=``, it also times
``make_vec(id, num_envs, native=True)`` (its whole step: a native env has no
per-env calls to subtract).

    python benchmarks/layer_overhead.py [--seconds 2] [--rounds 3] [--num-envs 256]
        [--ids mdp/climbing corral/rps] [--before-src PATH] [--after-src PATH]

Only public API that exists in both trees is used (``corral.VectorEnv``,
``corral.make``, ``corral.make_vec``, ``corral.MultiAgentEnv``).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from source_trees import add_tree_options, chosen_trees, describe_tree, print_result, run_child

HERE = Path(__file__).resolve()
DEFAULT_IDS = ["mdp/climbing", "corral/rps"]


class Clock:
    """Seconds spent inside the timed envs since the last :meth:`reset`."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0

    def reset(self) -> None:
        self.seconds = 0.0


def timed_env_class() -> type:
    """A subclass of the imported tree's ``corral.MultiAgentEnv`` that times an env.

    ``TimedEnv(env, clock)`` adds the time of ``env.step``, ``env.reset`` and
    ``env.state`` to ``clock``, and forwards every other attribute, read or
    written, to ``env``. Being a ``MultiAgentEnv``, it passes ``corral.adapt``
    as is (not wrapped by an adapter), and the vector layer treats it as the
    corral env it holds (``check_actions`` is switched off on ``env``).
    """
    from corral import MultiAgentEnv

    class TimedEnv(MultiAgentEnv):
        def __init__(self, env: Any, clock: Clock) -> None:
            object.__setattr__(self, "_env", env)
            object.__setattr__(self, "_clock", clock)

        def __getattr__(self, name: str) -> Any:
            # Only reached for names TimedEnv and MultiAgentEnv lack.
            return getattr(self._env, name)

        def __setattr__(self, name: str, value: Any) -> None:
            setattr(self._env, name, value)

        @property
        def state(self) -> Callable[[], Any]:
            # A property, so that an env without state() has no state here either.
            state, clock = self._env.state, self._clock

            def timed_state() -> Any:
                start = time.perf_counter()
                try:
                    return state()
                finally:
                    clock.seconds += time.perf_counter() - start

            return timed_state

        def step(self, actions: Any) -> Any:
            start = time.perf_counter()
            try:
                return self._env.step(actions)
            finally:
                self._clock.seconds += time.perf_counter() - start

        def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
            start = time.perf_counter()
            try:
                return self._env.reset(seed=seed, options=options)
            finally:
                self._clock.seconds += time.perf_counter() - start

    # MultiAgentEnv's own members (agents, possible_agents, check_actions,
    # observation_space, close...) would shadow __getattr__: forward each.
    for name in vars(MultiAgentEnv):
        if not name.startswith("_") and name not in vars(TimedEnv):
            setattr(TimedEnv, name, _forwarded(name))
    return TimedEnv


def _forwarded(name: str) -> property:
    return property(
        lambda self: getattr(self._env, name),
        lambda self, value: setattr(self._env, name, value),
    )


def legal_actions(batch: Any, seed: int = 0, draws: int = 64) -> Callable[[Any, int], dict]:
    """``actions(batch, k)``: random legal actions for ``batch``'s masks, from keys drawn now."""
    if set(batch.action_mask) != set(batch.acting):
        raise ValueError(
            f"every group needs discrete actions with masks; groups {sorted(batch.acting)} "
            f"have masks for {sorted(batch.action_mask)}"
        )
    rng = np.random.default_rng(seed)
    keys = {g: rng.random((draws, *np.shape(m))) for g, m in batch.action_mask.items()}

    def actions(batch: Any, k: int) -> dict:
        return {
            g: np.argmax(np.where(np.asarray(batch.action_mask[g]), keys[g][k % draws], -1.0), -1)
            for g in keys
        }

    return actions


def time_steps(venv: Any, seconds: float, clock: Clock | None = None) -> tuple[float, float]:
    """Mean seconds per ``venv.step`` and, with ``clock``, of env time within it."""
    batch = venv.reset(seed=0)
    actions = legal_actions(batch)
    for k in range(3):
        batch = venv.step(actions(batch, k))
    if clock is not None:
        clock.reset()
    total, steps, start = 0.0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        acts = actions(batch, steps)
        t = time.perf_counter()
        batch = venv.step(acts)
        total += time.perf_counter() - t
        steps += 1
    env = clock.seconds / steps if clock is not None else 0.0
    return total / steps, env


def measure_layer(id: str, num_envs: int, copy: bool, seconds: float) -> dict[str, float]:
    """Microseconds per step: ``total``, ``env`` (inside the envs) and ``layer`` (the rest).

    ``total`` is timed on plain envs and ``env`` on timed ones, one after the
    other: the proxy's own cost (its clock, its forwarded attribute reads)
    would otherwise count as the layer's.
    """
    import corral

    def total_and_env(wrap: Callable[[Any], Any], clock: Clock | None) -> tuple[float, float]:
        venv = corral.VectorEnv(
            env_fns=[lambda: wrap(corral.make(id))] * num_envs, backend="sync", copy=copy
        )
        try:
            return time_steps(venv, seconds, clock)
        finally:
            venv.close()

    clock = Clock()
    timed_env = timed_env_class()
    total, _ = total_and_env(lambda env: env, None)
    timed_total, env = total_and_env(lambda env: timed_env(env, clock), clock)
    return {
        "total": total * 1e6,
        "env": env * 1e6,
        "layer": (total - env) * 1e6,
        "timed_total": timed_total * 1e6,
    }


def measure_native(id: str, num_envs: int, seconds: float) -> float | str:
    """Microseconds per step of ``make_vec(id, num_envs, native=True)``, or why there is none."""
    import corral

    try:
        venv = corral.make_vec(id, num_envs, "sync", native=True)
    except (ValueError, LookupError, NotImplementedError) as err:
        return f"no native ({type(err).__name__})"
    try:
        total, _ = time_steps(venv, seconds)
    finally:
        venv.close()
    return total * 1e6


def child(args: argparse.Namespace) -> None:
    """Measure the tree on ``PYTHONPATH`` and print one ``RESULT`` JSON line."""
    import inspect

    import corral

    result: dict[str, Any] = {"layer": {}}
    for id in args.ids:
        result["layer"][id] = {
            str(copy): measure_layer(id, args.num_envs, copy, args.seconds)
            for copy in (False, True)
        }
    if "native" in inspect.signature(corral.make_vec).parameters:
        result["native"] = {id: measure_native(id, args.num_envs, args.seconds) for id in args.ids}
    print_result(result)


def run_tree(src: str, args: argparse.Namespace) -> dict[str, Any]:
    """One round of measurements of the tree ``src``, in a fresh interpreter."""
    command = ["--child", "--seconds", str(args.seconds), "--num-envs", str(args.num_envs)]
    return run_child(src, HERE, [*command, "--ids", *args.ids])


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> None:
    """Print the medians over rounds of each tree, the ratio of layer times where there
    are two trees, and the native rows."""
    trees = tuple(runs)
    compare = trees == ("before", "after")
    print(f"\n{'':<21}" + "".join(f"{f'---- {t} (us) ----':>27}" for t in trees))
    print(
        f"{'id':<15}{'copy':>6}"
        + f"{'step':>9}{'env':>9}{'layer':>9}" * len(trees)
        + ("  after/before" if compare else "")
    )
    proxy: dict[str, list[float]] = {t: [] for t in trees}
    for id in args.ids:
        for copy in ("False", "True"):
            cells = {t: [r["layer"][id][copy] for r in runs[t]] for t in trees}
            row = {t: {k: med([c[k] for c in cells[t]]) for k in cells[t][0]} for t in trees}
            for t in trees:
                proxy[t] += [c["timed_total"] - c["total"] for c in cells[t]]
            line = f"{id:<15}{copy:>6}" + "".join(
                f"{row[t][k]:>9,.0f}" for t in trees for k in ("total", "env", "layer")
            )
            if compare:
                ratio = row["after"]["layer"] / row["before"]["layer"]
                per_round = " ".join(
                    f"{a['layer'] / b['layer']:.2f}" for b, a in zip(*cells.values(), strict=True)
                )
                line += f"{ratio:>9.3f}  (rounds: {per_round})"
            print(line)
    print(
        "\nthe timing proxy's own cost per step, not counted above (median): "
        + ", ".join(f"{t} {med(proxy[t]):,.0f} us" for t in trees)
    )
    native = [r["native"] for r in runs["after"] if "native" in r]
    if not native:
        print("\nnative: the after-tree's make_vec takes no native=")
        return
    print(f"\nnative=True on the after-tree, {args.num_envs} envs, whole step:")
    for id in args.ids:
        values = [n[id] for n in native]
        times = [v for v in values if not isinstance(v, str)]
        if not times:
            print(f"  {id:<15} {values[0]}")
            continue
        dict_total = med([r["layer"][id]["False"]["total"] for r in runs["after"]])
        total = med(times)
        print(
            f"  {id:<15} {total:>9,.1f} us   (dict envs, copy=False: {dict_total:,.0f} us, "
            f"{dict_total / total:.1f}x the native time)"
        )


def med(values: list[float]) -> float:
    return float(np.median(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--ids", nargs="+", default=DEFAULT_IDS)
    add_tree_options(parser)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    trees = chosen_trees(parser, args)
    print(
        f"machine: {platform.machine()}, python {platform.python_version()}, "
        f"{len(os.sched_getaffinity(0))} cores, load average "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    for name, src in trees.items():
        print(f"{name}: {describe_tree(src)}")
    print(
        f"{args.num_envs} envs, sync backend, random legal actions; median of {args.rounds} "
        f"alternating rounds of {args.seconds:g} s per measurement; times per step"
    )
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, src in trees.items():
            runs[name].append(run_tree(src, args))
    report(args, runs)
    print("\nload average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
