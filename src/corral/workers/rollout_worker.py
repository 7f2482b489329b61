"""One rollout worker: a shard of a run's envs, a copy of the policies acting there and one
:class:`~corral.training.collector.Collector` that samples rollouts without learning.

A :class:`RolloutWorker` is a plain class (it imports no Ray): the worker set
(:mod:`corral.workers.worker_set`) runs it in a Ray actor, a test in its own process.
Worker ``i`` of envs ``start .. start + M - 1`` (their indices among the run's envs)
resets them with the seeds those envs have in a single process run of the same
seed, and samples actions from a stream derived from ``(seed, i)``: worker 0 keeps the
run's own, so that one worker collects exactly the first rollout of a run without
workers.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np

from corral.algos.base import Algorithm
from corral.algos.policy import Weights
from corral.data.rollouts import Rollout
from corral.errors import ConfigError, EnvError, EnvRestartWarning
from corral.training.collector import Collector, Progress
from corral.training.config import BACKEND_OPTIONS, TrainConfig, replace_run
from corral.training.runner import build_players, build_venv, seating, uses_state
from corral.training.threads import set_torch_threads
from corral.workers.snapshots import PoolSync, SnapshotCopies, snapshot_pools


@dataclass
class Sample:
    """What one :meth:`RolloutWorker.sample` sends back: small and picklable."""

    index: int
    """The worker's index."""
    rollouts: dict[str, dict[str, Rollout]]
    """One rollout per group of each learned policy, by policy id (NumPy arrays)."""
    versions: dict[str, int]
    """The weights version each learned policy acted with, by policy id."""
    progress: Progress
    """Its env steps and the episodes that ended in it (no updates: nothing learned)."""
    seconds: float = 0.0
    """The worker's wall clock inside :meth:`RolloutWorker.sample` (loading weights and
    collecting): the rest of what the learner waited was transfer and scheduling."""
    restarts: list[EnvRestartWarning] = dataclasses.field(default_factory=list)
    """The envs that failed and were restarted in it (``on_env_error="restart"``), named
    by the run's env indices, for the driver to warn of."""


def policy_seed(seed: int, index: int, restart: int = 0) -> int:
    """The seed of worker ``index``'s policies' random streams in a run of ``seed``: the run's
    own for worker 0, one drawn from ``(seed, index)`` for the others; the replacement
    number ``restart`` of a lost worker draws one from ``(seed, index, restart)``.

    Examples:
        >>> policy_seed(7, 0)
        7
        >>> policy_seed(7, 1) != policy_seed(7, 2)
        True
        >>> policy_seed(7, 0, restart=1) != 7
        True
    """
    if index == 0 and restart == 0:
        return seed
    entropy = [seed, index] if restart == 0 else [seed, index, restart]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0])


def restart_seed(seed: int, index: int, restart: int) -> int:
    """Where the envs of worker ``index``'s replacement number ``restart`` (1, 2, ...) start
    their seeds in a run whose envs start from ``seed``: drawn from ``(seed, index,
    restart)``, so that a replacement does not replay its predecessor's episodes.

    Examples:
        >>> restart_seed(7, 1, 1) != restart_seed(7, 1, 2)
        True
    """
    state = np.random.SeedSequence([seed, index, restart]).generate_state(1, np.uint32)
    return int(state[0])


def check_rollout_steps(learners: Mapping[str, Algorithm], num_envs: int) -> None:
    """Refuse learners of different ``rollout_steps`` on a worker of ``num_envs`` envs (a
    :class:`~corral.errors.ConfigError`): a sample holds one rollout of each, ending
    together."""
    steps = {pid: learner.rollout_steps for pid, learner in learners.items()}
    if len(set(steps.values())) > 1:
        raise ConfigError(
            f"runners > 0 samples one rollout of every learner at once, so they need the same "
            f"rollout_steps (vector steps); on a worker of {num_envs} envs these have {steps}: "
            "set rollout_steps (train_freq for learners from replay) alike, or runners=0"
        )


class RolloutWorker:
    """Steps the envs ``envs`` (indices among ``config``'s envs) of a run with copies of its
    policies and sends back one rollout per learned policy per :meth:`sample`.

    The policies that are not learned (``policies``' fixed, scripted and other runs' ones,
    self-play's pool of past copies) are built here from ``config`` and play in the worker's
    collector as in a single process; a ``policy_map`` function (and self-play's seat swap)
    seats them in the worker, its envs' episodes numbered as in a collector of all the run's
    envs. ``allow_imports``: what the configs of other runs whose policies play here may
    import (see :func:`~corral.training.runner.read_run_config`).

    ``seed``: the seed the run's envs start from (``run.seed``, or where a resumed run
    starts its new episodes); env ``k`` of the shard is reset with ``seed + envs[k]``.
    ``restart``: the replacement number of a lost worker, whose envs and policies start
    from seeds drawn from ``(seed, index, restart)`` (:func:`restart_seed`) instead.
    The envs run on ``runner_backend``, NumPy arrays; the policies act on the CPU with one
    torch thread, and hold no weights until the first :meth:`sample` gives them some.
    """

    def __init__(
        self,
        config: TrainConfig,
        index: int,
        envs: range,
        seed: int,
        restart: int = 0,
        *,
        allow_imports: Collection[str] = (),
    ) -> None:
        self.index = index
        self.restart = restart
        """Which replacement of a lost worker this is (0: the first of its index)."""
        self._threads = set_torch_threads(1)
        run = config.run
        local = replace_run(
            run,
            num_envs=len(envs),
            backend=run.runner_backend,
            runners=0,
            envs_per_runner=None,
            device="cpu",
            array="numpy",
            **dict.fromkeys(BACKEND_OPTIONS),  # the run's backend's, not the worker's
        )
        own = policy_seed(config.algo_config.seed, index, restart)
        self.config = dataclasses.replace(
            config,
            run=local,
            algo_config=config.algo_config.replace(seed=own),
            policy_configs={
                pid: c.replace(seed=policy_seed(c.seed, index, restart))
                for pid, c in config.policy_configs.items()
            },
        )
        self.first_env = envs.start
        """The run's index of the worker's env 0 (its errors name the run's envs)."""
        try:
            self.venv = build_venv(local, options={}, state=uses_state(self.config))
        except EnvError as err:
            raise err.moved(self.first_env) from None
        try:
            self.learners, fixed = build_players(self.config, self.venv, allow_imports)
            seats = seating(self.config, self.venv, learning=True, first=envs.start)
            start = seed + envs.start if restart == 0 else restart_seed(seed, index, restart)
            self.collector = Collector(self.venv, self.learners, fixed, seed=start, seating=seats)
            self.snapshots = SnapshotCopies(snapshot_pools(self.collector.fixed))
            """Its copies of self-play's pools, kept to the driver's members."""
            check_rollout_steps(self.learners, len(envs))
        except BaseException:
            self.close()
            raise
        self.versions: dict[str, int | None] = {pid: None for pid in self.learners}
        """The weights version each learned policy holds (``None``: none given yet)."""

    @property
    def policy_ids(self) -> list[str]:
        """The learned policies, in the order :meth:`sample` takes their weights."""
        return list(self.learners)

    @property
    def num_envs(self) -> int:
        return self.venv.num_envs

    @property
    def sample_steps(self) -> int:
        """The env steps of one :meth:`sample`: a rollout of its learners (their
        ``rollout_steps`` alike) on each of its envs."""
        return next(iter(self.learners.values())).rollout_steps * self.num_envs

    def sample(self, *weights: Weights, pools: Mapping[str, PoolSync] | None = None) -> Sample:
        """Act with ``weights`` (one per learned policy, in :attr:`policy_ids`' order; a
        version no newer than the one held is not loaded again) and collect one rollout
        of every learned policy.

        ``pools``: per self-play pool (by policy id), its members for this sample; the
        snapshots it names as ``new`` follow the learned policies' weights in ``weights``
        (see :mod:`corral.workers.snapshots`)."""
        sent = sum(len(sync.new) for sync in (pools or {}).values())
        if len(weights) != len(self.learners) + sent:
            then = f", then the {sent} new snapshot(s) its pools name" if sent else ""
            raise ValueError(
                f"sample() takes the weights of the learned policies {self.policy_ids}, one "
                f"each{then}; got {len(weights)}"
            )
        started = time.perf_counter()
        learned, snapshots = weights[: len(self.learners)], weights[len(self.learners) :]
        if pools:
            self.snapshots.load(pools, snapshots)
        for (pid, learner), given in zip(self.learners.items(), learned, strict=True):
            held, version = self.versions[pid], int(given["version"])
            if held is None or version > held:
                learner.policy.load_weights(given)
                self.versions[pid] = version
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", EnvRestartWarning)
            try:
                rollouts, progress = self.collector.sample()
            except EnvError as err:
                raise err.moved(self.first_env) from None
        restarts = []
        for said in caught:
            if isinstance(said.message, EnvRestartWarning):
                restarts.append(EnvRestartWarning(said.message.fault.moved(self.first_env)))
            else:  # not the worker's to change: shown as it would have been
                warnings.showwarning(said.message, said.category, said.filename, said.lineno)
        versions = {pid: int(v) for pid, v in self.versions.items() if v is not None}
        seconds = time.perf_counter() - started
        return Sample(self.index, rollouts, versions, progress, seconds, restarts)

    def close(self) -> None:
        """Close its envs and give torch its thread count back."""
        venv = getattr(self, "venv", None)
        if venv is not None:  # closing twice is a no-op
            venv.close()
        if self._threads is not None:
            set_torch_threads(self._threads)
            self._threads = None
