"""DQN self-play on PettingZoo's tic-tac-toe, scored against a uniformly random legal player.

The learner plays both seats in turn (one Q-network for the group ``player``:
the observation is the board from the mover's side) against a pool of its
own past snapshots (self-play's policy map, as ``corral train dqn --self-play``
plays), then plays ``--games`` greedy games moving first and
``--games`` moving second against a player that picks uniformly among the
legal moves. A game scores +1 for a win, 0 for a draw and -1 for a loss.
Targets: at least 0.85 moving first and 0.6 moving second.

    python benchmarks/dqn_tictactoe.py [--env-steps 100000] [--num-envs 16] [--seed 0]
        [--random-opponent-prob 0.2]
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch

import corral
from corral.algos.dqn import DQN, Config
from corral.training.collector import Collector
from corral.training.self_play import OPPONENT, self_play
from corral.training.selfplay_eval import evaluate_vs_random

ENV_ID = "pettingzoo/classic/tictactoe_v3"


def settings(env_steps: int, seed: int, random_opponent_prob: float) -> Config:
    """The DQN settings of this benchmark, with epsilon decaying over the first 40% of training."""
    return Config(
        gamma=0.99,
        lr=5e-4,
        hidden=(128, 128),
        seed=seed,
        buffer_size=100_000,
        batch_size=128,
        learning_starts=2_000,
        train_freq=4,
        gradient_steps=1,
        target_update_interval=500,
        epsilon_start=1.0,
        epsilon_end=0.05,
        epsilon_decay_steps=int(0.4 * env_steps),
        self_play=True,
        pool_size=10,
        snapshot_interval=2_000,
        random_opponent_prob=random_opponent_prob,
        opponent_epsilon=0.05,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-steps", type=int, default=100_000)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--games", type=int, default=1_000)
    parser.add_argument("--eval-every", type=int, default=50_000, help="env steps between checks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--random-opponent-prob",
        type=float,
        default=0.2,
        help="share of self-play episodes against a random legal player instead of a snapshot",
    )
    args = parser.parse_args()

    torch.set_num_threads(1)
    config = settings(args.env_steps, args.seed, args.random_opponent_prob)
    changed = {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if getattr(config, f.name) != f.default
    }
    print(f"{ENV_ID}: {args.env_steps} env steps over {args.num_envs} envs, seed {args.seed}")
    print(f"DQN settings (besides the defaults): {changed}")

    venv = corral.make_vec(ENV_ID, args.num_envs, seed=args.seed)
    algo = DQN(venv, config)
    collector = Collector(venv, algo, seed=args.seed, **self_play(venv, algo))
    pool = collector.fixed[OPPONENT].policy
    start = time.perf_counter()
    done = 0
    while done < args.env_steps:
        chunk = min(args.eval_every, args.env_steps - done)
        progress = collector.run(chunk)
        done += progress.env_steps
        losses = [u["loss/player"] for u in progress.updates if "loss/player" in u]
        returns = progress.episode_returns  # the learner's, each in its own seat
        first = evaluate_vs_random(algo.policy, ENV_ID, 200, seat=0, seed=1)
        second = evaluate_vs_random(algo.policy, ENV_ID, 200, seat=1, seed=2)
        print(
            f"{done:>8} env steps, {time.perf_counter() - start:6.0f} s: "
            f"epsilon {algo.epsilon():.2f}, loss {_mean(losses):.4f}, "
            f"self-play return {_mean(returns):+.2f}, "
            f"pool {len(pool.members)}, vs random (200 games) first {first:+.2f} "
            f"second {second:+.2f}",
            flush=True,
        )
    venv.close()
    train_time = time.perf_counter() - start

    first = evaluate_vs_random(algo.policy, ENV_ID, args.games, seat=0, seed=10_000)
    second = evaluate_vs_random(algo.policy, ENV_ID, args.games, seat=1, seed=20_000)
    print(f"trained in {train_time:.0f} s ({algo.gradient_step} gradient steps)")
    print(f"mean reward vs a random legal player over {args.games} games:")
    print(f"  moving first:  {first:+.3f}  (target >= 0.85)")
    print(f"  moving second: {second:+.3f}  (target >= 0.60)")


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


if __name__ == "__main__":
    main()
