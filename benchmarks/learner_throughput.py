"""Learning throughput at JaxMARL's ``ippo_ff_mpe`` settings: corral against JaxMARL, one run.

corral trains IPPO on mpe2 ``simple_spread_v3`` (N=3, max_cycles=25, discrete
actions) through the runner (``corral.train``, what ``corral train ippo`` runs),
with evaluation, checkpoints and TensorBoard turned off, at the settings of
JaxMARL's ``baselines/IPPO/config/ippo_ff_mpe.yaml``: 16 envs x 128 steps, 4
epochs x 4 minibatches, 64x64 tanh networks, lr 2.5e-4, gamma 0.99, GAE lambda
0.95, clip 0.2 (policy and value), entropy 0.01, value coefficient 0.5,
gradient norm 0.5 (:data:`IPPO_SETTINGS`). What corral has and JaxMARL lacks is
turned off so that both do the same work: value normalisation, the agent id
and the time input of the critic. What cannot be mapped: JaxMARL anneals the
learning rate linearly (corral's is constant: no cost either way), clips the
global gradient norm of its one actor-critic network (corral clips actor and
critic apart) and standardises advantages per minibatch (corral per rollout).
A round's rate is env steps/s over the rollouts after the first
(``steps_per_s`` of the run's metrics rows, one row per rollout).

With ``--jaxmarl PATH`` (a JaxMARL checkout) and ``--jaxmarl-python PY`` (an
interpreter with jaxmarl, jax, flax, optax, distrax, hydra and wandb), the same
run also runs JaxMARL's unchanged ``baselines/IPPO/ippo_ff_mpe.py`` (one seed per
process, ``NUM_SEEDS=1``, W&B disabled) in a subprocess, alternating with corral
for ``--rounds`` rounds, and prints the median env steps/s of each and
corral / JaxMARL. JaxMARL's rate is timed between its per-update callbacks
(``wandb.log``, which the script calls once per update), from the second update
on, so its compilation is not counted.

    python benchmarks/learner_throughput.py [--steps 131072] [--rounds 3]
        [--jaxmarl PATH --jaxmarl-python PY] [--before-src PATH] [--profile]

``--before-src PATH`` also measures another source tree (each tree in its own
interpreter, alternating) and prints after / before. ``--profile`` prints where a
rollout's milliseconds go (acting, env step, rollout writes, GAE, the rollout's
gathers, minibatch updates and the Python between them), per tree.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from source_trees import add_tree_options, chosen_trees, describe_tree, print_result, run_child

ENV = "mpe2/simple_spread_v3"
NUM_ENVS, ROLLOUT_STEPS = 16, 128
ROLLOUT = NUM_ENVS * ROLLOUT_STEPS
IPPO_SETTINGS: dict[str, Any] = {
    "num_envs": NUM_ENVS,
    "rollout_steps": ROLLOUT_STEPS,
    "epochs": 4,
    "minibatches": 4,
    "hidden": (64, 64),
    "lr": 2.5e-4,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "clip": 0.2,
    "value_clip": 0.2,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
    "normalize_values": False,
    "agent_id": False,
    "time_scale": None,
    "env_kwargs": {"N": 3, "max_cycles": 25, "continuous_actions": False},
}
"""JaxMARL's ``ippo_ff_mpe.yaml`` as corral's IPPO settings (see the module docstring)."""
TARGET = 1.0
HERE = Path(__file__).resolve()
COLLECTORS = (
    ("corral.training.rollout_collector", "RolloutCollector"),
    ("corral.training.collector", "Collector"),
)
SECTIONS = ("acting", "env step", "rollout writes", "GAE", "gathers", "updates")


def train_settings(steps: int, run_dir: str, seed: int = 0) -> dict[str, Any]:
    """``corral.train``'s keywords for ``steps`` env steps at :data:`IPPO_SETTINGS`, nothing
    but the loop: a metrics row per rollout, no evaluation, checkpoint or TensorBoard."""
    return {
        **IPPO_SETTINGS,
        "total_steps": steps,
        "seed": seed,
        "run_dir": run_dir,
        "log_every": ROLLOUT,
        "eval_every": 0,
        "eval_episodes": 1,
        "checkpoint_every": 0,
        "tensorboard": False,
    }


class Sections:
    """Seconds spent inside named calls made while training (in a collector's ``run``, not
    in an evaluation), by wrapping functions in place."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(SECTIONS, 0.0)
        self.training = 0
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, name: str, section: str | None) -> None:
        """Count the time of ``owner.name`` (a class's method or a module's function) in
        ``section``; ``None``: count nothing, but the calls inside it are training's."""
        inner = getattr(owner, name)

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if section is None:
                self.training += 1
            elif not self.training:
                return inner(*args, **kwargs)
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                if section is None:
                    self.training -= 1
                else:
                    self.seconds[section] += time.perf_counter() - start

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, inner))

    def restore(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()


def collector_classes() -> list[type]:
    """The tree's collector classes (one or two, by the tree's age)."""
    found = []
    for module, name in COLLECTORS:
        if importlib.util.find_spec(module) is not None:
            found.append(getattr(importlib.import_module(module), name))
    return found


def profiled_sections() -> Sections:
    """Wrap the learning loop's parts of this tree's corral (the names of the tree at
    the start of issue 25; a part a tree lacks is not counted)."""
    import corral.algos.mappo as mappo
    from corral.data import rollouts
    from corral.vector.vector_env import VectorEnv

    sections = Sections()
    parts = [
        *((collector, "run", None) for collector in collector_classes()),
        (mappo.MAPPOPolicy, "act", "acting"),
        (mappo.MAPPOPolicy, "bootstrap_values", "acting"),
        (VectorEnv, "step", "env step"),
        (rollouts.RolloutBuilder, "act", "rollout writes"),
        (rollouts.RolloutBuilder, "observe", "rollout writes"),
        (rollouts.RolloutBuilder, "finish", "rollout writes"),
        (mappo, "masked_gae", "GAE"),
        (mappo.MAPPOLearner, "rollout_rows", "gathers"),
        (mappo.MAPPOLearner, "ppo", "updates"),
    ]
    for owner, name, section in parts:
        if owner is not None and hasattr(owner, name):
            sections.wrap(owner, name, section)
    return sections


def corral_round(steps: int, profile: bool) -> dict[str, Any]:
    """One run of ``corral.train`` in this process: env steps/s of its rollouts after the
    first, and with ``profile`` the seconds of each part of the loop over those rollouts."""
    import corral
    from corral.training.metrics import read_metrics

    sections = profiled_sections() if profile else None
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = str(Path(tmp) / "run")
        started = time.perf_counter()
        corral.train("ippo", ENV, progress=False, **train_settings(steps, run_dir))
        wall = time.perf_counter() - started
        rows = read_metrics(run_dir)
    if sections is not None:
        sections.restore()
    timed = [row for row in rows if row.get("steps_per_s") and row["env_steps"] > ROLLOUT]
    loop = sum(ROLLOUT / row["steps_per_s"] for row in timed)
    result: dict[str, Any] = {"rate": len(timed) * ROLLOUT / loop, "wall": wall}
    if sections is not None:
        # the sections cover every rollout, the first included: scaled to the loop's
        # seconds per rollout over all of them
        result["sections"] = sections.seconds
        result["loop_all"] = sum(
            ROLLOUT / row["steps_per_s"] for row in rows if row.get("steps_per_s")
        )
        result["rollouts"] = len([row for row in rows if row.get("steps_per_s")])
    return result


def breakdown(result: dict[str, Any]) -> dict[str, float]:
    """Milliseconds per rollout of each part, and ``Python between`` (the rest of the loop)."""
    per = 1000 / result["rollouts"]
    ms = {name: seconds * per for name, seconds in result["sections"].items()}
    ms["gathers"] -= ms["GAE"]  # the gathers' call holds GAE's
    ms["Python between"] = result["loop_all"] * per - sum(ms.values())
    ms["total"] = result["loop_all"] * per
    return ms


def jaxmarl_round(checkout: str, python: str, steps: int) -> dict[str, Any]:
    """One run of JaxMARL's unchanged ``ippo_ff_mpe.py`` (one seed) in a subprocess: env
    steps/s between its per-update callbacks from the second update on."""
    script = Path(checkout) / "baselines" / "IPPO" / "ippo_ff_mpe.py"
    if not script.is_file():
        raise SystemExit(f"--jaxmarl {checkout}: no baselines/IPPO/ippo_ff_mpe.py there")
    overrides = ["NUM_SEEDS=1", f"TOTAL_TIMESTEPS={steps}", "WANDB_MODE=disabled"]
    with tempfile.TemporaryDirectory() as tmp:  # the script saves a plot in its directory
        done = subprocess.run(
            [python, "-c", JAXMARL_DRIVER, str(script), *overrides],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("UPDATES ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"JaxMARL's ippo_ff_mpe.py failed (exit {done.returncode}):\n"
                           f"{done.stderr[-3000:]}")  # fmt: skip
    times = json.loads(lines[-1][len("UPDATES ") :])
    if len(times) < 3:
        raise RuntimeError(f"JaxMARL ran {len(times)} updates: give --steps >= {3 * ROLLOUT}")
    return {"rate": (len(times) - 1) * ROLLOUT / (times[-1] - times[0])}


JAXMARL_DRIVER = """
import json, runpy, sys, time
import wandb
times = []
init = wandb.init
def timed_init(*args, **kwargs):  # wandb.init rebinds wandb.log: keep ours
    run = init(*args, **kwargs)
    wandb.log = lambda *args, **kwargs: times.append(time.perf_counter())
    return run
wandb.init = timed_init
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, script.rsplit("/", 1)[0])
runpy.run_path(script, run_name="__main__")
print("UPDATES " + json.dumps(times), flush=True)
"""
"""Runs the baseline as ``python ippo_ff_mpe.py OVERRIDES`` would, keeping when each of
its updates reached the host (its ``wandb.log`` callback)."""


def child(args: argparse.Namespace) -> None:
    print_result(corral_round(args.steps, args.profile))


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"machine: {platform.machine()}, python {platform.python_version()}, "
        f"{os.cpu_count()} cores, load average {load}"
    )


def print_breakdown(name: str, results: list[dict[str, Any]]) -> None:
    parts = [breakdown(r) for r in results]
    median = {key: statistics.median(p[key] for p in parts) for key in parts[0]}
    print(f"\n{name}: ms per rollout of {ROLLOUT} env steps (median of {len(parts)})")
    for key, ms in median.items():
        share = f"{100 * ms / median['total']:5.1f}%" if key != "total" else ""
        print(f"  {key:<16}{ms:9.1f}  {share}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64 * ROLLOUT, help="env steps per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jaxmarl", help="a JaxMARL checkout (its baselines/ are run)")
    parser.add_argument("--jaxmarl-python", default=sys.executable)
    add_tree_options(parser)
    parser.add_argument("--profile", action="store_true", help="print each part's ms per rollout")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    print(machine())
    trees = chosen_trees(parser, args)
    for name, src in trees.items():
        print(f"corral {name}: {describe_tree(src)}")
    if args.jaxmarl:
        print(f"JaxMARL: {args.jaxmarl} with {args.jaxmarl_python}")
    print(
        f"IPPO on {ENV} at JaxMARL's ippo_ff_mpe settings, {args.steps:,} env steps per run, "
        f"{args.rounds} alternating rounds; env steps/s after the first rollout\n"
    )
    rates: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    if args.jaxmarl:
        rates["JaxMARL"] = []
    command = ["--child", "--steps", str(args.steps), *(["--profile"] if args.profile else [])]
    for r in range(args.rounds):
        for name, src in trees.items():
            rates[name].append(run_child(src, HERE, command))
        if args.jaxmarl:
            rates["JaxMARL"].append(jaxmarl_round(args.jaxmarl, args.jaxmarl_python, args.steps))
        line = ", ".join(f"{name} {runs[-1]['rate']:,.0f}" for name, runs in rates.items())
        print(f"round {r + 1}: {line}", flush=True)

    median = {name: statistics.median(r["rate"] for r in runs) for name, runs in rates.items()}
    print()
    for name, rate in median.items():
        print(f"{'corral ' + name if name in trees else name:>14}: {rate:10,.0f} env steps/s")
    if "before" in median:
        print(f"  after / before: {median['after'] / median['before']:.3f}")
    if "JaxMARL" in median:
        ratio = median["after"] / median["JaxMARL"]
        met = "met" if ratio >= TARGET else "not met"
        print(f"  corral / JaxMARL: {ratio:.3f} (target >= {TARGET}: {met})")
    if args.profile:
        for name in trees:
            print_breakdown(f"corral {name}", rates[name])


if __name__ == "__main__":
    main()
