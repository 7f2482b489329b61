"""A natively batched env: ``E`` games of Nim stepped as one array operation, numpy or torch.

Run it from the repository root:

    python -m examples.batched_env

It registers ``mine/nim-v1`` with two implementations, the dict env ``Nim`` of
``examples/custom_env.py`` and ``BatchedNim`` below, plays 4,096 games at once
with random legal actions, and runs the conformance checker on the batched env,
which also replays every copy on the dict env. ``docs/batched_env.md`` walks
through this file.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

import corral
from corral.batched_env import CopyGenerators, copy_seeds, selected
from corral.checks import check_batched_env
from examples.custom_env import Nim


class BatchedNim(corral.BatchedEnv):
    """``num_envs`` games of :class:`examples.custom_env.Nim`, stepped together.

    One group, ``"player"``, of two agents. Copy ``i`` reset with seed ``s`` plays
    exactly like ``Nim`` reset with seed ``s``: the first player is drawn from the
    same generator, and nothing else is random. Every array lives in ``array``
    (``"numpy"`` or ``"torch"``) on ``device``.
    """

    metadata = {"name": "nim_v1"}

    def __init__(
        self,
        num_envs: int,
        array: str = "numpy",
        device: str = "cpu",
        sticks: int = 10,
        max_take: int = 3,
    ) -> None:
        self.num_envs = num_envs
        self.place = corral.Place(array, device)
        self.sticks = sticks
        self.possible_agents = ["player_0", "player_1"]
        self._obs_space = spaces.Discrete(sticks + 1)
        self._action_space = spaces.Discrete(max_take)
        self._generators = CopyGenerators(num_envs)
        # The namespace's own functions (where, arange...) take the same arguments in both.
        self._xp = corral.arrays.ops_in(self.place).xp
        put = self.place.asarray
        self._copies = put(np.arange(num_envs))
        self._players = put(np.arange(2))
        self._takes = put(np.arange(1, max_take + 1))
        self._left = put(np.zeros(num_envs, np.int64))  # sticks left in each copy
        self._turn = put(np.zeros(num_envs, np.int64))  # the player to move: 0 or 1
        self._alive = put(np.zeros((num_envs, 2), bool))  # both, until the game ends
        self._seen = put(np.zeros((num_envs, 2), np.int64))  # what each player saw last

    def observation_space(self, agent: str) -> spaces.Space:
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_space

    def reset(
        self, seed: Any = None, where: Any = None, options: dict[str, Any] | None = None
    ) -> corral.BatchedStep:
        copies = selected(where, self.num_envs)
        generators = self._generators.at_reset(copy_seeds(seed, self.num_envs), copies)
        first = np.zeros(self.num_envs, np.int64)
        first[copies] = [g.integers(2) for g in generators]  # as Nim.reset draws it
        chosen = np.zeros(self.num_envs, bool)
        chosen[copies] = True
        xp, new = self._xp, self.place.asarray(chosen)
        # New arrays, never writes into old ones: a caller may still hold what step returned.
        self._left = xp.where(new, self.sticks, self._left)
        self._turn = xp.where(new, self.place.asarray(first), self._turn)
        self._alive = self._alive | new[:, None]
        self._seen = xp.where(new[:, None], self.sticks, self._seen)
        return self._batch()

    def step(self, actions: dict[str, Any]) -> corral.BatchedStep:
        xp = self._xp
        playing = self._alive[:, 0]  # both players are alive until the game ends
        mover = self._turn
        taken = actions["player"][self._copies, mover] + 1  # only the mover's entry is read
        self._left = xp.where(playing, self._left - taken, self._left)
        done = playing & (self._left == 0)
        is_mover = self._players[None, :] == mover[:, None]
        won, lost = done[:, None] & is_mover, done[:, None] & ~is_mover
        reward = self.place.asarray(xp.where(won, 1.0, xp.where(lost, -1.0, 0.0)), np.float64)
        terminated = self._alive & done[:, None]
        self._alive = self._alive & ~done[:, None]
        self._turn = xp.where(playing & ~done, 1 - mover, mover)
        return self._batch(reward, terminated, xp.zeros_like(terminated))

    def _batch(self, reward: Any = None, terminated: Any = None, truncated: Any = None) -> Any:
        acting = self._alive & (self._players[None, :] == self._turn[:, None])
        # A player sees the pile when asked to move, and once more when the game ends.
        ended = acting if terminated is None else acting | terminated
        self._seen = self._xp.where(ended, self._left[:, None], self._seen)
        legal = self._takes[None, None, :] <= self._left[:, None, None]
        return corral.BatchedStep(
            obs={"player": self._seen},
            alive={"player": self._alive},
            acting={"player": acting},
            action_mask={"player": legal | ~acting[:, :, None]},  # idle rows: all True
            reward=None if reward is None else {"player": reward},
            terminated=None if terminated is None else {"player": terminated},
            truncated=None if truncated is None else {"player": truncated},
        )


def random_legal_actions(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One uniformly random legal action per row of a ``[..., n]`` bool mask."""
    return np.argmax(rng.random(mask.shape) * mask, axis=-1)


def main() -> None:
    corral.register("mine/nim-v1", Nim, batched=BatchedNim, sticks=10)

    env = corral.spec("mine/nim-v1").make_batched(4096)
    rng = np.random.default_rng(0)
    mask = env.reset(seed=0).action_mask["player"]
    wins, games = np.zeros(2), 0
    for _ in range(100):
        batch = env.step({"player": random_legal_actions(mask, rng)})
        wins += batch.reward["player"].clip(0).sum(axis=0)
        over = ~batch.alive["player"].any(axis=1)
        games += int(over.sum())
        # The env never resets a copy by itself; only the rows of the copies reset are read.
        fresh = env.reset(where=over).action_mask["player"]
        mask = np.where(over[:, None, None], fresh, batch.action_mask["player"])
    print(f"{games} games, wins per player: {wins.tolist()}")

    print(check_batched_env("mine/nim-v1"))


if __name__ == "__main__":
    main()
