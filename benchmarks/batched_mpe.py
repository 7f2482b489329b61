"""Env-steps/s of batched MPE: corral's native MPE next to mpe2's loop, VMAS and JaxMARL.

One run, one process, one machine, the same thread count for every library (``--threads``,
default 2: torch's threads, and the process's CPUs when fewer than the machine has, which
bounds JAX's too). mpe2 ``simple_spread_v3`` by default (N=3, max_cycles=25, discrete
actions; ``--scenario`` picks ``simple_tag`` or ``simple_world_comm`` with their mpe2
defaults), at each E of ``--envs`` copies:

- ``mpe2 loop``: ``mpe2.<scenario>.parallel_env`` stepped in a Python loop, E=1 only (the
  rate of one env; the reference for every ratio);
- ``corral native``: ``corral.make_vec(id, E, native=True, array=, device=, dtype=)`` on
  numpy float64, numpy float32 and torch float32 (on the GPU with ``--device cuda``);
  printed as not available while the id has no natively batched implementation;
- ``corral dict``: ``make_vec(id, E, native=False)``, one mpe2 env per copy, at E up to
  ``--dict-max``;
- ``VMAS`` (``vmas.make_env(..., continuous_actions=False, max_steps=25)``), stepped with
  its batched tensors; all copies start together and end together at 25 steps, so a whole
  ``env.reset()`` every 25 steps is what its done flags ask for (and what TorchRL's VMAS
  wrapper calls when every copy is done);
- ``JaxMARL`` (``jaxmarl.make("MPE_..._v3", action_type="Discrete")``):
  ``jax.vmap(env.step)`` (its autoreset included), jitted, timed twice: ``scan``, one jitted
  ``lax.scan`` over 25 steps (what JaxMARL users run), and ``loop``, the jitted step called
  from a Python loop. Both keep the last step's observations, rewards and dones, so that XLA
  cannot skip computing them.

Every path steps with random discrete actions drawn beforehand on its device (25 steps of
them, reused in turn). A cell runs chunks of 25 steps (one mpe2 episode), two for warm-up
(compilation, first autoresets), then until ``--seconds`` have passed; each chunk ends by
waiting for the device (``torch.cuda.synchronize``, ``block_until_ready``). The rate is E x
25 over the median chunk's time. A missing peer is skipped with a printed line.

    python benchmarks/batched_mpe.py [--scenario simple_spread] [--envs 1 64 1024 8192 65536]
        [--device cpu|cuda] [--seconds 2] [--threads 2] [--dict-max 64] [--peers vmas jaxmarl]

``--scenario simple_tag`` and ``simple_world_comm`` run at E=8192 unless ``--envs`` says
otherwise. On ``--device cuda`` (default E: 1, 1024, 65536, 262144, 1048576) VMAS, JaxMARL
and corral's torch path run on the GPU (corral's numpy paths are left out) and the last
column is the device memory per env: the peak during the cell above what was allocated
before it, less the action pool, over E (JAX keeps one peak per process, so a JaxMARL cell
shows the higher of its own and the other JaxMARL cell's at the same E).

The peers are not the same envs as mpe2's; the ``obs/env`` column (observation floats per
env step, all agents) shows one difference, see benchmarks/JOURNAL.md ("Batched MPE") for
the others.

Given ``--before-src PATH`` (another checkout's ``src``), the script measures two trees: it
runs itself (the same cells) in a subprocess with ``PYTHONPATH`` set to each tree,
alternating (before, after, before, after, ...) for ``--rounds`` rounds, and prints each
cell's median in both and ``after / before`` (mpe2's loop and the peers, the same code in
both, show the noise):

    python benchmarks/batched_mpe.py --before-src PATH [--after-src PATH] [--rounds 3]
        [--envs 1 64 1024] [--peers] [--no-compile]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from source_trees import add_tree_options, chosen_trees, describe_tree, print_result, run_child

HERE = Path(__file__).resolve()

CHUNK = 25  # steps per timed call: one mpe2 episode (max_cycles)
CPU_ENVS = [1, 64, 1024, 8192, 65536]
CUDA_ENVS = [1, 1024, 65536, 262144, 1048576]
OTHER_SCENARIO_ENVS = [8192]


@dataclass(frozen=True)
class Scenario:
    """One MPE scenario as each library names it, with mpe2's default sizes."""

    mpe2: str  # module of mpe2
    kwargs: dict[str, Any]  # mpe2's (and corral's) constructor arguments
    vmas: tuple[str, dict[str, Any]]  # VMAS's scenario and its arguments
    jaxmarl: tuple[str, dict[str, Any]]  # JaxMARL's id and its arguments

    @property
    def corral_id(self) -> str:
        return f"mpe2/{self.mpe2}"


SCENARIOS = {
    "simple_spread": Scenario(
        "simple_spread_v3",
        {"N": 3},
        ("simple_spread", {"n_agents": 3}),
        ("MPE_simple_spread_v3", {"num_agents": 3, "num_landmarks": 3}),
    ),
    "simple_tag": Scenario(
        "simple_tag_v3",
        {"num_good": 1, "num_adversaries": 3, "num_obstacles": 2},
        ("simple_tag", {"num_good_agents": 1, "num_adversaries": 3, "num_landmarks": 2}),
        ("MPE_simple_tag_v3", {"num_good_agents": 1, "num_adversaries": 3, "num_obs": 2}),
    ),
    "simple_world_comm": Scenario(
        "simple_world_comm_v3",
        {"num_good": 2, "num_adversaries": 4, "num_obstacles": 1, "num_food": 2, "num_forests": 2},
        (
            "simple_world_comm",
            {
                "num_good_agents": 2,
                "num_adversaries": 4,
                "num_landmarks": 1,
                "num_food": 2,
                "num_forests": 2,
            },
        ),
        (
            "MPE_simple_world_comm_v3",
            {"num_good_agents": 2, "num_adversaries": 4, "num_obs": 1, "num_food": 2},
        ),
    ),
}


@dataclass
class Cell:
    """A built implementation at one E: ``run()`` steps it CHUNK times and waits for it."""

    run: Callable[[], None]
    obs_per_env: int
    memory: Callable[[], float | None] = field(default=lambda: None)  # bytes, after the run


def measure(cell: Cell, num_envs: int, seconds: float) -> float:
    """Env-steps/s of ``cell``: E x CHUNK over the median time of a chunk, after two."""
    cell.run()
    cell.run()
    times: list[float] = []
    start = time.perf_counter()
    while not times or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        cell.run()
        times.append(time.perf_counter() - t0)
    return num_envs * CHUNK / statistics.median(times)


def draw(num_actions: list[int], num_envs: int, seed: int = 0) -> np.ndarray:
    """CHUNK steps of uniformly random actions, shape (CHUNK, agents, E), int64."""
    rng = np.random.default_rng(seed)
    high = np.asarray(num_actions)[None, :, None]
    return rng.integers(0, high, (CHUNK, len(num_actions), num_envs))


class GpuMemory:
    """Torch's peak GPU memory since ``start()`` above what was allocated then, less
    ``exclude`` bytes (the action pool); None on the CPU."""

    def __init__(self, device: str) -> None:
        self.on, self.base, self.exclude = device.startswith("cuda"), 0, 0

    def start(self) -> None:
        if self.on:
            import torch

            torch.cuda.synchronize()
            self.base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()

    def peak(self) -> float | None:
        if not self.on:
            return None
        import torch

        return float(torch.cuda.max_memory_allocated() - self.base - self.exclude)


def nbytes(tensors: list[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def sync_torch(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


# -- the implementations ---------------------------------------------------------------


def mpe2_loop(scenario: Scenario, num_envs: int, device: str) -> Cell:
    """mpe2's parallel env stepped in a Python loop; one env (``num_envs`` must be 1)."""
    import importlib

    assert num_envs == 1
    env = importlib.import_module(f"mpe2.{scenario.mpe2}").parallel_env(
        max_cycles=CHUNK, continuous_actions=False, **scenario.kwargs
    )
    env.reset(seed=0)
    agents = list(env.agents)
    pool = draw([int(env.action_space(a).n) for a in agents], 1)
    actions = [{a: int(pool[k, i, 0]) for i, a in enumerate(agents)} for k in range(CHUNK)]

    def run() -> None:
        for step in actions:
            env.step(step)
            if not env.agents:
                env.reset()

    obs = sum(int(np.prod(env.observation_space(a).shape)) for a in agents)
    return Cell(run, obs)


def corral_vec(scenario: Scenario, num_envs: int, compile: bool = False, **options: Any) -> Cell:
    """``corral.make_vec(id, num_envs, **options)`` stepped with ``copy=False``; ``compile``:
    the native env's step through ``torch.compile``."""
    import corral

    kwargs = {"max_cycles": CHUNK, "continuous_actions": False, **scenario.kwargs}
    if compile:
        kwargs["compile"] = True
    place_device = options.get("device", "cpu")
    memory = GpuMemory(place_device)
    memory.start()
    venv = corral.make_vec(
        scenario.corral_id, num_envs, seed=0, copy=False, env_kwargs=kwargs, **options
    )
    venv.reset()
    groups = venv.groups
    pool = draw(
        [int(venv.action_space(g).n) for g, agents in groups.items() for _ in agents], num_envs
    )
    bounds = np.cumsum([0, *(len(agents) for agents in groups.values())])
    steps = [
        {
            g: np.ascontiguousarray(pool[k, bounds[i] : bounds[i + 1]].T)
            for i, g in enumerate(groups)
        }
        for k in range(CHUNK)
    ]
    if options.get("array") == "torch":
        import torch

        steps = [{g: torch.as_tensor(a, device=place_device) for g, a in s.items()} for s in steps]
        memory.exclude = nbytes([a for s in steps for a in s.values()])
    sync = sync_torch(place_device)

    def run() -> None:
        for actions in steps:
            venv.step(actions)
        sync()

    obs = sum(
        int(np.prod(venv.observation_space(g).shape)) * len(agents) for g, agents in groups.items()
    )
    return Cell(run, obs, memory.peak)


def vmas_env(scenario: Scenario, num_envs: int, device: str) -> Cell:
    """VMAS's batched env; a whole reset every CHUNK steps, when all its copies are done."""
    import torch
    import vmas

    name, kwargs = scenario.vmas
    memory = GpuMemory(device)
    memory.start()
    env = vmas.make_env(
        name,
        num_envs=num_envs,
        device=device,
        continuous_actions=False,
        max_steps=CHUNK,
        seed=0,
        **kwargs,
    )
    env.reset()
    counts = [int(space.n) for space in env.action_space]
    pool = torch.as_tensor(draw(counts, num_envs), device=device).unsqueeze(-1)
    memory.exclude = nbytes([pool])
    steps = [list(pool[k].unbind(0)) for k in range(CHUNK)]  # per agent (E, 1)
    sync = sync_torch(device)

    def run() -> None:
        for actions in steps:
            env.step(actions)
        env.reset()
        sync()

    obs = sum(int(np.prod(space.shape)) for space in env.observation_space)
    return Cell(run, obs, memory.peak)


def jaxmarl_env(scenario: Scenario, num_envs: int, device: str, *, scan: bool) -> Cell:
    """JaxMARL's env, ``vmap(env.step)`` with its autoreset: a jitted ``lax.scan`` over
    CHUNK steps, or the jitted step called CHUNK times from Python."""
    import jax
    import jaxmarl

    name, kwargs = scenario.jaxmarl
    env = jaxmarl.make(name, action_type="Discrete", max_steps=CHUNK, **kwargs)
    agents = list(env.agents)
    pool = draw([int(env.action_space(a).n) for a in agents], num_envs).astype(np.int32)
    dev = jax.devices()[0]
    before = _jax_bytes(dev, "bytes_in_use")
    actions = {a: jax.device_put(pool[:, i], dev) for i, a in enumerate(agents)}
    step_all = jax.vmap(env.step)

    def one_step(carry: tuple, acts: dict) -> tuple:
        key, state, _ = carry
        key, sub = jax.random.split(key)
        obs, state, reward, dones, _ = step_all(jax.random.split(sub, num_envs), state, acts)
        # strong types, so that the carry's type does not change after the first call
        outputs = jax.tree.map(
            lambda x: jax.lax.convert_element_type(x, x.dtype), (obs, reward, dones)
        )
        return (key, state, outputs), None

    key, sub = jax.random.split(jax.random.PRNGKey(0))
    _, state = jax.vmap(env.reset)(jax.random.split(sub, num_envs))
    first_actions = {a: v[0] for a, v in actions.items()}
    outputs = jax.eval_shape(one_step, (key, state, None), first_actions)[0][2]
    zeros = jax.tree.map(lambda x: jax.numpy.zeros(x.shape, x.dtype), outputs)
    first = jax.device_put((key, state, zeros), dev)  # committed, as every later carry is
    carry = [first]
    if scan:
        chunk = jax.jit(lambda c, xs: jax.lax.scan(one_step, c, xs)[0])

        def run() -> None:
            carry[0] = jax.block_until_ready(chunk(carry[0], actions))

    else:
        step = jax.jit(one_step)
        per_step = [{a: v[k] for a, v in actions.items()} for k in range(CHUNK)]

        def run() -> None:
            c = carry[0]
            for acts in per_step:
                c = step(c, acts)[0]
            carry[0] = jax.block_until_ready(c)

    obs_size = sum(int(np.prod(env.observation_space(a).shape)) for a in agents)

    def memory() -> float | None:
        # JAX keeps one peak for the process: where an earlier cell peaked higher, this is
        # that peak (cells run in increasing E, so only the other JaxMARL cell at this E)
        peak = _jax_bytes(dev, "peak_bytes_in_use")
        return None if peak is None or before is None else peak - before - pool.nbytes

    return Cell(run, obs_size, memory)


def _jax_bytes(dev: Any, key: str) -> float | None:
    stats = dev.memory_stats() if dev.platform == "gpu" else None
    return None if not stats else float(stats[key])


# -- the run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Impl:
    name: str
    role: str  # "reference" (mpe2's loop), "corral" or "peer"
    build: Callable[[Scenario, int, str], Cell]
    envs: Callable[[int], bool] = lambda e: True  # which E it runs at


def implementations(args: argparse.Namespace, scenario: Scenario) -> list[Impl]:
    """What runs in this process, printing a line for each peer that cannot."""
    import corral

    impls = [Impl("mpe2 loop", "reference", mpe2_loop, lambda e: e == 1)]
    if scenario.corral_id in corral.batched_ids():
        places = (
            [("torch", args.device, "float32", False), ("torch", args.device, "float32", True)]
            if args.device.startswith("cuda")
            else [
                ("numpy", "cpu", "float64", False),
                ("numpy", "cpu", "float32", False),
                ("torch", "cpu", "float32", False),
                ("torch", "cpu", "float32", True),
            ]
        )
        for array, device, dtype, compiled in places:
            if compiled and not args.compile:
                continue
            impls.append(
                Impl(
                    f"corral native {array} {dtype}{' compiled' if compiled else ''}",
                    "corral",
                    lambda s, e, _, a=array, d=device, t=dtype, c=compiled: corral_vec(
                        s, e, c, native=True, array=a, device=d, dtype=t
                    ),
                )
            )
    else:
        print("corral native MPE: not available")
    impls.append(
        Impl(
            "corral dict (native=False)",
            "corral",
            lambda s, e, _: corral_vec(s, e, native=False),
            lambda e: e <= args.dict_max,
        )
    )
    for module in args.peers:
        label, variants = PEERS[module]
        if importlib.util.find_spec(module) is None:
            print(f"{label}: not installed (pip install {module}), skipped")
            continue
        impls += [Impl(name, "peer", build) for name, build in variants]
    return impls


# module -> (name, [(implementation, build)])
PEERS: dict[str, tuple[str, list[tuple[str, Callable[[Scenario, int, str], Cell]]]]] = {
    "vmas": ("VMAS", [("VMAS", vmas_env)]),
    "jaxmarl": (
        "JaxMARL",
        [
            ("JaxMARL scan", partial(jaxmarl_env, scan=True)),
            ("JaxMARL loop", partial(jaxmarl_env, scan=False)),
        ],
    ),
}


def set_threads(threads: int, device: str) -> str:
    """Give torch and JAX the same threads; say what was set."""
    cpus = sorted(os.sched_getaffinity(0))
    if threads < len(cpus):
        os.sched_setaffinity(0, cpus[:threads])  # JAX sizes its thread pool from these
    if threads == 1:
        os.environ["XLA_FLAGS"] = (
            os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
        ).strip()
    os.environ["JAX_PLATFORMS"] = "cuda" if device.startswith("cuda") else "cpu"
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # leave the GPU to torch too
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(threads)
    return f"{threads} (of {len(cpus)} CPUs the process had)"


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for name in ("numpy", "torch", "mpe2", "vmas", "jax", "jaxmarl"):
        try:
            out.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            out.append(f"{name} -")
    return ", ".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="simple_spread")
    parser.add_argument("--envs", type=int, nargs="+", help="E values (default: see above)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per cell")
    parser.add_argument("--threads", type=int, default=2, help="torch and JAX threads")
    parser.add_argument("--dict-max", type=int, default=64, help="largest E of corral dict")
    parser.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="leave out corral's torch.compile'd rows (each compiles for some seconds)",
    )
    parser.add_argument(
        "--peers",
        nargs="*",
        choices=list(PEERS),
        default=list(PEERS),
        help="the peers to run where installed (none: --peers alone)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --before-src")
    add_tree_options(parser)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.envs is None:
        if args.scenario != "simple_spread":
            args.envs = OTHER_SCENARIO_ENVS
        else:
            args.envs = CUDA_ENVS if args.device.startswith("cuda") else CPU_ENVS
    scenario = SCENARIOS[args.scenario]
    trees = chosen_trees(parser, args)
    if args.child:
        set_threads(args.threads, args.device)
        print_result({"rates": measure_cells(args, scenario, implementations(args, scenario))})
        return
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, load average "
        + " ".join(f"{x:.2f}" for x in os.getloadavg())
        + f", python {platform.python_version()}"
    )
    if "before" in trees:
        compare_trees(args, trees)
    else:
        threads = set_threads(args.threads, args.device)
        print(f"versions: {versions()}")
        print(f"threads: {threads}; device {args.device}; {args.seconds:g} s per cell")
        print(f"scenario: {scenario.corral_id} {scenario.kwargs}, max_cycles {CHUNK}, discrete")
        measure_cells(args, scenario, implementations(args, scenario))
    print("load average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


def measure_cells(
    args: argparse.Namespace, scenario: Scenario, impls: list[Impl]
) -> dict[str, float]:
    """Time and print every cell (implementation at E); ``"E name"`` -> env-steps/s."""
    gpu = args.device.startswith("cuda")
    print(
        f"\n{'E':>9}  {'implementation':<28}{'env-steps/s':>14}{'x mpe2':>10}{'obs/env':>9}"
        + (f"{'bytes/env':>11}" if gpu else "")
    )
    rates = {}
    reference = None
    for num_envs in sorted({1, *args.envs}):
        rows = []
        for impl in impls:
            if not impl.envs(num_envs) or (num_envs not in args.envs and impl.role != "reference"):
                continue
            cell = impl.build(scenario, num_envs, args.device)
            rate = measure(cell, num_envs, args.seconds)
            memory = cell.memory()
            if impl.role == "reference":
                reference = rate
            rows.append((impl, rate))
            rates[f"{num_envs} {impl.name}"] = rate
            ratio = f"{rate / reference:>9,.1f}x" if reference else f"{'-':>10}"
            line = f"{num_envs:>9}  {impl.name:<28}{rate:>14,.0f}{ratio}{cell.obs_per_env:>9}"
            if gpu:
                line += f"{'-' if memory is None else f'{memory / num_envs:,.0f}':>11}"
            print(line, flush=True)
            del cell
        corral_rows = [(r, i.name) for i, r in rows if i.role == "corral"]
        peer_rows = [(r, i.name) for i, r in rows if i.role == "peer"]
        if corral_rows and peer_rows:
            best, best_name = max(corral_rows)
            peer, peer_name = max(peer_rows)
            print(
                f"{'':>11}corral best / best peer: {best / peer:.2f}x ({best_name} / {peer_name})"
            )
    return rates


def compare_trees(args: argparse.Namespace, trees: dict[str, str]) -> None:
    """Time every cell of each tree in its own interpreter, the trees alternating, and
    print each cell's medians and ``after / before`` with each round's ratio."""
    for name, src in trees.items():
        print(f"{name}: {describe_tree(src)}")
    print(
        f"scenario {args.scenario}, device {args.device}, {args.threads} threads, "
        f"{args.seconds:g} s per cell; median of {args.rounds} alternating rounds"
    )
    command = ["--child", "--scenario", args.scenario, "--envs", *map(str, args.envs)]
    command += ["--device", args.device, "--seconds", str(args.seconds)]
    command += ["--threads", str(args.threads), "--dict-max", str(args.dict_max)]
    command += [*([] if args.compile else ["--no-compile"]), "--peers", *args.peers]
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, src in trees.items():
            runs[name].append(run_child(src, HERE, command)["rates"])
    print(f"\n{'E and implementation':<44}{'before':>14}{'after':>14}{'after/before':>14}")
    for cell in runs["after"][0]:
        if cell not in runs["before"][0]:
            print(f"{cell:<44}  (not in the before-tree)")
            continue
        before, after = ([r[cell] for r in runs[t]] for t in ("before", "after"))
        ratio = statistics.median(after) / statistics.median(before)
        per_round = " ".join(f"{a / b:.2f}" for b, a in zip(before, after, strict=True))
        print(
            f"{cell:<44}{statistics.median(before):>14,.0f}{statistics.median(after):>14,.0f}"
            f"{ratio:>14.3f}  (rounds: {per_round})"
        )


if __name__ == "__main__":
    main()
