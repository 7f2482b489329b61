"""Reference baselines on mpe2 simple_spread_v3: uniformly random play and the scripted
heuristic (each agent goes to a landmark chosen by a greedy assignment).

Scored as a run's ``eval_return`` is: an episode's return is each agent's reward summed
over its steps, averaged over the agents; printed as the mean +- its standard error over
``--episodes`` episodes, for discrete and continuous actions. The env is the learning
targets' (N=3, max_cycles=25, local_ratio=0.5) unless ``--n`` says otherwise.

    python benchmarks/spread_baselines.py [--n 3] [--episodes 1000] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

from corral.training.baselines import SPREAD, reference_scores


def measure(n: int, episodes: int, seed: int) -> list[str]:
    """One line per action kind: every baseline's score on simple_spread with ``n`` agents."""
    lines = []
    for continuous in (False, True):
        kwargs = {"N": n, "max_cycles": 25, "local_ratio": 0.5, "continuous_actions": continuous}
        scores = reference_scores(SPREAD, kwargs, episodes=episodes, seed=seed)
        kind = "continuous" if continuous else "discrete"
        cells = "   ".join(f"{name} {score}" for name, score in scores.items())
        lines.append(f"{kind:<10}   {cells}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3, help="agents (and landmarks)")
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    start = time.perf_counter()
    print(
        f"{SPREAD} N={args.n}, max_cycles=25, local_ratio=0.5: mean return per agent "
        f"+- s.e. over {args.episodes} episodes (seed {args.seed})"
    )
    for line in measure(args.n, args.episodes, args.seed):
        print(line)
    print(f"({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
