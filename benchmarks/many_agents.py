"""Env-steps/s and agent-steps/s on MAgent2's ``battle_v4``, hundreds of agents that die.

Three loops side by side in one run, on the same env (its default 45x45 map: 162
agents, ``max_cycles=1000``) with random legal actions drawn beforehand: MAgent2's
raw PettingZoo parallel loop, and corral's ``make_vec(..., native=False)`` over
``sync`` and over ``subproc`` with 2 workers. An agent step is one alive agent's
action in one env step: as agents die, an env step holds fewer of them. The loops
alternate for ``--rounds`` rounds; each one's median is printed, with its ratio to
the raw loop.

    python benchmarks/many_agents.py [--rounds 3] [--seconds 3] [--num-envs 2]
        [--map-size 45]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

NUM_ACTIONS = 21  # battle's: nothing, 12 moves, 8 attacks; every one always legal
LOOPS = ("raw loop", "sync", "subproc")


def raw_env(map_size: int):  # type: ignore[no-untyped-def]
    from magent2.environments import battle_v4

    return battle_v4.parallel_env(map_size=map_size)


def timed(step: Callable[[int], int], seconds: float) -> tuple[float, float]:
    """Env steps/s and agent steps/s of ``step(k)`` (which returns its env steps and
    agent steps) called for ``seconds`` after a short warm-up."""
    for k in range(2):
        step(k)
    env_steps = agent_steps = calls = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs, agents = step(calls)
        env_steps, agent_steps, calls = env_steps + envs, agent_steps + agents, calls + 1
    elapsed = time.perf_counter() - start
    return env_steps / elapsed, agent_steps / elapsed


def bench_raw(map_size: int, seconds: float) -> tuple[float, float]:
    """The raw PettingZoo loop: one env, reset when its last agent is gone."""
    env = raw_env(map_size)
    env.reset(seed=0)
    index = {a: j for j, a in enumerate(env.possible_agents)}
    acts = np.random.default_rng(0).integers(0, NUM_ACTIONS, (256, len(index))).tolist()

    def step(k: int) -> tuple[int, int]:
        if not env.agents:
            env.reset()
        row = acts[k % len(acts)]
        alive = env.agents
        env.step({a: row[index[a]] for a in alive})
        return 1, len(alive)

    return timed(step, seconds)


def bench_corral(backend: str, num_envs: int, map_size: int, seconds: float) -> tuple[float, float]:
    """corral's vector layer over MAgent2's envs (one per copy), ``native=False``."""
    import corral

    options = {"num_workers": 2} if backend == "subproc" else {}
    venv = corral.make_vec(
        "magent2/battle_v4",
        num_envs,
        backend,
        native=False,
        seed=0,
        env_kwargs={"map_size": map_size},
        copy=False,
        **options,
    )
    rng = np.random.default_rng(0)
    acts = [
        {g: rng.integers(0, NUM_ACTIONS, (num_envs, len(a))) for g, a in venv.groups.items()}
        for _ in range(64)
    ]
    batch = venv.reset()

    def step(k: int) -> tuple[int, int]:
        nonlocal batch
        acting = sum(int(a.sum()) for a in batch.acting.values())  # before this step
        batch = venv.step(acts[k % len(acts)])
        return num_envs, acting

    try:
        return timed(step, seconds)
    finally:
        venv.close()


def measure(loop: str, num_envs: int, map_size: int, seconds: float) -> tuple[float, float]:
    if loop == "raw loop":
        return bench_raw(map_size, seconds)
    return bench_corral(loop, num_envs, map_size, seconds)


def run(rounds: int, seconds: float, num_envs: int, map_size: int) -> dict[str, list]:
    """Each loop's (env steps/s, agent steps/s) of every round, the loops alternating."""
    results: dict[str, list] = {loop: [] for loop in LOOPS}
    for _ in range(rounds):
        for loop in LOOPS:
            results[loop].append(measure(loop, num_envs, map_size, seconds))
    return results


def report(results: dict[str, list], num_envs: int) -> str:
    """The medians of each loop and their ratios to the raw loop, as a table."""
    medians = {
        loop: tuple(statistics.median(r[i] for r in rounds) for i in range(2))
        for loop, rounds in results.items()
    }
    raw_env_rate = medians["raw loop"][0]
    lines = [f"{'loop':<9} {'envs':>4} {'env steps/s':>12} {'agent steps/s':>14} {'x raw':>6}"]
    for loop, (env_rate, agent_rate) in medians.items():
        envs = 1 if loop == "raw loop" else num_envs
        lines.append(
            f"{loop:<9} {envs:>4} {env_rate:>12,.0f} {agent_rate:>14,.0f}"
            f" {env_rate / raw_env_rate:>6.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three loops")
    parser.add_argument("--seconds", type=float, default=3.0, help="time of each measurement")
    parser.add_argument("--num-envs", type=int, default=2, help="copies in corral's loops")
    parser.add_argument("--map-size", type=int, default=45, help="battle's map (45: 162 agents)")
    args = parser.parse_args(argv)
    results = run(args.rounds, args.seconds, args.num_envs, args.map_size)
    print(
        f"magent2/battle_v4, map_size={args.map_size}, random actions, "
        f"median of {args.rounds} rounds of {args.seconds} s"
    )
    print(report(results, args.num_envs))


if __name__ == "__main__":
    main()
