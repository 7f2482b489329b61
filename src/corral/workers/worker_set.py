"""The driver's side of the rollout workers: start them, broadcast weights, gather rollouts,
learn, and end every actor on close.

Synchronous mode (MAPPO, IPPO): each update, every learner's weights go into Ray's object
store once (``ray.put``) and every worker samples with that one version (``sample.remote``
gets the reference, which Ray resolves in the worker); the workers' rollouts are joined
along the env axis into one rollout per group (:func:`~corral.data.rollouts.concat_envs`),
from which the learner learns once. The metrics of an update add
``runner_version_lag`` (versions between the weights the rollout was collected with and the
learner's: 0 here), ``rollout_bytes`` (the pickled size of one worker's sample) and
``learner_wait_s`` (seconds the learner waited for the samples) and ``learner_wait_share``
(their share of the update's wall clock).

Asynchronous mode (DQN, MADDPG, VDN, QMIX: learners that learn from replay): every worker
always has a sample in flight; the learner takes the samples as they arrive
(``ray.wait``), learns from each, and the worker is sent the newest weights for its next
sample (put into the object store once per version). A rollout collected with weights more
than ``max_staleness`` versions behind the learner's is dropped and counted in
``rollouts_dropped``; ``runner_version_lag`` records the lag of each rollout learned from.
Samples in flight when a run checkpoints are not part of the checkpoint.

Policies that are not learned play in the workers (built there from the run's config), and
a ``policy_map`` function seats them there. Self-play's pool of past copies lives with the
learner: after each update the learner tells the run's players it learned, as in a single
process (the pool adds a snapshot when due and reports ``selfplay/pool``), and each
snapshot goes into the object store once; every worker's copy of the pool loads the
snapshots it lacks before its next sample (:mod:`corral.workers.snapshots`).
"""

from __future__ import annotations

import os
import pickle
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from corral.algos.base import Algorithm
from corral.algos.mappo import MAPPOLearner
from corral.data.rollouts import concat_envs
from corral.errors import (
    ConfigError,
    CorralError,
    MissingDependencyError,
    WorkerDiedError,
    WorkerTimeoutError,
)
from corral.training.collector import Progress, named_metrics, tell_learned
from corral.training.config import TrainConfig
from corral.training.policy_map import FixedPlayer
from corral.vector.backend import DEFAULT_START_TIMEOUT
from corral.vector.ray_backend import import_ray, join_ray, leave_ray
from corral.workers.rollout_worker import RolloutWorker, Sample
from corral.workers.snapshots import SnapshotSender, snapshot_pools

CLOSE_TIMEOUT = 10.0
"""Most seconds :meth:`WorkerSet.close` waits for the workers to close their envs."""

SYNCHRONOUS = (MAPPOLearner,)
"""The learners that rollout workers serve synchronously (on-policy)."""


def is_asynchronous(learners: Mapping[str, Algorithm]) -> bool:
    """Whether rollout workers serve ``learners`` asynchronously (they learn from replay:
    they record next observations) or synchronously (MAPPO, IPPO); a
    :class:`~corral.errors.ConfigError` for learners of neither kind or of both."""
    kinds = {
        pid: "sync" if isinstance(a, SYNCHRONOUS) else "async" if a.records_next else None
        for pid, a in learners.items()
    }
    other = {pid: type(learners[pid]).__name__ for pid, kind in kinds.items() if kind is None}
    if other:
        raise ConfigError(
            f"runners > 0 serves mappo/ippo (synchronously) and learners from replay (dqn, "
            f"maddpg, vdn, qmix; asynchronously); this run learns {other}: set runners=0"
        )
    if len(set(kinds.values())) > 1:
        raise ConfigError(
            f"runners > 0 serves learners of one kind at a time, synchronous (mappo, ippo) or "
            f"asynchronous (from replay); this run has {kinds}: set runners=0"
        )
    return "async" in kinds.values()


class WorkerActor(RolloutWorker):
    """A :class:`RolloutWorker` as a Ray actor: a :class:`~corral.errors.CorralError` of
    building it (a ``module:attr`` of the config that this node cannot import) is kept for
    :meth:`ready` to raise, so that it reaches the run as itself; Ray would report it raised
    by the constructor as the actor's death, its traceback as text."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.failed: CorralError | None = None
        try:
            super().__init__(*args, **kwargs)
        except CorralError as err:
            self.failed = err

    def ready(self) -> None:
        """Raise the error of building the worker, if any."""
        if self.failed is not None:
            raise self.failed


class WorkerSet:
    """``config.run.runners`` rollout workers in Ray actors (one CPU each), serving
    ``learners`` (by policy id, as the run builds them).

    ``seed``: where the workers' envs start their seeds (see :class:`RolloutWorker`).
    ``players``: the run's players that are not learned, as the runner built them; those
    that listen (self-play's pool) are told after each update, and the pools' snapshots
    sent to the workers. ``allow_imports``: what the configs of other runs whose policies
    play in the workers may import. Ray
    is joined as the ``ray`` backend joins it (``ray_address``, else a local Ray with a
    reaper, or the one already running); workers that do not start within
    ``start_timeout`` raise :class:`~corral.errors.WorkerStartError`.
    """

    def __init__(
        self,
        config: TrainConfig,
        learners: Mapping[str, Algorithm],
        *,
        seed: int,
        players: Mapping[str, FixedPlayer] | None = None,
        allow_imports: Collection[str] = (),
    ) -> None:
        self.asynchronous = is_asynchronous(learners)
        run = config.run
        try:
            self._ray = ray = import_ray()
        except MissingDependencyError as err:
            raise MissingDependencyError(
                "rollout workers (runners > 0) need Ray: pip install 'corral[ray]'"
            ) from err
        self.learners = dict(learners)
        self.players = dict(players or {})
        self.snapshots = SnapshotSender(snapshot_pools(self.players), lambda w: self._ray.put(w))
        """Self-play's snapshots in the object store, and which each worker holds."""
        self.envs = run.runner_envs()
        self.num_envs = sum(len(envs) for envs in self.envs)
        self.sample_timeout = run.sample_timeout or None
        self.max_staleness = run.max_staleness
        self.handles: list[Any] = []
        self._in_flight: dict[Any, int] = {}
        """Asynchronous: each sample in flight (its ObjectRef) -> the worker's index."""
        self._weights: dict[str, tuple[int, Any]] = {}
        """Asynchronous: each learner's newest weights in the object store (version, ref)."""
        self._owns_ray = join_ray(run.ray_address, max(os.cpu_count() or 1, len(self.envs)))
        try:
            remote = ray.remote(num_cpus=1)(WorkerActor)
            self.handles = [
                remote.remote(config, i, envs, seed, allow_imports=tuple(allow_imports))
                for i, envs in enumerate(self.envs)
            ]
            limit = DEFAULT_START_TIMEOUT if run.start_timeout is None else run.start_timeout
            self._get([h.ready.remote() for h in self.handles], limit or None, "start")
        except BaseException:
            self.close()
            raise

    def run(self, env_steps: int, on_step: Callable[[int], None] | None = None) -> Progress:
        """Update the learners from whole rounds of samples until at least ``env_steps`` env
        steps; ``on_step`` is called after each with the env steps it took."""
        progress = Progress()
        while progress.env_steps < env_steps:
            steps = self.take(progress) if self.asynchronous else self.update(progress)
            if on_step is not None:
                on_step(steps)
        return progress

    def take(self, progress: Progress) -> int:
        """Asynchronous: learn from the next sample to arrive (unless too stale) and send its
        worker the newest weights; adds to ``progress``, returns the sample's env steps."""
        ray = self._ray
        started = time.perf_counter()
        if not self._in_flight:
            for index in range(len(self.handles)):
                self._send(index)
        ready, _ = ray.wait(list(self._in_flight), num_returns=1, timeout=self.sample_timeout)
        if not ready:
            raise WorkerTimeoutError(
                f"no rollout worker finished a sample within {self.sample_timeout}s "
                "(sample_timeout)"
            )
        index = self._in_flight.pop(ready[0])
        (sample,) = self._get(ready, self.sample_timeout, "sample")
        waited = time.perf_counter() - started
        size = len(pickle.dumps(sample, protocol=pickle.HIGHEST_PROTOCOL))
        learned: list[dict[str, float]] = []
        for pid, learner in self.learners.items():
            lag = learner.policy.version - sample.versions[pid]
            if lag > self.max_staleness:
                progress.rollouts_dropped += 1
                continue
            metrics = {
                **learner.learn(sample.rollouts[pid]),
                **tell_learned(self.players, learner),
            }
            extra = {"runner_version_lag": lag, "rollout_bytes": size, "learner_wait_s": waited}
            learned.append(named_metrics(pid, {**metrics, **extra}))
        self._send(index)
        share = waited / (time.perf_counter() - started)
        progress.updates += [{**metrics, "learner_wait_share": share} for metrics in learned]
        add_progress(progress, sample.progress)
        return sample.progress.env_steps

    def _send(self, index: int) -> None:
        """Asynchronous: start worker ``index``'s next sample, with the newest weights (put
        into the object store once per version)."""
        refs = []
        for pid, learner in self.learners.items():
            version = learner.policy.version
            if self._weights.get(pid, (None,))[0] != version:
                self._weights[pid] = (version, self._ray.put(learner.policy.weights()))
            refs.append(self._weights[pid][1])
        pools, snapshots = self.snapshots.for_worker(index)
        call = self.handles[index].sample.remote(*refs, *snapshots, pools=pools)
        self._in_flight[call] = index

    def update(self, progress: Progress) -> int:
        """One synchronous update: broadcast the weights, gather a sample of every worker,
        learn from their rollouts; adds to ``progress``, returns the env steps."""
        ray = self._ray
        started = time.perf_counter()
        refs = [ray.put(learner.policy.weights()) for learner in self.learners.values()]
        calls = []
        for index, handle in enumerate(self.handles):
            pools, snapshots = self.snapshots.for_worker(index)
            calls.append(handle.sample.remote(*refs, *snapshots, pools=pools))
        samples: list[Sample] = self._get(calls, self.sample_timeout, "sample")
        waited = time.perf_counter() - started
        size = len(pickle.dumps(samples[0], protocol=pickle.HIGHEST_PROTOCOL))
        learned: list[dict[str, float]] = []
        for pid, learner in self.learners.items():
            version = learner.policy.version
            lag = max(version - s.versions[pid] for s in samples)
            rollouts = {
                g: concat_envs([s.rollouts[pid][g] for s in samples]) for g in learner.groups
            }
            metrics = {**learner.learn(rollouts), **tell_learned(self.players, learner)}
            extra = {"runner_version_lag": lag, "rollout_bytes": size, "learner_wait_s": waited}
            learned.append(named_metrics(pid, {**metrics, **extra}))
        share = waited / (time.perf_counter() - started)
        progress.updates += [{**metrics, "learner_wait_share": share} for metrics in learned]
        steps = 0
        for s in samples:
            steps += s.progress.env_steps
            add_progress(progress, s.progress)
        return steps

    def _get(self, refs: list[Any], timeout: float | None, what: str) -> Any:
        """``ray.get`` of the workers' calls ``refs``, their failures as corral's errors."""
        ray = self._ray
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError as err:
            raise WorkerTimeoutError(
                f"rollout workers did not {what} within {timeout}s (sample_timeout, start_timeout)"
            ) from err
        except ray.exceptions.RayActorError as err:
            raise WorkerDiedError(f"a rollout worker died in {what}(): {err}") from err
        except ray.exceptions.RayTaskError as err:
            cause = getattr(err, "cause", None)
            if isinstance(cause, CorralError):
                raise cause from err
            raise

    def close(self) -> None:
        """End every worker (after it closed its envs, for at most :data:`CLOSE_TIMEOUT`
        seconds) and let go of Ray; calling it again does nothing."""
        ray, handles, self.handles = self._ray, self.handles, []
        self._in_flight, self._weights = {}, {}  # no reference outlives the actors
        self.snapshots.close()
        try:
            if handles and ray.is_initialized():
                closing = [h.close.remote() for h in handles]
                ray.wait(closing, num_returns=len(closing), timeout=CLOSE_TIMEOUT)
        finally:
            if ray.is_initialized():
                for handle in handles:
                    ray.kill(handle)
            if self._owns_ray:
                self._owns_ray = False
                leave_ray()


def add_progress(total: Progress, part: Progress) -> None:
    """Add ``part``'s env steps, episodes and restarts to ``total``."""
    total.env_steps += part.env_steps
    total.episode_returns += part.episode_returns
    for agent, returns in part.agent_returns.items():
        total.agent_returns.setdefault(agent, []).extend(returns)
    total.episode_lengths += part.episode_lengths
    total.env_restarts += part.env_restarts
    total.episodes_cut += part.episodes_cut
    total.rollouts_dropped += part.rollouts_dropped
