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
snapshots it lacks before its next sample (:mod:`corral.workers.snapshots`); a replacement
of a lost worker is sent the whole pool again.

Faults (``runner_restarts``, on by default): a worker whose sample fails because its
process died or its node left the cluster, or that has not sent its sample within
``sample_timeout`` seconds (it is killed), is lost: its sample, with the partial rollout in
it, is dropped and counted in ``rollouts_lost``, and a new actor of the same index takes its
place (counted in ``runner_restarts``), with the current weights and envs that start new
episodes from seeds drawn from ``(seed, index, restart)``
(:func:`~corral.workers.rollout_worker.restart_seed`). Ray places it on any node with a CPU
free. Synchronously, the update waits for the replacement's sample, so that every update
learns from all the envs; asynchronously, the replacement gets a sample in flight at once. A
worker lost :data:`MAX_LOSSES_IN_ROW` times without a sample in between (its replacement
does not start within ``start_timeout``, or dies again) stops the run with a
:class:`~corral.errors.WorkerDiedError` naming it and the cause. ``runner_restarts=False``:
the first lost worker stops the run. An env that raises inside a worker follows the run's
``on_env_error`` as in a single process (its worker's backend restarts it, or the run stops
with its error).
"""

from __future__ import annotations

import os
import pickle
import time
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

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
from corral.vector.ray_backend import cpu_shortage, import_ray, join_ray, leave_ray
from corral.workers.rollout_worker import RolloutWorker, Sample
from corral.workers.snapshots import SnapshotSender, snapshot_pools

MAX_LOSSES_IN_ROW = 3
"""A rollout worker lost this many times in a row (no sample in between) stops the run."""

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
    recurrent = [
        pid for pid, kind in kinds.items() if kind == "async" and _recurrent(learners[pid])
    ]
    if recurrent:
        raise ConfigError(
            f"runners > 0 does not serve recurrent learners from replay yet (policies "
            f"{recurrent}): their sequence memories keep one stream per env of this process, "
            "and the workers' envs are not: set runners=0 or recurrent=false"
        )
    return "async" in kinds.values()


def _recurrent(learner: Algorithm) -> bool:
    return bool(getattr(learner.config, "recurrent", False))


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

    def ready(self) -> int:
        """Raise the error of building the worker, if any; else its :attr:`sample_steps`."""
        if self.failed is not None:
            raise self.failed
        return self.sample_steps


@dataclass
class Lost:
    """Why a worker's call gave no answer: ``died`` (its process or node is gone) or
    ``late`` (past the timeout); ``cause`` says it in words."""

    kind: str
    cause: str


class WorkerSet:
    """``config.run.runners`` rollout workers in Ray actors (one CPU each), serving
    ``learners`` (by policy id, as the run builds them).

    ``seed``: where the workers' envs start their seeds (see :class:`RolloutWorker`).
    ``players``: the run's players that are not learned, as the runner built them; those
    that listen (self-play's pool) are told after each update, and the pools' snapshots
    sent to the workers. ``allow_imports``: what the configs of other runs whose policies
    play in the workers may import. Ray is joined as the ``ray`` backend joins it
    (``ray_address``, else a local Ray with a reaper, or the one already running); workers
    that do not start within ``start_timeout`` raise :class:`~corral.errors.WorkerTimeoutError`
    (one that cannot be built, its :class:`~corral.errors.CorralError`). Lost workers are
    replaced (``runner_restarts``, see :mod:`corral.workers.worker_set`).
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
        self.restart_lost = run.runner_restarts
        limit = DEFAULT_START_TIMEOUT if run.start_timeout is None else run.start_timeout
        self.start_timeout = limit or None
        self.handles: list[Any] = []
        self.sample_steps: list[int] = []
        """The env steps of one sample of each worker (by index), as it said when ready."""
        self.restarts = [0] * len(self.envs)
        """How many times each worker (by index) was replaced."""
        self._losses = [0] * len(self.envs)
        """Each worker's losses since its last sample."""
        self._config, self._seed, self._allow_imports = config, seed, tuple(allow_imports)
        self._in_flight: dict[Any, int] = {}
        """Asynchronous: each sample in flight (its ObjectRef) -> the worker's index."""
        self._sent_at: dict[Any, float] = {}
        """Asynchronous: when each sample in flight was asked for (``time.monotonic``)."""
        self.current_progress: Progress | None = None
        """What the :meth:`run` under way has produced so far (``None`` between runs)."""
        self._weights: dict[str, tuple[int, Any]] = {}
        """Asynchronous: each learner's newest weights in the object store (version, ref)."""
        self._owns_ray = join_ray(run.ray_address, max(os.cpu_count() or 1, len(self.envs)))
        try:
            self._free_cpus = ray.available_resources().get("CPU", 0.0)
            self._remote = ray.remote(num_cpus=1)(WorkerActor)
            self.handles = [self._spawn(i) for i in range(len(self.envs))]
            ready = [h.ready.remote() for h in self.handles]
            self.sample_steps = self._get(ready, self.start_timeout, "start")
        except BaseException:
            self.close()
            raise

    @property
    def round_steps(self) -> int:
        """The most env steps one update takes: a sample of every worker (synchronous), or
        of the largest worker (asynchronous, one sample at a time)."""
        return max(self.sample_steps) if self.asynchronous else sum(self.sample_steps)

    def run(self, env_steps: int, on_step: Callable[[int], None] | None = None) -> Progress:
        """Update the learners from whole rounds of samples until at least ``env_steps`` env
        steps; ``on_step`` is called after each with the env steps it took."""
        progress = self.current_progress = Progress()
        try:
            while progress.env_steps < env_steps:
                steps = self.take(progress) if self.asynchronous else self.update(progress)
                if on_step is not None:
                    on_step(steps)
        finally:
            self.current_progress = None
        return progress

    def take(self, progress: Progress) -> int:
        """Asynchronous: learn from the next sample to arrive (unless too stale) and send its
        worker the newest weights; adds to ``progress``, returns the sample's env steps."""
        started = time.perf_counter()
        if not self._in_flight:
            for index in range(len(self.handles)):
                self._send(index)
        sample = None
        while sample is None:
            sample = self._next_sample(progress)
        index = sample.index
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
        add_sample(progress, sample)
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
        call = self._sample_call(index, refs)
        self._in_flight[call] = index
        self._sent_at[call] = time.monotonic()

    def _next_sample(self, progress: Progress) -> Sample | None:
        """Asynchronous: the first sample in flight to arrive, or ``None`` where a worker was
        lost instead (replaced, with a new sample in flight)."""
        ray = self._ray
        timeout = None
        if self.sample_timeout is not None:
            first = min(self._sent_at.values()) + self.sample_timeout
            timeout = max(0.0, first - time.monotonic())
        ready, _ = ray.wait(list(self._in_flight), num_returns=1, timeout=timeout)
        if ready:
            index = self._in_flight.pop(ready[0])
            del self._sent_at[ready[0]]
            answer = self._answer(ready[0])
            if isinstance(answer, Sample):
                self._losses[index] = 0
                return answer
            self._lose(index, answer, progress)
            self._send(index)
            return None
        now = time.monotonic()
        assert self.sample_timeout is not None  # ray.wait waits for ever without one
        for call, sent in list(self._sent_at.items()):
            if now - sent >= self.sample_timeout:
                index = self._in_flight.pop(call)
                del self._sent_at[call]
                self._lose(index, self._late(), progress)
                self._send(index)
        return None

    def update(self, progress: Progress) -> int:
        """One synchronous update: broadcast the weights, gather a sample of every worker,
        learn from their rollouts; adds to ``progress``, returns the env steps."""
        ray = self._ray
        started = time.perf_counter()
        refs = [ray.put(learner.policy.weights()) for learner in self.learners.values()]
        samples = self._sample_all(refs, progress)
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
            add_sample(progress, s)
        return steps

    def _sample_all(self, refs: list[Any], progress: Progress) -> list[Sample]:
        """Synchronous: a sample of every worker (by index) acting with the weights ``refs``;
        a lost worker's replacement samples with them in its place."""
        calls = {i: self._sample_call(i, refs) for i in range(len(self.handles))}
        samples: dict[int, Sample] = {}
        while calls:
            answers = self._gather(calls)
            calls = {}
            for index, answer in answers.items():
                if isinstance(answer, Sample):
                    samples[index] = answer
                    self._losses[index] = 0
                else:
                    self._lose(index, answer, progress)
                    calls[index] = self._sample_call(index, refs)
        return [samples[i] for i in sorted(samples)]

    def _sample_call(self, index: int, refs: list[Any]) -> Any:
        """Worker ``index``'s ``sample`` call with the learners' weights ``refs`` and the
        self-play snapshots it lacks."""
        pools, snapshots = self.snapshots.for_worker(index)
        return self.handles[index].sample.remote(*refs, *snapshots, pools=pools)

    def _gather(self, calls: dict[int, Any]) -> dict[int, Sample | Lost]:
        """The answer of each call (by worker index) within ``sample_timeout``, or why there
        is none."""
        ready, _ = self._ray.wait(
            list(calls.values()), num_returns=len(calls), timeout=self.sample_timeout
        )
        done = set(ready)
        return {
            index: self._answer(call) if call in done else self._late()
            for index, call in calls.items()
        }

    def _late(self) -> Lost:
        return Lost("late", f"no sample within {self.sample_timeout}s (sample_timeout)")

    def _answer(self, call: Any) -> Sample | Lost:
        """The sample that the finished ``call`` returned, or :class:`Lost` where its worker
        died; an error the worker raised (an env's, under ``on_env_error=raise``) is raised."""
        ray = self._ray
        try:
            sample: Sample = ray.get(call)
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as err:
            return Lost("died", f"{type(err).__name__}: {str(err).splitlines()[0]}")
        except ray.exceptions.RayTaskError as err:
            raise_worker_error(err)
        return sample

    def _lose(self, index: int, lost: Lost, progress: Progress) -> None:
        """Drop worker ``index``'s sample (counted in ``progress.rollouts_lost``) and put a
        new worker in its place, or raise where the run does not restart workers or this
        one was lost :data:`MAX_LOSSES_IN_ROW` times in a row."""
        progress.rollouts_lost += 1
        self._ray.kill(self.handles[index])
        if not self.restart_lost:
            error = WorkerTimeoutError if lost.kind == "late" else WorkerDiedError
            raise error(
                f"rollout worker {index} was lost in sample(): {lost.cause} "
                "(runner_restarts=False stops the run)"
            )
        while True:
            self._losses[index] += 1
            if self._losses[index] >= MAX_LOSSES_IN_ROW:
                raise WorkerDiedError(
                    f"rollout worker {index} was lost {self._losses[index]} times in a row, "
                    f"the last: {lost.cause}"
                )
            self.restarts[index] += 1
            progress.runner_restarts += 1
            self.handles[index] = handle = self._spawn(index)
            self.snapshots.forget(index)  # the replacement holds no snapshot yet
            try:
                self._ray.get(handle.ready.remote(), timeout=self.start_timeout)
                return
            except self._ray.exceptions.GetTimeoutError:
                lost = Lost("late", f"its replacement did not start within {self.start_timeout}s")
            except self._ray.exceptions.RayActorError as err:
                lost = Lost("died", f"its replacement died: {str(err).splitlines()[0]}")
            except self._ray.exceptions.RayTaskError as err:
                self._ray.kill(handle)  # it could not be built (a setting its node refuses)
                raise_worker_error(err)
            self._ray.kill(handle)

    def _spawn(self, index: int) -> Any:
        """A new actor for worker ``index`` (its replacement number ``restarts[index]``)."""
        return self._remote.remote(
            self._config,
            index,
            self.envs[index],
            self._seed,
            self.restarts[index],
            allow_imports=self._allow_imports,
        )

    def _get(self, refs: list[Any], timeout: float | None, what: str) -> Any:
        """``ray.get`` of the workers' calls ``refs``, their failures as corral's errors."""
        ray = self._ray
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError as err:
            said = f"rollout workers did not {what} within {timeout}s (start_timeout)"
            if what == "start":
                said = self._shortage(said)
            raise WorkerTimeoutError(said) from err
        except ray.exceptions.RayActorError as err:
            raise WorkerDiedError(f"a rollout worker died in {what}(): {err}") from err
        except ray.exceptions.RayTaskError as err:
            raise_worker_error(err)

    def _shortage(self, what: str) -> str:
        """``what`` went wrong, with the CPUs the workers need (one each) against what the
        cluster has, and what to change."""
        return cpu_shortage(
            f"{len(self.envs)} {what}",
            len(self.envs),
            1,
            self._free_cpus,
            self._ray.cluster_resources().get("CPU", 0.0),
            workers_setting="runners",
            envs_setting="envs_per_runner",
        )

    def close(self) -> None:
        """End every worker (after it closed its envs, for at most :data:`CLOSE_TIMEOUT`
        seconds) and let go of Ray; calling it again does nothing."""
        ray, handles, self.handles = self._ray, self.handles, []
        self._in_flight, self._sent_at, self._weights = {}, {}, {}  # no reference outlives them
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


def raise_worker_error(err: Exception) -> NoReturn:
    """Raise the :class:`~corral.errors.CorralError` that a worker raised, out of the
    ``RayTaskError`` Ray wraps it in; any other error as it is."""
    cause = getattr(err, "cause", None)
    if isinstance(cause, CorralError):
        raise cause from err
    raise err


def add_sample(total: Progress, sample: Sample) -> None:
    """Add a worker's ``sample`` to ``total``, and warn of the envs restarted in it."""
    add_progress(total, sample.progress)
    for restart in sample.restarts:
        warnings.warn(restart, stacklevel=4)  # the caller of the run's train()


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
    total.runner_restarts += part.runner_restarts
    total.rollouts_lost += part.rollouts_lost
