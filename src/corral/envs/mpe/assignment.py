"""Minimal-cost assignment of agents to targets in every copy at once.

mpe2's simple_formation and simple_line match their agents to target positions with
scipy's ``linear_sum_assignment`` (the Hungarian algorithm) one env at a time.
:class:`Assignment` solves all copies' matchings with array operations: by trying
every permutation where there are few (up to 5 agents), else by the shortest
augmenting paths scipy itself follows, one step of them for every copy at once.
Both find the optimal matching, which is scipy's unless two matchings cost exactly
the same.
"""

from __future__ import annotations

from itertools import permutations
from typing import Any

import numpy as np

from corral.arrays import Place, ops_in
from corral.batched_env import Array
from corral.envs.mpe.batched_mpe import BatchedMPE
from corral.envs.mpe.numerics import mean, norm

# Up to this many agents, every permutation is tried (5! = 120 per copy).
MAX_PERMUTED = 5


class Assignment:
    """Matches ``n`` rows to ``n`` columns of each copy's cost ``[E, n, n]`` at least total
    cost, for arrays of ``place``."""

    def __init__(self, n: int, place: Place) -> None:
        if n < 1:
            raise ValueError(f"an assignment needs at least one row, got {n}")
        self.n, self.place, self.ops = n, place, ops_in(place)
        if n <= MAX_PERMUTED:
            # [row, permutation]: the index of (row, its column) in a flattened cost.
            chosen = np.array(list(permutations(range(n)))).T + n * np.arange(n)[:, None]
            self._chosen = place.from_host(chosen.reshape(-1))

    def matched(self, cost: Array) -> Array:
        """``[E, n]``: each row's cost at the column it is assigned, rows in order."""
        if self.n <= MAX_PERMUTED:
            return self._by_permutations(cost)
        columns = self.columns(cost)
        return self.ops.gather(cost, columns[..., None], 2)[..., 0]

    def _by_permutations(self, cost: Array) -> Array:
        e, n = len(cost), self.n
        chosen = self.ops.take(cost.reshape(e, n * n), self._chosen, 1).reshape(e, n, -1)
        total = chosen[:, 0]
        for row in range(1, n):
            total = total + chosen[:, row]
        index = self.ops.broadcast_to(total.argmin(1)[:, None, None], (e, n, 1))
        return self.ops.gather(chosen, index, 2)[..., 0]

    def columns(self, cost: Array) -> Array:
        """``[E, n]`` int64: each row's column, by shortest augmenting paths (Jonker and
        Volgenant's, as scipy follows them), all copies stepped together."""
        ops, place, n = self.ops, self.place, self.n
        e = len(cost)
        copies = place.from_host(np.arange(e))
        every = place.from_host(np.arange(n))
        u = ops.zeros_like(cost[:, :, 0])  # row potentials
        inf = u + np.inf
        v = ops.zeros_like(u)  # column potentials
        none = place.from_host(np.full((e, n), -1, np.int64))
        col4row, row4col = ops.copy(none), ops.copy(none)
        for current in range(n):
            # Dijkstra from the row `current` over reduced costs until a free column.
            shortest, path = ops.copy(inf), ops.copy(none)
            seen_rows = every[None, :] == current
            seen_columns = every[None, :] < 0
            row = place.from_host(np.full(e, current, np.int64))
            sink = place.from_host(np.full(e, -1, np.int64))
            low = ops.zeros_like(u[:, 0])
            for _ in range(current + 1):  # at most `current` columns are taken
                searching = sink < 0
                if _settled(searching):
                    break
                reached = (every[None, :] == row[:, None]) & searching[:, None]
                seen_rows = seen_rows | reached
                reduced = low[:, None] + cost[copies, row] - u[copies, row][:, None] - v
                better = searching[:, None] & ~seen_columns & (reduced < shortest)
                path = ops.where(better, row[:, None], path)
                shortest = ops.where(better, reduced, shortest)
                column = ops.where(seen_columns, inf, shortest).argmin(1)
                low = ops.where(searching, shortest[copies, column], low)
                owner = row4col[copies, column]
                sink = ops.where(searching & (owner < 0), column, sink)
                row = ops.where(searching & (owner >= 0), owner, row)
                reached = (every[None, :] == column[:, None]) & searching[:, None]
                seen_columns = seen_columns | reached
            # New potentials: rows and columns the search reached move by how far it got.
            assigned = col4row.clip(0, n - 1)
            moved = seen_rows & (every[None, :] != current)
            zero = ops.zeros_like(u)
            u = u + ops.where(moved, low[:, None] - ops.gather(shortest, assigned, 1), zero)
            u[:, current] = u[:, current] + low
            v = v - ops.where(seen_columns, low[:, None] - shortest, zero)
            # Flip the path's assignments from the sink back to the row `current`.
            column, done = sink, sink < 0
            for _ in range(current + 1):
                if _settled(~done):
                    break
                row = path[copies, column]
                keep = ~done
                previous = col4row[copies, row]
                row4col[copies, column] = ops.where(keep, row, row4col[copies, column])
                col4row[copies, row] = ops.where(keep, column, previous)
                column = ops.where(keep, previous, column)
                done = done | (row == current)
        return col4row


def _settled(pending: Array) -> bool:
    """Whether no copy is ``pending``, asked only of numpy arrays: torch would wait for
    its device (and break a compiled graph), so it runs every round."""
    return isinstance(pending, np.ndarray) and not pending.any()


class BatchedTargetMatching(BatchedMPE):
    """The part mpe2's simple_formation and simple_line share: ``N`` silent agents and
    fixed landmarks, observations ``[velocity, position, each landmark - position]``, and
    one shared reward, minus the mean distance (clipped to [0, 2]) of the agents to the
    target positions a minimal-cost assignment gives them; with
    ``terminate_on_success``, an episode ends when every one is within 0.05 of its
    target. A subclass draws the episode and says where the targets are."""

    DIST_THRESHOLD = 0.05

    def setup(self, raw: Any) -> None:
        self.n = n = len(self.possible_agents)
        self.terminate_on_success = bool(raw.scenario.terminate_on_success)
        self.assignment = Assignment(n, self.place)
        self._matched: Array = None  # the matched distances [E, agent], from global_reward()

    def targets(self) -> Array:
        """``[E, N, 2]``: every copy's target positions now."""
        raise NotImplementedError

    def observe(self) -> dict[str, Array]:
        pos, n = self.world.pos, self.n
        landmarks = pos[:, None, n:] - pos[:, :n, None]  # [E, agent, landmark, 2]
        e = len(pos)
        parts = [self.world.vel[:, :n], pos[:, :n], landmarks.reshape(e, n, -1)]
        return {"agent": self.assemble(parts)}

    def reward(self) -> Array:
        return self.ops.zeros_like(self.world.pos[:, : self.n, 0])

    def global_reward(self) -> Array:
        agents = self.world.pos[:, : self.n]
        distances = norm(agents[:, :, None] - self.targets()[:, None, :])  # [E, agent, target]
        self._matched = self.assignment.matched(distances)
        clipped = self._matched.clip(0, 2)
        return -mean(clipped)

    def terminal(self) -> Array | None:
        if not self.terminate_on_success:
            return None
        return (self._matched < self.DIST_THRESHOLD).all(1)
