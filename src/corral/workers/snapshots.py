"""Self-play's pool of past copies across rollout workers.

The pool (:class:`~corral.algos.selfplay.SnapshotPool`) that the learner adds snapshots to
lives in the runner's process, next to the learner (the driver). Each snapshot it adds
goes into Ray's object store once, under an id (:class:`SnapshotSender`, counting them in
:attr:`~SnapshotSender.puts`); each sample a worker is sent says, per pool, the ids of the
pool's members, oldest first, and comes with the snapshots that worker does not hold yet
(:class:`PoolSync`). The worker's own copy of the pool (:class:`SnapshotCopies`) loads those
before it samples and drops the members the driver's pool dropped; which member plays which
env's episode it draws as the single-process pool does, from its own generator (seeded per
worker, see :func:`~corral.workers.rollout_worker.policy_seed`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.algos.policy import Weights
from corral.algos.selfplay import SnapshotPool
from corral.training.policy_map import FixedPlayer


@dataclass(frozen=True)
class PoolSync:
    """What a worker's copy of one pool becomes before a sample."""

    members: tuple[int, ...]
    """The ids of the pool's members, oldest first."""
    new: tuple[int, ...]
    """The ids of the members sent with this sample (the worker does not hold them yet)."""


def snapshot_pools(players: Mapping[str, FixedPlayer]) -> dict[str, SnapshotPool]:
    """The players of ``players`` that are self-play pools, by policy id."""
    return {pid: p.policy for pid, p in players.items() if isinstance(p.policy, SnapshotPool)}


class SnapshotSender:
    """The driver's side: gives each snapshot of ``pools`` an id and puts it into the object
    store once (``put``: ``ray.put``), and says what each worker lacks."""

    def __init__(self, pools: Mapping[str, SnapshotPool], put: Callable[[Weights], Any]) -> None:
        self.pools = dict(pools)
        self.put = put
        self.puts = 0
        """Snapshots put into the object store so far."""
        self._members: dict[str, list[tuple[Weights, int, Any]]] = {pid: [] for pid in self.pools}
        """Per pool, each member (the pool's object), its id and its object reference."""
        self._held: dict[int, set[int]] = {}
        """Per worker index, the ids of the snapshots its pools hold."""
        self._next_id = 0

    def refresh(self) -> None:
        """Put the members the pools added since the last look; forget those they dropped."""
        for pid, pool in self.pools.items():
            known = {id(member): (i, ref) for member, i, ref in self._members[pid]}
            kept = []
            for member in pool.members:
                found = known.get(id(member))
                if found is None:
                    found = (self._next_id, self.put(member))
                    self._next_id += 1
                    self.puts += 1
                kept.append((member, *found))
            self._members[pid] = kept

    def for_worker(self, index: int) -> tuple[dict[str, PoolSync], list[Any]]:
        """Worker ``index``'s :class:`PoolSync` of each pool for its next sample, and the
        references of the snapshots it lacks (in the order of the pools' ``new`` ids)."""
        self.refresh()
        held = self._held.get(index, set())
        syncs: dict[str, PoolSync] = {}
        refs: list[Any] = []
        for pid, members in self._members.items():
            new = [(i, ref) for _, i, ref in members if i not in held]
            syncs[pid] = PoolSync(tuple(i for _, i, _ in members), tuple(i for i, _ in new))
            refs += [ref for _, ref in new]
        self._held[index] = {i for members in self._members.values() for _, i, _ in members}
        return syncs, refs

    def forget(self, index: int) -> None:
        """Worker ``index`` holds no snapshot (it was started anew)."""
        self._held.pop(index, None)

    def close(self) -> None:
        """Drop every reference into the object store."""
        self._members = {pid: [] for pid in self.pools}
        self._held = {}


class SnapshotCopies:
    """A worker's side: its copies of the pools ``pools`` (built in the worker from the run's
    config), kept to the members the driver's pools hold."""

    def __init__(self, pools: Mapping[str, SnapshotPool]) -> None:
        self.pools = dict(pools)
        self._held: dict[str, dict[int, Weights]] = {pid: {} for pid in self.pools}
        self.loaded: list[int] = []
        """The ids of the snapshots loaded, in order (each once)."""

    def load(self, syncs: Mapping[str, PoolSync], snapshots: Sequence[Weights]) -> None:
        """Make each pool's members those of ``syncs``, ``snapshots`` being the weights of
        their ``new`` ids in order; a :class:`ValueError` for a pool it has not, a count of
        snapshots that does not match, or a member neither held nor sent."""
        unknown = sorted(set(syncs) - set(self.pools))
        if unknown:
            raise ValueError(
                f"snapshots were sent for the pools {unknown}; this worker's pools: "
                f"{sorted(self.pools)}"
            )
        wanted = sum(len(sync.new) for sync in syncs.values())
        if wanted != len(snapshots):
            raise ValueError(f"the pools' syncs name {wanted} new snapshots, {len(snapshots)} came")
        given = iter(snapshots)
        for pid, sync in syncs.items():
            held = self._held[pid]
            for i in sync.new:
                held[i] = next(given)
                self.loaded.append(i)
            missing = [i for i in sync.members if i not in held]
            if missing:
                raise ValueError(
                    f"the pool {pid!r} holds the snapshots {missing}, which this worker was "
                    "never sent"
                )
            self._held[pid] = {i: held[i] for i in sync.members}
            self.pools[pid].members = [held[i] for i in sync.members]
